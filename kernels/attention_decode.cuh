// Split-KV decode attention (1 to 16 query rows against a long cache): a block takes one slice of one KV
// head's cache and up to 16 query rows of that head's group (its query heads times the query rows), so the
// slice is read from memory once for all of them. K and V stream through a shared-memory ring of 64-key
// chunks filled by cp.async several chunks ahead of the compute (the copies, not the compute, set the
// pace); each of the block's four warps takes 16 keys of a chunk and keeps its own online softmax:
// S = Q K^T and O^T += V^T P^T on mma.sync (bf16 in, fp32 accumulators), P passed from the first
// product's accumulators to the second's B operand in registers. At the end of its slice a block merges
// its warps, writes the slice's normalized O and log2-sum-exp to a workspace, and the block that finishes
// a (batch, KV head, row group) last (a counter in global memory) combines the slices into O and the LSE,
// so one launch does the whole decode. The slices, the ring's depth (a kernel instance per residency) and
// the grid come from attention_decode_plan (kernels/attention.h). Included once, by attention_sm90.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "tile/sync.cuh"
#include "tile/warp.cuh"

namespace mp::kernels {
namespace {

// Per-stream, grow-only device buffers for the kernels' fp32 partials (slot: which buffer). With `zeroed`,
// a buffer is cleared when it is allocated (the decode's counters, which every launch leaves at zero).
void* attention_workspace(cudaStream_t stream, size_t bytes, int slot, bool zeroed = false) {
  struct entry {
    cudaStream_t s;
    int slot;
    void* p;
    size_t bytes;
  };
  thread_local std::vector<entry> ws;
  auto clear = [&](void* p) {
    if (zeroed && cudaMemsetAsync(p, 0, bytes, stream) != cudaSuccess)
      fail_user("attention: clearing a ", bytes, "-byte workspace failed");
  };
  for (auto& e : ws)
    if (e.s == stream && e.slot == slot) {
      if (e.bytes < bytes) {
        if (cudaFreeAsync(e.p, stream) != cudaSuccess || cudaMallocAsync(&e.p, bytes, stream) != cudaSuccess)
          fail_user("attention: allocating a ", bytes, "-byte workspace failed");
        e.bytes = bytes;
        clear(e.p);
      }
      return e.p;
    }
  void* p = nullptr;
  if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess)
    fail_user("attention: allocating a ", bytes, "-byte workspace failed");
  clear(p);
  ws.push_back({stream, slot, p, bytes});
  return p;
}

constexpr int decode_threads = 128, decode_warps = decode_threads / 32,
              decode_rows = attention_decode_block_rows;
template <int D, int BPS>
constexpr AttentionDecodeRing decode_ring = attention_decode_ring(D, BPS);

struct decode_params {
  const __nv_bfloat16 *q, *k, *v;
  __nv_bfloat16* o;
  float* lse;         // may be null
  float* part_o;      // (batch, heads, seq_q, splits, dim): each slice's normalized O (splits > 1)
  float* part_lse;    // (batch, heads, seq_q, splits): each slice's log2-sum-exp (log2 domain)
  unsigned* counter;  // (batch, kv_heads * row_groups): slices done; the last one resets it to 0
  int heads, kv_heads, group, seq_q, seq_kv, splits, row_groups;
  int chunks;  // 64-key chunks of the cache; slice i takes [i * chunks / splits, (i + 1) * chunks / splits)
  int causal;
  float scale_log2;
};

// ---- the instructions, one wrapper each ----
__device__ inline uint32_t decode_smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
// 16 bytes global -> shared, bypassing L1; with in == false the 16 bytes are zero-filled and nothing is read.
__device__ inline void decode_cp_async16(uint32_t dst, const void* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(in ? 16 : 0)
               : "memory");
}
__device__ inline void decode_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ inline void decode_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Four 8x8 b16 matrices, matrix i's rows at the addresses of lanes 8i..8i+7; lane l gets row l/4, columns
// 2(l%4), +1 of each (the mma.sync A / B fragment of a row-major tile).
__device__ inline void decode_ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// The same, transposed: lane l gets rows 2(l%4), +1 of column l/4.
__device__ inline void decode_ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c (16x8 fp32) += a (16x16 bf16, row-major fragment) * b (16x8 bf16, column fragment).
__device__ inline void decode_mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ inline uint32_t decode_pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// NT: 8-row tiles of O^T (1 for at most 8 rows per block, the GQA group of one decode step; else 2).
// BPS: resident blocks per SM, which sets the ring's depth (attention_decode_ring).
//
// Per warp and 16 keys (the warp's quarter of a chunk), g = lane / 4, q = lane % 4:
//   S = Q K^T: m16n8k16 with M = the block's 16 rows (Q from shared, rows past `rows` zero), N = 8 keys
//     (two tiles), K = 16 dims per step; accumulator sc[tile] holds rows g (0, 1) and g + 8 (2, 3) at
//     keys 8 tile + 2q, +1.
//   O^T += V^T P^T: M = 16 dims (D / 16 tiles, V^T by ldmatrix.trans from the key-major chunk), N = 8 rows,
//     K = the 16 keys. The B fragment wants rows g and keys 2q, +1 (and + 8): exactly S's accumulators of
//     rows g (n-tile 0) or g + 8 (n-tile 1), so P goes from one product to the other in registers.
//     o[t][u] holds dims 16t + g (0, 1) and + 8 (2, 3), rows 8u + 2q (0, 2) and + 1 (1, 3).
template <int D, int NT, int BPS>
__global__ void __launch_bounds__(decode_threads, BPS) attn_decode_split(const decode_params p) {
  constexpr AttentionDecodeRing ring = decode_ring<D, BPS>;
  constexpr int C = ring.chunk_keys, S = ring.stages;
  constexpr int P = D + 8;    // padded row (bf16): the 8 rows of an ldmatrix 16 bytes apart mod 128, no
                              // bank conflicts
  constexpr int V16 = D / 8;  // 16-byte vectors per row
  constexpr int KT = D / 16;  // k-steps of S = m-tiles of O^T
  constexpr int stage_elems = 2 * C * P;
  constexpr int copies = C * V16 / decode_threads;  // 16-byte copies per thread per chunk, K and V each
  static_assert(C == 16 * decode_warps && copies * decode_threads == C * V16,
                "decode: chunk and block sizes");
  static_assert(S >= 2 && S * 2 * C * P * 2 + decode_rows * P * 2 + 1024 == ring.smem_bytes,
                "decode: the ring's shared-memory layout");
  static_assert(decode_warps * decode_rows * D * 4 <= S * stage_elems * 2 &&
                    decode_rows * attention_decode_max_splits * 4 <= S * stage_elems * 2,
                "decode: the merge and combine scratch must fit in the ring");
  static_assert(NT == 1 || NT == 2);
  extern __shared__ __align__(128) unsigned char decode_smem[];
  __nv_bfloat16* ring_s = reinterpret_cast<__nv_bfloat16*>(decode_smem);
  __nv_bfloat16* qs = ring_s + S * stage_elems;
  float* mw = reinterpret_cast<float*>(qs + decode_rows * P);  // [warp][row]: each warp's running max
  float* lw = mw + decode_warps * decode_rows;                 // [warp][row]: and its sum
  float* cm = lw + decode_warps * decode_rows;                 // [row]: the combine's max
  int* last_flag = reinterpret_cast<int*>(cm + decode_rows);
  float* scratch = reinterpret_cast<float*>(decode_smem);  // the ring, once the slice is read

  // Launched with programmatic stream serialization, the block may start while the previous kernel in the
  // stream runs: nothing global (Q, the cache, the workspace, O) is touched before it has finished.
  mp::tile::grid_dependency_wait();
  const int split = blockIdx.x;
  const int hk = blockIdx.y / p.row_groups, rg = blockIdx.y % p.row_groups;
  const int b = blockIdx.z;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, q4 = lane % 4;
  const int rows = min(decode_rows, p.group * p.seq_q - rg * decode_rows);
  // Row r of the block: query head hk * group + hq, query row i, with hq * seq_q + i = rg * decode_rows + r.
  auto row_index = [&](int r) {  // flat (batch, head, i) index
    const int rr = rg * decode_rows + r;
    const int h = hk * p.group + rr / p.seq_q, i = rr % p.seq_q;
    return (size_t(b) * p.heads + h) * size_t(p.seq_q) + i;
  };
  // The slice's keys (AttentionDecodePlan::first_key): whole chunks, dealt evenly, none empty.
  const int begin = int(1ll * split * p.chunks / p.splits) * C;
  const int end = min(p.seq_kv, int(1ll * (split + 1) * p.chunks / p.splits) * C);
  auto limit = [&](int r) {  // keys [begin, limit) that row r sees in this slice
    if (r >= rows) return begin;
    if (!p.causal) return end;
    const int i = (rg * decode_rows + r) % p.seq_q;
    return min(end, i + p.seq_kv - p.seq_q + 1);
  };
  const int chunks = end > begin ? (end - begin + C - 1) / C : 0;
  const size_t kv_base = (size_t(b) * p.kv_heads + hk) * size_t(p.seq_kv) * D;
  const __nv_bfloat16* kg = p.k + kv_base;
  const __nv_bfloat16* vg = p.v + kv_base;
  auto issue = [&](int j) {  // chunk j of the slice into stage j % S (keys past the slice: zeros), one group
    if (j < chunks) {
      const uint32_t ks = decode_smem_addr(ring_s + (j % S) * stage_elems), vs = ks + C * P * 2;
      const int key0 = begin + j * C;
#pragma unroll
      for (int u = 0; u < copies; ++u) {
        const int e = t + u * decode_threads, r = e / V16, c = e % V16;
        const bool in = key0 + r < end;
        const size_t off = size_t(in ? key0 + r : begin) * D + 8 * c;
        const uint32_t at = uint32_t((r * P + 8 * c) * 2);
        decode_cp_async16(ks + at, kg + off, in);
        decode_cp_async16(vs + at, vg + off, in);
      }
    }
    decode_cp_async_commit();  // an empty group past the end keeps the group count uniform
  };
#pragma unroll
  for (int j = 0; j < S - 1; ++j) issue(j);
  // Q after the first chunks' copies, so that its load latency overlaps theirs (the loop's first barrier
  // publishes it).
  for (int e = t; e < decode_rows * V16; e += decode_threads) {
    const int r = e / V16, c = e % V16;
    *reinterpret_cast<uint4*>(&qs[r * P + 8 * c]) =
        r < rows ? reinterpret_cast<const uint4*>(p.q + row_index(r) * D)[c] : make_uint4(0, 0, 0, 0);
  }

  const int lim0 = limit(g), lim1 = limit(g + 8);
  float m0 = -INFINITY, m1 = -INFINITY;  // running max of rows g, g + 8 (log2 domain, quad-uniform)
  float l0 = 0.f, l1 = 0.f;              // running sums, this lane's share
  float o[KT][NT][4];
#pragma unroll
  for (int tt = 0; tt < KT; ++tt)
#pragma unroll
    for (int u = 0; u < NT; ++u)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[tt][u][x] = 0.f;
  // ldmatrix row addresses: Q rows ((lane / 8) % 2) * 8 + lane % 8, dims (lane / 16) * 8; K and V keys
  // 16 warp + (lane / 16) * 8 + lane % 8, dims ((lane / 8) % 2) * 8 (see the fragment map above).
  const uint32_t q_addr =
      decode_smem_addr(qs) + uint32_t(((((lane / 8) % 2) * 8 + lane % 8) * P + (lane / 16) * 8) * 2);
  const uint32_t kv_off = uint32_t(((16 * warp + (lane / 16) * 8 + lane % 8) * P + ((lane / 8) % 2) * 8) * 2);

  for (int j = 0; j < chunks; ++j) {
    decode_cp_async_wait<S - 2>();  // this thread's copies of chunk j have landed
    __syncthreads();                // everyone's have, and everyone is done with chunk j - 1's stage
    issue(j + S - 1);               // into that stage
    const uint32_t ks = decode_smem_addr(ring_s + (j % S) * stage_elems), vs = ks + C * P * 2;
    float sc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      uint32_t a[4], kb[4];
      decode_ldsm_x4(a, q_addr + kk * 32);
      decode_ldsm_x4(kb, ks + kv_off + kk * 32);
      decode_mma(sc[0], a, kb[0], kb[1]);
      decode_mma(sc[1], a, kb[2], kb[3]);
    }
    // Mask (keys past the row's limit) and scale; the running max over the warp's keys so far.
    const int key_base = begin + j * C + 16 * warp + 2 * q4;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        const int key = key_base + 8 * tile + (x & 1);
        const bool in = key < (x < 2 ? lim0 : lim1);
        sc[tile][x] = in ? sc[tile][x] * p.scale_log2 : -INFINITY;
        if (x < 2)
          mx0 = fmaxf(mx0, sc[tile][x]);
        else
          mx1 = fmaxf(mx1, sc[tile][x]);
      }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    const float n0 = fmaxf(m0, mx0), use0 = n0 == -INFINITY ? 0.f : n0;
    const float alpha0 = exp2f(m0 - use0);  // 0 while the row has seen no key (m0 = -inf)
    m0 = n0;
    float alpha1 = 1.f, use1 = 0.f;
    if constexpr (NT == 2) {
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      const float n1 = fmaxf(m1, mx1);
      use1 = n1 == -INFINITY ? 0.f : n1;
      alpha1 = exp2f(m1 - use1);
      m1 = n1;
    }
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int tile = 0; tile < 2; ++tile)
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        if (x < 2) {
          sc[tile][x] = mp::tile::exp2_ftz(sc[tile][x] - use0);
          sum0 += sc[tile][x];
        } else if (NT == 2) {
          sc[tile][x] = mp::tile::exp2_ftz(sc[tile][x] - use1);
          sum1 += sc[tile][x];
        }
      }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
    // O^T's columns are rows 2q, 2q + 1 (+ 8): their rescale factors from the lanes that hold those rows.
    float al[NT][2];
    al[0][0] = __shfl_sync(0xffffffffu, alpha0, 8 * q4);
    al[0][1] = __shfl_sync(0xffffffffu, alpha0, 8 * q4 + 4);
    if constexpr (NT == 2) {
      al[NT - 1][0] = __shfl_sync(0xffffffffu, alpha1, 8 * q4);
      al[NT - 1][1] = __shfl_sync(0xffffffffu, alpha1, 8 * q4 + 4);
    }
    uint32_t pb[NT][2];
    pb[0][0] = decode_pack_bf16(sc[0][0], sc[0][1]);
    pb[0][1] = decode_pack_bf16(sc[1][0], sc[1][1]);
    if constexpr (NT == 2) {
      pb[NT - 1][0] = decode_pack_bf16(sc[0][2], sc[0][3]);
      pb[NT - 1][1] = decode_pack_bf16(sc[1][2], sc[1][3]);
    }
