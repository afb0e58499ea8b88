// Split-KV decode attention (1 to 16 query rows against a long cache) on CUDA cores: a block takes one
// slice of one KV head's cache and the query rows of that head's group (its query heads times the query
// rows, attention_decode_block_rows at a time), so the slice is read from memory once for all of them.
// Keys go through shared memory in chunks of 64 with 16-byte loads, the next chunk's loads in flight
// (registers) while the current one is computed; each block writes its slice's O (normalized) and
// log2-sum-exp to a workspace, and a combine kernel weighs the slices by their LSEs. Memory-bound at 1 to
// 4 rows per KV head; with many rows per block the score and P V loops on CUDA cores become the limit.
// Included once, by attention_sm90.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <vector>

#include "core/error.h"
#include "kernels/attention.h"

namespace mp::kernels {
namespace {

// Per-stream, grow-only device buffers for the kernels' fp32 partials (slot: which buffer).
void* attention_workspace(cudaStream_t stream, size_t bytes, int slot) {
  struct entry {
    cudaStream_t s;
    int slot;
    void* p;
    size_t bytes;
  };
  thread_local std::vector<entry> ws;
  for (auto& e : ws)
    if (e.s == stream && e.slot == slot) {
      if (e.bytes < bytes) {
        if (cudaFreeAsync(e.p, stream) != cudaSuccess || cudaMallocAsync(&e.p, bytes, stream) != cudaSuccess)
          fail_user("attention: allocating a ", bytes, "-byte workspace failed");
        e.bytes = bytes;
      }
      return e.p;
    }
  void* p = nullptr;
  if (cudaMallocAsync(&p, bytes, stream) != cudaSuccess)
    fail_user("attention: allocating a ", bytes, "-byte workspace failed");
  ws.push_back({stream, slot, p, bytes});
  return p;
}

// Two blocks per SM for D <= 128 (__launch_bounds__ below): a memory-bound kernel needs the warps in flight.
constexpr int decode_chunk = 64, decode_threads = 256, decode_rows = attention_decode_block_rows;

struct decode_params {
  const __nv_bfloat16 *q, *k, *v;
  float* part_o;    // (batch, heads, seq_q, splits, dim): each slice's normalized O
  float* part_lse;  // (batch, heads, seq_q, splits): each slice's log2-sum-exp (log2 domain)
  int heads, kv_heads, group, seq_q, seq_kv, splits, slice, row_groups;
  int causal;
  float scale_log2;
};

template <int D>
constexpr int decode_smem_bytes =
    2 * (decode_rows + 2 * decode_chunk) * (D + 8) + decode_rows*(decode_chunk + 1) * 4 + 3 * decode_rows * 4;

template <int D>
__global__ void __launch_bounds__(decode_threads, D <= 128 ? 2 : 1) attn_decode_split(const decode_params p) {
  constexpr int P = D + 8;    // padded row (bf16): rows 16 bytes apart modulo 128, so 16-byte reads of 8
                              // consecutive rows hit different banks
  constexpr int V16 = D / 8;  // 16-byte vectors per row
  constexpr int vec_per_thread = decode_chunk * V16 / decode_threads;
  constexpr int pairs_per_thread = decode_rows * (D / 2) / decode_threads;
  static_assert(vec_per_thread >= 1 && pairs_per_thread >= 1, "decode: chunk and block sizes");
  // Dynamic shared memory (decode_smem_bytes<D>): Q rows, the K and V chunk, the scores, per-row state.
  extern __shared__ __align__(16) unsigned char decode_smem[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(decode_smem);
  __nv_bfloat16* ks = qs + decode_rows * P;
  __nv_bfloat16* vs = ks + decode_chunk * P;
  auto ss = reinterpret_cast<float(*)[decode_chunk + 1]>(vs + decode_chunk * P);
  float* ms = &ss[decode_rows][0];
  float* ls = ms + decode_rows;
  float* as = ls + decode_rows;

  const int split = blockIdx.x;
  const int hk = blockIdx.y / p.row_groups, rg = blockIdx.y % p.row_groups;
  const int b = blockIdx.z;
  const int t = threadIdx.x;
  const int total_rows = p.group * p.seq_q;
  const int rows = min(decode_rows, total_rows - rg * decode_rows);
  // Row r of the block: query head hk * group + hq, query row i, with hq * seq_q + i = rg * decode_rows + r.
  auto row_index = [&](int r) {  // flat (batch, head, i) index
    const int rr = rg * decode_rows + r;
    const int h = hk * p.group + rr / p.seq_q, i = rr % p.seq_q;
    return (size_t(b) * p.heads + h) * size_t(p.seq_q) + i;
  };
  auto visible = [&](int r) {  // keys [0, visible) for row r
    if (!p.causal) return p.seq_kv;
    const int i = (rg * decode_rows + r) % p.seq_q;
    return max(0, min(p.seq_kv, i + p.seq_kv - p.seq_q + 1));
  };
  for (int e = t; e < rows * V16; e += decode_threads) {
    const int r = e / V16, c = e % V16;
    *reinterpret_cast<uint4*>(&qs[r * P + 8 * c]) = reinterpret_cast<const uint4*>(p.q + row_index(r) * D)[c];
  }
  for (int r = t; r < decode_rows; r += decode_threads) {
    ms[r] = -INFINITY;
    ls[r] = 0.f;
  }
  const int begin = split * p.slice, end = min(p.seq_kv, begin + p.slice);
  const size_t kv_base = (size_t(b) * p.kv_heads + hk) * size_t(p.seq_kv);
  const uint4* kg = reinterpret_cast<const uint4*>(p.k + kv_base * D);
  const uint4* vg = reinterpret_cast<const uint4*>(p.v + kv_base * D);
  uint4 kr[vec_per_thread], vr[vec_per_thread];
  auto fetch = [&](int key0) {  // the chunk at key0 into registers (zeros past the end)
#pragma unroll
    for (int u = 0; u < vec_per_thread; ++u) {
      const int e = t + u * decode_threads, key = key0 + e / V16;
      const bool in = key < end;
      kr[u] = in ? kg[size_t(key) * V16 + e % V16] : make_uint4(0, 0, 0, 0);
      vr[u] = in ? vg[size_t(key) * V16 + e % V16] : make_uint4(0, 0, 0, 0);
    }
  };
  float2 o[pairs_per_thread];
#pragma unroll
  for (int u = 0; u < pairs_per_thread; ++u) o[u] = float2{0.f, 0.f};
  if (begin < end) fetch(begin);
  for (int key0 = begin; key0 < end; key0 += decode_chunk) {
    __syncthreads();  // the previous chunk's readers are done with ks, vs, ss
#pragma unroll
    for (int u = 0; u < vec_per_thread; ++u) {
      const int e = t + u * decode_threads, r = e / V16, c = e % V16;
      *reinterpret_cast<uint4*>(&ks[r * P + 8 * c]) = kr[u];
      *reinterpret_cast<uint4*>(&vs[r * P + 8 * c]) = vr[u];
    }
    __syncthreads();
    if (key0 + decode_chunk < end) fetch(key0 + decode_chunk);  // in flight while this chunk is computed
    // Scores: thread t takes key c = t % 64 for rows t / 64, + 4, + 8, ...
    {
      const int c = t % decode_chunk, r0 = t / decode_chunk;
      constexpr int rsteps = decode_rows * decode_chunk / decode_threads;
      float acc[rsteps];
#pragma unroll
      for (int u = 0; u < rsteps; ++u) acc[u] = 0.f;
#pragma unroll 4
      for (int d8 = 0; d8 < V16; ++d8) {
        const uint4 kv = *reinterpret_cast<const uint4*>(&ks[c * P + 8 * d8]);
        const __nv_bfloat162* k2 = reinterpret_cast<const __nv_bfloat162*>(&kv);
        float2 kf[4];
#pragma unroll
        for (int x = 0; x < 4; ++x) kf[x] = __bfloat1622float2(k2[x]);
#pragma unroll
        for (int u = 0; u < rsteps; ++u) {
          const int r = r0 + u * (decode_threads / decode_chunk);
          if (r >= rows) break;
          const uint4 qv = *reinterpret_cast<const uint4*>(&qs[r * P + 8 * d8]);
          const __nv_bfloat162* q2 = reinterpret_cast<const __nv_bfloat162*>(&qv);
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            const float2 qf = __bfloat1622float2(q2[x]);
            acc[u] = fmaf(qf.x, kf[x].x, fmaf(qf.y, kf[x].y, acc[u]));
          }
        }
      }
#pragma unroll
      for (int u = 0; u < rsteps; ++u) {
        const int r = r0 + u * (decode_threads / decode_chunk);
        if (r >= rows) break;
        ss[r][c] = key0 + c < min(end, visible(r)) ? acc[u] * p.scale_log2 : -INFINITY;
      }
    }
    __syncthreads();
    // The online softmax: a warp per row.
    {
      const int warp = t / 32, lane = t % 32;
      for (int r = warp; r < rows; r += decode_threads / 32) {
        const float s0 = ss[r][lane], s1 = ss[r][lane + 32];
        float mx = fmaxf(s0, s1);
#pragma unroll
        for (int x = 16; x >= 1; x /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, x));
        const float m_old = ms[r], m_new = fmaxf(m_old, mx);
        const float m_use = m_new == -INFINITY ? 0.f : m_new;
        const float p0 = exp2f(s0 - m_use), p1 = exp2f(s1 - m_use);
        float sum = p0 + p1;
#pragma unroll
        for (int x = 16; x >= 1; x /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, x);
        ss[r][lane] = p0;
        ss[r][lane + 32] = p1;
        __syncwarp();
        if (lane == 0) {
          const float alpha = exp2f(m_old - m_use);
          as[r] = alpha;
          ls[r] = ls[r] * alpha + sum;
          ms[r] = m_new;
        }
      }
    }
    __syncthreads();
    // O = alpha O + P V: thread t owns the pairs (row, 2 d) numbered t, t + 256, ...
#pragma unroll
    for (int u = 0; u < pairs_per_thread; ++u) {
      const int e = t + u * decode_threads, r = e / (D / 2), d2 = e % (D / 2);
      if (r >= rows) break;
      float2 acc = o[u];
      const float alpha = as[r];
      acc.x *= alpha;
      acc.y *= alpha;
      // Unrolled so that the shared loads of later keys issue while earlier FMAs wait.
#pragma unroll 16
      for (int c = 0; c < decode_chunk; ++c) {
        const float pc = ss[r][c];
        const float2 vf = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&vs[c * P + 2 * d2]));
        acc.x = fmaf(pc, vf.x, acc.x);
        acc.y = fmaf(pc, vf.y, acc.y);
      }
      o[u] = acc;
    }
  }
  __syncthreads();
  // The slice's normalized O and its log2-sum-exp (a slice no row sees: O = 0, -inf).
