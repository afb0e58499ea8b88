// The GPU engine's host side that needs no GPU: the operation list of a Llama model (from its shapes),
// its split into tasks, the launch groups of each mode, and the memory estimate.
#include <algorithm>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <utility>

#include "backends/cuda/llama_gpu.h"
#include "core/checked.h"
#include "core/error.h"

namespace mp::cuda {

const std::vector<std::string>& launch_names() {
  static const std::vector<std::string> n = {"per-op", "per-layer", "megakernel"};
  return n;
}

const char* to_string(Launch l) {
  switch (l) {
    case Launch::per_op:
      return "per-op";
    case Launch::per_layer:
      return "per-layer";
    case Launch::megakernel:
      return "megakernel";
  }
  return "?";
}

Launch parse_launch(const std::string& s) {
  if (s == "per-op") return Launch::per_op;
  if (s == "per-layer") return Launch::per_layer;
  if (s == "megakernel") return Launch::megakernel;
  fail_user("unknown --launch mode '", s, "'; modes: per-op, per-layer, megakernel");
}

namespace {
// The enumerator that `value` names among `names`; bad() (which throws) otherwise.
template <class E, class Bad>
E pick(const std::string& value, std::initializer_list<std::pair<const char*, E>> names, Bad bad) {
  for (auto& [n, e] : names)
    if (value == n) return e;
  bad();
  return names.begin()->second;  // not reached
}
}  // namespace

void apply_tuning(const std::string& list, LlamaGpuOptions& o) {
  static const char* kItems =
      "min-blocks=2|3|4, loads=4|8, prefetch-kib=N|all, split=balanced|two-per-worker, fetch-ahead=0|1, "
      "stream=0..8, seg-kib=1..16, combine=separate|fused|last, rope=attention|separate, slices=auto|1|2|4|8, "
      "l2-ahead-kib=N, l2-hint=first|normal, preload=0|1, pdl=0|1";
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    auto bad = [&]() { fail_user("--gpu-tune: '", item, "' is not one of ", kItems, ""); };
    auto number = [&]() {
      MP_USER_CHECK(
          !value.empty() && value.size() <= 9 && value.find_first_not_of("0123456789") == std::string::npos,
          "--gpu-tune: '", item, "': expected a whole number");
      return std::stoll(value);
    };
    if (key == "min-blocks") {
      if (value != "2" && value != "3" && value != "4") bad();
      o.min_blocks_per_sm = int(number());
    } else if (key == "loads") {
      if (value != "4" && value != "8") bad();
      o.gemv_loads = int(number());
    } else if (key == "prefetch-kib") {
      o.prefetch_bytes = value == "all" ? -1 : number() * 1024;
    } else if (key == "split") {
      o.gemv_split = pick<GemvSplit>(value, {{"balanced", GemvSplit::balanced}, {"two-per-worker", GemvSplit::two_per_worker}}, bad);
    } else if (key == "stream") {
      const long long d = number();
      if (d > 8) bad();
      o.stream_depth = int(d);
    } else if (key == "seg-kib") {
      const long long k = number();
      if (k < 1 || k > 16) bad();
      o.stream_seg_bytes = k * 1024;
    } else if (key == "combine") {
      o.combine = pick<Combine>(
          value, {{"separate", Combine::separate}, {"fused", Combine::in_o_projection}, {"last", Combine::last_task}}, bad);
    } else if (key == "rope") {
      o.rope = pick<RopePlace>(value, {{"attention", RopePlace::attention}, {"separate", RopePlace::separate}}, bad);
    } else if (key == "slices") {
      if (value != "auto" && value != "1" && value != "2" && value != "4" && value != "8") bad();
      o.gemv_slices = value == "auto" ? 0 : int(number());
    } else if (key == "l2-ahead-kib") {
      o.l2_ahead_bytes = number() * 1024;
    } else if (key == "l2-hint") {
      o.l2_evict_first = pick<bool>(value, {{"first", true}, {"normal", false}}, bad);
    } else if (key == "pdl") {
      if (value != "0" && value != "1") bad();
      o.overlap_launches = value == "1";
    } else if (key == "preload") {
      if (value != "0" && value != "1") bad();
      o.gemv_preload = value == "1";
    } else if (key == "fetch-ahead") {
      if (value != "0" && value != "1") bad();
      o.fetch_ahead = value == "1";
    } else {
      bad();
    }
  }
}