#pragma unroll
    for (int tt = 0; tt < KT; ++tt) {
      uint32_t a[4];
      decode_ldsm_x4_trans(a, vs + kv_off + tt * 32);
#pragma unroll
      for (int u = 0; u < NT; ++u) {
        o[tt][u][0] *= al[u][0];
        o[tt][u][1] *= al[u][1];
        o[tt][u][2] *= al[u][0];
        o[tt][u][3] *= al[u][1];
        decode_mma(o[tt][u], a, pb[u][0], pb[u][1]);
      }
    }
  }
  decode_cp_async_wait<0>();
  // The cache is read: the next grid in the stream, if it was launched for it, may start being scheduled
  // (it waits in its own dependency wait until this grid has finished).
  mp::tile::allow_dependent_launch();
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  __syncthreads();  // the ring is free: it becomes the merge's scratch
  if (q4 == 0) {
    mw[warp * decode_rows + g] = m0, lw[warp * decode_rows + g] = l0;
    mw[warp * decode_rows + g + 8] = m1, lw[warp * decode_rows + g + 8] = l1;
  }
  __syncthreads();
  // Merge the warps: the block's max and sum per row, each warp's O^T scaled into scratch[warp][row][dim].
  auto block_max = [&](int r) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < decode_warps; ++w) m = fmaxf(m, mw[w * decode_rows + r]);
    return m;
  };
  auto block_sum = [&](int r, float m) {  // m: block_max(r), not -inf
    float l = 0.f;
#pragma unroll
    for (int w = 0; w < decode_warps; ++w) {
      const float mv = mw[w * decode_rows + r];
      l += mv == -INFINITY ? 0.f : lw[w * decode_rows + r] * exp2f(mv - m);
    }
    return l;
  };
