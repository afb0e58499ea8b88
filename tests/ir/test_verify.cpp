// The verifier, one test per check in ir/verify.cpp: each builds an IR that breaks exactly that rule
// and asserts the message. User errors (the program is wrong) say what and how to fix it; internal errors
// (a pass produced a broken IR) name the node. Where a check only applies to a later pass's invariant,
// the test also shows the same IR accepted without that flag.
#include <gtest/gtest.h>

#include <string>

#include "front/front.h"
#include "ir/verify.h"
#include "tests/support/expect_user_error.h"

using namespace mp;
using namespace mp::ir;

// The statement must throw mp::internal_error whose message contains the substring.
#define EXPECT_INTERNAL_ERROR(stmt, substr)                                         \
  do {                                                                              \
    try {                                                                           \
      stmt;                                                                         \
      ADD_FAILURE() << "expected an internal_error containing: " << substr;         \
    } catch (const mp::internal_error& e) {                                         \
      EXPECT_NE(std::string(e.what()).find(substr), std::string::npos) << e.what(); \
    }                                                                               \
  } while (0)

namespace {

std::string id(const Value& v) { return std::to_string(v->id); }

// A METAPIPE of `trip` iterations whose body is one unscheduled stage.
std::shared_ptr<MetaPipe> loop(Program& p, int64_t trip, std::vector<NodeRef> ops) {
  auto m = p.new_node<MetaPipe>();
  m->var = p.new_loop_var(trip);
  m->stages.push_back({"body", std::move(ops), {}});
  return m;
}

// A scheduled two-stage loop: s0 loads a 64 x 64 f32 tile (16 KiB), s1 stores it. `buffered` adds the
// Stream buffer that carries the tile from s0 to s1 (2 slots, 32 KiB).
struct TwoStages {
  Program p;
  std::shared_ptr<LoadTile> load;
  std::shared_ptr<MetaPipe> m;
  explicit TwoStages(bool buffered) {
    auto X = p.add_tensor("X", {64, 64}, DType::f32, TensorRole::Input);
    auto Y = p.add_tensor("Y", {64, 64}, DType::f32, TensorRole::Output);
    load = make_load(p, X, {64, 64}, {0, 0}, false);
    auto store = make_store(p, Y, load->out, {0, 0}, false);
    m = p.new_node<MetaPipe>();
    m->var = p.new_loop_var(2);
    m->stages.push_back({"s0", {load}, {}});
    m->stages.push_back({"s1", {store}, {}});
    m->scheduled = true;
    if (buffered) {
      BufferInfo b;
      b.name = "b0";
      b.value = load->out;
      b.producer = 0;
      b.consumers = {1};
      b.depth = 2;
      b.slot_bytes = load->out->bytes();
      m->buffers.push_back(b);
    }
    p.body = {m};
  }
};

}  // namespace

// ---- user errors ---------------------------------------------------------------------------------

TEST(Verify, OperandUsedOutsideItsScope) {
  // x is defined inside the loop and stored after it.
  Program p;
  auto X = p.add_tensor("X", {16, 16}, DType::f32, TensorRole::Input);
  auto Y = p.add_tensor("Y", {16, 16}, DType::f32, TensorRole::Output);
  auto x = make_load(p, X, {16, 16}, {0, 0}, false);
  auto store = make_store(p, Y, x->out, {0, 0}, false);
  p.body = {loop(p, 1, {x}), store};
  EXPECT_USER_ERROR(verify(p), "StoreTile #" + std::to_string(store->id) + " uses " + id(x->out) +
                                   " before it is defined (or outside its scope)");
  p.body = {loop(p, 1, {x, store})};
  EXPECT_NO_THROW(verify(p));
}

