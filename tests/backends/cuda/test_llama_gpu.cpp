// The GPU Llama engine's host side, without a GPU: launch-mode parsing, the operation list and task
// schedule built from the model's shapes (every weight of the model definition read once, every task
// of every operation scheduled once, dependencies that order every conflicting access to a buffer),
// the memory estimate, bad input, and the CLI's --target cuda / --launch errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <bitset>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <tuple>

#include "backends/cuda/llama_gpu.h"
#include "core/device.h"
#include "models/llama.h"
#include "tests/support/expect_user_error.h"
#include "tests/support/run_cli.h"

namespace mp::cuda {
namespace {

LlamaGpuShapes shapes(const std::string& preset) {
  return shapes_of(models::LlamaConfig::preset(preset), models::rope_frequency);
}

TEST(LlamaGpuOptions, LaunchModes) {
  for (auto& n : launch_names()) EXPECT_EQ(to_string(parse_launch(n)), n);
  EXPECT_USER_ERROR(parse_launch("fused"),
                    "unknown --launch mode 'fused'; modes: per-op, per-layer, megakernel");
}

TEST(LlamaGpuSchedule, LaunchesPerTokenFollowTheMode) {
  for (const char* preset : {"toy", "smollm2-135m", "llama3.1-8b"}) {
    SCOPED_TRACE(preset);
    LlamaGpuShapes s = shapes(preset);
    const int64_t L = s.layers;
    EXPECT_EQ(build_schedule(s, Launch::per_op, 64, 528).launches_per_token(), 1 + 16 * L + 3);
    EXPECT_EQ(build_schedule(s, Launch::per_layer, 64, 528).launches_per_token(), L + 2);
    EXPECT_EQ(build_schedule(s, Launch::megakernel, 64, 528).launches_per_token(), 1);
  }
}

TEST(LlamaGpuSchedule, ReadsEveryWeightOfTheModel) {
  for (const char* preset : {"toy", "smollm2-135m", "llama3.1-8b"})
    for (Launch m : {Launch::per_op, Launch::megakernel}) {
      SCOPED_TRACE(std::string(preset) + " " + to_string(m));
      auto c = models::LlamaConfig::preset(preset);
      auto sc = build_schedule(shapes(preset), m, 64, 100);
      std::vector<std::string> got, want = models::weight_names(c);
      for (auto& w : sc.weights) got.push_back(w.name);
      std::sort(got.begin(), got.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(got, want);
      std::map<int32_t, int> uses;
      for (auto& o : sc.ops) {
        if (o.weight >= 0) ++uses[o.weight];
        if (o.norm_weight >= 0) ++uses[o.norm_weight];
      }
      for (size_t i = 0; i < sc.weights.size(); ++i) {
        const std::string& n = sc.weights[i].name;
        // The tied embedding table is read by the embedding and by the LM head; in the fused modes each
        // GEMV after a norm stages the norm itself (q, k, v after attn_norm; gate, up after ffn_norm).
        int expect = n == "token_embd.weight" && c.tied_embeddings ? 2 : 1;
        if (m != Launch::per_op && n.find("attn_norm") != std::string::npos) expect = 3;
        if (m != Launch::per_op && n.find("ffn_norm") != std::string::npos) expect = 2;
        EXPECT_EQ(uses[int32_t(i)], expect) << n;
      }
    }
}

// Every task once; GEMV tasks cover their rows exactly once; attention has a task per (head, chunk).
TEST(LlamaGpuSchedule, EveryTaskOnceAndRowsCovered) {
  for (int64_t workers : {1, 7, 132, 528, 1056})
    for (GemvSplit split : {GemvSplit::balanced, GemvSplit::two_per_worker})
      for (Launch m : {Launch::per_op, Launch::per_layer, Launch::megakernel}) {
        auto sc = build_schedule(shapes("smollm2-135m"), m, 1000, workers, split);
        EXPECT_NO_THROW(verify_schedule(sc));
        std::set<std::pair<int32_t, int32_t>> seen;
        for (auto& t : sc.tasks) EXPECT_TRUE(seen.insert({t.op, t.index}).second);
        int64_t sum = 0;
        for (auto& o : sc.ops) sum += o.tasks;
        EXPECT_EQ(sum, int64_t(sc.tasks.size()));
        for (auto& o : sc.ops) {
          if (o.kind == OpKind::gemv) {
            std::vector<int> hit(size_t(o.rows), 0);
            for (int32_t t = 0; t < o.tasks; ++t)
              for (int32_t r = t * o.per_task; r < std::min(o.rows, (t + 1) * o.per_task); ++r)
                ++hit[size_t(r)];
            EXPECT_TRUE(std::all_of(hit.begin(), hit.end(), [](int h) { return h == 1; }));
            EXPECT_EQ(o.per_task * o.slices % 8, 0);  // whole warps: rows x column slices
            EXPECT_TRUE(o.slices == 1 || o.slices == 2 || o.slices == 4 || o.slices == 8) << o.slices;
            EXPECT_EQ(o.cols % (32 * o.slices), 0) << o.cols << " / " << o.slices;
          }
          if (o.kind == OpKind::attention) {
            EXPECT_EQ(o.tasks, 9 * sc.attn_chunks);
            EXPECT_GE(int64_t(sc.attn_chunk) * sc.attn_chunks, 1000);
            EXPECT_LT(int64_t(sc.attn_chunk) * (sc.attn_chunks - 1), 1000);
          }
        }
        // Groups: contiguous, in order; per-layer groups hold one layer each.
        for (auto& g : sc.groups)
          for (int32_t i = g.first_op; i < g.first_op + g.ops; ++i)
            EXPECT_EQ(sc.ops[size_t(i)].group, &g - sc.groups.data());
        if (m == Launch::per_layer)
          for (size_t g = 1; g + 1 < sc.groups.size(); ++g) {
            EXPECT_EQ(sc.groups[g].ops, 8);  // the fused layer (the combine and RoPE in the attention)
            EXPECT_EQ(sc.ops[size_t(sc.groups[g].first_op)].layer, int32_t(g - 1));
          }
      }
}

// The balanced split never gives a worker more rows than two tasks per worker does (the makespan of a
// wave model: waves x (warp rows per task + the per-task overhead)), and picks the sizes worked out by
// hand for Llama 3.1 8B on 132 SMs x 3 blocks: FFN gate / up 14,336 rows -> 40 per task (359 tasks, one wave) where two per
// worker gives 24 (598 tasks, two waves); 4,096 rows -> 16 (256 tasks, one wave).
TEST(LlamaGpuSchedule, BalancedGemvSplit) {
  auto makespan = [](int64_t rows, int64_t workers, int64_t per_task) {
    const int64_t tasks = (rows + per_task - 1) / per_task;
    return (tasks + workers - 1) / workers * ((per_task + 7) / 8 + kTaskOverheadItems);
  };
  for (int64_t rows : {8, 64, 192, 576, 1024, 1536, 4096, 14336, 49152, 128256})
    for (int64_t workers : {1, 7, 132, 264, 396, 528, 1056}) {
      SCOPED_TRACE(std::to_string(rows) + " rows, " + std::to_string(workers) + " workers");
      const int64_t b = gemv_rows_per_task(rows, workers, GemvSplit::balanced);
      const int64_t t = gemv_rows_per_task(rows, workers, GemvSplit::two_per_worker);
      EXPECT_EQ(b % 8, 0);
      EXPECT_GE(b, 8);
      EXPECT_LE(b, 256);
      EXPECT_LE(makespan(rows, workers, b), makespan(rows, workers, t));
    }
  EXPECT_EQ(gemv_rows_per_task(14336, 396, GemvSplit::balanced), 40);
  EXPECT_EQ(gemv_rows_per_task(14336, 396, GemvSplit::two_per_worker), 24);
  EXPECT_EQ(gemv_rows_per_task(4096, 396, GemvSplit::balanced), 16);
  // The LM head of 128,256 rows: 168 rows per task in two waves (764 tasks), not 16,032 tasks of 8.
  EXPECT_EQ(gemv_rows_per_task(128256, 396, GemvSplit::balanced), 168);
  // Sized together: Llama 3.1 8B's gate and up (14,336 rows each) in one wave of 396 workers: 80 rows
  // per task, 2 x 180 tasks (alone each would take 40 rows in 359 tasks, and the two 718 tasks two waves).
  EXPECT_EQ(gemv_items_per_task({14336, 14336}, 396, GemvSplit::balanced), 80);
  // q / k / v in warp items (q 4,096 rows x 4 slices, k and v 1,024 x 8): 88 items, 375 tasks.
  EXPECT_EQ(gemv_items_per_task({16384, 8192, 8192}, 396, GemvSplit::balanced), 88);
  const LlamaSchedule sc = build_schedule(shapes("llama3.1-8b"), Launch::megakernel, 64, 396);
  int64_t qkv_tasks = 0, ffn_tasks = 0;
  for (const GpuOp& o : sc.ops)
    if (o.kind == OpKind::gemv && o.layer == 0) {
      if (o.stage == Stage::rmsnorm && o.rows != 14336) qkv_tasks += o.tasks;  // q, k, v
      if (o.rows == 14336) ffn_tasks += o.tasks;
    }
  EXPECT_EQ(ffn_tasks, 360);
  EXPECT_LE(qkv_tasks, 396);
}

// Column slices: only where a GEMV has too few rows for 4 warp items per warp, at most 8, and only
// where the columns split into whole blocks of 32.
TEST(LlamaGpuSchedule, GemvColumnSlices) {
  // Llama 3.1 8B on 132 x 3 workers: the target is rows x slices >= 4 items x 8 warps x 396 = 12,672.
  EXPECT_EQ(gemv_slices(14336, 4096, 396), 1);   // gate / up: 14,336 rows
  EXPECT_EQ(gemv_slices(4096, 14336, 396), 4);   // down: 4,096 x 4 >= 12,672
  EXPECT_EQ(gemv_slices(1024, 4096, 396), 8);    // k / v
  EXPECT_EQ(gemv_slices(128256, 4096, 396), 1);  // LM head
  EXPECT_EQ(gemv_slices(576, 576, 528), 2);      // SmolLM2: 576 = 32 x 18 splits in two only
  EXPECT_EQ(gemv_slices(576, 1536, 528), 8);
  EXPECT_EQ(gemv_slices(576, 1536, 528, 4), 4);  // fixed
  EXPECT_EQ(gemv_slices(576, 576, 528, 4), 1);   // fixed, but the columns do not split in four
  const LlamaSchedule sc = build_schedule(shapes("llama3.1-8b"), Launch::megakernel, 64, 396);
  for (const GpuOp& o : sc.ops) {
    if (o.kind == OpKind::gemv && o.cols == 14336) { EXPECT_EQ(o.slices, 4); }
  }
  const LlamaSchedule one = build_schedule(shapes("llama3.1-8b"), Launch::megakernel, 64, 396,
                                           GemvSplit::balanced, Combine::last_task, 1);
  for (const GpuOp& o : one.ops) {
    if (o.kind == OpKind::gemv) { EXPECT_EQ(o.slices, 1); }
  }
  EXPECT_USER_ERROR(build_schedule(shapes("toy"), Launch::megakernel, 64, 16, GemvSplit::balanced, Combine::last_task, 3),
                    "GPU engine: 3 column slices; 0 (chosen), 1, 2, 4 or 8");
}

TEST(LlamaGpuOptions, Tuning) {
  LlamaGpuOptions o;
  EXPECT_EQ(o.min_blocks_per_sm, 2);
  EXPECT_EQ(o.gemv_loads, 0);  // 8 in the 2-block kernel, 4 in the others
  EXPECT_EQ(o.prefetch_bytes, 32 << 10);
  apply_tuning("min-blocks=2,prefetch-kib=all,split=two-per-worker,fetch-ahead=0", o);
  EXPECT_EQ(o.min_blocks_per_sm, 2);
  EXPECT_EQ(o.prefetch_bytes, -1);
  EXPECT_EQ(o.gemv_split, GemvSplit::two_per_worker);
  EXPECT_FALSE(o.fetch_ahead);
  apply_tuning("prefetch-kib=0,fetch-ahead=1,split=balanced,min-blocks=4", o);
  EXPECT_EQ(o.prefetch_bytes, 0);
  EXPECT_TRUE(o.fetch_ahead);
  EXPECT_EQ(o.gemv_split, GemvSplit::balanced);
  EXPECT_EQ(o.min_blocks_per_sm, 4);
  apply_tuning("min-blocks=3,loads=8", o);
  EXPECT_EQ(o.min_blocks_per_sm, 3);
  EXPECT_EQ(o.gemv_loads, 8);
  EXPECT_USER_ERROR(apply_tuning("min-blocks=5", o),
                    "--gpu-tune: 'min-blocks=5' is not one of min-blocks=2|3|4, loads=4|8");
  EXPECT_USER_ERROR(apply_tuning("loads=6", o), "--gpu-tune: 'loads=6' is not one of");
  EXPECT_USER_ERROR(apply_tuning("prefetch-kib=-5", o),
                    "--gpu-tune: 'prefetch-kib=-5': expected a whole number");
  EXPECT_EQ(o.stream_depth, 0);
  apply_tuning("stream=6,seg-kib=16", o);
  EXPECT_EQ(o.stream_depth, 6);
  EXPECT_EQ(o.stream_seg_bytes, 16384);
  EXPECT_USER_ERROR(apply_tuning("stream=9", o), "--gpu-tune: 'stream=9' is not one of");
  EXPECT_USER_ERROR(apply_tuning("seg-kib=0", o), "--gpu-tune: 'seg-kib=0' is not one of");
  EXPECT_EQ(o.combine, Combine::last_task);
  for (auto [item, c] : {std::pair{"combine=fused", Combine::in_o_projection}, {"combine=separate", Combine::separate},
                         {"combine=last", Combine::last_task}}) {
    apply_tuning(item, o);
    EXPECT_EQ(o.combine, c) << item;
  }
  EXPECT_USER_ERROR(apply_tuning("combine=maybe", o), "--gpu-tune: 'combine=maybe' is not one of");
  EXPECT_EQ(o.rope, RopePlace::attention);
  for (auto [item, r] : {std::pair{"rope=separate", RopePlace::separate}, {"rope=attention", RopePlace::attention}}) {
    apply_tuning(item, o);
    EXPECT_EQ(o.rope, r) << item;
  }
  EXPECT_USER_ERROR(apply_tuning("rope=late", o), "--gpu-tune: 'rope=late' is not one of");
  EXPECT_EQ(o.gemv_slices, 0);
  apply_tuning("slices=4", o);
  EXPECT_EQ(o.gemv_slices, 4);
  apply_tuning("slices=auto", o);
  EXPECT_EQ(o.gemv_slices, 0);
  EXPECT_USER_ERROR(apply_tuning("slices=3", o), "--gpu-tune: 'slices=3' is not one of");
  EXPECT_EQ(o.l2_ahead_bytes, 0);
  apply_tuning("l2-ahead-kib=16384", o);
  EXPECT_EQ(o.l2_ahead_bytes, int64_t(16) << 20);
  EXPECT_TRUE(o.l2_evict_first);
  EXPECT_TRUE(o.gemv_preload);
  apply_tuning("l2-hint=normal,preload=0", o);
  EXPECT_FALSE(o.l2_evict_first);
  EXPECT_FALSE(o.gemv_preload);
  apply_tuning("l2-hint=first,preload=1", o);
  EXPECT_TRUE(o.l2_evict_first);
  EXPECT_TRUE(o.gemv_preload);
  EXPECT_TRUE(o.overlap_launches);
  apply_tuning("pdl=0", o);
  EXPECT_FALSE(o.overlap_launches);
  apply_tuning("pdl=1", o);
  EXPECT_TRUE(o.overlap_launches);
  EXPECT_USER_ERROR(apply_tuning("pdl=on", o), "'pdl=on' is not one of");
  EXPECT_USER_ERROR(apply_tuning("l2-hint=last", o), "'l2-hint=last' is not one of");
  EXPECT_USER_ERROR(apply_tuning("preload=2", o), "'preload=2' is not one of");
  EXPECT_USER_ERROR(apply_tuning("l2-ahead-kib=-1", o), "--gpu-tune: 'l2-ahead-kib=-1': expected a whole number");
  EXPECT_USER_ERROR(apply_tuning("turbo", o), "--gpu-tune: 'turbo' is not one of");
}

// The dependency graph is what keeps the megakernel correct: two operations that touch the same buffer
// (one of them writing) must be ordered by a chain of dependencies, or they could run at once.
TEST(LlamaGpuSchedule, DependenciesOrderEveryConflictingAccess) {
  for (int variant = 0; variant < 9; ++variant) {
    // per-op; megakernel with the combine as its own operation, in the O projection, in the last task;
    // each with RoPE in the attention (variants 0-3) and as an operation of its own (4-7); 8: the
    // megakernel's defaults with the O projection prefetched into L2 during the attention
    const int v = variant == 8 ? 3 : variant % 4;
    const int64_t ahead = variant == 8 ? 1 << 20 : 0;
    const Launch m = v == 0 ? Launch::per_op : Launch::megakernel;
    const Combine cm = v == 2 ? Combine::in_o_projection : v == 3 ? Combine::last_task : Combine::separate;
    const RopePlace rp = variant < 4 || variant == 8 ? RopePlace::attention : RopePlace::separate;
    SCOPED_TRACE(std::string(to_string(m)) + " combine=" + to_string(cm) + " rope=" + to_string(rp) +
                 " l2 ahead " + std::to_string(ahead));
    auto sc = build_schedule(shapes("toy"), m, 64, 132, GemvSplit::balanced, cm, 0, 0, 0, rp, ahead);
    const size_t n = sc.ops.size();
    ASSERT_LE(n, 64u);
    const size_t fused_per_layer = (v >= 2 ? 8 : 9) + (rp == RopePlace::separate ? 1 : 0) + (ahead ? 1 : 0);
    EXPECT_EQ(n, m == Launch::per_op ? 1 + 16 * 2 + 3u : 1 + fused_per_layer * 2 + 2u);
    std::vector<std::bitset<64>> anc(n);
    for (size_t i = 0; i < n; ++i) {
      const GpuOp& o = sc.ops[i];
      EXPECT_EQ(o.dep_count == 0, o.kind == OpKind::embed) << i;
      for (int32_t j = 0; j < o.dep_count; ++j) {
        size_t p = size_t(sc.deps[size_t(o.dep_begin + j)]);
        anc[i] |= anc[p];
        anc[i].set(p);
      }
    }
    // Buffers each op reads and writes; the KV cache of layer l and the argmax partials get ids of their own.
    const int kCache = kBufCount, kArgmax = kBufCount + 100;
    auto access = [&](const GpuOp& o, std::set<int>& r, std::set<int>& w) {
      switch (o.kind) {
        case OpKind::embed:
          w = {o.out};
          break;
        case OpKind::rmsnorm:
          r = {o.in0}, w = {o.out};
          break;
        case OpKind::gemv:
          r = {o.in0}, w = {o.out};
          if (o.stage == Stage::silu_mul) r.insert(o.in1);
          if (o.stage == Stage::attn_combine) r.insert(kPartML);
          if (o.accumulate) r.insert(o.out);
          if (&o - sc.ops.data() == sc.lm_head_op) w.insert(kArgmax);
          break;
        case OpKind::rope:
          r = w = {o.in0, o.in1};
          break;
        case OpKind::kv_append:
          r = {o.in0, o.in1}, w = {kCache + o.layer};
          break;
        case OpKind::rope_append:
          r = {o.in0, o.in1, o.out}, w = {o.in0, o.in1, kCache + o.layer};
          break;
        case OpKind::attention:
          r = {o.in0, kCache + o.layer}, w = {kPartML, kPartO};
          if (o.combine >= 0) w.insert(o.combine);
          if (o.rope) r.insert({kK, kV}), w.insert(kCache + o.layer);
          break;
        case OpKind::attn_combine:
          r = {kPartML, kPartO}, w = {o.out};
          break;
        case OpKind::add:
          r = {o.in0, o.out}, w = {o.out};
          break;
        case OpKind::silu_mul:
          r = {o.in0, o.in1}, w = {o.out};
          break;
        case OpKind::argmax:
          r = {kArgmax};
          break;
        case OpKind::l2_prefetch:  // reads a weight, which nothing writes
          break;
      }
    };
    int conflicts = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        std::set<int> ri, wi, rj, wj;
        access(sc.ops[i], ri, wi);
        access(sc.ops[j], rj, wj);
        bool conflict = false;
        for (int b : wi) conflict |= rj.count(b) || wj.count(b);
        for (int b : wj) conflict |= ri.count(b);
        if (!conflict) continue;
        ++conflicts;
        EXPECT_TRUE(anc[j].test(i)) << "ops " << i << " (" << to_string(sc.ops[i].kind) << ") and " << j
                                    << " (" << to_string(sc.ops[j].kind)
                                    << ") share a buffer but are not ordered";
      }
    EXPECT_GT(conflicts, 40);  // buffers are reused by every layer
  }
}

// l2_ahead_bytes: one l2_prefetch per layer in the fused modes, of the O projection's weight, right
// before it in the queue, waiting on what the attention waits on; bounded by the bytes at 2 per value.
TEST(LlamaGpuSchedule, L2AheadPrefetchesTheOProjection) {
  for (auto [name, ahead, rows] : {std::tuple{"llama3.1-8b", int64_t(16) << 20, 2048}, {"smollm2-135m", int64_t(16) << 20, 576},
                                   {"llama3.1-8b", int64_t(1), 1}}) {
    SCOPED_TRACE(std::string(name) + " " + std::to_string(ahead));
    auto s = shapes(name);
    auto sc = build_schedule(s, Launch::megakernel, 1024, 396, GemvSplit::balanced, Combine::last_task, 0, 0, 0,
                             RopePlace::attention, ahead);
    int found = 0;
    for (size_t i = 0; i < sc.ops.size(); ++i) {
      const GpuOp& o = sc.ops[i];
      if (o.kind != OpKind::l2_prefetch) continue;
      ++found;
      ASSERT_GE(i, 1u);
      ASSERT_LT(i + 1, sc.ops.size());
      const GpuOp& at = sc.ops[i - 1];
      const GpuOp& proj = sc.ops[i + 1];
      EXPECT_EQ(at.kind, OpKind::attention);
      EXPECT_EQ(proj.kind, OpKind::gemv);
      EXPECT_EQ(o.weight, proj.weight);
      EXPECT_EQ(sc.weights[size_t(o.weight)].name, "blk." + std::to_string(o.layer) + ".attn_output.weight");
      EXPECT_EQ(o.rows, rows);
      EXPECT_EQ(o.tasks, (rows + o.per_task - 1) / o.per_task);
      EXPECT_LE(int64_t(o.per_task) * 2 * o.cols, int64_t(1) << 20);
      ASSERT_EQ(o.dep_count, at.dep_count);
      for (int j = 0; j < o.dep_count; ++j)
        EXPECT_EQ(sc.deps[size_t(o.dep_begin + j)], sc.deps[size_t(at.dep_begin + j)]);
    }
    EXPECT_EQ(found, s.layers);
    for (Launch m : {Launch::per_op, Launch::megakernel}) {  // none per-op, none when 0
      auto none = build_schedule(s, m, 1024, 396, GemvSplit::balanced, Combine::last_task, 0, 0, 0, RopePlace::attention,
                                 m == Launch::per_op ? ahead : 0);
      for (auto& o : none.ops) EXPECT_NE(o.kind, OpKind::l2_prefetch);
    }
  }
  EXPECT_USER_ERROR(build_schedule(shapes("toy"), Launch::megakernel, 64, 132, GemvSplit::balanced, Combine::last_task,
                                   0, 0, 0, RopePlace::attention, -5),
                    "l2_ahead_bytes = -5 must be >= 0");
}

TEST(LlamaGpuSchedule, BadInput) {
  auto s = shapes("smollm2-135m");
  EXPECT_USER_ERROR(build_schedule(s, Launch::megakernel, 9000, 132),
                    "a KV cache of 9000 positions; it must be in [1, 8192]");
  auto odd = s;
  odd.d_model = 580;
  EXPECT_USER_ERROR(odd.check(), "not supported yet: GPU engine: model 'smollm2-135m': d_model = 580");
  auto big = s;
  big.head_dim = 512;
  big.rope_freq.resize(256);
  EXPECT_USER_ERROR(big.check(), "head_dim 512 must be even and at most 256");
  auto nofreq = s;
  nofreq.rope_freq.clear();
  EXPECT_USER_ERROR(nofreq.check(), "0 RoPE frequencies for head_dim 64");
  auto gqa = s;
  gqa.kv_heads = 2;
  EXPECT_USER_ERROR(gqa.check(), "9 query heads are not a multiple of 2 kv heads");
}

TEST(LlamaGpuMemory, EstimateCountsWeightsAndCache) {
  LlamaGpuOptions o;
  o.context = 1024;
  // Llama 3.1 8B in bf16: 8.03e9 parameters, 2 bytes each; KV cache 32 layers x 2 x 1024 x 1024 x 2 bytes.
  int64_t b = gpu_bytes_needed(shapes("llama3.1-8b"), nullptr, o);
  const int64_t kv = 32LL * 2 * 1024 * 1024 * 2;
  EXPECT_GT(b, 16'000'000'000LL + kv);
  EXPECT_LT(b, 16'200'000'000LL + kv);
}

// A synthetic trace of the toy megakernel schedule: every op's tasks ready 100 ns after its last
// producer ends and running 1 us; the summary's spans and lags must come out of those times.
TEST(LlamaGpuTrace, SummaryFromTaskTimes) {
  const LlamaSchedule s = build_schedule(shapes("toy"), Launch::megakernel, 64, 16);
  std::vector<uint64_t> end(s.ops.size(), 0);
  std::vector<TaskTime> t(s.tasks.size());
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const GpuOp& op = s.ops[i];
    uint64_t dep = 1000;
    for (int d = 0; d < op.dep_count; ++d) dep = std::max(dep, end[size_t(s.deps[size_t(op.dep_begin + d)])]);
    for (int k = 0; k < op.tasks; ++k) {
      TaskTime& x = t[size_t(op.first_task + k)];
      x.fetched = dep - 50, x.ready = dep + 100 + uint64_t(k) * 10, x.finished = x.ready + 1000;
      end[i] = std::max(end[i], x.finished);
    }
  }
  std::vector<int64_t> bytes(s.ops.size(), 0);
  for (size_t i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].kind == OpKind::gemv) bytes[i] = 2000;
  const std::string sum = trace_summary(s, t, bytes);
  EXPECT_NE(sum.find("attn_q"), std::string::npos) << sum;
  EXPECT_NE(sum.find("ffn_down"), std::string::npos) << sum;
  EXPECT_NE(sum.find("attention"), std::string::npos) << sum;
  // attn_q: tasks ready 100 ns after the producer; span = 1000 + 10 * (tasks - 1) ns; 2000 bytes over it.
  const GpuOp* q = nullptr;
  for (int32_t i = 0; i < int32_t(s.ops.size()); ++i)
    if (op_role(s, i) == "attn_q") q = &s.ops[size_t(i)];
  ASSERT_NE(q, nullptr);
  char want[128];
  std::snprintf(want, sizeof want, "%10.2f %9.2f", (1000.0 + 10.0 * (q->tasks - 1)) / 1e3, 0.10);
  EXPECT_NE(sum.find(want), std::string::npos) << want << "\n" << sum;
  const std::string csv = trace_csv(s, t);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), int64_t(s.tasks.size()) + 1);
  EXPECT_EQ(csv.rfind("op,role,layer,task,sm,fetched_ns,ready_ns,finished_ns\n0,embed,-1,0,0,0,", 0), 0u)
      << csv.substr(0, 200);
  // Out-of-order or missing times are a user error, not a wrong table.
  std::vector<TaskTime> bad = t;
  bad[3].finished = bad[3].ready - 1;
  EXPECT_USER_ERROR(trace_summary(s, bad, bytes), "trace: task 3 has its times out of order");
  bad.pop_back();
  EXPECT_USER_ERROR(trace_summary(s, bad, bytes), "task times for");
}

