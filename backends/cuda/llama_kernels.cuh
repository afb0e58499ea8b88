// Device code of the GPU Llama engine: one function per operation kind, each computing one task of an
// operation (a slice of GEMV rows, a chunk of one head's attention, ...), and the task loop that runs
// them in all three launch modes. A block of kThreads threads runs one task at a time.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backends/cuda/llama_gpu.h"
#include "tile/sync.cuh"

namespace mp::cuda::dev {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// The streamed GEMV's ring (Params::stream_depth > 0): at ring_off in the dynamic shared memory, the
// semaphores (kWarps x kMaxStreamDepth), one sequence counter per warp, then each warp's
// stream_depth x stream_seg bytes.
constexpr int kMaxStreamDepth = 8;
constexpr int kRingHeader = 640;  // 8 x 8 x 8 bytes of semaphores + 8 x 4 of counters, rounded up to 128

enum WeightFormat : int32_t { kF32 = 0, kBF16 = 1, kQ8_0 = 2, kQ4_1 = 3 };

// A weight on the GPU. bf16: q holds rows x cols bf16. Q8_0: q holds the int8 values row-major, s one
// fp16 scale per 32. Q4_1: q holds 16 bytes of nibbles per block of 32 (GGML's order: byte j has element
// j low, j + 16 high), s one (scale, min) half2 per block. Repacked from GGML's interleaved blocks so
// that every row is 16-byte aligned.
struct DevWeight {
  int32_t format, rows, cols;
  const uint8_t* q;
  const void* s;
};

struct Params {
  const GpuOp* ops;
  const int32_t* deps;
  const GpuTask* tasks;
  const DevWeight* weights;
  float* buf[kBufCount];
  unsigned long long* argmax_part;   // one per LM-head task: (ordered logit bits << 32) | ~row
  __nv_bfloat16 *cache_k, *cache_v;  // [layers][context][kv_heads * head_dim]
  const double* rope_freq;
  const int32_t* prompt;      // tokens fed by the host, by position
  int32_t* pred;              // greedy prediction made at each position
  unsigned long long* done;   // per op: tasks finished, summed over all positions run
  unsigned long long* heads;  // per launch group: tasks fetched, summed over its launches
  int32_t d, H, HKV, Dh, ffn, vocab, context, attn_chunk, attn_chunks, lm_head_op;
  float eps;
  int32_t pos, prompt_end;
  unsigned long long epoch;  // 1 + positions run before this one: op o is done at epoch * tasks(o)
  int32_t group, group_first_task, group_tasks;
  unsigned long long head_base;  // heads[group] before this launch
  int32_t dynamic;               // 1: fetch tasks from the queue and wait on dependencies
  int64_t prefetch_bytes;        // L2 prefetch per GEMV task: 0 none, < 0 the whole task
  int32_t fetch_ahead;           // 1: take the next task index before running the current one
  int32_t stream_depth;          // bf16 GEMV rows streamed through shared memory: segments per warp (0: off)
  int32_t stream_seg;            // bytes per segment (a multiple of 16)
  int32_t ring_off;              // byte offset of the ring in the dynamic shared memory (a multiple of 128)
  int32_t loads;                 // register-load GEMV: 16-byte loads in flight per lane, 4 or 8
  TaskTime* trace;               // per task of the schedule: its times in this position (null: not traced)
  unsigned long long* head_done;  // layers x H: attention tasks finished per head, over all positions
  int32_t preload;                // 1: a bf16 GEMV issues its first weight loads before its wait
  int32_t l2_evict_first;         // 1: the GEMVs' weight loads are L2 evict-first (weight_policy)
};

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum / max; `scratch` holds kWarps floats. Every thread gets the result.
template <bool Max>
__device__ __forceinline__ float block_reduce(float v, float* scratch) {
  v = Max ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float r = Max ? -INFINITY : 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) r = Max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}
__device__ __forceinline__ float block_sum(float v, float* scratch) { return block_reduce<false>(v, scratch); }
__device__ __forceinline__ float block_max(float v, float* scratch) { return block_reduce<true>(v, scratch); }

