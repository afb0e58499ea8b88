// Replays the fuzz targets' corpora (tests/fuzz/corpus_*) in CI without libFuzzer: every input must parse
// or end in a user_error, never another exception (the sanitizer build also catches memory errors and
// undefined behaviour on the way).
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace mp::models {
class Tokenizer;
}

namespace mp::fuzz {
void systolic_one(std::string_view text);
void arch_one(std::string_view text);
void set_one(std::string_view text);
void gguf_one(const uint8_t* data, size_t size);
void tokenizer_one(std::string_view text);
const mp::models::Tokenizer* default_tokenizer();
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
  EXPECT_GE(n, 2) << dir;  // the corpus is there and not empty
}

TEST(FuzzCorpus, SystolicConfigAndTopology) { replay("corpus_systolic", mp::fuzz::systolic_one); }
TEST(FuzzCorpus, ArchFilesAndOverrides) { replay("corpus_arch", mp::fuzz::arch_one); }
TEST(FuzzCorpus, SetAssignments) { replay("corpus_set", mp::fuzz::set_one); }
TEST(FuzzCorpus, GgufFiles) {
  // An exactly sized copy, so that the address sanitizer sees a read one byte past the file.
  replay("corpus_gguf", [](std::string_view text) {
    const std::vector<uint8_t> bytes(text.begin(), text.end());
    mp::fuzz::gguf_one(bytes.data(), bytes.size());
  });
}
TEST(FuzzCorpus, TokenizerRoundTrip) {
  if (!mp::fuzz::default_tokenizer())
    GTEST_SKIP() << "the default model is not installed (scripts/install-deps)";
  replay("corpus_tokenizer", mp::fuzz::tokenizer_one);
}

}  // namespace