// ---- Tensor parallelism: the schedule of a rank, the shards, and the sums they make ----

TEST(LlamaGpuTp, ScheduleCutsAtTheAllReduces) {
  for (const char* preset : {"toy", "llama3.1-8b"}) {
    SCOPED_TRACE(preset);
    const LlamaGpuShapes full = shapes(preset);
    const LlamaGpuShapes s = shard_shapes(full, 2);
    EXPECT_EQ(s.heads, full.heads / 2);
    EXPECT_EQ(s.kv_heads, full.kv_heads / 2);
    EXPECT_EQ(s.ffn, full.ffn / 2);
    EXPECT_EQ(s.d_model, full.d_model);
    const int64_t L = s.layers;
    for (int rank : {0, 1}) {
      auto op = build_schedule(s, Launch::per_op, 64, 528, GemvSplit::balanced, Combine::last_task, 0, rank, 2);
      auto pl = build_schedule(s, Launch::per_layer, 64, 528, GemvSplit::balanced, Combine::last_task, 0, rank, 2);
      auto mk = build_schedule(s, Launch::megakernel, 64, 528, GemvSplit::balanced, Combine::last_task, 0, rank, 2);
      EXPECT_EQ(op.launches_per_token(), 1 + 16 * L + 3);  // already a launch per op
      EXPECT_EQ(pl.launches_per_token(), 2 * L + 2);  // each layer cut after its attention output too
      EXPECT_EQ(mk.launches_per_token(), 2 * L + 1);
      for (auto* sc : {&op, &pl, &mk}) {
        EXPECT_EQ(sc->all_reduces_per_token(), 2 * L);
        for (auto& g : sc->groups) {
          if (g.all_reduce < 0) continue;
          // The group ends with the projection whose output the ranks sum: per-op its own output
          // buffer, the fused modes the residual itself, folded in on rank 0 only.
          const GpuOp& last = sc->ops[size_t(g.first_op + g.ops - 1)];
          ASSERT_EQ(last.kind, OpKind::gemv);
          const std::string role = op_role(*sc, int32_t(g.first_op + g.ops - 1));
          EXPECT_TRUE(role == "attn_output" || role == "ffn_down") << role;
          EXPECT_EQ(g.all_reduce, last.out);
          EXPECT_EQ(last.out, sc == &op ? kO : kX);
          EXPECT_EQ(last.accumulate, sc != &op && rank == 0) << role;
        }
      }
    }
    // Without tensor parallelism: no all-reduce, and the residual folded in everywhere.
    auto one = build_schedule(full, Launch::megakernel, 64, 528);
    EXPECT_EQ(one.all_reduces_per_token(), 0);
    EXPECT_EQ(one.launches_per_token(), 1);
    auto tp1 = build_schedule(full, Launch::megakernel, 64, 528, GemvSplit::balanced, Combine::last_task, 0, 0, 1);
    EXPECT_EQ(tp1.all_reduces_per_token(), 2 * full.layers);
    EXPECT_NE(tp1.summary().find("rank 0 of 1"), std::string::npos) << tp1.summary();
  }
  EXPECT_USER_ERROR(build_schedule(shapes("toy"), Launch::per_op, 64, 8, GemvSplit::balanced, Combine::last_task, 0, 2, 2),
                    "GPU engine: tensor-parallel rank 2 of 2 (ranks 0 .. size - 1, size <= 64)");
}