// Weights do not change while a kernel runs: read them through the non-coherent path, without
// allocating in L1 (each byte is read once per token), with the L2 eviction policy `pol`
// (weight_policy).
__device__ __forceinline__ uint4 ld_weight(const void* p, uint64_t pol) {
  uint4 v;
  // Not volatile: the loads of an unrolled loop may be issued together, ahead of the arithmetic.
  asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p), "l"(pol));
  return v;
}
// The L2 policy of the GEMVs' weight loads (Params::l2_evict_first): evict-first, so that rows read once
// per token do not push out what an l2_prefetch operation brought in ahead of its GEMV (nor the KV
// cache); otherwise the loads' default, evict-normal.
__device__ __forceinline__ uint64_t weight_policy(int evict_first) {
  uint64_t pol;
  if (evict_first)
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  else
    asm("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// One element (for the embedding row).
__device__ __forceinline__ float weight_at(const DevWeight& w, int64_t r, int64_t c) {
  const int64_t i = r * w.cols + c;
  switch (w.format) {
    case kF32:
      return reinterpret_cast<const float*>(w.q)[i];
    case kBF16:
      return __uint_as_float(uint32_t(reinterpret_cast<const uint16_t*>(w.q)[i]) << 16);
    case kQ8_0:
      return __half2float(reinterpret_cast<const __half*>(w.s)[i / 32]) * float(int8_t(w.q[i]));
    default: {
      const int64_t b = i / 32, j = i % 32;
      const uint8_t byte = w.q[b * 16 + (j & 15)];
      const float2 dm = __half22float2(reinterpret_cast<const __half2*>(w.s)[b]);
      return float(j < 16 ? byte & 15 : byte >> 4) * dm.x + dm.y;
    }
  }
}

// The 16-byte pieces of a row a lane reads, Loads at a time (Params::loads: 4 or 8): all of them are
// issued before any of their arithmetic, so each lane keeps Loads x 16 bytes in flight (a warp 2 KiB at
// 4). Each lane adds its pieces in the same order whatever Loads is, so the sums do not depend on it. A
// plain loop leaves it to the compiler whether the loads of an unrolled body go out together.
// q: the round's registers; loaded: its first round is already there (load_round before the task's
// wait for its producers, Params::preload), so only the later rounds are loaded here.
template <int kLoads>
__device__ __forceinline__ void load_round(const uint8_t* row, int n, int c0, uint64_t pol, uint4 (&q)[8]) {
#pragma unroll
  for (int u = 0; u < kLoads; ++u) {
    const int c = c0 + 32 * u;
    q[u] = c < n ? ld_weight(row + int64_t(c) * 16, pol) : make_uint4(0, 0, 0, 0);
  }
}
template <int kLoads, class Dot>
__device__ __forceinline__ float dot_pieces(const uint8_t* row, int n, int lane, Dot dot, uint64_t pol,
                                            uint4 (&q)[8], bool loaded) {
  float acc = 0;
  for (int c0 = lane; c0 < n; c0 += 32 * kLoads) {
    if (c0 != lane || !loaded) load_round<kLoads>(row, n, c0, pol, q);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int c = c0 + 32 * u;
      if (c < n) acc += dot(q[u], c);
    }
  }
  return acc;
}

// Piece c (8 bf16 values) of a row dotted with x[8c, 8c + 8).
__device__ __forceinline__ float dot_piece_bf16(const uint4& q, const float* __restrict__ x, int c) {
  const float4 a = *reinterpret_cast<const float4*>(x + c * 8);
  const float4 b = *reinterpret_cast<const float4*>(x + c * 8 + 4);
  float s = bf16_lo(q.x) * a.x + bf16_hi(q.x) * a.y + bf16_lo(q.y) * a.z + bf16_hi(q.y) * a.w;
  s += bf16_lo(q.z) * b.x + bf16_hi(q.z) * b.y + bf16_lo(q.w) * b.z + bf16_hi(q.w) * b.w;
  return s;
}

// Row r of W dotted with x (in shared memory), computed by one warp; every lane gets the sum. With
// slices > 1, only the columns of slice `slice` of `slices` equal parts (cols a multiple of 32 x slices,
// so each part is whole 16-byte pieces and whole blocks of 32); x is the whole input vector. q and
// loaded as in dot_pieces (loaded only for bf16).
template <int kLoads>
__device__ __forceinline__ float dot_row(const DevWeight& w, int64_t r, const float* __restrict__ x,
                                         int lane, int slice, int slices, uint64_t pol, uint4 (&q)[8],
                                         bool loaded = false) {
  float acc = 0;
  const int cols = w.cols / slices, c0 = slice * cols;  // this slice's columns: [c0, c0 + cols)
  x += c0;
  if (w.format == kBF16) {
    acc = dot_pieces<kLoads>(w.q + (r * int64_t(w.cols) + c0) * 2, cols / 8, lane,
                             [&](const uint4& q, int c) { return dot_piece_bf16(q, x, c); }, pol, q, loaded);
  } else if (w.format == kQ8_0) {
    const __half* sc = reinterpret_cast<const __half*>(w.s) + (r * int64_t(w.cols) + c0) / 32;
    acc = dot_pieces<kLoads>(w.q + r * int64_t(w.cols) + c0, cols / 16, lane, [&](const uint4& q, int c) {
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      float s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 a = *reinterpret_cast<const float4*>(x + c * 16 + 4 * k);
        s += float(int8_t(words[k])) * a.x + float(int8_t(words[k] >> 8)) * a.y +
             float(int8_t(words[k] >> 16)) * a.z + float(int8_t(words[k] >> 24)) * a.w;
      }
      return __half2float(sc[c / 2]) * s;
    }, pol, q, false);
  } else {  // Q4_1: a 16-byte piece is one block of 32
    const __half2* sc = reinterpret_cast<const __half2*>(w.s) + (r * int64_t(w.cols) + c0) / 32;
    acc = dot_pieces<kLoads>(w.q + (r * int64_t(w.cols) + c0) / 2, cols / 32, lane, [&](const uint4& q, int c) {
      const uint32_t words[4] = {q.x, q.y, q.z, q.w};
      const float* xb = x + c * 32;
      float sq = 0, sx = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 lo = *reinterpret_cast<const float4*>(xb + 4 * k);
        const float4 hi = *reinterpret_cast<const float4*>(xb + 16 + 4 * k);
        const uint32_t v = words[k];
        sq += float(v & 15) * lo.x + float((v >> 8) & 15) * lo.y + float((v >> 16) & 15) * lo.z +
              float((v >> 24) & 15) * lo.w;
        sq += float((v >> 4) & 15) * hi.x + float((v >> 12) & 15) * hi.y + float((v >> 20) & 15) * hi.z +
              float((v >> 28) & 15) * hi.w;
        sx += lo.x + lo.y + lo.z + lo.w + hi.x + hi.y + hi.z + hi.w;
      }
      const float2 dm = __half22float2(sc[c]);
      return dm.x * sq + dm.y * sx;
    }, pol, q, false);
  }
  return warp_sum(acc);
}

// Rows ra and rb of a bf16 W dotted with x by one warp, for a column slice of at most 128 pieces of 16
// bytes (4 per lane): the 8 loads of both rows go out before any arithmetic, twice the bytes in flight
// of one row with 4 loads, where a longer row would have given dot_pieces<8> the same. Each row's sum
// is the one dot_row computes (the same pieces, added in the same order), so the values do not change.
// load_row_pair issues the loads into q (row ra's pieces in q[0..3], rb's in q[4..7]); sum_row_pair
// adds them up, so that the loads of a task's first pair can go out before it waits for its producers.
__device__ __forceinline__ void load_row_pair_bf16(const DevWeight& w, int64_t ra, int64_t rb, int lane,
                                                   int slice, int slices, uint64_t pol, uint4 (&q)[8]) {
  const int cols = w.cols / slices, c0 = slice * cols, n = cols / 8;
  const uint8_t* row[2] = {w.q + (ra * int64_t(w.cols) + c0) * 2, w.q + (rb * int64_t(w.cols) + c0) * 2};
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = lane + 32 * u;
      q[4 * k + u] = c < n ? ld_weight(row[k] + int64_t(c) * 16, pol) : make_uint4(0, 0, 0, 0);
    }
}
__device__ __forceinline__ float2 sum_row_pair_bf16(const DevWeight& w, const float* __restrict__ x, int lane,
                                                    int slice, int slices, const uint4 (&q)[8]) {
  const int cols = w.cols / slices, c0 = slice * cols, n = cols / 8;
  x += c0;
  float acc[2] = {0.f, 0.f};
#pragma unroll
  for (int k = 0; k < 2; ++k)
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int c = lane + 32 * u;
      if (c < n) acc[k] += dot_piece_bf16(q[4 * k + u], x, c);
    }
  return make_float2(warp_sum(acc[0]), warp_sum(acc[1]));
}
// Logit v of row r as a key whose unsigned order is (v, then the smaller row first).
__device__ __forceinline__ unsigned long long argmax_key(float v, int r) {
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - uint32_t(r));
}

