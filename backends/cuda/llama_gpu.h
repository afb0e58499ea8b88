// The GPU Llama decode engine (batch 1, greedy, KV cache in HBM) in three launch modes: one kernel per
// operation, one kernel per decoder layer, or one persistent kernel for the whole token whose blocks walk
// a task queue with dependency counters in global memory. The operation list and the task schedule are
// built on the host from the model's shapes (plain C++, tested without a GPU); the kernels are in
// llama_gpu.cu. See docs/llama-gpu.md.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/quant_matmul.h"
#include "core/quant.h"

namespace mp::cuda {

// Weights by GGUF tensor name: the same type as cpu::WeightBindings (backends/cpu/llm_engine.h).
using WeightBindings = std::map<std::string, cpu::QMatrix>;

// What the engine needs of a Llama model: its shapes, RMSNorm epsilon and the RoPE frequency of each
// pair of a head (the model's scaling applied). Made from models::LlamaConfig by shapes_of().
struct LlamaGpuShapes {
  std::string name;
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t context = 0;  // the model's trained context (the KV cache may hold fewer positions)
  double rms_eps = 1e-5;
  std::vector<double> rope_freq;  // head_dim / 2 entries
  bool tied_embeddings = true;
  void check() const;  // user_error naming what the GPU engine cannot run
};

// Any configuration with LlamaConfig's fields and a frequency function such as models::rope_frequency
// (the engine sits below the models layer, so it takes the fields rather than the type).
template <class Config, class Freq>
LlamaGpuShapes shapes_of(const Config& c, Freq freq) {
  LlamaGpuShapes s;
  s.name = c.name;
  s.layers = c.layers, s.d_model = c.d_model, s.heads = c.heads, s.kv_heads = c.kv_heads;
  s.head_dim = c.head_dim, s.ffn = c.ffn, s.vocab = c.vocab, s.context = c.context;
  s.rms_eps = c.rms_eps, s.tied_embeddings = c.tied_embeddings;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) s.rope_freq.push_back(freq(c, i));
  return s;
}

enum class Launch { per_op, per_layer, megakernel };
const char* to_string(Launch l);            // "per-op", "per-layer", "megakernel"
Launch parse_launch(const std::string& s);  // user_error listing the modes
const std::vector<std::string>& launch_names();

// ---- The operation list and the task schedule (host-side, built from the shapes) ----

enum class OpKind : int32_t {
  embed,         // x = row `token` of the embedding table
  rmsnorm,       // out = in0 * rsqrt(mean(in0^2) + eps) * weight
  gemv,          // out[r] = W[r] . in0 (tasks are slices of rows); the LM head also records argmax partials
  rope,          // rotates the pairs of q (in0) and k (in1) in place by position * frequency
  kv_append,     // cache_k[pos] = k (in0), cache_v[pos] = v (in1), as bf16
  rope_append,   // rope, then kv_append, in one task (the fused modes with RopePlace::separate)
  attention,     // one task per (query head, cache chunk): partial softmax max, sum and weighted V
  attn_combine,  // one task per head: merges its chunks' partials into out
  add,           // out += in0 (the residual)
  silu_mul,      // out = silu(in0) * in1
  argmax,        // the greedy token of the LM head's partials, stored as the position's prediction
  // Fused modes: starts loading the first `rows` rows of a later GEMV's weight (`weight`) into L2, a
  // task per `per_task` rows (one thread's bulk-copy prefetches; no inputs, no outputs, nothing waits on
  // it). Placed beside a step that reads little from HBM (the attention), so that the HBM loads the next
  // step's weights meanwhile (LlamaGpuOptions::l2_ahead_bytes).
  l2_prefetch,
};
const char* to_string(OpKind k);

// How a GEMV task fills its input vector in shared memory. The fused modes fold the operation that
// produces a GEMV's input into the GEMV's staging (each task recomputes it; it is small next to the
// rows' weights): the RMSNorm of in0 (norm_weight), silu(in0) * in1, or the attention combine of the
// split-KV partials.
enum class Stage : int32_t { plain, rmsnorm, silu_mul, attn_combine };

// Activation buffers (fp32) the operations read and write; the engine allocates each once.
enum Buf : int32_t { kX, kH, kQ, kK, kV, kAttn, kO, kGate, kUp, kAct, kLogits, kPartML, kPartO, kBufCount };