TEST(LlamaGpuTp, ShardShapesNameWhatDoesNotSplit) {
  EXPECT_USER_ERROR(shard_shapes(shapes("smollm2-135m"), 2),
                    "--tp 2: the model 'smollm2-135m' has 9 query heads, which do not split over 2 GPUs; "
                    "--tp values that split it: 1, 3");
  EXPECT_USER_ERROR(shard_shapes(shapes("llama3.1-8b"), 16),
                    "--tp 16: the model 'llama3.1-8b' has 8 KV heads, which do not split over 16 GPUs; "
                    "--tp values that split it: 1, 2, 4, 8");
  EXPECT_USER_ERROR(shard_shapes(shapes("toy"), 0), "--tp 0 must be in [1, 64]");
  EXPECT_EQ(shard_shapes(shapes("smollm2-135m"), 3).heads, 3);
}

// A small model whose shards' column slices miss the 32-element Q8_0 blocks (so they are dequantized).
LlamaGpuShapes odd_shapes() {
  LlamaGpuShapes s;
  s.name = "odd", s.layers = 1, s.d_model = 32, s.heads = 4, s.kv_heads = 2, s.head_dim = 8, s.ffn = 96;
  s.vocab = 40, s.context = 64;
  for (int i = 0; i < 4; ++i) s.rope_freq.push_back(std::pow(10000.0, -2.0 * i / 8));
  return s;
}