// Element e of head h of the attention output: its chunks' partials merged,
// o = sum_c exp(m_c - m) o_c / sum_c exp(m_c - m) l_c. Shared by the combine operation and the fused
// staging of the O projection, so both compute the same values.
__device__ __forceinline__ float combine_element(const Params& p, const float* partial_o, int h, int e) {
  const int chunks = p.attn_chunks, Dh = p.Dh;
  // Read from L2 (__ldcg): other blocks wrote the partials in this kernel, and this SM's L1 may hold the
  // same addresses from an earlier layer.
  // The loads of kCombineBatch chunks are issued before any of them is used (every chunk's partial is
  // written, an empty one as (-inf, 0) and zeros), so a head of c chunks costs 2 x ceil(c / 8) L2 round
  // trips, not one per chunk; the sums run over the chunks in order, as a loop of one chunk at a time.
  constexpr int kCombineBatch = 8;
  const float* ml = p.buf[kPartML] + int64_t(h) * chunks * 2;
  const float* po = partial_o + int64_t(h) * chunks * Dh;
  float m = -INFINITY;
  for (int c0 = 0; c0 < chunks; c0 += kCombineBatch) {
    float mv[kCombineBatch];
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) mv[u] = c0 + u < chunks ? __ldcg(ml + 2 * (c0 + u)) : -INFINITY;
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) m = fmaxf(m, mv[u]);
  }
  float l = 0, o = 0;
  for (int c0 = 0; c0 < chunks; c0 += kCombineBatch) {
    float mv[kCombineBatch], lv[kCombineBatch], ov[kCombineBatch];
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) {
      const int c = c0 + u < chunks ? c0 + u : c0;
      mv[u] = c0 + u < chunks ? __ldcg(ml + 2 * c) : -INFINITY;
      lv[u] = __ldcg(ml + 2 * c + 1);
      ov[u] = __ldcg(po + int64_t(c) * Dh + e);
    }
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u)
      if (mv[u] != -INFINITY) {
        const float w = __expf(mv[u] - m);
        l += w * lv[u];
        o += w * ov[u];
      }
  }
  return o / l;
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + __expf(-g)) * u; }

// The small operations are latency-bound: one block walks a few thousand values that sit in L2. A loop
// that loads, computes and stores one value per iteration pays a full L2 round trip per iteration (the
// compiler cannot move a load above a store that may alias it), about 10 us for 4,096 values; so each
// thread issues kBatch independent 16-byte loads before it uses any of them, and the block then needs
// one or two round trips per pass.
constexpr int kBatch = 4;

__device__ __forceinline__ float4 f4_load(const float* p, int i4, int n4) {
  return i4 < n4 ? reinterpret_cast<const float4*>(p)[i4] : make_float4(0, 0, 0, 0);
}

// out[i] = f(a[i], b[i]) for i < n by the whole block, float4 at a time, kBatch loads in flight per
// thread (a, b and out 16-byte aligned; a tail of n % 4 values goes one by one). b may be null: f then
// gets a[i] twice and only a is read.
template <class F>
__device__ __forceinline__ void map2_block(const float* __restrict__ a, const float* __restrict__ b, float* out,
                                           int n, F f) {
  const int n4 = n / 4;
  const float* bb = b ? b : a;
  for (int i0 = threadIdx.x; i0 < n4; i0 += kThreads * kBatch) {
    float4 x[kBatch], y[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = f4_load(a, i0 + u * kThreads, n4);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) y[u] = b ? f4_load(b, i0 + u * kThreads, n4) : x[u];
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (i0 + u * kThreads < n4)
        reinterpret_cast<float4*>(out)[i0 + u * kThreads] =
            make_float4(f(x[u].x, y[u].x), f(x[u].y, y[u].y), f(x[u].z, y[u].z), f(x[u].w, y[u].w));
  }
  for (int i = n4 * 4 + threadIdx.x; i < n; i += kThreads) out[i] = f(a[i], bb[i]);
}

// out[i] = in[i] * rsqrt(mean(in^2) + eps) * g[i] for i < n, by the whole block. Up to kThreads x kBatch
// float4 (4,096 values) in one pass: in and g are loaded together and kept in registers, one L2 round
// trip before the block's sum instead of one for in and another for in and g after it (the same sums in
// the same order as the two-pass loop below).
__device__ __forceinline__ void rmsnorm_block(const float* in, const float* g, float* out, int n, float eps,
                                              float* scratch) {
  const int n4 = n / 4;
  float ss = 0;
  if (n4 <= kThreads * kBatch) {
    float4 x[kBatch], w[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      x[u] = f4_load(in, threadIdx.x + u * kThreads, n4);
      w[u] = f4_load(g, threadIdx.x + u * kThreads, n4);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) ss += x[u].x * x[u].x + x[u].y * x[u].y + x[u].z * x[u].z + x[u].w * x[u].w;
    for (int i = n4 * 4 + threadIdx.x; i < n; i += kThreads) ss += in[i] * in[i];
    const float inv = rsqrtf(block_sum(ss, scratch) / float(n) + eps);
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (threadIdx.x + u * kThreads < n4)
        reinterpret_cast<float4*>(out)[threadIdx.x + u * kThreads] =
            make_float4(x[u].x * inv * w[u].x, x[u].y * inv * w[u].y, x[u].z * inv * w[u].z, x[u].w * inv * w[u].w);
    for (int i = n4 * 4 + threadIdx.x; i < n; i += kThreads) out[i] = in[i] * inv * g[i];
    return;
  }
  for (int i0 = threadIdx.x; i0 < n4; i0 += kThreads * kBatch) {
    float4 x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = f4_load(in, i0 + u * kThreads, n4);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) ss += x[u].x * x[u].x + x[u].y * x[u].y + x[u].z * x[u].z + x[u].w * x[u].w;
  }
  for (int i = n4 * 4 + threadIdx.x; i < n; i += kThreads) ss += in[i] * in[i];
  const float inv = rsqrtf(block_sum(ss, scratch) / float(n) + eps);
  map2_block(in, g, out, n, [inv](float x, float w) { return x * inv * w; });
}

// A task's operation and its weights' descriptors, copied into shared memory by thread 0 before the task
// waits for its producers. The wait's acquire invalidates the SM's L1, so reading them from the global
// tables after it would cost dependent L2 round trips (the op, then the weight it names, then the
// weight's values) on the chain of every dependency step.
struct TaskMeta {
  GpuOp op;
  DevWeight w;   // op.weight's, when op has one
  DevWeight nw;  // op.norm_weight's (a GEMV with the RMSNorm staged)
};

__device__ __forceinline__ void load_meta(const Params& p, const GpuTask& task, TaskMeta& m) {
  if (threadIdx.x != 0) return;
  m.op = p.ops[task.op];
  if (m.op.weight >= 0) m.w = p.weights[m.op.weight];
  if (m.op.norm_weight >= 0) m.nw = p.weights[m.op.norm_weight];
}