const char* to_string(Combine c) {
  return c == Combine::separate ? "separate" : c == Combine::in_o_projection ? "fused" : "last";
}

const char* to_string(RopePlace r) { return r == RopePlace::attention ? "attention" : "separate"; }

const char* to_string(GpuWeights w) { return w == GpuWeights::native ? "native" : "bf16"; }

const char* to_string(OpKind k) {
  switch (k) {
    case OpKind::embed:
      return "embed";
    case OpKind::rmsnorm:
      return "rmsnorm";
    case OpKind::gemv:
      return "gemv";
    case OpKind::rope:
      return "rope";
    case OpKind::kv_append:
      return "kv_append";
    case OpKind::rope_append:
      return "rope_append";
    case OpKind::attention:
      return "attention";
    case OpKind::attn_combine:
      return "attn_combine";
    case OpKind::add:
      return "add";
    case OpKind::silu_mul:
      return "silu_mul";
    case OpKind::argmax:
      return "argmax";
    case OpKind::l2_prefetch:
      return "l2_prefetch";
  }
  return "?";
}

void LlamaGpuShapes::check() const {
  auto pos = [&](int64_t v, const char* what) {
    MP_USER_CHECK(v >= 1, "GPU engine: model '", name, "': ", what, " = ", v, " must be >= 1");
  };
  pos(layers, "layers");
  pos(d_model, "d_model");
  pos(heads, "heads");
  pos(kv_heads, "kv_heads");
  pos(head_dim, "head_dim");
  pos(ffn, "ffn");
  pos(vocab, "vocab");
  pos(context, "context");
  MP_USER_CHECK(heads % kv_heads == 0, "GPU engine: model '", name, "': ", heads,
                " query heads are not a multiple of ", kv_heads, " kv heads");
  MP_USER_CHECK(head_dim % 2 == 0 && head_dim <= 256, "GPU engine: model '", name, "': head_dim ", head_dim,
                " must be even and at most 256");
  MP_USER_CHECK(int64_t(rope_freq.size()) == head_dim / 2, "GPU engine: model '", name,
                "': ", rope_freq.size(), " RoPE frequencies for head_dim ", head_dim, " (need head_dim / 2)");
  // Rows are read in 16-byte pieces of 8 bf16 values.
  for (auto [v, what] : {std::pair{d_model, "d_model"},
                         {ffn, "ffn"},
                         {heads * head_dim, "heads * head_dim"},
                         {kv_heads * head_dim, "kv_heads * head_dim"}})
    MP_USER_CHECK(v % 8 == 0, "not supported yet: GPU engine: model '", name, "': ", what, " = ", v,
                  " is not a multiple of 8");
  MP_USER_CHECK(layers <= 4096 && d_model <= (1 << 16) && ffn <= (1 << 18) && vocab <= (1 << 24) &&
                    heads <= 1024 && context <= (1 << 24),
                "GPU engine: model '", name, "': sizes beyond what the engine indexes (", layers,
                " layers, d ", d_model, ", FFN ", ffn, ", vocab ", vocab, ")");
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

std::string layer_name(int64_t l, const char* what) { return "blk." + std::to_string(l) + "." + what; }

}  // namespace

int64_t gemv_rows_per_task(int64_t rows, int64_t workers, GemvSplit split) {
  return gemv_items_per_task({rows}, workers, split);
}

int64_t gemv_items_per_task(const std::vector<int64_t>& items, int64_t workers, GemvSplit split) {
  int64_t total = 0;
  for (int64_t n : items) {
    MP_USER_CHECK(n >= 1 && workers >= 1, "GPU engine: a GEMV of ", n, " rows over ", workers, " workers");
    total += n;
  }
  MP_USER_CHECK(!items.empty(), "GPU engine: no GEMV to split");
  if (split == GemvSplit::two_per_worker)
    return std::clamp<int64_t>(round_up(ceil_div(total, 2 * workers), 8), 8, 256);
  // A task of 8k items gives each of its 8 warps k; a worker runs ceil(tasks / workers) tasks, the
  // tasks of all the GEMVs together (they run at once). Each task also pays about one item's time for
  // taking it, staging its input and publishing it (the LM head's 16,032 tasks of 8 rows spent as much
  // on that as on their 64 KB of weights).
  int64_t best = 1, best_cost = std::numeric_limits<int64_t>::max();
  for (int64_t k = 1; k <= 32; ++k) {
    int64_t tasks = 0;
    for (int64_t n : items) tasks += ceil_div(n, 8 * k);
    const int64_t cost = ceil_div(tasks, workers) * (k + kTaskOverheadItems);
    if (cost <= best_cost) best = k, best_cost = cost;  // ties: the larger tasks
    if (8 * k >= total) break;
  }
  return 8 * best;
}