// Random weights for every tensor of `s` in type t (F32 or Q8_0), kept alive by `store`.
WeightBindings random_bindings(const LlamaGpuShapes& s, quant::QType t, std::vector<std::vector<uint8_t>>& store,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  WeightBindings w;
  for (auto& wr : build_schedule(s, Launch::per_op, 8, 8).weights) {
    auto& b = store.emplace_back();
    const int64_t n = wr.rows * wr.cols;
    if (t == quant::QType::F32 || wr.rows == 1) {
      b.resize(size_t(n) * 4);
      for (int64_t i = 0; i < n; ++i) {
        const float v = wr.rows == 1 ? 1.f + 0.1f * u(rng) : u(rng);
        std::memcpy(b.data() + i * 4, &v, 4);
      }
      w.emplace(wr.name, cpu::QMatrix{quant::QType::F32, b.data(), wr.rows, wr.cols});
    } else {
      b.resize(size_t(n / 32) * sizeof(quant::BlockQ8_0));
      auto* q = reinterpret_cast<quant::BlockQ8_0*>(b.data());
      for (int64_t i = 0; i < n / 32; ++i) {
        q[i].d = quant::float_to_fp16(0.01f + 0.02f * std::abs(u(rng)));
        for (auto& v : q[i].qs) v = int8_t(int(rng() % 255) - 127);
      }
      w.emplace(wr.name, cpu::QMatrix{t, b.data(), wr.rows, wr.cols});
    }
  }
  return w;
}