// The GEMV's input vector, into shared memory.
__device__ void stage_input(const Params& p, const GpuOp& op, const DevWeight& nw, float* xs) {
  __shared__ float scratch[kWarps];
  const float* in = p.buf[op.in0];
  switch (op.stage) {
    case Stage::plain:
      map2_block(in, nullptr, xs, op.cols, [](float x, float) { return x; });
      break;
    case Stage::rmsnorm:
      rmsnorm_block(in, reinterpret_cast<const float*>(nw.q), xs, op.cols, p.eps,
                    scratch);
      break;
    case Stage::silu_mul:
      map2_block(in, p.buf[op.in1], xs, op.cols, silu_mul);
      break;
    case Stage::attn_combine:
      for (int i = threadIdx.x; i < op.cols; i += kThreads)
        xs[i] = combine_element(p, in, i / p.Dh, i % p.Dh);
      break;
  }
  __syncthreads();
}

// The streamed GEMV's semaphores and counters: initialized once per kernel launch by the block.
__device__ __forceinline__ void init_stream(const Params& p, uint8_t* smem) {
  if (p.stream_depth == 0) return;
  auto* bars = reinterpret_cast<tile::semaphore*>(smem + p.ring_off);
  auto* seq = reinterpret_cast<uint32_t*>(smem + p.ring_off + kWarps * kMaxStreamDepth * 8);
  if (threadIdx.x < kWarps * kMaxStreamDepth) tile::init_semaphore(bars[threadIdx.x], 1);
  if (threadIdx.x < kWarps) seq[threadIdx.x] = 0;
  tile::fence_barrier_init();
  __syncthreads();
}

// Rows r0 + warp, r0 + warp + kWarps, ... < r1 of a bf16 W dotted with x, their weights streamed through
// shared memory by bulk copies (the TMA engine: the bytes in flight cost no registers, so a warp keeps
// stream_depth x stream_seg bytes loading, where register loads keep 2 KiB). Each warp streams its rows'
// segments through its own ring and is its own producer: once all its lanes have read a segment
// (__syncwarp), lane 0 refills that slot with the segment stream_depth ahead, so no barrier spans warps.
// The warp's sequence counter carries the ring's phases from one task to the next.
__device__ void gemv_rows_streamed(const Params& p, const DevWeight& w, int r0, int r1,
                                   const float* __restrict__ xs, float* __restrict__ out, bool accumulate,
                                   unsigned long long& best, uint8_t* smem) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int D = p.stream_depth;
  const uint32_t seg = uint32_t(p.stream_seg);
  auto* bars = reinterpret_cast<tile::semaphore*>(smem + p.ring_off) + warp * kMaxStreamDepth;
  auto* seqp = reinterpret_cast<uint32_t*>(smem + p.ring_off + kWarps * kMaxStreamDepth * 8) + warp;
  uint8_t* ring = smem + p.ring_off + kRingHeader + size_t(warp) * D * seg;
  const int64_t row_bytes = int64_t(w.cols) * 2;
  const int spr = int((row_bytes + seg - 1) / seg);  // segments per row
  const int nrows = r1 - r0 > warp ? (r1 - r0 - warp + kWarps - 1) / kWarps : 0;
  const int total = nrows * spr;
  const uint32_t q0 = *seqp;
  auto seg_bytes = [&](int s) { return uint32_t(min(int64_t(seg), row_bytes - int64_t(s) * seg)); };
  auto issue = [&](int i) {  // lane 0: segment i of this warp's stream into its slot
    const int row = r0 + warp + (i / spr) * kWarps, s = i % spr;
    const uint32_t bytes = seg_bytes(s);
    const int slot = int((q0 + uint32_t(i)) % uint32_t(D));
    tile::expect_bytes(bars[slot], bytes);
    tile::load_bulk(ring + size_t(slot) * seg, w.q + int64_t(row) * row_bytes + int64_t(s) * seg, bytes,
                    bars[slot]);
  };
  if (lane == 0)
    for (int i = 0; i < min(D, total); ++i) issue(i);
  float acc = 0;
  for (int i = 0; i < total; ++i) {
    const uint32_t q = q0 + uint32_t(i);
    const int slot = int(q % uint32_t(D)), s = i % spr;
    tile::wait(bars[slot], (q / uint32_t(D)) & 1u);
    const uint8_t* src = ring + size_t(slot) * seg;
    const float* x = xs + int64_t(s) * (seg / 2);
    const int pieces = int(seg_bytes(s) / 16);
    for (int c = lane; c < pieces; c += 32) {
      const uint4 qv = *reinterpret_cast<const uint4*>(src + c * 16);
      const float4 a = *reinterpret_cast<const float4*>(x + c * 8);
      const float4 b = *reinterpret_cast<const float4*>(x + c * 8 + 4);
      // The register path's order: the same lanes take the same 16-byte pieces (a segment is a multiple
      // of 32 pieces), and each piece is summed as one term.
      float t = bf16_lo(qv.x) * a.x + bf16_hi(qv.x) * a.y + bf16_lo(qv.y) * a.z + bf16_hi(qv.y) * a.w;
      t += bf16_lo(qv.z) * b.x + bf16_hi(qv.z) * b.y + bf16_lo(qv.w) * b.z + bf16_hi(qv.w) * b.w;
      acc += t;
    }
    if (s == spr - 1) {
      const float v = warp_sum(acc);
      acc = 0;
      const int row = r0 + warp + (i / spr) * kWarps;
      if (lane == 0) out[row] = accumulate ? out[row] + v : v;
      best = max(best, argmax_key(v, row));
    }
    __syncwarp();  // every lane has read the slot
    if (lane == 0 && i + D < total) issue(i + D);
  }
  if (lane == 0) *seqp = q0 + uint32_t(total);
  __syncwarp();
}