int gemv_slices(int64_t rows, int64_t cols, int64_t workers, int want) {
  auto fits = [&](int s) { return cols % (32 * s) == 0; };
  if (want > 0) return fits(want) ? want : 1;
  int s = 1;
  while (s < 8 && rows * s < 4 * 8 * workers && fits(2 * s)) s *= 2;
  return s;
}

LlamaSchedule build_schedule(const LlamaGpuShapes& s, Launch launch, int64_t context, int64_t workers,
                             GemvSplit split, Combine combine, int slices, int tp_rank, int tp_size,
                             RopePlace rope, int64_t l2_ahead_bytes) {
  MP_USER_CHECK(slices == 0 || slices == 1 || slices == 2 || slices == 4 || slices == 8,
                "GPU engine: ", slices, " column slices; 0 (chosen), 1, 2, 4 or 8");
  s.check();
  MP_USER_CHECK(context >= 1 && context <= s.context, "GPU engine: a KV cache of ", context,
                " positions; it must be in [1, ", s.context, "] (the model's context length)");
  MP_USER_CHECK(workers >= 1 && workers <= (1 << 20), "GPU engine: ", workers, " workers must be >= 1");
  MP_USER_CHECK(l2_ahead_bytes >= 0, "GPU engine: l2_ahead_bytes = ", l2_ahead_bytes, " must be >= 0");
  MP_USER_CHECK(
      tp_size >= 0 && tp_size <= 64 && (tp_size == 0 ? tp_rank == 0 : tp_rank >= 0 && tp_rank < tp_size),
      "GPU engine: tensor-parallel rank ", tp_rank, " of ", tp_size, " (ranks 0 .. size - 1, size <= 64)");
  LlamaSchedule sc;
  sc.tp_rank = tp_rank, sc.tp_size = tp_size;
  // Tensor parallelism: the ops after which the ranks sum a buffer, and whether this rank folds the
  // residual into the projections of the fused modes (rank 0 only, so that the sum adds it once).
  std::map<int32_t, int32_t> all_reduce_after;
  const bool residual_here = tp_size == 0 || tp_rank == 0;
  sc.launch = launch;
  sc.context = context;
  const int64_t d = s.d_model, H = s.heads, Dh = s.head_dim, qw = H * Dh, kvw = s.kv_heads * Dh;

  // Attention: enough chunks per head to give every worker a task, 1024 cache positions at most and at
  // least what one pass of the task's score loads covers (256 threads, Dh / 32 per position: 128
  // positions at Dh 64, 64 at Dh >= 128): a smaller chunk costs its task the same round trips and adds
  // a partial to the head's combine.
  int64_t want = std::max<int64_t>(1, workers / H);
  const int64_t min_chunk = std::clamp<int64_t>(round_up(256 * 32 / Dh, 64), 64, 1024);
  sc.attn_chunk = int32_t(std::clamp<int64_t>(round_up(ceil_div(context, want), 64), min_chunk, 1024));
  sc.attn_chunks = int32_t(ceil_div(context, sc.attn_chunk));

  sc.buf_elems.assign(kBufCount, 0);
  sc.buf_elems[kX] = sc.buf_elems[kH] = sc.buf_elems[kO] = d;
  sc.buf_elems[kQ] = sc.buf_elems[kAttn] = qw;
  sc.buf_elems[kK] = sc.buf_elems[kV] = kvw;
  sc.buf_elems[kGate] = sc.buf_elems[kUp] = sc.buf_elems[kAct] = s.ffn;
  sc.buf_elems[kLogits] = s.vocab;
  sc.buf_elems[kPartML] = H * sc.attn_chunks * 2;
  sc.buf_elems[kPartO] = H * sc.attn_chunks * Dh;

  auto weight = [&](const std::string& name, int64_t rows, int64_t cols) {
    for (size_t i = 0; i < sc.weights.size(); ++i)
      if (sc.weights[i].name == name) return int32_t(i);
    sc.weights.push_back({name, rows, cols});
    return int32_t(sc.weights.size() - 1);
  };
  // Rows per task of a GEMV cut into `sl` column slices: the balanced split of its rows x sl warp items.
  // Several GEMVs with the same producers run at once (q / k / v, gate / up) and are sized together:
  // `joint_items` is then their shared task size in warp items.
  int64_t joint_items = 0;
  auto gemv_rows = [&](int64_t rows, int sl) {
    return (joint_items ? joint_items : gemv_rows_per_task(rows * sl, workers, split)) / sl;
  };
  auto joint = [&](std::vector<std::pair<int64_t, int64_t>> shapes) {  // (rows, cols) each
    std::vector<int64_t> items;
    for (auto [r, c] : shapes) items.push_back(r * gemv_slices(r, c, workers, slices));
    return gemv_items_per_task(items, workers, split);
  };
  constexpr int64_t kElemsPerTask = 2048;
  int32_t group = 0;
  auto op = [&](OpKind k, int64_t layer, int32_t w, int32_t in0, int32_t in1, int32_t out, int64_t rows,
                int64_t cols, std::vector<int32_t> deps) {
    GpuOp o{};
    o.slices = 1, o.combine = -1, o.rope = 0;
    o.kind = k, o.layer = int32_t(layer), o.weight = w, o.in0 = in0, o.in1 = in1, o.out = out;
    o.rows = int32_t(rows), o.cols = int32_t(cols);
    switch (k) {
      case OpKind::gemv:
        o.slices = gemv_slices(rows, cols, workers, slices);
        o.per_task = int32_t(gemv_rows(rows, o.slices));
        break;
      case OpKind::add:
      case OpKind::silu_mul:
        o.per_task = int32_t(kElemsPerTask);
        break;
      case OpKind::attention:
        o.per_task = sc.attn_chunk;
        break;
      case OpKind::attn_combine:
        o.per_task = 1;
        break;
      case OpKind::rope_append:  // a task per KV head: its group's query pairs and its own key pairs
        o.per_task = int32_t(rows / s.kv_heads);
        break;
      case OpKind::l2_prefetch:  // about 1 MiB of bf16 rows a task: 16 bulk prefetches of one thread
        o.per_task = int32_t(std::clamp<int64_t>((int64_t(1) << 20) / (2 * cols), 1, rows));
        break;
      default:
        o.per_task = int32_t(rows);
        break;  // one task
    }
    o.tasks = k == OpKind::attention ? int32_t(H * sc.attn_chunks) : int32_t(ceil_div(rows, o.per_task));
    o.first_task = int32_t(sc.tasks.size());
    for (int32_t t = 0; t < o.tasks; ++t) sc.tasks.push_back({int32_t(sc.ops.size()), t});
    o.dep_begin = int32_t(sc.deps.size());
    o.dep_count = int32_t(deps.size());
    sc.deps.insert(sc.deps.end(), deps.begin(), deps.end());
    o.group = group;
    o.stage = Stage::plain, o.norm_weight = -1, o.accumulate = 0;
    sc.ops.push_back(o);
    if (launch == Launch::per_op) ++group;
    return int32_t(sc.ops.size() - 1);
  };
  auto next_group = [&] {
    if (launch == Launch::per_layer) ++group;
  };
  // The ranks sum `buf` after op `i`; the launch group ends there.
  auto all_reduce = [&](int32_t i, int32_t buf) {
    if (tp_size == 0) return;
    all_reduce_after[i] = buf;
    if (launch != Launch::per_op) ++group;
  };

  // A GEMV whose input is staged in a fused way.
  auto gemv = [&](int64_t layer, int32_t w, int32_t in0, int32_t in1, int32_t out, int64_t rows, int64_t cols,
                  std::vector<int32_t> deps, Stage st, int32_t norm_w, bool acc) {
    int32_t i = op(OpKind::gemv, layer, w, in0, in1, out, rows, cols, std::move(deps));
    sc.ops[size_t(i)].stage = st, sc.ops[size_t(i)].norm_weight = norm_w, sc.ops[size_t(i)].accumulate = acc;
    return i;
  };
  const bool fused = launch != Launch::per_op;
  const int32_t emb = weight("token_embd.weight", s.vocab, d);
  int32_t last = op(OpKind::embed, -1, emb, -1, -1, kX, d, d, {});
  next_group();
  for (int64_t l = 0; l < s.layers; ++l) {
    auto w = [&](const char* n, int64_t rows, int64_t cols) { return weight(layer_name(l, n), rows, cols); };
    const int32_t an = w("attn_norm.weight", 1, d), wq = w("attn_q.weight", qw, d),
                  wk = w("attn_k.weight", kvw, d), wv = w("attn_v.weight", kvw, d),
                  wo = w("attn_output.weight", d, qw), fnw = w("ffn_norm.weight", 1, d),
                  wg = w("ffn_gate.weight", s.ffn, d), wu = w("ffn_up.weight", s.ffn, d),
                  wd = w("ffn_down.weight", d, s.ffn);
    if (fused) {
      joint_items = joint({{qw, d}, {kvw, d}, {kvw, d}});
      int32_t q = gemv(l, wq, kX, -1, kQ, qw, d, {last}, Stage::rmsnorm, an, false);
      int32_t k = gemv(l, wk, kX, -1, kK, kvw, d, {last}, Stage::rmsnorm, an, false);
      int32_t v = gemv(l, wv, kX, -1, kV, kvw, d, {last}, Stage::rmsnorm, an, false);
      joint_items = 0;
      int32_t at = -1;
      if (rope == RopePlace::attention) {
        at = op(OpKind::attention, l, -1, kQ, kK, kPartO, H, Dh, {q, k, v});
        sc.ops[size_t(at)].rope = 1;
      } else {
        int32_t ra = op(OpKind::rope_append, l, -1, kQ, kK, kV, (qw + kvw) / 2, Dh, {q, k, v});
        at = op(OpKind::attention, l, -1, kQ, -1, kPartO, H, Dh, {ra});
      }
      if (l2_ahead_bytes > 0) {
        const int64_t rows = std::min<int64_t>(d, std::max<int64_t>(1, l2_ahead_bytes / (2 * qw)));
        const GpuOp& a = sc.ops[size_t(at)];
        std::vector<int32_t> ad(sc.deps.begin() + a.dep_begin, sc.deps.begin() + a.dep_begin + a.dep_count);
        op(OpKind::l2_prefetch, l, wo, -1, -1, -1, rows, qw, ad);
      }
      int32_t o = -1;
      if (combine == Combine::in_o_projection) {
        o = gemv(l, wo, kPartO, -1, kX, d, qw, {at}, Stage::attn_combine, -1, residual_here);
      } else if (combine == Combine::last_task) {
        sc.ops[size_t(at)].combine = kAttn;
        o = gemv(l, wo, kAttn, -1, kX, d, qw, {at}, Stage::plain, -1, residual_here);
      } else {
        const int32_t cb = op(OpKind::attn_combine, l, -1, kPartO, -1, kAttn, H, Dh, {at});
        o = gemv(l, wo, kAttn, -1, kX, d, qw, {cb}, Stage::plain, -1, residual_here);
      }
      all_reduce(o, kX);
      joint_items = joint({{s.ffn, d}, {s.ffn, d}});
      int32_t g = gemv(l, wg, kX, -1, kGate, s.ffn, d, {o}, Stage::rmsnorm, fnw, false);
      int32_t u = gemv(l, wu, kX, -1, kUp, s.ffn, d, {o}, Stage::rmsnorm, fnw, false);
      joint_items = 0;
      last = gemv(l, wd, kGate, kUp, kX, d, s.ffn, {g, u}, Stage::silu_mul, -1, residual_here);
      all_reduce(last, kX);
    } else {
      int32_t n1 = op(OpKind::rmsnorm, l, an, kX, -1, kH, d, d, {last});
      int32_t q = op(OpKind::gemv, l, wq, kH, -1, kQ, qw, d, {n1});
      int32_t k = op(OpKind::gemv, l, wk, kH, -1, kK, kvw, d, {n1});
      int32_t v = op(OpKind::gemv, l, wv, kH, -1, kV, kvw, d, {n1});
      int32_t r = op(OpKind::rope, l, -1, kQ, kK, -1, (qw + kvw) / 2, Dh, {q, k});
      int32_t a = op(OpKind::kv_append, l, -1, kK, kV, -1, kvw, kvw, {r, v});
      int32_t at = op(OpKind::attention, l, -1, kQ, -1, kPartO, H, Dh, {r, a});
      int32_t cb = op(OpKind::attn_combine, l, -1, kPartO, -1, kAttn, H, Dh, {at});
      int32_t o = op(OpKind::gemv, l, wo, kAttn, -1, kO, d, qw, {cb});
      all_reduce(o, kO);
      int32_t r1 = op(OpKind::add, l, -1, kO, -1, kX, d, d, {o});
      int32_t n2 = op(OpKind::rmsnorm, l, fnw, kX, -1, kH, d, d, {r1});
      int32_t g = op(OpKind::gemv, l, wg, kH, -1, kGate, s.ffn, d, {n2});
      int32_t u = op(OpKind::gemv, l, wu, kH, -1, kUp, s.ffn, d, {n2});
      int32_t sm = op(OpKind::silu_mul, l, -1, kGate, kUp, kAct, s.ffn, s.ffn, {g, u});
      int32_t dn = op(OpKind::gemv, l, wd, kAct, -1, kO, d, s.ffn, {sm});
      all_reduce(dn, kO);
      last = op(OpKind::add, l, -1, kO, -1, kX, d, d, {dn});
    }
    next_group();
  }
  const int32_t onw = weight("output_norm.weight", 1, d);
  const int32_t out_w = s.tied_embeddings ? emb : weight("output.weight", s.vocab, d);
  if (fused) {
    sc.lm_head_op = gemv(-1, out_w, kX, -1, kLogits, s.vocab, d, {last}, Stage::rmsnorm, onw, false);
  } else {
    int32_t fn = op(OpKind::rmsnorm, -1, onw, kX, -1, kH, d, d, {last});
    sc.lm_head_op = op(OpKind::gemv, -1, out_w, kH, -1, kLogits, s.vocab, d, {fn});
  }
  op(OpKind::argmax, -1, -1, kLogits, -1, -1, sc.ops[size_t(sc.lm_head_op)].tasks, 0, {sc.lm_head_op});

  // Launch groups: contiguous op ranges (numbered from 0 without gaps).
  int32_t prev = -1;
  for (size_t i = 0; i < sc.ops.size(); ++i) {
    GpuOp& o = sc.ops[i];
    if (sc.groups.empty() || o.group != prev) sc.groups.push_back({o.first_task, 0, int32_t(i), 0});
    prev = o.group;
    o.group = int32_t(sc.groups.size() - 1);
    sc.groups.back().tasks += o.tasks;
    sc.groups.back().ops += 1;
    if (auto it = all_reduce_after.find(int32_t(i)); it != all_reduce_after.end())
      sc.groups.back().all_reduce = it->second;
  }
  verify_schedule(sc);
  return sc;
}