#pragma unroll
  for (int u = 0; u < NT; ++u)
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int r = 8 * u + 2 * q4 + x;
      const float m = block_max(r), mine = mw[warp * decode_rows + r];
      float f = 0.f;
      if (m != -INFINITY && mine != -INFINITY) {
        const float l = block_sum(r, m);
        f = l > 0.f ? exp2f(mine - m) / l : 0.f;
      }
      float* out = scratch + (warp * decode_rows + r) * D;
#pragma unroll
      for (int tt = 0; tt < KT; ++tt) {
        out[16 * tt + g] = o[tt][u][x] * f;
        out[16 * tt + g + 8] = o[tt][u][x + 2] * f;
      }
    }
  __syncthreads();
  // The slice's normalized O (row r, dims 4 d4 ..): the sum over the warps. With one slice it is the result.
  const bool single = p.splits == 1;
  for (int e = t; e < rows * (D / 4); e += decode_threads) {
    const int r = e / (D / 4), d4 = e % (D / 4);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < decode_warps; ++w) {
      const float4 v = reinterpret_cast<const float4*>(scratch + (w * decode_rows + r) * D)[d4];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
    if (single) {
      __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.o + row_index(r) * D) + 2 * d4;
      out[0] = __floats2bfloat162_rn(acc.x, acc.y);
      out[1] = __floats2bfloat162_rn(acc.z, acc.w);
    } else {
      reinterpret_cast<float4*>(p.part_o + (row_index(r) * p.splits + split) * D)[d4] = acc;
    }
  }
  if (t < rows) {
    const float m = block_max(t), l = m == -INFINITY ? 0.f : block_sum(t, m);
    const float lse2 = l > 0.f ? m + log2f(l) : -INFINITY;  // a slice the row does not see: -inf
    if (!single)
      p.part_lse[row_index(t) * p.splits + split] = lse2;
    else if (p.lse)
      p.lse[row_index(t)] = lse2 == -INFINITY ? -INFINITY : lse2 * 0.69314718055994531f;
  }
  if (single) return;

  // The last slice of this (batch, KV head, row group) to finish combines them all: the slices' O weighted
  // by 2^(lse_s - lse), the row's LSE in natural log.
  __threadfence();  // this block's partials are visible before its count is
  __syncthreads();
  const unsigned counter = unsigned(b) * gridDim.y + blockIdx.y;
  if (t == 0) *last_flag = atomicAdd(&p.counter[counter], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!*last_flag) return;
  __threadfence();
  // The weights, one warp per row (rows w, w + 4, ...) and two slices per lane (lane, lane + 32): every
  // row's log2-sum-exps loaded at once, the max and the sum by shuffles, so the combine's path is one
  // round trip to L2 here and one per 16 slices below (not a loop over the slices per row).
  constexpr int row_steps = decode_rows / decode_warps;
  float* wts = scratch;  // [row][attention_decode_max_splits]; zero past the slice count
  float la[row_steps], lb[row_steps];