// Wide: the kernel has the registers for 8 loads in flight per lane (built for at most 3 blocks per SM).
// wait(): waits for the task's producers (a no-op in per-op mode). With Params::preload, a GEMV of
// paired bf16 rows issues the loads of its warps' first pair before it (weights do not depend on the
// producers), so that after the wait only the staging of the input vector stands between the producers
// and the first sums.
template <bool Wide, class Wait>
__device__ void task_gemv(const Params& p, const TaskMeta& m, int t, bool lm_head, float* smem, Wait wait) {
  const GpuOp& op = m.op;
  const DevWeight w = m.w;
  float* __restrict__ out = p.buf[op.out];
  float* xs = smem;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r0 = t * op.per_task, r1 = min(op.rows, r0 + op.per_task);
  const uint64_t pol = weight_policy(p.l2_evict_first);
  const bool streamed = p.stream_depth > 0 && w.format == kBF16;
  // Warp w takes column slice w % S of rows r0 + w / S, + 8 / S, ... (S = 1: whole rows); the slices'
  // sums meet in shared memory after the input vector and are added in slice order (the same sums
  // every run).
  const int S = op.slices, lanes = kWarps / S, slice = warp % S;
  // Slices of at most 4 pieces per lane: two rows at a time fill the 8 loads (load_row_pair_bf16); an
  // odd last row is paired with itself and the copy dropped.
  const bool paired = !streamed && Wide && p.loads == 8 && w.format == kBF16 && op.cols / S <= 8 * 128;
  // Only the paired rows preload: their tasks are a round or two of loads, where the first round is
  // most of the time after the wait; held across the staging, the registers of a longer row's first
  // round made the 2-block kernel spill.
  const bool pre = paired && p.preload && r0 + warp / S < r1;
  uint4 q[8];
  if (pre) {
    const int r = r0 + warp / S;
    load_row_pair_bf16(w, r, r + lanes < r1 ? r + lanes : r, lane, slice, S, pol, q);
  }
  wait();
  stage_input(p, op, m.nw, xs);
  unsigned long long best = 0;
  if (streamed) {
    gemv_rows_streamed(p, w, r0, r1, xs, out, op.accumulate, best, reinterpret_cast<uint8_t*>(smem));
  } else {
    float* part = xs + (op.cols + 3) / 4 * 4;
    if (paired) {
      for (int r = r0 + warp / S; r < r1; r += 2 * lanes) {
        const int rb = r + lanes < r1 ? r + lanes : r;
        if (r != r0 + warp / S || !pre) load_row_pair_bf16(w, r, rb, lane, slice, S, pol, q);
        const float2 v = sum_row_pair_bf16(w, xs, lane, slice, S, q);
        if (lane == 0) {
          part[(r - r0) * S + slice] = v.x;
          if (rb != r) part[(rb - r0) * S + slice] = v.y;
        }
      }
    } else {
      for (int r = r0 + warp / S; r < r1; r += lanes) {
        uint4 qr[8];
        const float v = Wide && p.loads == 8 ? dot_row<8>(w, r, xs, lane, slice, S, pol, qr)
                                             : dot_row<4>(w, r, xs, lane, slice, S, pol, qr);
        if (lane == 0) part[(r - r0) * S + slice] = v;
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < r1 - r0; i += kThreads) {
      float v = 0;
      for (int s = 0; s < S; ++s) v += part[i * S + s];
      out[r0 + i] = op.accumulate ? out[r0 + i] + v : v;
      best = max(best, argmax_key(v, r0 + i));
    }
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  }
  if (lm_head) {  // this task's best row, for the argmax operation
    __shared__ unsigned long long s_best[kWarps];
    if (lane == 0) s_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int i = 0; i < kWarps; ++i) best = max(best, s_best[i]);
      p.argmax_part[t] = best;
    }
  }
}

__device__ void task_rmsnorm(const Params& p, const GpuOp& op, const DevWeight& w, float* smem) {
  rmsnorm_block(p.buf[op.in0], reinterpret_cast<const float*>(w.q), p.buf[op.out], op.rows,
                p.eps, smem);
}

__device__ void task_embed(const Params& p, const GpuOp& op, const DevWeight& w) {
  const int pos = p.pos;
  int token = pos < p.prompt_end ? p.prompt[pos] : p.pred[pos - 1];
  token = min(max(token, 0), p.vocab - 1);  // the host checks fed ids; predictions are in range
  float* x = p.buf[op.out];
  for (int i0 = threadIdx.x; i0 < op.rows; i0 += kThreads * kBatch) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) v[u] = i0 + u * kThreads < op.rows ? weight_at(w, token, i0 + u * kThreads) : 0.f;
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (i0 + u * kThreads < op.rows) x[i0 + u * kThreads] = v[u];
  }
}

// A (query or key) pair rotated by the angle whose (cos, sin) is r: every place that applies RoPE calls
// this one expression, so that all of them round alike.
__device__ __forceinline__ float2 rope_pair(float2 x, float2 r) {
  return make_float2(x.x * r.x - x.y * r.y, x.y * r.x + x.x * r.y);
}

// Rotates the query and key pairs by the position's angles. The Dh / 2 angles (in double, as the CPU
// reference computes them) go into a table in shared memory first, then every pair is one float2 load,
// kBatch in flight per thread.
__device__ void task_rope(const Params& p, const GpuOp& op, float* smem) {
  const int half = p.Dh / 2, qpairs = p.H * half;
  float2* cs = reinterpret_cast<float2*>(smem);  // (cos, sin) per frequency
  for (int j = threadIdx.x; j < half; j += kThreads) {
    double s, c;
    sincos(double(p.pos) * p.rope_freq[j], &s, &c);
    cs[j] = make_float2(float(c), float(s));
  }
  __syncthreads();
  auto at = [&](int i) {
    float* v = i < qpairs ? p.buf[op.in0] : p.buf[op.in1];
    return reinterpret_cast<float2*>(v) + (i < qpairs ? i : i - qpairs);
  };
  for (int i0 = threadIdx.x; i0 < op.rows; i0 += kThreads * kBatch) {
    float2 x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) x[u] = i0 + u * kThreads < op.rows ? *at(i0 + u * kThreads) : make_float2(0, 0);
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= op.rows) continue;
      const float2 r = cs[(i < qpairs ? i : i - qpairs) % half];
      *at(i) = rope_pair(x[u], r);
    }
  }
  __syncthreads();  // the table is read before the block's next use of shared memory
}