TEST(Verify, TiledValueOverBudget) {
  Program p;
  auto X = p.add_tensor("X", {64, 64}, DType::f32, TensorRole::Input);
  auto Y = p.add_tensor("Y", {64, 64}, DType::f32, TensorRole::Output);
  auto x = make_load(p, X, {64, 64}, {0, 0}, false);
  p.body = {x, make_store(p, Y, x->out, {0, 0}, false)};
  p.onchip_budget = 8 * 1024;
  EXPECT_NO_THROW(verify(p));  // before tiling a value may be a whole tensor
  p.tiled = true;
  EXPECT_USER_ERROR(verify(p), "LoadTile #");
  EXPECT_USER_ERROR(verify(p), "produces f32[64, 64] = 16.0 KiB, more than the on-chip budget of 8.0 KiB");
  EXPECT_USER_ERROR(verify(p), "tile it smaller");
}

TEST(Verify, NonDividingTileNeedsMasking) {
  front::ProgramBuilder b("nd");
  auto X = b.input("X", {100, 16});
  auto Y = b.output("Y", {100, 16});
  front::METAPIPE(front::cdiv(100, 32), [&]() { front::STORE_TILE(Y, front::LOAD_TILE(X, {32, 16})); });
  Program p = b.finish();
  p.tiled = true;
  EXPECT_USER_ERROR(verify(p), "LoadTile #");
  EXPECT_USER_ERROR(verify(p), "tile 32 does not divide dimension 100 of X");
  EXPECT_USER_ERROR(verify(p), "enable masking (--set mask=1");
}

TEST(Verify, TileStartsOutOfBounds) {
  front::ProgramBuilder b("oob");
  auto X = b.input("X", {64, 16});
  auto Y = b.output("Y", {64, 16});
  front::METAPIPE(4, [&](front::Idx i) {  // the store is shifted by one tile: the last starts at row 64
    auto x = front::LOAD_TILE(X, {16, 16});
    front::STORE_TILE(Y, x, front::at(i * 16 + 16, 0));
  });
  Program p = b.finish();
  p.tiled = true;
  EXPECT_USER_ERROR(verify(p), "StoreTile #");
  EXPECT_USER_ERROR(verify(p), "out of bounds");
  EXPECT_USER_ERROR(verify(p), "reduce the loop trip count to 4");
}

TEST(Verify, ConstantTileRunsPastANonDividingAxis) {
  // A 32-row tile at row 80 of 100 rows: inside at its start, past the end at 112.
  for (bool masked : {false, true}) {
    Program p;
    auto X = p.add_tensor("X", {100, 16}, DType::f32, TensorRole::Input);
    auto Y = p.add_tensor("Y", {32, 16}, DType::f32, TensorRole::Output);
    auto x = make_load(p, X, {32, 16}, {80, 0}, masked);
    p.body = {x, make_store(p, Y, x->out, {0, 0}, false)};
    p.tiled = true;
    if (masked)
      EXPECT_NO_THROW(verify(p));
    else
      EXPECT_USER_ERROR(verify(p), "LoadTile #" + std::to_string(x->id) +
                                       " (LOAD_TILE of X): tile 32 does not divide dimension 100 of X");
  }
}

TEST(Verify, TileRunsPastTheEndOfADividingAxis) {
  // A 32-row tile stored at row 48 of 64: the axis divides, so masking would not apply; the offset is wrong.
  Program p;
  auto X = p.add_tensor("X", {32, 16}, DType::f32, TensorRole::Input);
  auto Y = p.add_tensor("Y", {64, 16}, DType::f32, TensorRole::Output);
  auto x = make_load(p, X, {32, 16}, {0, 0}, false);
  p.body = {x, make_store(p, Y, x->out, {48, 0}, false)};
  p.tiled = true;
  EXPECT_USER_ERROR(verify(p), "StoreTile #");
  EXPECT_USER_ERROR(verify(p), "writes past the end of Y[64, 16] on axis 0 (up to 80 > 64)");
}