#pragma unroll
  for (int i = 0; i < row_steps; ++i) {
    const int r = warp + i * decode_warps;
    la[i] = lb[i] = -INFINITY;
    if (r < rows) {
      const float* src = p.part_lse + row_index(r) * p.splits;
      if (lane < p.splits) la[i] = __ldcg(src + lane);
      if (lane + 32 < p.splits) lb[i] = __ldcg(src + lane + 32);
    }
  }
#pragma unroll
  for (int i = 0; i < row_steps; ++i) {
    const int r = warp + i * decode_warps;
    if (r >= rows) continue;  // warp-uniform
    float m = fmaxf(la[i], lb[i]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    const float ea = m == -INFINITY ? 0.f : exp2f(la[i] - m), eb = m == -INFINITY ? 0.f : exp2f(lb[i] - m);
    float total = ea + eb;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) total += __shfl_xor_sync(0xffffffffu, total, off);
    const float inv = total > 0.f ? 1.f / total : 0.f;  // a row that sees no key: weights 0, O = 0
    wts[r * attention_decode_max_splits + lane] = ea * inv;
    wts[r * attention_decode_max_splits + lane + 32] = eb * inv;
    if (lane == 0 && p.lse)
      p.lse[row_index(r)] = m == -INFINITY ? -INFINITY : (m + log2f(total)) * 0.69314718055994531f;
  }
  __syncthreads();
  // O: each thread one (row, 4 dims) at a time, its slices' partials loaded 16 at once.
  constexpr int batch_loads = 16;
  for (int e = t; e < rows * (D / 4); e += decode_threads) {
    const int r = e / (D / 4), d4 = e % (D / 4);
    const float4* src = reinterpret_cast<const float4*>(p.part_o + row_index(r) * p.splits * D) + d4;
    const float* w = wts + r * attention_decode_max_splits;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < p.splits; s0 += batch_loads) {
      float4 v[batch_loads];
#pragma unroll
      for (int k = 0; k < batch_loads; ++k)
        v[k] = s0 + k < p.splits ? __ldcg(src + size_t(s0 + k) * (D / 4)) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int k = 0; k < batch_loads; ++k) {
        const float wk = s0 + k < p.splits ? w[s0 + k] : 0.f;
        acc.x += wk * v[k].x, acc.y += wk * v[k].y, acc.z += wk * v[k].z, acc.w += wk * v[k].w;
      }
    }
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.o + row_index(r) * D) + 2 * d4;
    out[0] = __floats2bfloat162_rn(acc.x, acc.y);
    out[1] = __floats2bfloat162_rn(acc.z, acc.w);
  }
  if (t == 0) p.counter[counter] = 0u;  // ready for the next launch on this stream
}