void verify_schedule(const LlamaSchedule& s) {
  std::vector<int64_t> seen(s.ops.size(), 0);
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    const GpuTask& k = s.tasks[t];
    MP_INTERNAL_CHECK(k.op >= 0 && size_t(k.op) < s.ops.size(), "task ", t, " names op ", k.op);
    const GpuOp& o = s.ops[size_t(k.op)];
    MP_INTERNAL_CHECK(k.index >= 0 && k.index < o.tasks && int64_t(t) == int64_t(o.first_task) + k.index,
                      "task ", t, " is not task ", k.index, " of op ", k.op, " in place");
    ++seen[size_t(k.op)];
  }
  for (size_t i = 0; i < s.ops.size(); ++i) {
    const GpuOp& o = s.ops[i];
    MP_INTERNAL_CHECK(seen[i] == o.tasks && o.tasks >= 1, "op ", i, " (", to_string(o.kind), ") has ",
                      seen[i], " tasks scheduled of ", o.tasks);
    for (int32_t j = 0; j < o.dep_count; ++j) {
      int32_t p = s.deps[size_t(o.dep_begin + j)];
      MP_INTERNAL_CHECK(p >= 0 && size_t(p) < i, "op ", i, " depends on op ", p,
                        ", which does not precede it");
    }
    if (o.weight >= 0) MP_INTERNAL_CHECK(size_t(o.weight) < s.weights.size(), "op ", i, " weight index");
    MP_INTERNAL_CHECK((o.stage == Stage::rmsnorm) == (o.norm_weight >= 0) &&
                          (o.norm_weight < 0 || size_t(o.norm_weight) < s.weights.size()),
                      "op ", i, " norm weight");
  }
  int64_t covered = 0, ops = 0;
  for (size_t g = 0; g < s.groups.size(); ++g) {
    MP_INTERNAL_CHECK(s.groups[g].first_task == covered && s.groups[g].first_op == ops, "launch group ", g,
                      " does not start where the previous ends");
    covered += s.groups[g].tasks, ops += s.groups[g].ops;
  }
  MP_INTERNAL_CHECK(covered == int64_t(s.tasks.size()) && ops == int64_t(s.ops.size()),
                    "launch groups cover ", covered, " of ", s.tasks.size(), " tasks");
  for (size_t g = 0; g < s.groups.size(); ++g)
    MP_INTERNAL_CHECK(s.groups[g].all_reduce < 0 || (s.tp_size >= 1 && s.groups[g].all_reduce < kBufCount),
                      "launch group ", g, " sums buffer ", s.groups[g].all_reduce, " on ", s.tp_size,
                      " ranks");
}