TEST(Verify, BufferOverBudget) {
  Program p;
  auto X = p.add_tensor("X", {64, 64}, DType::f32, TensorRole::Input);
  auto Y = p.add_tensor("Y", {64, 64}, DType::f32, TensorRole::Output);
  auto x = make_load(p, X, {64, 64}, {0, 0}, false);
  auto buf = make_buffer(p, x->out, 2);
  p.body = {x, buf, make_store(p, Y, buf->out, {0, 0}, false)};
  p.onchip_budget = 24 * 1024;  // the tile (16 KiB) fits, two slots of it do not
  EXPECT_USER_ERROR(verify(p), "BUFFER Buffer #" + std::to_string(buf->id));
  EXPECT_USER_ERROR(verify(p), "holds 2 x 16.0 KiB = 32.0 KiB, more than the on-chip budget of 24.0 KiB");
  p.onchip_budget = 32 * 1024;
  EXPECT_NO_THROW(verify(p));
}

TEST(Verify, TripCountAtLeastOne) {
  Program p;
  auto m = loop(p, 0, {make_fill(p, {8, 8}, DType::f32, Expr(0.0))});
  p.body = {m};
  EXPECT_USER_ERROR(verify(p),
                    "MetaPipe #" + std::to_string(m->id) + ": METAPIPE trip count must be >= 1, got 0");
}

TEST(Verify, LoopCarriedValueKeepsItsShape) {
  Program p;
  auto init = make_fill(p, {8, 8}, DType::f32, Expr(0.0));
  auto next = make_fill(p, {4, 8}, DType::f32, Expr(1.0));
  auto m = loop(p, 2, {next});
  Carried c{init->out, p.new_value({8, 8}, DType::f32, {}), next->out, p.new_value({8, 8}, DType::f32, {})};
  m->carried.push_back(c);
  p.body = {init, m};
  EXPECT_USER_ERROR(verify(p), "loop-carried value " + id(c.arg) + " changes shape from [8, 8] to [4, 8]");
  EXPECT_USER_ERROR(verify(p), "the body must yield the same shape it receives");
}

TEST(Verify, YieldedValueDefinedInTheBody) {
  Program p;
  auto init = make_fill(p, {8, 8}, DType::f32, Expr(0.0));
  auto m = loop(p, 2, {make_fill(p, {8, 8}, DType::f32, Expr(1.0))});
  Value stray = p.new_value({8, 8}, DType::f32, {});  // no node produces it
  m->carried.push_back(
      {init->out, p.new_value({8, 8}, DType::f32, {}), stray, p.new_value({8, 8}, DType::f32, {})});
  p.body = {init, m};
  EXPECT_USER_ERROR(verify(p), "yielded value " + id(stray) + " is not defined in the body");
}

TEST(Verify, MetapipelinedLoopBuffersFitTheBudget) {
  TwoStages t(true);
  t.p.metapipelined = true;
  t.p.onchip_budget = 24 * 1024;  // the 16 KiB tile fits, its two buffer slots do not
  EXPECT_USER_ERROR(verify(t.p), "the buffers of MetaPipe #" + std::to_string(t.m->id) +
                                     " need 32.0 KiB, more than the on-chip budget of 24.0 KiB");
  t.p.onchip_budget = 32 * 1024;
  EXPECT_NO_THROW(verify(t.p));
}

// ---- internal errors (broken IR from a pass) -------------------------------------------------------

TEST(Verify, LoopVariableOutsideItsMetapipe) {
  Program p;
  auto X = p.add_tensor("X", {64, 16}, DType::f32, TensorRole::Input);
  auto Y = p.add_tensor("Y", {16, 16}, DType::f32, TensorRole::Output);
  LoopVar v = p.new_loop_var(4, "i");
  auto x = make_load(p, X, {16, 16}, {Affine::var(v, 16), 0}, false);  // no loop binds i
  p.body = {x, make_store(p, Y, x->out, {0, 0}, false)};
  EXPECT_INTERNAL_ERROR(verify(p),
                        "LoadTile #" + std::to_string(x->id) + " uses loop variable i outside its METAPIPE");
}