#pragma unroll
  for (int u = 0; u < pairs_per_thread; ++u) {
    const int e = t + u * decode_threads, r = e / (D / 2), d2 = e % (D / 2);
    if (r >= rows) break;
    const float l = ls[r], inv = l > 0.f ? 1.f / l : 0.f;
    float* out = p.part_o + (row_index(r) * p.splits + split) * D;
    *reinterpret_cast<float2*>(out + 2 * d2) = float2{o[u].x * inv, o[u].y * inv};
  }
  for (int r = t; r < rows; r += decode_threads)
    p.part_lse[row_index(r) * p.splits + split] = ls[r] > 0.f ? ms[r] + log2f(ls[r]) : -INFINITY;
}

// One block per query row: the slices' O weighted by 2^(lse_s - lse), the row's LSE in natural log.
template <int D>
__global__ void __launch_bounds__(128) attn_decode_combine(const float* part_o, const float* part_lse,
                                                           __nv_bfloat16* o, float* lse, int splits) {
  const size_t row = blockIdx.x;
  const float* pl = part_lse + row * splits;
  float m = -INFINITY;
  for (int s = 0; s < splits; ++s) m = fmaxf(m, pl[s]);
  float total = 0.f;
  if (m != -INFINITY)
    for (int s = 0; s < splits; ++s) total += exp2f(pl[s] - m);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.f;
    if (m != -INFINITY)
      for (int s = 0; s < splits; ++s) acc += exp2f(pl[s] - m) * part_o[(row * splits + s) * D + d];
    o[row * D + d] = __float2bfloat16_rn(total > 0.f ? acc / total : 0.f);
  }
  if (lse && threadIdx.x == 0)
    lse[row] = m == -INFINITY ? -INFINITY : (m + log2f(total)) * 0.69314718055994531f;
}

