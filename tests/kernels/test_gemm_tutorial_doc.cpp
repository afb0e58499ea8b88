// The GEMM tutorial's code snippets are the library's code: every ```cpp block of docs/gemm-tutorial.md
// appears verbatim in kernels/gemm_sm90.cu, so the doc cannot drift from the kernel it explains.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

namespace {
std::string read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST(GemmTutorialDoc, SnippetsAreTheKernelsCode) {
  const std::string doc = read(MP_SOURCE_DIR "/docs/gemm-tutorial.md");
  const std::string kernel = read(MP_SOURCE_DIR "/kernels/gemm_sm90.cu");
  ASSERT_FALSE(doc.empty());
  ASSERT_FALSE(kernel.empty());
  int snippets = 0;
  for (size_t at = doc.find("```cpp\n"); at != std::string::npos; at = doc.find("```cpp\n", at)) {
    const size_t from = at + 7, to = doc.find("```", from);
    ASSERT_NE(to, std::string::npos) << "an unclosed ```cpp block";
    const std::string snippet = doc.substr(from, to - from);
    EXPECT_NE(kernel.find(snippet), std::string::npos) << "not in kernels/gemm_sm90.cu:\n" << snippet;
    ++snippets;
    at = to + 3;
  }
  EXPECT_GE(snippets, 2);  // load and compute
}