std::vector<double> dense(const cpu::QMatrix& m) {
  std::vector<float> row(size_t(m.cols));
  std::vector<double> d;
  const uint64_t rb = *quant::row_bytes(m.type, m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    quant::dequantize_row(m.type, static_cast<const uint8_t*>(m.data) + r * int64_t(rb), row.data(), m.cols);
    d.insert(d.end(), row.begin(), row.end());
  }
  return d;
}

TEST(LlamaGpuTp, ShardsTileEveryTensor) {
  for (auto [s, t] : {std::pair{shapes("toy"), quant::QType::Q8_0}, {odd_shapes(), quant::QType::Q8_0},
                      {shapes("toy"), quant::QType::F32}}) {
    SCOPED_TRACE(s.name + " " + quant::to_string(t));
    std::vector<std::vector<uint8_t>> store;
    const WeightBindings w = random_bindings(s, t, store, 7);
    const int tp = 2;
    std::map<std::string, std::vector<int>> covered;  // element -> how many ranks hold it
    for (int r = 0; r < tp; ++r) {
      std::vector<std::vector<uint8_t>> st;
      const WeightBindings sw = shard_weights(w, s, r, tp, st);
      ASSERT_EQ(sw.size(), w.size());
      for (auto& [name, m] : sw) {
        const cpu::QMatrix& f = w.at(name);
        ShardSlice sl = shard_slice(name, s, r, tp);
        if (sl.rows < 0) sl = ShardSlice::whole(f.rows, f.cols);
        ASSERT_EQ(m.rows, sl.rows) << name;
        ASSERT_EQ(m.cols, sl.cols) << name;
        const std::vector<double> whole = dense(f), part = dense(m);
        auto& cov = covered[name];
        cov.resize(whole.size());
        for (int64_t i = 0; i < sl.rows; ++i)
          for (int64_t j = 0; j < sl.cols; ++j) {
            const size_t at = size_t((sl.row0 + i) * f.cols + sl.col0 + j);
            ASSERT_EQ(part[size_t(i * sl.cols + j)], whole[at]) << name << " " << i << "," << j;
            ++cov[at];
          }
        // The column slices of the odd shapes miss the Q8_0 blocks and become f32.
        const bool split_cols = sl.cols != f.cols;
        if (split_cols && s.name == "odd") { EXPECT_EQ(m.type, quant::QType::F32) << name; }
        if (!split_cols) { EXPECT_EQ(m.type, f.type) << name; }
      }
    }
    for (auto& [name, cov] : covered) {
      const bool whole = shard_slice(name, s, 0, tp).rows < 0;
      for (size_t i = 0; i < cov.size(); ++i) ASSERT_EQ(cov[i], whole ? tp : 1) << name << " element " << i;
    }
  }
}

