// Attention on Hopper, written with the tile layer: the FlashAttention forward (online softmax over K/V
// tiles streamed through the pipeline template's TMA ring), its backward (dQ, dK, dV), and a split-KV
// decode for 1 to 16 query rows against a long cache; with the shape checks, the CPU fp64 references
// and a check routine (fresh random inputs, poisoned outputs) that the CLI, the tests and the benchmark
// share. Tensors are contiguous bf16 (batch, heads, seq, dim) on the device; the row log-sum-exp is fp32
// (batch, heads, seq_q), natural log. This header needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

struct CUstream_st;

namespace mp::kernels {

// Q is (batch, heads, seq_q, dim), K and V (batch, kv_heads, seq_kv, dim), O like Q. Query head h reads
// KV head h / (heads / kv_heads) (GQA; kv_heads == heads is plain multi-head, kv_heads == 1 MQA).
// Causal masks are aligned to the end: query row i sees key j when j <= i + seq_kv - seq_q (prefill
// after a cache); a row that sees no key gets O = 0 and LSE = -inf.
struct AttentionShape {
  int batch = 1, heads = 1, kv_heads = 1, seq_q = 1, seq_kv = 1, dim = 128;
  std::size_t q_elems() const { return std::size_t(batch) * heads * seq_q * dim; }
  std::size_t kv_elems() const { return std::size_t(batch) * kv_heads * seq_kv * dim; }
  std::size_t lse_elems() const { return std::size_t(batch) * heads * seq_q; }
  int group() const { return heads / kv_heads; }
  std::string str() const;  // "B=2 H=8:2 N=1000:1000 D=128"
};

// The head dims the kernels are compiled for.
constexpr int attention_dims[] = {64, 128, 256};
// At most this many query rows for attention_decode.
constexpr int attention_decode_max_rows = 16;
// Query rows (query heads of a group times query rows) one decode block takes (the M = 16 of its
// mma.sync tiles); a group with more is split into row groups, each reading the KV slice again.
constexpr int attention_decode_block_rows = 16;

// The decode kernel's shared-memory ring for a head dim and a number of resident blocks per SM (0: the
// dim's default, attention_decode_default_residency): K and V stream through `stages` chunks of
// `chunk_keys` keys each (rows padded by 16 bytes), copied by cp.async `stages - 1` chunks ahead of the
// compute; `blocks_per_sm` blocks of `smem_bytes` each are resident on an SM (sm_90: 228 KB of shared
// memory per SM, at most 227 KB per block, 1 KB reserved per block). A residency whose blocks leave room
// for fewer than 2 stages gets stages = 0 (not a ring). Host code, so that tests check it.
struct AttentionDecodeRing {
  int chunk_keys = 0, stages = 0, blocks_per_sm = 0, stage_bytes = 0, smem_bytes = 0;
};
constexpr int attention_decode_default_residency(int dim) { return dim <= 128 ? 2 : 1; }
constexpr AttentionDecodeRing attention_decode_ring(int dim, int blocks_per_sm = 0) {
  AttentionDecodeRing r;
  r.chunk_keys = 64;
  r.blocks_per_sm = blocks_per_sm > 0 ? blocks_per_sm : attention_decode_default_residency(dim);
  const int row_bytes = (dim + 8) * 2;
  r.stage_bytes = 2 * r.chunk_keys * row_bytes;              // a K chunk and a V chunk
  const int fixed = attention_decode_block_rows * row_bytes  // the block's Q rows
                    + 1024;                                  // per-warp softmax state, the combine's flag
  const int budget = (228 * 1024) / r.blocks_per_sm - 1024;  // per block, below the 227 KB limit
  r.stages = budget > fixed ? (budget - fixed) / r.stage_bytes : 0;
  if (r.stages > 8) r.stages = 8;  // beyond 7 chunks in flight per block the copies gain nothing
  if (r.stages < 2) r.stages = 0;
  r.smem_bytes = r.stages > 0 ? r.stages * r.stage_bytes + fixed : 0;
  return r;
}
// The residencies the decode kernel is compiled for (a kernel instance each): the default of every dim,
// and at dim 128 (the Llama layouts) also 3 blocks per SM (a 2-stage ring: more, shorter slices) and 1
// (a 6-stage ring: fewer, deeper ones), the two other ways to trade slices against bytes in flight per
// block. true when (dim, blocks_per_sm) is one of them.
constexpr bool attention_decode_residency_built(int dim, int blocks_per_sm) {
  return blocks_per_sm == attention_decode_default_residency(dim) ||
         (dim == 128 && (blocks_per_sm == 1 || blocks_per_sm == 3));
}
// At most this many slices per (batch, KV head, row group): the combine's weights are two per lane.
constexpr int attention_decode_max_splits = 64;

// How the decode is laid out on the GPU. Every choice here changes the speed, never the result beyond
// fp32 rounding (the slices' partials are combined exactly through their log-sum-exps); the defaults are
// what attention_decode runs. Meant for benchmarks and tests (bench_attention --decode-config): a zero
// field takes the automatic choice.
struct AttentionDecodeConfig {
  int blocks_per_sm = 0;  // the ring's residency (attention_decode_residency_built); 0: the dim's default
  int waves = 0;          // how many waves of resident blocks the grid may fill, 1 to 4; 0: 1
  int splits = 0;         // a fixed slice count, 1 to attention_decode_max_splits; 0: from waves
  // Programmatic dependent launch: the grid may be scheduled while the previous kernel in the stream
  // ends (its blocks touch no global memory before that kernel has finished), and it lets the next
  // such grid start during its own combine. Off by default until timed.
  bool pdl = false;
  std::string str() const;  // "bps=2,waves=auto,splits=auto,pdl=off"
};
// Parses "bps=3,waves=2,splits=48,pdl=on" (any subset, in any order; "default" or "" for all automatic;
// pdl is on or off); a bad key or value is a one-line mp::user_error naming it.
AttentionDecodeConfig parse_attention_decode_config(const std::string& text);

// The decode's launch for a shape on `sms` SMs: the ring, the slice count and the grid. The cache is cut
// into whole 64-key chunks, dealt to the slices as evenly as whole chunks allow (slice i takes chunks
// [i * chunks / splits, (i + 1) * chunks / splits)), so no slice is empty and the slice count need not
// divide the length.
struct AttentionDecodePlan {
  AttentionDecodeRing ring;
  int splits = 1;                  // slices per (batch, KV head, row group)
  int chunks = 0;                  // 64-key chunks of the cache (the last one may be partial)
  int row_groups = 1;              // blocks of attention_decode_block_rows query rows per KV head
  long long blocks = 0;            // the grid: batch * kv_heads * row_groups * splits
  long long slots = 0;             // blocks resident at once: sms * ring.blocks_per_sm
  int first_key(int split) const;  // slice `split`'s keys are [first_key(split), first_key(split + 1)),
                                   // the last clamped to seq_kv by the kernel
};
AttentionDecodePlan attention_decode_plan(const AttentionShape& s, int sms,
                                          const AttentionDecodeConfig& config = {});

// One-line mp::user_error naming the argument when the shape cannot run: a dim other than 64, 128, 256;
// heads not a multiple of kv_heads; a zero or negative size; sizes whose element counts overflow.
void check_attention_shape(const AttentionShape& s);
// The same, then decode's own limit (seq_q from 1 to attention_decode_max_rows).
void check_attention_decode_shape(const AttentionShape& s);
// 1 / sqrt(dim), the usual softmax scale.
double default_attention_scale(int dim);

// How the wgmma backward adds dQ's partials into its fp32 buffer (kernels/attention_backward_sm90.cuh):
// one partial per row and block, the two consumer warpgroups taking turns at dQ = dS K (turns, what
// `automatic` runs), or one per consumer (atomic: the layout before, for A/B timing).
// MP_ATTENTION_BWD_DQ=auto|turns|atomic.
enum class AttentionBackwardDq { automatic, turns, atomic };
AttentionBackwardDq attention_backward_dq_from_env();

// How the forward's blocks take the query tiles. PerTile: one block per 128-row query tile of a (batch,
// head), which sets up its shared memory, loads its Q and streams K / V (three K / V stages at d128).
// Persistent: one block per SM walking the tiles, with two copies of Q at d64 (one at d128 and d256) so
// that the next tile's Q and first K / V tiles load while this one computes and stores, and a block's
// set-up is paid once. The tiles are dealt to the blocks statically, so long causal rows balance worse
// than the hardware's dealing of one block per tile.
// Automatic: the persistent grid where it measured faster on the H200 (docs/attention.md, "Persistent
// grid"): d64 without the mask at every length and causal up to 8k keys; d128 up to 1k keys, and causal
// up to 2k; d256 without the mask at every length and causal up to 2k keys.
enum class AttentionGrid { automatic, per_tile, persistent };
// MP_ATTENTION_GRID=auto|per-tile|persistent (for timing the two side by side), else automatic; another
// value is a user error naming the variable.
AttentionGrid attention_grid_from_env();
// Whether the forward of `s` (`causal` or not) runs on the persistent grid under `grid`.
bool attention_forward_persistent(const AttentionShape& s, bool causal,
                                  AttentionGrid grid = attention_grid_from_env());

// ---- the GPU entry points (device pointers, 16-byte aligned; asynchronous on `stream`) ----
// Throw mp::user_error for bad shapes / pointers, mp::not_supported in a build without CUDA.

// O = softmax(scale * Q K^T (masked)) V and, when lse is not null, the row log-sum-exp of the masked
// scaled scores (fp32, natural log).
void attention_forward(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                       float* lse, float scale, bool causal, CUstream_st* stream);

// The same result for seq_q <= 16 (the decode step, a few speculative or grouped rows), computed by
// splitting the cache into slices (count chosen from the SM count and the length), each block reading
// one KV head's slice once for all the query heads of its group, then combining the slices through their
// log-sum-exps. lse may be null.
void attention_decode(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                      float* lse, float scale, bool causal, CUstream_st* stream,
                      const AttentionDecodeConfig& config = {});

// The backward's two implementations. wgmma: a block per 128-key tile of a (batch, KV head), S, dP, dV,
// dK and dQ on Tensor Cores (dims 64 and 128; dim 256 throws mp::not_supported). cuda_core: CUDA cores
// only, every dim, about 50x slower. automatic (the default): wgmma where it exists, cuda_core for dim 256.
enum class attention_backward_impl { automatic, cuda_core, wgmma };
// "auto" / "cuda-core" / "wgmma".
const char* attention_backward_impl_name(attention_backward_impl impl);
// The implementation `impl` runs for head dim `dim`: automatic resolved, the others as given.
attention_backward_impl attention_backward_resolve(attention_backward_impl impl, int dim);

// dQ, dK, dV (bf16, shaped as Q, K, V) from dO, the forward's O and LSE; dK and dV are summed over the
// query heads of a group. fp32 accumulation.
void attention_backward(const AttentionShape& s, const void* q, const void* k, const void* v, const void* o,
                        const float* lse, const void* d_o, void* dq, void* dk, void* dv, float scale,
                        bool causal, CUstream_st* stream,
                        attention_backward_impl impl = attention_backward_impl::automatic);

// The slice count attention_decode uses on `sms` SMs with the default config (exposed for the CLI):
// attention_decode_plan(s, sms).splits.
int attention_decode_splits(const AttentionShape& s, int sms);

// ---- CPU fp64 references (inputs as float, already rounded to bf16 by the caller if wanted) ----
// Rows: the query rows (b, h, i) to compute, as flat indices into (batch, heads, seq_q); empty = all.
// o gets q_elems() values (rows not asked for are left as they were), lse lse_elems().
void attention_reference_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                 double scale, bool causal, double* o, double* lse,
                                 const std::vector<std::size_t>& rows = {});