// Plain data, copied to the GPU as is.
struct GpuOp {
  OpKind kind;
  int32_t layer;   // -1 outside the decoder layers
  int32_t weight;  // index into LlamaSchedule::weights, -1 for none
  int32_t in0, in1, out;
  int32_t rows, cols;            // gemv: the matrix; elementwise: elements in `rows`
  int32_t tasks;                 // tasks the operation is split into
  int32_t per_task;              // rows (gemv), elements (elementwise), cache positions (attention) per task
  int32_t first_task;            // index of its first task in LlamaSchedule::tasks
  int32_t dep_begin, dep_count;  // its producers: LlamaSchedule::deps[dep_begin .. +dep_count)
  int32_t group;                 // launch group (a kernel launch of per-layer / megakernel mode)
  Stage stage;                   // gemv: how its input is staged
  int32_t norm_weight;           // gemv with Stage::rmsnorm: the norm's weight
  int32_t accumulate;            // gemv: out += W x (the residual folded in) instead of out = W x
  int32_t slices;                // gemv: column slices per row (1, 2, 4, 8), each a warp's; summed per row
  int32_t combine;  // attention: the buffer its last task per head merges the head into (-1: none)
  // attention: 1 = its inputs are the raw q (in0), k and v (kK, kV) GEMV outputs: each task rotates its
  // query head, takes the position's key and value rows from kK / kV (RoPE, rounded to bf16 as the cache
  // holds them) and one task per KV head appends them to the cache (the fused modes' default, no
  // rope_append step); 0 = q rotated and the cache appended by earlier operations.
  int32_t rope;
};

struct GpuTask {
  int32_t op, index;  // task `index` of operation `op`
};

struct LaunchGroup {
  int32_t first_task, tasks;  // a contiguous range of LlamaSchedule::tasks
  int32_t first_op, ops;
  // Tensor parallelism: the buffer (a Buf) the ranks sum with an all-reduce after this group, -1 none.
  int32_t all_reduce = -1;
};

struct WeightRef {
  std::string name;  // GGUF tensor name ("blk.3.attn_q.weight")
  int64_t rows, cols;
};

struct LlamaSchedule {
  Launch launch = Launch::megakernel;
  std::vector<GpuOp> ops;  // in a topological order: every producer comes before its consumers
  std::vector<int32_t> deps;
  std::vector<GpuTask> tasks;       // the ops' tasks, op by op
  std::vector<LaunchGroup> groups;  // per-op: one per op; per-layer: embed, one per layer, tail; mega: 1
  std::vector<WeightRef> weights;
  std::vector<int64_t> buf_elems;           // per Buf
  int64_t context = 0;                      // KV-cache positions
  int32_t attn_chunk = 0, attn_chunks = 0;  // cache positions per attention task, chunks per head
  int32_t lm_head_op = -1;
  int32_t tp_rank = 0, tp_size = 0;  // tensor parallelism: this rank of tp_size (0: a single-GPU schedule)
  int64_t launches_per_token() const { return int64_t(groups.size()); }
  int64_t all_reduces_per_token() const;
  std::string summary() const;  // "megakernel: 1 launch per token, 487 ops, 12,345 tasks"
};

// How a GEMV's rows are cut into tasks. balanced: the task size (a multiple of 8 rows, one per warp)
// that minimizes the rows one worker runs, waves x (rows per task + a task's overhead), for the given
// workers (ties: fewer, larger tasks). two_per_worker: about two tasks per worker, the smallest
// multiple of 8 rows that gives it.
enum class GemvSplit { balanced, two_per_worker };

// Where the fused modes merge the split-KV partials of a head: an operation of its own (a task per
// head), inside every O-projection task's staging, or in the attention task that finishes a head's
// chunks last (a per-head counter in global memory; no operation and no dependency step of its own).
enum class Combine { separate, in_o_projection, last_task };
const char* to_string(Combine c);  // "separate", "fused", "last"

// Where the fused modes apply RoPE and append the position's key and value to the cache: in the
// attention tasks (no step of their own: a layer is q / k / v, attention, o, gate / up, down), or in a
// rope_append operation between the q / k / v GEMVs and the attention (one dependency step more).
enum class RopePlace { attention, separate };
const char* to_string(RopePlace r);  // "attention", "separate"