// One decoder layer at one position, in double: attention over a cache of T earlier positions and the
// current one, then the FFN. The Megatron split computes the residual's update as a sum over the ranks'
// shards; the test checks that the sum equals the whole model's update.
struct RefLayer {
  const WeightBindings& w;
  LlamaGpuShapes s;
  std::vector<double> mv(const std::string& n, const std::vector<double>& x) const {
    const cpu::QMatrix& m = w.at("blk.0." + n);
    const std::vector<double> d = dense(m);
    std::vector<double> y(size_t(m.rows), 0.0);
    for (int64_t r = 0; r < m.rows; ++r)
      for (int64_t c = 0; c < m.cols; ++c) y[size_t(r)] += d[size_t(r * m.cols + c)] * x[size_t(c)];
    return y;
  }
  std::vector<double> norm(const std::string& n, const std::vector<double>& x) const {
    const std::vector<double> g = dense(w.at("blk.0." + n));
    double ss = 0;
    for (double v : x) ss += v * v;
    const double k = 1.0 / std::sqrt(ss / double(x.size()) + s.rms_eps);
    std::vector<double> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * k * g[i];
    return y;
  }
  // The attention output projection's contribution; cache_k / cache_v: T rows of this shard's KV width.
  std::vector<double> attention(const std::vector<double>& x, const std::vector<std::vector<double>>& ck,
                                const std::vector<std::vector<double>>& cv) const {
    const auto h = norm("attn_norm.weight", x);
    const auto q = mv("attn_q.weight", h), k = mv("attn_k.weight", h), v = mv("attn_v.weight", h);
    const int64_t Dh = s.head_dim, group = s.heads / s.kv_heads, T = int64_t(ck.size());
    std::vector<double> out(size_t(s.heads * Dh), 0.0);
    for (int64_t hd = 0; hd < s.heads; ++hd) {
      const int64_t kvh = hd / group;
      std::vector<double> sc;
      for (int64_t t = 0; t <= T; ++t) {
        double dot = 0;
        for (int64_t i = 0; i < Dh; ++i)
          dot += q[size_t(hd * Dh + i)] * (t < T ? ck[size_t(t)][size_t(kvh * Dh + i)] : k[size_t(kvh * Dh + i)]);
        sc.push_back(dot / std::sqrt(double(Dh)));
      }
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (double& e : sc) sum += (e = std::exp(e - mx));
      for (int64_t t = 0; t <= T; ++t)
        for (int64_t i = 0; i < Dh; ++i)
          out[size_t(hd * Dh + i)] +=
              sc[size_t(t)] / sum * (t < T ? cv[size_t(t)][size_t(kvh * Dh + i)] : v[size_t(kvh * Dh + i)]);
    }
    return mv("attn_output.weight", out);
  }
  std::vector<double> ffn(const std::vector<double>& x) const {
    const auto h = norm("ffn_norm.weight", x);
    auto g = mv("ffn_gate.weight", h);
    const auto u = mv("ffn_up.weight", h);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    return mv("ffn_down.weight", g);
  }
};

