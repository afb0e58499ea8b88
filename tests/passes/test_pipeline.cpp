// The pass pipeline: tile, fuse, parallelize and metapipeline in that order, the verifier after each,
// the IR dumped after the passes asked for.
#include <gtest/gtest.h>

#include <sstream>

#include "passes/pipeline.h"
#include "tests/passes/programs.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/slide51.h"

using namespace mp;
using mp::test::has;
using mp::test::softmax;

TEST(Pipeline, RunsThePassesInOrder) {
  std::vector<passes::PassRecord> log;
  auto p = passes::compile(softmax(64, 8), {}, &log);
  std::vector<std::string> names;
  for (auto& r : log) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"input", "tile", "fuse", "parallelize", "metapipeline"}));
  EXPECT_TRUE(p.tiled && p.fused && p.parallelized && p.metapipelined);
}

TEST(Pipeline, DumpsAfterEveryPass) {
  std::ostringstream os;
  passes::CompileOptions o;
  o.dump = "after-all";
  o.dump_to = &os;
  passes::compile(softmax(64, 8), o);
  size_t at = 0;
  for (auto* name : {"tile", "fuse", "parallelize", "metapipeline"}) {  // each once, in this order
    size_t next = os.str().find(std::string("IR after ") + name, at);
    ASSERT_NE(next, std::string::npos) << name;
    at = next;
  }
}

TEST(Pipeline, DumpsAfterOnePass) {
  std::ostringstream os;
  passes::CompileOptions o;
  o.dump = "after-fuse";
  o.dump_to = &os;
  passes::compile(softmax(64, 8), o);
  EXPECT_TRUE(has(os.str(), "IR after fuse")) << os.str();
  EXPECT_FALSE(has(os.str(), "IR after tile")) << os.str();
  EXPECT_FALSE(has(os.str(), "IR after metapipeline")) << os.str();
}

TEST(Pipeline, UnknownDumpRejected) {
  passes::CompileOptions o;
  o.dump = "after-everything";
  EXPECT_USER_ERROR(passes::compile(softmax(64, 8), o), "unknown --dump-ir value 'after-everything'");
}

TEST(Pipeline, VerifiesAfterTheTilePass) {
  // The tile pass leaves explicit tiles alone; the verifier after it rejects the one that does not divide.
  EXPECT_USER_ERROR(passes::compile(mp::test::slide51(100, 64, 32, 32, 32), {}),
                    "tile 32 does not divide dimension 100 of A");
}