// Splits the model into operations (the decoder layer's sequence, per layer, then the final norm, LM
// head and argmax) and the operations into tasks for `workers` concurrently running blocks. per-op keeps
// every operation of the layer separate (16 per layer); per-layer and megakernel fold norms, SiLU*mul and
// the residuals into the GEMVs and RoPE with the KV append into the attention (`rope`
// RopePlace::attention; with RopePlace::separate, a rope_append operation of its own, one more per
// layer): 9 per layer with the split-KV combine an operation of its own, 8 with `combine`
// in_o_projection, where every task of the O projection merges all heads' partials itself while staging
// its input, or last_task, where the attention task that finishes a head last merges that head's.
// user_error when the context does not fit the model's.
//
// l2_ahead_bytes > 0 (fused modes): an l2_prefetch operation beside each attention, covering the O
// projection's first rows up to that many bytes at 2 bytes a value, with the attention's producers as its
// own (it starts when the attention can), one more operation per layer.
//
// A GEMV's rows are cut into column slices (GpuOp::slices) when it has too few rows to give every warp
// of every worker several: `slices` 0 chooses (the fewest that give 4 per warp, at most 8, cols a
// multiple of 32 x slices), > 0 fixes it where the columns allow (else 1).
//
// Tensor parallelism (tp_size >= 1; 0 is the single-GPU schedule): `s` are one rank's shard shapes
// (shard_shapes), and the schedule places an all-reduce of the residual's update after the attention
// output projection and after the FFN down projection. The launch group ends there (LaunchGroup::
// all_reduce): per-op mode sums the projection's output before the residual add; the fused modes fold
// the residual into the projection on rank 0 only (the other ranks write their partial product), so
// the sum is the new residual. The megakernel is cut at each all-reduce (2 x layers + 1 launches: the
// collectives are launched from the host; a device-initiated all-reduce is not supported yet).
LlamaSchedule build_schedule(const LlamaGpuShapes& s, Launch launch, int64_t context, int64_t workers,
                             GemvSplit split = GemvSplit::balanced, Combine combine = Combine::last_task,
                             int slices = 0, int tp_rank = 0, int tp_size = 0,
                             RopePlace rope = RopePlace::attention, int64_t l2_ahead_bytes = 0);
// Column slices of a GEMV of rows x cols over `workers` blocks of 8 warps (see build_schedule).
int gemv_slices(int64_t rows, int64_t cols, int64_t workers, int want = 0);
// The per-task cost the balanced split charges on top of a task's rows, in warp items.
constexpr int64_t kTaskOverheadItems = 1;
// Rows per task of a GEMV of `rows` rows over `workers` blocks (a multiple of 8 in [8, 256]).
int64_t gemv_rows_per_task(int64_t rows, int64_t workers, GemvSplit split);
// The same for GEMVs that run at once (their tasks share the workers), in warp items (rows x column
// slices) per task: one size for all of them.
int64_t gemv_items_per_task(const std::vector<int64_t>& items, int64_t workers, GemvSplit split);
// Internal consistency (topological order, every task of every op exactly once, groups cover the tasks);
// internal_error naming what is wrong. build_schedule's result always passes; tests call it.
void verify_schedule(const LlamaSchedule& s);

// ---- Tensor parallelism: the shards of a model ----

// One rank's shapes out of `tp`: query heads, KV heads and FFN columns divided by tp (the embedding,
// the norms and the LM head stay whole on every rank). user_error naming the count that does not divide
// and the tp values that would.
LlamaGpuShapes shard_shapes(const LlamaGpuShapes& full, int tp);
// The part of tensor `name` (GGUF name) that rank `rank` of `tp` holds: rows [row0, row0 + rows) and
// columns [col0, col0 + cols) of the full [full_rows, full_cols] matrix. Q, K, V, gate and up are split
// by rows (heads, FFN columns), the attention output and down projections by columns; the rest whole.
struct ShardSlice {
  int64_t row0 = 0, rows = 0, col0 = 0, cols = 0, full_rows = 0, full_cols = 0;
  // The whole [rows, cols] tensor (what shard_slice means by rows < 0: a tensor every rank holds).
  static ShardSlice whole(int64_t r, int64_t c) { return {0, r, 0, c, r, c}; }
};
ShardSlice shard_slice(const std::string& name, const LlamaGpuShapes& full, int rank, int tp);
// The shard of every bound tensor: row slices are views of `w`'s data; column slices are copied into
// `storage` (quantized blocks kept where the slice falls on block boundaries, else dequantized to f32).
// user_error when a tensor is missing or has the wrong shape.
WeightBindings shard_weights(const WeightBindings& w, const LlamaGpuShapes& full, int rank, int tp,
                             std::vector<std::vector<uint8_t>>& storage);

// ---- The engine ----

enum class GpuWeights { native, bf16 };  // native: Q8_0 / Q4_1 stay quantized; others -> bf16
const char* to_string(GpuWeights w);