TEST(LlamaGpuTp, ShardedLayerSumsToTheWholeLayer) {
  for (auto [full, tp] : {std::pair{shapes("toy"), 2}, {odd_shapes(), 2}, {shapes("toy"), 1}}) {
    SCOPED_TRACE(full.name + " tp " + std::to_string(tp));
    std::vector<std::vector<uint8_t>> store;
    const WeightBindings w = random_bindings(full, quant::QType::Q8_0, store, 11);
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> u(-1, 1);
    const int64_t T = 5, kvw = full.kv_heads * full.head_dim;
    std::vector<double> x(size_t(full.d_model));
    for (double& v : x) v = u(rng);
    std::vector<std::vector<double>> ck(T, std::vector<double>(size_t(kvw))), cv = ck;
    for (auto* c : {&ck, &cv})
      for (auto& row : *c)
        for (double& v : row) v = u(rng);
    // The whole model.
    const RefLayer whole{w, full};
    std::vector<double> h = x, y;
    const auto a = whole.attention(x, ck, cv);
    for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
    y = h;
    const auto f = whole.ffn(h);
    for (size_t i = 0; i < y.size(); ++i) y[i] += f[i];
    // The shards, each with its KV heads' columns of the cache; the all-reduces are the sums.
    const LlamaGpuShapes s = shard_shapes(full, tp);
    std::vector<std::vector<std::vector<uint8_t>>> st(static_cast<size_t>(tp));
    std::vector<WeightBindings> sw;
    for (int r = 0; r < tp; ++r) sw.push_back(shard_weights(w, full, r, tp, st[size_t(r)]));
    const int64_t part = s.kv_heads * s.head_dim;
    std::vector<double> h2 = x;
    for (int r = 0; r < tp; ++r) {
      std::vector<std::vector<double>> k2, v2;
      for (int64_t t = 0; t < T; ++t) {
        k2.emplace_back(ck[size_t(t)].begin() + r * part, ck[size_t(t)].begin() + (r + 1) * part);
        v2.emplace_back(cv[size_t(t)].begin() + r * part, cv[size_t(t)].begin() + (r + 1) * part);
      }
      const auto ar = RefLayer{sw[size_t(r)], s}.attention(x, k2, v2);
      for (size_t i = 0; i < h2.size(); ++i) h2[i] += ar[i];
    }
    std::vector<double> y2 = h2;
    for (int r = 0; r < tp; ++r) {
      const auto fr = RefLayer{sw[size_t(r)], s}.ffn(h2);
      for (size_t i = 0; i < y2.size(); ++i) y2[i] += fr[i];
    }
    double scale = 0;
    for (double v : y) scale = std::max(scale, std::abs(v));
    ASSERT_GT(scale, 0.1);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y2[i], y[i], 1e-12 * scale) << i;
  }
}