TEST(Verify, NullOperand) {
  Program p;
  auto Y = p.add_tensor("Y", {16, 16}, DType::f32, TensorRole::Output);
  auto s = p.new_node<StoreTile>();
  s->dst = Y;
  s->offset = {0, 0};
  p.body = {s};
  EXPECT_INTERNAL_ERROR(verify(p), "StoreTile #" + std::to_string(s->id) + " has a null operand");
}

TEST(Verify, MetapipeWithoutStages) {
  Program p;
  auto m = p.new_node<MetaPipe>();
  m->var = p.new_loop_var(2);
  p.body = {m};
  EXPECT_INTERNAL_ERROR(verify(p), "MetaPipe #" + std::to_string(m->id) + " has no stages");
}

TEST(Verify, EveryLoopScheduledAfterMetapipelining) {
  TwoStages t(true);
  t.m->scheduled = false;
  EXPECT_NO_THROW(verify(t.p));
  t.p.metapipelined = true;
  EXPECT_INTERNAL_ERROR(verify(t.p), "is not scheduled after the metapipeline pass");
}

TEST(Verify, LoopCarriedValueComplete) {
  Program p;
  auto init = make_fill(p, {8, 8}, DType::f32, Expr(0.0));
  auto next = make_fill(p, {8, 8}, DType::f32, Expr(1.0));
  auto m = loop(p, 2, {next});
  m->carried.push_back({init->out, p.new_value({8, 8}, DType::f32, {}), next->out, nullptr});  // no result
  p.body = {init, m};
  EXPECT_INTERNAL_ERROR(verify(p), "incomplete loop-carried value");
}

TEST(Verify, BufferProducerIsAStage) {
  TwoStages t(true);
  EXPECT_NO_THROW(verify(t.p));
  t.m->buffers[0].producer = 2;  // the loop has stages 0 and 1
  EXPECT_INTERNAL_ERROR(verify(t.p), "buffer b0 has a bad producer stage");
}

TEST(Verify, StreamBufferFlowsForward) {
  TwoStages t(true);
  t.m->buffers[0].producer = 1;
  t.m->buffers[0].consumers = {0};
  EXPECT_INTERNAL_ERROR(verify(t.p), "buffer b0 flows backwards (1 -> 0)");
}

TEST(Verify, StageReadsNoValueOfALaterStage) {
  // Stage s0 reads v, and stage s1 (re)defines v. Value ids are SSA, so only a broken pass can produce
  // this; the verifier names the stage order as the problem.
  TwoStages t(true);
  auto v = make_fill(t.p, {64, 64}, DType::f32, Expr(0.0));
  auto redefine = t.p.new_node<Fill>();
  redefine->f = Expr(1.0);
  redefine->out = v->out;
  auto use = make_map(t.p, v->out, Expr::arg(0) * 2.0, DType::f32);
  t.m->stages[0].ops.push_back(use);
  t.m->stages[1].ops.push_back(redefine);
  t.p.body = {v, t.m};
  EXPECT_INTERNAL_ERROR(verify(t.p),
                        "Map #" + std::to_string(use->id) + " in stage 0 reads a value of the later stage 1");
}

TEST(Verify, CrossStageValueBuffered) {
  TwoStages t(false);  // the tile goes from s0 to s1 with no Stream buffer
  EXPECT_INTERNAL_ERROR(verify(t.p),
                        "in stage s1 reads %" + id(t.load->out) + " of stage s0 without a buffer");
}

TEST(Verify, NodeIdsUnique) {
  Program p;
  auto a = make_fill(p, {8, 8}, DType::f32, Expr(0.0));
  auto b = make_fill(p, {8, 8}, DType::f32, Expr(1.0));
  b->id = a->id;
  p.body = {a, b};
  EXPECT_INTERNAL_ERROR(verify(p), "node id " + std::to_string(a->id) + " appears twice");
}