int64_t LlamaSchedule::all_reduces_per_token() const {
  int64_t n = 0;
  for (auto& g : groups) n += g.all_reduce >= 0;
  return n;
}

std::string LlamaSchedule::summary() const {
  std::ostringstream os;
  os << to_string(launch) << ": " << launches_per_token() << " launch"
     << (launches_per_token() == 1 ? "" : "es") << " per token, " << ops.size() << " ops, " << tasks.size()
     << " tasks, attention " << attn_chunks << " chunk" << (attn_chunks == 1 ? "" : "s") << " of "
     << attn_chunk << " positions per head";
  if (tp_size >= 1)
    os << ", rank " << tp_rank << " of " << tp_size << " (" << all_reduces_per_token() << " all-reduces)";
  return os.str();
}

namespace {
// Bytes of a [rows, cols] weight on the GPU in the format the engine converts it to.
int64_t device_weight_bytes(quant::QType t, int64_t rows, int64_t cols, bool norm, GpuWeights mode) {
  int64_t n = mul_sat(rows, cols);
  if (norm) return mul_sat(n, 4);
  if (mode == GpuWeights::native && t == quant::QType::Q8_0) return add_sat(n, mul_sat(n / 32, 2));
  if (mode == GpuWeights::native && t == quant::QType::Q4_1) return add_sat(n / 2, mul_sat(n / 32, 4));
  return mul_sat(n, 2);
}
}  // namespace