// The fused modes' rope_append, a task per KV head g: RoPE on the query heads of g's group and on k's
// head g (the same rotation as task_rope), then head g's k and v into the cache as bf16.
__device__ void task_rope_append_head(const Params& p, const GpuOp& op, int g, float* smem) {
  const int half = p.Dh / 2, grp = p.H / p.HKV;
  float2* cs = reinterpret_cast<float2*>(smem);
  for (int j = threadIdx.x; j < half; j += kThreads) {
    double s, c;
    sincos(double(p.pos) * p.rope_freq[j], &s, &c);
    cs[j] = make_float2(float(c), float(s));
  }
  __syncthreads();
  float2* q = reinterpret_cast<float2*>(p.buf[op.in0] + int64_t(g) * grp * p.Dh);
  float* k = p.buf[op.in1] + int64_t(g) * p.Dh;
  const int qn = grp * half, n = qn + half;
  for (int i0 = threadIdx.x; i0 < n; i0 += kThreads * kBatch) {
    float2 x[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      x[u] = i < n ? (i < qn ? q[i] : reinterpret_cast<float2*>(k)[i - qn]) : make_float2(0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * kThreads;
      if (i >= n) continue;
      const float2 r = cs[(i < qn ? i : i - qn) % half];
      const float2 y = rope_pair(x[u], r);
      if (i < qn)
        q[i] = y;
      else
        reinterpret_cast<float2*>(k)[i - qn] = y;
    }
  }
  __syncthreads();  // k rotated; the table is read before the block's next use of shared memory
  const float* v = p.buf[op.out] + int64_t(g) * p.Dh;
  const int64_t at = (int64_t(op.layer) * p.context + p.pos) * (p.HKV * p.Dh) + int64_t(g) * p.Dh;
  for (int e = threadIdx.x; e < p.Dh; e += kThreads) {
    p.cache_k[at + e] = __float2bfloat16_rn(k[e]);
    p.cache_v[at + e] = __float2bfloat16_rn(v[e]);
  }
}

__device__ void kv_append(const Params& p, int layer, const float* k, const float* v) {
  const int kvw = p.HKV * p.Dh;
  const int64_t at = (int64_t(layer) * p.context + p.pos) * kvw;
  for (int i0 = threadIdx.x; i0 < kvw; i0 += kThreads * kBatch) {
    float a[kBatch], b[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = min(i0 + u * kThreads, kvw - 1);
      a[u] = k[i], b[u] = v[i];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (i0 + u * kThreads < kvw) {
        p.cache_k[at + i0 + u * kThreads] = __float2bfloat16_rn(a[u]);
        p.cache_v[at + i0 + u * kThreads] = __float2bfloat16_rn(b[u]);
      }
  }
}

__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float (&f)[8]) {
  f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
  f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
}

// One chunk's attention for a head dim that is a multiple of 32 (at most 256), every load independent
// of the others so that a chunk costs a few memory round trips rather than one per cache position:
// scores with Dh / 32 threads per position, each loading its 32 elements as four 16-byte pieces (all
// positions of a pass at once), summed over those threads by shuffles; then the exp-weighted sum of V
// with a thread per (16-byte piece of a row, group of positions), four positions' loads in flight per
// thread, the groups' sums added in group order. The cache is read with plain loads (it is written in
// the same kernel). Position `cur` (-1: none) reads its K and V rows from kcur / vcur instead (the
// position's own rows, in shared memory, when the attention applies RoPE and appends them itself).
__device__ void attention_chunk_batched(const Params& p, const __nv_bfloat16* K, const __nv_bfloat16* V,
                                        int kvw, int start, int end, const float* qs, float* sc, float* red,
                                        float* scratch, float* ml, float* po, int cur,
                                        const __nv_bfloat16* kcur, const __nv_bfloat16* vcur) {
  const int Dh = p.Dh, tpp = Dh / 32, sub = threadIdx.x % tpp, per_pass = kThreads / tpp;
  for (int j0 = start; j0 < end; j0 += per_pass) {
    const int j = j0 + int(threadIdx.x) / tpp;
    const bool in = j < end;
    const uint4* kp = reinterpret_cast<const uint4*>(j == cur ? kcur : K + int64_t(in ? j : start) * kvw) + sub * 4;
    uint4 kq[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) kq[u] = in ? kp[u] : make_uint4(0, 0, 0, 0);
    float s = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float f[8];
      bf16x8_to_float(kq[u], f);
      const float* q = qs + (sub * 4 + u) * 8;
#pragma unroll
      for (int e = 0; e < 8; ++e) s += f[e] * q[e];
    }
    for (int o = tpp / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (in && sub == 0) sc[j - start] = s;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < end - start; j += kThreads) m = fmaxf(m, sc[j]);
  m = block_max(m, scratch);
  float l = 0;
  for (int j = threadIdx.x; j < end - start; j += kThreads) {
    const float e = __expf(sc[j] - m);
    sc[j] = e;
    l += e;
  }
  l = block_sum(l, scratch);  // its barriers also publish sc
  const int np = Dh / 8, groups = kThreads / np, piece = threadIdx.x % np, grp = threadIdx.x / np;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  constexpr int kBatchV = 4;
  for (int j0 = start + grp; j0 < end; j0 += groups * kBatchV) {
    uint4 vv[kBatchV];
#pragma unroll
    for (int u = 0; u < kBatchV; ++u) {
      const int j = j0 + groups * u;
      vv[u] = j < end ? reinterpret_cast<const uint4*>(j == cur ? vcur : V + int64_t(j) * kvw)[piece]
                      : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kBatchV; ++u) {
      const int j = j0 + groups * u;
      if (j >= end) continue;
      const float w = sc[j - start];
      float f[8];
      bf16x8_to_float(vv[u], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[e] += w * f[e];
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) red[grp * Dh + piece * 8 + e] = acc[e];
  __syncthreads();
  for (int e = threadIdx.x; e < Dh; e += kThreads) {
    float o = 0;
    for (int k = 0; k < groups; ++k) o += red[k * Dh + e];
    po[e] = o;
  }
  if (threadIdx.x == 0) ml[0] = m, ml[1] = l;
}

// attention_partial's shared memory, in floats: the query (256), the scores (attn_chunk, at most
// kAttnMaxChunk), the groups' partial outputs (8 x kThreads), the reduction scratch (kWarps), then, for
// RoPE in the attention, the (cos, sin) table (128 float2) and the position's K and V rows (256 bf16
// each). The engine sizes the task kernel's shared memory with it.
constexpr int kAttnMaxChunk = 1024;
constexpr int kAttnSmemFloats = 256 + kAttnMaxChunk + 8 * kThreads + kWarps + 256 + 256;

// Decode attention of one query head over one chunk of the cache (split-KV): scores of the chunk's
// valid positions, their max m, sum l of exp(score - m) and the exp-weighted sum of V rows.
__device__ void attention_partial(const Params& p, const GpuOp& op, int t, float* smem) {
  const int Dh = p.Dh, chunks = p.attn_chunks, h = t / chunks, c = t % chunks;
  const int g = h / (p.H / p.HKV), kvw = p.HKV * Dh;
  const int start = c * p.attn_chunk, end = min(start + p.attn_chunk, p.pos + 1);
  float* ml = p.buf[kPartML] + (int64_t(h) * chunks + c) * 2;
  float* po = p.buf[op.out] + (int64_t(h) * chunks + c) * Dh;
  if (start >= end) {  // beyond the current position: an empty partial
    if (threadIdx.x == 0) ml[0] = -INFINITY, ml[1] = 0;
    for (int e = threadIdx.x; e < Dh; e += kThreads) po[e] = 0;
    return;
  }
  float* qs = smem;                // Dh
  float* sc = qs + 256;            // attn_chunk scores
  float* red = sc + p.attn_chunk;  // groups x Dh partial outputs (at most 8 x kThreads)
  float* scratch = red + 8 * kThreads;
  float2* cs = reinterpret_cast<float2*>(scratch + kWarps);             // op.rope: (cos, sin) per frequency
  auto* kcur = reinterpret_cast<__nv_bfloat16*>(cs + 128), *vcur = kcur + 256;  // op.rope: pos's K, V rows
  const float scale = rsqrtf(float(Dh));
  // The chunk that holds the position (end is then pos + 1) takes its K and V rows from kcur / vcur when
  // the attention applies RoPE itself; the cache is read only at earlier positions.
  const int cur = op.rope && end == p.pos + 1 ? p.pos : -1;
  if (op.rope) {
    // RoPE as task_rope_append_head computes it: the query head rotated, and in the position's chunk
    // the key head, rounded to bf16 as the cache stores it, with the value row. The group's first query
    // head appends them to the cache (one task per KV head and position writes it).
    const int half = Dh / 2;
    for (int j = threadIdx.x; j < half; j += kThreads) {
      double sn, cn;
      sincos(double(p.pos) * p.rope_freq[j], &sn, &cn);
      cs[j] = make_float2(float(cn), float(sn));
    }
    __syncthreads();
    const float2* q = reinterpret_cast<const float2*>(p.buf[op.in0] + int64_t(h) * Dh);
    for (int j = threadIdx.x; j < half; j += kThreads) {
      const float2 y = rope_pair(q[j], cs[j]);
      qs[2 * j] = y.x * scale;
      qs[2 * j + 1] = y.y * scale;
    }
    if (cur >= 0) {
      const float2* k = reinterpret_cast<const float2*>(p.buf[kK] + int64_t(g) * Dh);
      const float2* v = reinterpret_cast<const float2*>(p.buf[kV] + int64_t(g) * Dh);
      const bool append = h % (p.H / p.HKV) == 0;
      const int64_t at = (int64_t(op.layer) * p.context + p.pos) * kvw + int64_t(g) * Dh;
      for (int j = threadIdx.x; j < half; j += kThreads) {
        const float2 x = rope_pair(k[j], cs[j]), y = v[j];
        const __nv_bfloat162 kb = __floats2bfloat162_rn(x.x, x.y);
        const __nv_bfloat162 vb = __floats2bfloat162_rn(y.x, y.y);
        reinterpret_cast<__nv_bfloat162*>(kcur)[j] = kb;
        reinterpret_cast<__nv_bfloat162*>(vcur)[j] = vb;
        if (append) {
          reinterpret_cast<__nv_bfloat162*>(p.cache_k + at)[j] = kb;
          reinterpret_cast<__nv_bfloat162*>(p.cache_v + at)[j] = vb;
        }
      }
    }
  } else {
    for (int e = threadIdx.x; e < Dh; e += kThreads) qs[e] = p.buf[op.in0][h * Dh + e] * scale;
  }
  __syncthreads();
  const __nv_bfloat16* K = p.cache_k + int64_t(op.layer) * p.context * kvw + g * Dh;
  const __nv_bfloat16* V = p.cache_v + int64_t(op.layer) * p.context * kvw + g * Dh;
  if (Dh % 32 == 0 && Dh <= 256) {
    attention_chunk_batched(p, K, V, kvw, start, end, qs, sc, red, scratch, ml, po, cur, kcur, vcur);
    return;
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, pairs = Dh / 2;
  for (int j = start + warp; j < end; j += kWarps) {
    const __nv_bfloat162* k = reinterpret_cast<const __nv_bfloat162*>(j == cur ? kcur : K + int64_t(j) * kvw);
    float s = 0;
    for (int e = lane; e < pairs; e += 32) {
      const float2 kv = __bfloat1622float2(k[e]);
      s += kv.x * qs[2 * e] + kv.y * qs[2 * e + 1];
    }
    s = warp_sum(s);
    if (lane == 0) sc[j - start] = s;
  }
  __syncthreads();
  float m = -INFINITY;
  for (int j = threadIdx.x; j < end - start; j += kThreads) m = fmaxf(m, sc[j]);
  m = block_max(m, scratch);
  float l = 0;
  for (int j = threadIdx.x; j < end - start; j += kThreads) {
    const float e = __expf(sc[j] - m);
    sc[j] = e;
    l += e;
  }
  l = block_sum(l, scratch);  // its barriers also publish sc
  const int groups = kThreads / pairs, grp = threadIdx.x / pairs, e2 = threadIdx.x % pairs;
  float2 acc = {0, 0};
  if (grp < groups)
    for (int j = start + grp; j < end; j += groups) {
      const float2 v =
          __bfloat1622float2(reinterpret_cast<const __nv_bfloat162*>(j == cur ? vcur : V + int64_t(j) * kvw)[e2]);
      const float w = sc[j - start];
      acc.x += w * v.x, acc.y += w * v.y;
    }
  if (grp < groups) red[grp * Dh + 2 * e2] = acc.x, red[grp * Dh + 2 * e2 + 1] = acc.y;
  __syncthreads();
  for (int e = threadIdx.x; e < Dh; e += kThreads) {
    float o = 0;
    for (int k = 0; k < groups; ++k) o += red[k * Dh + e];
    po[e] = o;
  }
  if (threadIdx.x == 0) ml[0] = m, ml[1] = l;
}

// The attention task: its chunk's partial, then (Combine::last_task) a count of the head's finished
// chunks; the task that finishes the head's last chunk merges all of them into op.combine. Release: the
// block's partial writes, the fence, then the count; acquire: the count, the fence, L2 reads.
__device__ void task_attention(const Params& p, const GpuOp& op, int t, float* smem) {
  attention_partial(p, op, t, smem);
  if (op.combine < 0) return;
  const int h = t / p.attn_chunks;
  __shared__ int s_last;
  __syncthreads();  // every thread's partial writes are issued
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long done = atomicAdd(p.head_done + int64_t(op.layer) * p.H + h, 1ull) + 1;
    s_last = done == p.epoch * static_cast<unsigned long long>(p.attn_chunks);
    if (s_last) __threadfence();
  }
  __syncthreads();
  if (s_last)
    for (int e = threadIdx.x; e < p.Dh; e += kThreads)
      p.buf[op.combine][h * p.Dh + e] = combine_element(p, p.buf[op.out], h, e);
}

__device__ void task_attn_combine(const Params& p, const GpuOp& op, int h) {
  for (int e = threadIdx.x; e < p.Dh; e += kThreads)
    p.buf[op.out][h * p.Dh + e] = combine_element(p, p.buf[op.in0], h, e);
}

__device__ void task_elementwise(const Params& p, const GpuOp& op, int t) {
  const int b = t * op.per_task, e = min(op.rows, b + op.per_task);
  float* out = p.buf[op.out];
  const float* a = p.buf[op.in0];
  const bool add = op.kind == OpKind::add;
  const float* c = add ? out : p.buf[op.in1];
  for (int i0 = b + threadIdx.x; i0 < e; i0 += kThreads * kBatch) {
    float x[kBatch], y[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = min(i0 + u * kThreads, e - 1);
      x[u] = a[i], y[u] = c[i];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (i0 + u * kThreads < e) out[i0 + u * kThreads] = add ? y[u] + x[u] : silu_mul(x[u], y[u]);
  }
}

__device__ void task_argmax(const Params& p, const GpuOp& op, float* smem) {
  unsigned long long best = 0;
  for (int i = threadIdx.x; i < op.rows; i += kThreads) best = max(best, p.argmax_part[i]);
  auto* s = reinterpret_cast<unsigned long long*>(smem);
  s[threadIdx.x] = best;
  __syncthreads();
  for (int k = kThreads / 2; k; k >>= 1) {
    if (threadIdx.x < k) s[threadIdx.x] = max(s[threadIdx.x], s[threadIdx.x + k]);
    __syncthreads();
  }
  if (threadIdx.x == 0) p.pred[p.pos] = int32_t(0xffffffffu - uint32_t(s[0] & 0xffffffffu));
}

// Starts loading rows [r0, r1) of `w` into L2, at most `max_bytes` of them (< 0: all): the bulk-copy
// engine's prefetch, 64 KiB at a time, issued by the calling thread; a hint that changes no value.
__device__ void prefetch_rows_l2(const DevWeight& w, int r0, int r1, int64_t max_bytes) {
  const int64_t row_bytes = w.format == kBF16 ? int64_t(w.cols) * 2 : w.format == kQ8_0 ? w.cols : w.cols / 2;
  const uint8_t* base = w.q + r0 * row_bytes;
  int64_t bytes = (r1 - r0) * row_bytes;  // rows are 16-byte multiples (the shapes check)
  if (max_bytes >= 0) bytes = min(bytes, max_bytes & ~int64_t(15));
  constexpr int64_t kPiece = 1 << 16;
  for (int64_t off = 0; off < bytes; off += kPiece) {
    const uint32_t n = uint32_t(min(kPiece, bytes - off));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n) : "memory");
  }
}

// l2_prefetch: rows [t x per_task, + per_task) of the first op.rows rows of op.weight, by thread 0.
__device__ void task_l2_prefetch(const TaskMeta& m, int t) {
  if (threadIdx.x != 0) return;
  const int r0 = t * m.op.per_task;
  prefetch_rows_l2(m.w, r0, min(m.op.rows, r0 + m.op.per_task), -1);
}

// wait(): waits for the task's producers; every kind calls it before it reads what they wrote (the GEMV
// after issuing its first weight loads).
template <bool Wide, class Wait>
__device__ void run_task(const Params& p, const GpuTask& task, const TaskMeta& m, float* smem, Wait wait) {
  const GpuOp& op = m.op;
  if (op.kind == OpKind::gemv) {
    task_gemv<Wide>(p, m, task.index, task.op == p.lm_head_op, smem, wait);
    return;
  }
  wait();
  switch (op.kind) {
    case OpKind::embed:
      task_embed(p, op, m.w);
      break;
    case OpKind::rmsnorm:
      task_rmsnorm(p, op, m.w, smem);
      break;
    case OpKind::gemv:  // above
      break;
    case OpKind::rope:
      task_rope(p, op, smem);
      break;
    case OpKind::kv_append:
      kv_append(p, op.layer, p.buf[op.in0], p.buf[op.in1]);
      break;
    case OpKind::rope_append:
      task_rope_append_head(p, op, task.index, smem);
      break;
    case OpKind::attention:
      task_attention(p, op, task.index, smem);
      break;
    case OpKind::attn_combine:
      task_attn_combine(p, op, task.index);
      break;
    case OpKind::add:
    case OpKind::silu_mul:
      task_elementwise(p, op, task.index);
      break;
    case OpKind::argmax:
      task_argmax(p, op, smem);
      break;
    case OpKind::l2_prefetch:
      task_l2_prefetch(m, task.index);
      break;
  }
}

// Starts streaming a GEMV task's weight rows from HBM into L2 (the bulk-copy engine's prefetch, no
// registers or shared memory involved) before the task waits for its producers, so that the weights of
// the next layer load while the current one finishes. A hint: correctness does not depend on it.
// At most p.prefetch_bytes of the task's rows (< 0: all of them): every resident block prefetches for
// the task it holds, so the bytes in L2 at once are up to workers x that bound, and a bound too large
// for L2 (396 blocks x a 200 KB task is 80 MB, against 50 MB of L2) evicts rows before they are read,
// which then come from HBM twice.
__device__ void prefetch_weights(const Params& p, const TaskMeta& m, int t) {
  if (threadIdx.x != 0) return;  // before any read of m: thread 0 has just written it, unpublished
  const GpuOp& op = m.op;
  if (op.kind != OpKind::gemv || p.prefetch_bytes == 0) return;
  const int r0 = t * op.per_task;
  prefetch_rows_l2(m.w, r0, min(op.rows, r0 + op.per_task), p.prefetch_bytes);
}

// Waits until every producer of `op` has finished its tasks for this position. Acquire loads by one
// thread, then the block barrier orders the whole block's reads after them. A wait that never ends
// (a schedule bug) traps after 10 s instead of hanging the GPU.
__device__ void wait_for_producers(const Params& p, const GpuOp& op) {
  if (threadIdx.x == 0) {
    const unsigned long long t0 = global_ns();
    for (int i = 0; i < op.dep_count; ++i) {
      const GpuOp& dep = p.ops[p.deps[op.dep_begin + i]];
      const unsigned long long target = p.epoch * static_cast<unsigned long long>(dep.tasks);
      const unsigned long long* counter = p.done + p.deps[op.dep_begin + i];
      while (ld_acquire(counter) < target) {
        __nanosleep(64);
        if (global_ns() - t0 > 10000000000ull) __trap();
      }
    }
  }
  __syncthreads();
}

__device__ void finish_task(const Params& p, const GpuTask& task) {
  __syncthreads();  // every thread's writes of the task are issued
  if (threadIdx.x == 0) {
    __threadfence();
    atomicAdd(p.done + task.op, 1ull);
  }
}

}  // namespace mp::cuda::dev