struct LlamaGpuOptions {
  Launch launch = Launch::megakernel;
  int64_t context = 0;  // KV-cache positions; 0 = the model's context
  GpuWeights weights = GpuWeights::native;
  int blocks_per_sm = 0;  // 0: as many as fit
  // Tuning switches (the defaults are meant to be the fast path; each alternative is the simpler
  // setting, kept for comparison, see docs/llama-gpu.md):
  int min_blocks_per_sm = 2;  // the task kernel's register budget: 2 (128 registers), 3 (85) or 4 (64)
  // register-load GEMV: 16-byte loads a lane issues before using them, 4 or 8; 0: 8 in the 2-block kernel
  // (measured faster there, with the paired rows of short slices), 4 in the others
  int gemv_loads = 0;
  int64_t prefetch_bytes = 32 << 10;  // L2 prefetch per GEMV task in the fused modes; 0 none, -1 all
  GemvSplit gemv_split = GemvSplit::balanced;
  // Fused modes: take the next task from the queue before running one. Off: a block busy with a task
  // would hold the next one (a task of the next dependency step) until it finishes, so that step's
  // tasks start a task late on those blocks (measured: 8B 8.35 ms/token with, 5.31 without).
  bool fetch_ahead = false;
  // bf16 GEMV weights streamed through a shared-memory ring by bulk copies: segments in flight per warp
  // (0: register loads, as the quantized formats always use) and the bytes of one segment.
  int stream_depth = 0;
  int64_t stream_seg_bytes = 4096;
  Combine combine = Combine::last_task;  // fused modes: where the split-KV partials are merged
  RopePlace rope = RopePlace::attention;  // fused modes: where RoPE and the KV append run
  int gemv_slices = 0;  // column slices per GEMV row: 0 chosen per matrix (build_schedule), or 1, 2, 4, 8
  // Fused modes: the O projection's weight prefetched into L2 during the attention, at most this many
  // bytes of bf16 rows (an l2_prefetch operation; 0: none).
  int64_t l2_ahead_bytes = 0;
  // The GEMVs' weight loads with an L2 evict-first policy (read once per token, they then do not evict
  // the KV cache, the activations or what a prefetch brought in); off: the loads' default policy.
  bool l2_evict_first = true;
  // bf16 GEMVs of the 2- and 3-block kernels issue the loads of their first rows before waiting for
  // their producers.
  bool gemv_preload = true;
  // per-layer mode: each layer's launch is a programmatic dependent launch (PDL) of the one before, so
  // its blocks start as the previous layer's blocks leave, take tasks and wait on the same dependency
  // counters as the megakernel's; the first launch of a position (the embedding) waits for the stream as
  // usual. Off (and always in per-op mode and with tensor parallelism): every launch waits for the last.
  bool overlap_launches = true;
  // Record every task's times (the GPU's global timer) in each position; LlamaGpu::trace() returns the
  // last position's. Costs a few stores per task.
  bool trace = false;
  // Tensor parallelism over `tp` ranks (0: off). nccl: this process is rank `tp_rank`, on GPU tp_rank,
  // and reaches the others through NCCL; rank 0 writes NCCL's unique id to `tp_id_file`, the others read
  // it (tp_launch.h starts the processes). local: one engine holds all tp shards on this process's GPU
  // and sums their partials itself (tests of the sharding without several GPUs).
  int tp = 0;
  int tp_rank = 0;
  bool tp_local = false;
  std::string tp_id_file;
  double tp_timeout_s = 120;  // how long a rank waits for the unique id
  // While an all-reduce runs, the next operation's weights prefetched into L2, at most this many bytes.
  int64_t tp_prefetch_bytes = 16 << 20;
};

// Applies a comma-separated list of tuning switches to `o` (the CLI's --gpu-tune):
//   min-blocks=2|3|4, loads=4|8, prefetch-kib=N|all, split=balanced|two-per-worker, fetch-ahead=0|1,
//   stream=0..8, seg-kib=1..16, combine=separate|fused|last, slices=auto|1|2|4|8, l2-ahead-kib=N
// user_error naming the bad item and the accepted ones. Every switch at its alternative:
// "min-blocks=4,loads=4,prefetch-kib=all,split=two-per-worker,fetch-ahead=1,stream=4,combine=separate,slices=1".
void apply_tuning(const std::string& list, LlamaGpuOptions& o);

// One task of a traced position, in nanoseconds of the GPU's global timer: when its block took it (per-op
// mode: when the block started it), when its producers were done, when it had published its results; and
// the SM that ran it.
struct TaskTime {
  uint64_t fetched = 0, ready = 0, finished = 0;
  uint32_t sm = 0;
};