int64_t gpu_bytes_needed(const LlamaGpuShapes& s, const WeightBindings* w, const LlamaGpuOptions& o) {
  int64_t ctx = o.context ? o.context : s.context;
  LlamaSchedule sc = build_schedule(s, o.launch, ctx, 1);
  int64_t b = 0;
  for (auto& wr : sc.weights) {
    quant::QType t = quant::QType::BF16;
    if (w)
      if (auto it = w->find(wr.name); it != w->end()) t = it->second.type;
    bool norm = wr.rows == 1;
    b = add_sat(b, device_weight_bytes(t, wr.rows, wr.cols, norm, o.weights));
  }
  const int64_t kvw = s.kv_heads * s.head_dim;
  b = add_sat(b, mul_sat(mul_sat(mul_sat(s.layers, 2), mul_sat(ctx, kvw)), 2));
  // Activations, with attention partials for the most chunks any worker count gives.
  int64_t act = 0;
  for (int i = 0; i < kBufCount; ++i) act = add_sat(act, sc.buf_elems[size_t(i)]);
  act = add_sat(act, mul_sat(mul_sat(s.heads, ceil_div(ctx, 64)), s.head_dim + 2));
  return add_sat(b, add_sat(mul_sat(act, 4), mul_sat(ctx, 8)));
}

}  // namespace mp::cuda