// dq (q_elems), dk and dv (kv_elems) from dO; O and LSE are recomputed in fp64.
void attention_reference_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                                  const float* d_o, double scale, bool causal, double* dq, double* dk,
                                  double* dv);

// ---- the check routine ----
enum class attention_pass { forward, decode, backward };

struct AttentionCheckOptions {
  uint64_t seed = 0;  // 0: a fresh seed (printed in the result)
  // Forward / decode: every row against fp64 when batch * heads * seq_q * seq_kv * dim is at most this,
  // else a sample of rows (all heads of a few batches, rows at the start, the end and spread between).
  long long full_reference_limit = 1ll << 28;
  double scale = 0;  // 0: 1 / sqrt(dim)
  bool causal = false;
  attention_backward_impl backward_impl = attention_backward_impl::automatic;
  AttentionDecodeConfig decode;  // the decode's launch (the default: automatic); with pdl, three
                                 // launches back to back, checked after the last
};

struct AttentionCheckResult {
  uint64_t seed = 0;
  double max_err_o = 0;    // max |O - ref| / (max |ref| over the compared outputs), per output tensor
  double max_err_lse = 0;  // max |LSE - ref| (absolute; LSE is O(log seq) in size)
  double max_err_dq = 0, max_err_dk = 0, max_err_dv = 0;  // backward: as max_err_o
  double tolerance = 0;                                   // the relative bound each output was held to
  std::size_t unwritten = 0;  // output elements still holding the NaN poison (all of them are counted)
  std::size_t checked_rows = 0;
  bool ok = false;
  std::string summary() const;  // "ok (O err 3.1e-03, LSE err 1.2e-06, 1000 rows)" or "FAIL: ..."
};

// Runs the pass on fresh random inputs (uniform in [-1, 1), bf16) with the outputs poisoned with NaN
// first, and compares with the fp64 reference. Throws mp::user_error for bad shapes, mp::not_supported
// without CUDA.
AttentionCheckResult check_attention(const AttentionShape& s, attention_pass pass,
                                     const AttentionCheckOptions& opt = {});

// Times the pass on random inputs: `samples` batches of launches of about batch_ms each (after warm-up),
// the median per launch in ms. FLOPs: 4 * B * H * Nq * Nkv * D forward (halved when causal), backward
// 2.5x that (attention_flops).
struct AttentionTiming {
  double ms = 0, tflops = 0;
  int batch_launches = 0;
};
AttentionTiming time_attention(const AttentionShape& s, attention_pass pass, bool causal, int samples = 10,
                               double batch_ms = 200,
                               attention_backward_impl impl = attention_backward_impl::automatic,
                               const AttentionDecodeConfig& decode = {});
double attention_flops(const AttentionShape& s, attention_pass pass, bool causal);

}  // namespace mp::kernels