cudaError_t launch_decode(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                          float* lse, float scale, bool causal, int splits, cudaStream_t stream) {
  decode_params p{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.heads = s.heads, p.kv_heads = s.kv_heads, p.group = s.group(), p.seq_q = s.seq_q, p.seq_kv = s.seq_kv;
  p.splits = splits;
  p.slice = ((s.seq_kv + splits - 1) / splits + decode_chunk - 1) / decode_chunk * decode_chunk;
  p.row_groups = (p.group * p.seq_q + decode_rows - 1) / decode_rows;
  p.causal = causal;
  p.scale_log2 = float(double(scale) * 1.4426950408889634);
  const size_t rows = s.lse_elems();
  p.part_o = static_cast<float*>(attention_workspace(stream, rows * splits * s.dim * sizeof(float), 0));
  p.part_lse = static_cast<float*>(attention_workspace(stream, rows * splits * sizeof(float), 1));
  MP_USER_CHECK(1ll * s.kv_heads * p.row_groups < 65536 && s.batch < 65536, "attention decode: ", s.str(),
                " needs more blocks than a launch grid has (batch and kv_heads * row groups below 65536)");
  const dim3 grid(unsigned(splits), unsigned(s.kv_heads * p.row_groups), unsigned(s.batch));
  auto go = [&]<int D>() -> cudaError_t {
    static const cudaError_t attr = cudaFuncSetAttribute(
        attn_decode_split<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, decode_smem_bytes<D>);
    if (attr != cudaSuccess) return attr;
    attn_decode_split<D><<<grid, decode_threads, decode_smem_bytes<D>, stream>>>(p);
    attn_decode_combine<D><<<unsigned(rows), 128, 0, stream>>>(p.part_o, p.part_lse,
                                                               static_cast<__nv_bfloat16*>(o), lse, splits);
    return cudaGetLastError();
  };
  if (s.dim == 64) return go.template operator()<64>();
  if (s.dim == 128) return go.template operator()<128>();
  return go.template operator()<256>();
}

}  // namespace
}  // namespace mp::kernels