// What a traced position spent where, per operation role ("attn_q", "ffn_down", "attention", ...),
// averaged over the layers: for each role, its operations' span (first task ready to last task
// finished), the lag before it (first task ready minus the end of its last producer: the dependency
// hand-off), the mean time a task waited for its producers and ran, and for GEMVs the weight bandwidth
// over the span. `times` is indexed like s.tasks. A plain-text table; user_error when the sizes differ.
std::string trace_summary(const LlamaSchedule& s, const std::vector<TaskTime>& times,
                          const std::vector<int64_t>& weight_bytes);
// The same times as CSV: one row per task (op, role, layer, task, sm, fetched, ready, finished; times in
// ns from the position's first fetch).
std::string trace_csv(const LlamaSchedule& s, const std::vector<TaskTime>& times);
// The role of operation `op`: its weight's name without "blk.N." and ".weight" for GEMVs ("output" for
// an untied LM head, "token_embd" when tied), else the kind's name.
std::string op_role(const LlamaSchedule& s, int32_t op);

struct LlamaGpuStats {
  int64_t positions = 0;      // positions run
  int64_t launches = 0;       // kernel launches made for them
  int64_t weight_bytes = 0;   // bytes of weights one position reads (the embedding table: one row)
  int64_t kv_bytes_read = 0;  // bytes of KV cache the positions read, summed
  int workers = 0;            // blocks of the persistent / per-layer kernels
  int sm_count = 0;
  int64_t all_reduces = 0;  // tensor parallelism: all-reduces issued
};

class LlamaGpu {
 public:
  // Weights bound by GGUF tensor name (a GGUF file's tensors or random CPU-side blocks); they are
  // copied to the GPU (converted per `o.weights`), so the source need not outlive the engine.
  // user_error when a tensor is missing or has the wrong shape, when the model does not fit the GPU
  // (naming the sizes); not_supported without a usable GPU.
  static std::unique_ptr<LlamaGpu> create(const LlamaGpuShapes& s, const WeightBindings& w,
                                          const LlamaGpuOptions& o);
  // Random bf16 weights generated on the GPU (uniform, scaled to keep activations of unit size).
  static std::unique_ptr<LlamaGpu> random(const LlamaGpuShapes& s, const LlamaGpuOptions& o, uint64_t seed);
  virtual ~LlamaGpu() = default;

  virtual const LlamaSchedule& schedule() const = 0;
  virtual int64_t context() const = 0;
  virtual int64_t position() const = 0;  // positions already in the cache
  virtual void reset() = 0;

  // Runs the given tokens at positions position().. (asynchronously: nothing waits for the GPU).
  // user_error when they do not fit the KV cache (naming both lengths) or an id is out of range.
  virtual void feed(const std::vector<int32_t>& tokens) = 0;
  // Runs n positions, each fed the greedy prediction of the one before, and returns the n predictions
  // they make (waits for the GPU). The prediction of the last fed position is last_prediction().
  virtual std::vector<int32_t> generate(int64_t n) = 0;
  virtual int32_t last_prediction() = 0;
  virtual std::vector<float> logits() = 0;  // the last position's logits (waits for the GPU)
  virtual void synchronize() = 0;
  // Fills every activation buffer, the whole KV cache and the predictions with NaN bytes (tests: a value
  // read before it is written shows up in the logits).
  virtual void poison() = 0;
  virtual const LlamaGpuStats& stats() const = 0;
  virtual std::string device_name() const = 0;
  // The last position's task times (waits for the GPU); user_error unless the engine was made with
  // LlamaGpuOptions::trace and has run a position.
  virtual std::vector<TaskTime> trace() = 0;
  // Bytes of weights each GEMV operation reads (indexed like schedule().ops; 0 for other kinds).
  virtual std::vector<int64_t> op_weight_bytes() const = 0;
};

// What this build and machine offer tensor parallelism: the CUDA GPUs visible (0 without CUDA), and
// whether the build has NCCL.
int visible_gpus();
bool have_nccl();
// What a tensor-parallel run over `tp` processes needs of the build and the machine: not_supported
// without NCCL, user_error with fewer than `tp` GPUs visible (each naming --tp-local, the one-GPU check).
void check_tp_machine(int tp);

// Bytes the engine allocates on the GPU for these shapes (weights as converted, KV cache, activations):
// what the memory check compares with the free memory.
int64_t gpu_bytes_needed(const LlamaGpuShapes& s, const WeightBindings* w, const LlamaGpuOptions& o);

}  // namespace mp::cuda