cudaError_t launch_decode(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                          float* lse, float scale, bool causal, const AttentionDecodePlan& plan, bool pdl,
                          cudaStream_t stream) {
  decode_params p{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.o = static_cast<__nv_bfloat16*>(o);
  p.lse = lse;
  p.heads = s.heads, p.kv_heads = s.kv_heads, p.group = s.group(), p.seq_q = s.seq_q, p.seq_kv = s.seq_kv;
  p.splits = plan.splits, p.chunks = plan.chunks, p.row_groups = plan.row_groups;
  p.causal = causal;
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  MP_USER_CHECK(1ll * s.kv_heads * p.row_groups < 65536 && s.batch < 65536, "attention decode: ", s.str(),
                " needs more blocks than a launch grid has (batch and kv_heads * row groups below 65536)");
  MP_INTERNAL_CHECK(p.splits >= 1 && p.splits <= attention_decode_max_splits && p.splits <= p.chunks,
                    "attention decode: ", p.splits, " slices of ", p.chunks, " chunks");
  if (p.splits > 1) {
    const size_t rows = s.lse_elems();
    p.part_o = static_cast<float*>(attention_workspace(stream, rows * p.splits * s.dim * sizeof(float), 0));
    p.part_lse = static_cast<float*>(attention_workspace(stream, rows * p.splits * sizeof(float), 1));
    p.counter = static_cast<unsigned*>(attention_workspace(
        stream, size_t(s.batch) * s.kv_heads * p.row_groups * sizeof(unsigned), 4, /*zeroed=*/true));
  }
  const dim3 grid(unsigned(p.splits), unsigned(s.kv_heads * p.row_groups), unsigned(s.batch));
  auto go = [&]<int D, int NT, int BPS>() -> cudaError_t {
    constexpr int smem = decode_ring<D, BPS>.smem_bytes;
    static const cudaError_t attr = cudaFuncSetAttribute(attn_decode_split<D, NT, BPS>,
                                                         cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (attr != cudaSuccess) return attr;
    if (!pdl) {
      attn_decode_split<D, NT, BPS><<<grid, decode_threads, smem, stream>>>(p);
      return cudaGetLastError();
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid, cfg.blockDim = dim3(decode_threads), cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at, cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, attn_decode_split<D, NT, BPS>, p);
  };
  // One instance per (dim, row tiles, residency) that attention_decode_residency_built names.
  static_assert(attention_decode_residency_built(64, 2) && attention_decode_residency_built(128, 1) &&
                attention_decode_residency_built(128, 2) && attention_decode_residency_built(128, 3) &&
                attention_decode_residency_built(256, 1));
  const bool narrow = p.group * p.seq_q <= 8;
  const int bps = plan.ring.blocks_per_sm;
  MP_INTERNAL_CHECK(attention_decode_residency_built(s.dim, bps), "attention decode: residency ", bps);
  if (s.dim == 64) return narrow ? go.template operator()<64, 1, 2>() : go.template operator()<64, 2, 2>();
  if (s.dim == 128) {
    if (bps == 1) return narrow ? go.template operator()<128, 1, 1>() : go.template operator()<128, 2, 1>();
    if (bps == 3) return narrow ? go.template operator()<128, 1, 3>() : go.template operator()<128, 2, 3>();
    return narrow ? go.template operator()<128, 1, 2>() : go.template operator()<128, 2, 2>();
  }
  return narrow ? go.template operator()<256, 1, 1>() : go.template operator()<256, 2, 1>();
}
}  // namespace
}  // namespace mp::kernels
