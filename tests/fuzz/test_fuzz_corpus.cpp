// Replays the fuzz targets' corpora (tests/fuzz/corpus_*) in CI without libFuzzer: every input must parse
// or end in a user_error, never another exception (the sanitizer build also catches memory errors and
// undefined behaviour on the way).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace mp::fuzz {
void systolic_one(std::string_view text);
void arch_one(std::string_view text);
void set_one(std::string_view text);
}  // namespace mp::fuzz

namespace {

namespace fs = std::filesystem;

void replay(const char* corpus, const std::function<void(std::string_view)>& one) {
  const fs::path dir = fs::path(MP_FUZZ_CORPUS) / corpus;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    std::ostringstream s;
    s << f.rdbuf();
    EXPECT_NO_THROW(one(s.str())) << e.path().filename();
    ++n;
  }
  EXPECT_GE(n, 5) << dir;  // the corpus is there and not empty
}

TEST(FuzzCorpus, SystolicConfigAndTopology) { replay("corpus_systolic", mp::fuzz::systolic_one); }
TEST(FuzzCorpus, ArchFilesAndOverrides) { replay("corpus_arch", mp::fuzz::arch_one); }
TEST(FuzzCorpus, SetAssignments) { replay("corpus_set", mp::fuzz::set_one); }

}  // namespace
