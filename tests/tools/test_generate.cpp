// `metapipe generate` as a user runs it: greedy output is reproducible, --json's last line carries the
// ids, text and speeds, sampling is seeded, and bad input is a one-line error.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tests/support/run_cli.h"

namespace {

using mp::test::run_cli;

std::string last_line(const std::string& s) {
  auto e = s.find_last_not_of('\n');
  auto b = s.rfind('\n', e);
  return s.substr(b == std::string::npos ? 0 : b + 1, e - (b == std::string::npos ? 0 : b + 1) + 1);
}

// The random-weight presets need no model file, so these run everywhere (the toy vocabulary has 96
// tokens: "hello" is its bytes modulo 96).
TEST(CliGenerate, ToyShapesJsonAndReproducible) {
  auto a = run_cli("generate --shapes toy --prompt hello -n 6 --threads 2 --json --seed 3");
  ASSERT_EQ(a.status, 0) << a.out;
  std::string j = last_line(a.out);
  for (const char* key : {"\"prompt_tokens\": [8, 5, 12, 12, 15]", "\"tokens\": [",
                          "\"text\": ", "\"prompt_tokens_per_s\": ", "\"decode_tokens_per_s\": "})
    EXPECT_NE(j.find(key), std::string::npos) << key << " in " << j;
  EXPECT_NE(a.out.find("prompt eval: 5 tokens"), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("decode: 5 tokens"), std::string::npos) << a.out;
  // Greedy: the same tokens for any thread count.
  auto b = run_cli("generate --shapes toy --prompt hello -n 6 --threads 1 --json --seed 3");
  ASSERT_EQ(b.status, 0) << b.out;
  auto toks = [](const std::string& l) {
    return l.substr(l.find("\"tokens\""), l.find("\"text\"") - l.find("\"tokens\""));
  };
  EXPECT_EQ(toks(j), toks(last_line(b.out)));
  // Sampling with a seed is reproducible too.
  auto s1 = run_cli(
      "generate --shapes toy --prompt hi -n 8 --temperature 0.8 --top-k 20 --top-p 0.9 --seed 5 --json");
  auto s2 = run_cli(
      "generate --shapes toy --prompt hi -n 8 --temperature 0.8 --top-k 20 --top-p 0.9 --seed 5 --json");
  ASSERT_EQ(s1.status, 0) << s1.out;
  EXPECT_EQ(toks(last_line(s1.out)), toks(last_line(s2.out)));
}

TEST(CliGenerate, BadInputIsOneLineError) {
  struct Case {
    const char* args;
    const char* message;
  };
  const Case cases[] = {
      {"generate --model /nonexistent/model.gguf", "/nonexistent/model.gguf"},
      {"generate --shapes toy -n 0", "-n 0: the number of tokens to generate must be in [1, 1000000]"},
      {"generate --shapes toy --temperature -1", "--temperature -1 must be in [0, 100]"},
      {"generate --shapes toy --temperature 1e9", "--temperature 1e+09 must be in [0, 100]"},
      {"generate --shapes toy --temperature nan", "--temperature expects a number, got 'nan'"},
      {"generate --shapes toy --top-p 0", "--top-p 0 must be in (0, 1]"},
      {"generate --shapes toy --top-p 1.5", "--top-p 1.5 must be in (0, 1]"},
      {"generate --shapes toy --top-k -2", "--top-k -2 must be >= 0"},
      {"generate --shapes toy --threads 0", "--threads 0 must be in [1, 1024]"},
      {"generate --shapes toy --seed -1", "--seed must be >= 0"},
      {"generate --shapes gpt5", "unknown model shapes 'gpt5'"},
      {"generate --shapes toy --target rdu", "unknown --target 'rdu' for generate"},
      {"generate --shapes toy --prompt a --chat b", "either --prompt or --chat"},
      {"generate --shapes toy -n 60 --prompt 0123456789", "need 69 positions but the context is 64 tokens"},
  };
  for (auto& c : cases) {
    auto r = run_cli(c.args);
    EXPECT_NE(r.status, 0) << c.args;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.args << " -> " << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << c.args << ": more than one line: " << r.out;
  }
  // A prompt longer than the context names both lengths.
  std::string longp(70, 'x');
  auto r = run_cli("generate --shapes toy --prompt " + longp);
  EXPECT_NE(r.out.find("the prompt has 70 tokens but the model's context is 64 tokens"), std::string::npos)
      << r.out;
  // A file that is not GGUF.
  std::string bad = testing::TempDir() + "not_a_model.gguf";
  std::ofstream(bad) << "this is not a GGUF file, just text\n";
  r = run_cli("generate --model " + bad);
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.out.find(bad), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
  std::remove(bad.c_str());
}

}  // namespace