TEST(LlamaGpuEngine, WithoutAGpuSaysSo) {
  if (query_gpu()) GTEST_SKIP() << "a GPU is present (SM90_LlamaGpu* covers the engine)";
  LlamaGpuOptions o;
  o.context = 64;
  try {
    LlamaGpu::random(shapes("toy"), o, 1);
    ADD_FAILURE() << "expected not_supported";
  } catch (const not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet: the GPU engine"), std::string::npos) << e.what();
  }
}

TEST(LlamaGpuCli, BadLaunchModeAndNoGpu) {
  auto r = test::run_cli("generate --shapes toy --target cuda --launch fused -n 2");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.out.find("unknown --launch mode 'fused'; modes: per-op, per-layer, megakernel"),
            std::string::npos)
      << r.out;
  auto c = test::run_cli("generate --shapes toy --launch per-op -n 2");
  EXPECT_EQ(c.status, 2) << c.out;
  EXPECT_NE(c.out.find("--launch needs --target cuda"), std::string::npos) << c.out;
  auto t = test::run_cli("generate --shapes toy --gpu-tune min-blocks=2 -n 2");
  EXPECT_EQ(t.status, 2) << t.out;
  EXPECT_NE(t.out.find("--gpu-tune needs --target cuda"), std::string::npos) << t.out;
  auto b = test::run_cli("generate --shapes toy --target cuda --gpu-tune split=even -n 2");
  EXPECT_EQ(b.status, 1) << b.out;
  EXPECT_NE(b.out.find("--gpu-tune: 'split=even' is not one of"), std::string::npos) << b.out;
  auto tr = test::run_cli("generate --shapes toy --gpu-trace t.csv -n 2");
  EXPECT_EQ(tr.status, 2) << tr.out;
  EXPECT_NE(tr.out.find("--gpu-trace needs --target cuda"), std::string::npos) << tr.out;
  // Tensor parallelism's usage errors (exit 2) and the split that does not divide (exit 1).
  struct Case {
    const char* args;
    int status;
    const char* says;
  };
  for (const Case& k : {Case{"--shapes toy --tp 2", 2, "--tp needs --target cuda"},
                        Case{"--shapes toy --target cuda --tp 0", 2, "--tp 0 must be in [1, 64]"},
                        Case{"--shapes toy --target cuda --tp-local", 2, "--tp-local needs --tp N"},
                        Case{"--shapes smollm2-135m --target cuda --tp 2", 1,
                             "which do not split over 2 GPUs; --tp values that split it: 1, 3"}}) {
    auto t = test::run_cli(std::string("generate ") + k.args + " -n 2");
    EXPECT_EQ(t.status, k.status) << k.args << ": " << t.out;
    EXPECT_NE(t.out.find(k.says), std::string::npos) << k.args << ": " << t.out;
  }
  if (query_gpu()) return;
  // No GPU here: the supervisor stops before starting any process (NCCL missing, or too few GPUs).
  auto tn = test::run_cli("generate --shapes toy --target cuda --tp 2 -n 2");
  EXPECT_EQ(tn.status, 1) << tn.out;
  EXPECT_TRUE(tn.out.find("--tp 2 needs 2 GPUs; this machine has 0") != std::string::npos ||
              tn.out.find("--tp: this build has no NCCL") != std::string::npos)
      << tn.out;
  EXPECT_EQ(std::count(tn.out.begin(), tn.out.end(), '\n'), 1) << tn.out;
  auto g = test::run_cli("generate --shapes toy --target cuda -n 2");
  EXPECT_EQ(g.status, 1) << g.out;
  EXPECT_NE(g.out.find("not supported yet: the GPU engine"), std::string::npos) << g.out;
  EXPECT_EQ(std::count(g.out.begin(), g.out.end(), '\n'), 1) << g.out;
}

}  // namespace
}  // namespace mp::cuda
