// The attention backward, written for correctness first, on CUDA cores: D = rowsum(dO * O) per query row;
// then a block per (batch, KV head, tile of 32 keys) walks every query row of the head's group that sees
// the tile, recomputes P = exp(scale * q k^T - LSE) for its keys, and accumulates dV += P^T dO and
// dK += dS^T Q in registers (dS = P * (dO V^T - D)), summing the group's query heads in the block, while
// dQ += dS K goes to an fp32 buffer by atomics; a last pass rounds dQ to bf16. No tensor cores: it is the
// reference-speed path the wgmma backward will be measured against. Included once, by attention_sm90.cu.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/attention.h"
#include "kernels/attention_decode.cuh"  // attention_workspace

namespace mp::kernels {
namespace {

constexpr int bwd_keys = 32, bwd_threads = 256;

struct bwd_params {
  const __nv_bfloat16 *q, *k, *v, *o, *d_o;
  const float* lse;
  float* delta;   // (batch, heads, seq_q)
  float* dq_acc;  // like Q, fp32
  __nv_bfloat16 *dk, *dv;
  int heads, kv_heads, group, seq_q, seq_kv, causal;
  float scale;
};

// One warp per query row: delta = sum_d dO * O.
template <int D>
__global__ void __launch_bounds__(256) attn_bwd_delta(const bwd_params p, size_t rows) {
  const size_t row = blockIdx.x * size_t(8) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int d = lane; d < D; d += 32)
    acc += __bfloat162float(p.d_o[row * D + d]) * __bfloat162float(p.o[row * D + d]);
  for (int x = 16; x >= 1; x /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, x);
  if (lane == 0) p.delta[row] = acc;
}

template <int D>
constexpr int bwd_smem_bytes = (2 * bwd_keys * (D + 1) + 2 * D + 2 * bwd_keys) * 4;

template <int D>
__global__ void __launch_bounds__(bwd_threads) attn_bwd_kv(const bwd_params p) {
  constexpr int per_thread = bwd_keys * D / bwd_threads;  // dK and dV elements each thread owns
  constexpr int parts = bwd_threads / bwd_keys;           // threads per key in the dot products
  extern __shared__ __align__(16) float bwd_smem[];
  float* kf = bwd_smem;                 // [bwd_keys][D + 1]
  float* vf = kf + bwd_keys * (D + 1);  // [bwd_keys][D + 1]
  float* qf = vf + bwd_keys * (D + 1);  // [D]
  float* dof = qf + D;                  // [D]
  float* ps = dof + D;                  // [bwd_keys]
  float* dss = ps + bwd_keys;           // [bwd_keys]
  const int t = threadIdx.x;
  const int j0 = blockIdx.x * bwd_keys, hk = blockIdx.y, b = blockIdx.z;
  const size_t kv_row0 = (size_t(b) * p.kv_heads + hk) * size_t(p.seq_kv);
  for (int e = t; e < bwd_keys * D; e += bwd_threads) {
    const int j = e / D, d = e % D;
    const bool in = j0 + j < p.seq_kv;
    kf[j * (D + 1) + d] = in ? __bfloat162float(p.k[(kv_row0 + j0 + j) * D + d]) : 0.f;
    vf[j * (D + 1) + d] = in ? __bfloat162float(p.v[(kv_row0 + j0 + j) * D + d]) : 0.f;
  }
  float dk[per_thread], dv[per_thread];
#pragma unroll
  for (int u = 0; u < per_thread; ++u) dk[u] = dv[u] = 0.f;
  const int offset = p.seq_kv - p.seq_q;
  // With the causal mask, row i sees key j0 from i = j0 - offset on.
  const int i_first = p.causal ? max(0, j0 - offset) : 0;
  for (int hq = 0; hq < p.group; ++hq) {
    const int h = hk * p.group + hq;
    for (int i = i_first; i < p.seq_q; ++i) {
      const size_t row = (size_t(b) * p.heads + h) * size_t(p.seq_q) + i;
      __syncthreads();  // the previous row's readers of qf, dof, ps, dss are done
      for (int d = t; d < D; d += bwd_threads) {
        qf[d] = __bfloat162float(p.q[row * D + d]);
        dof[d] = __bfloat162float(p.d_o[row * D + d]);
      }
      __syncthreads();
      {
        const int j = t / parts, part = t % parts;
        float s = 0.f, dp = 0.f;
        for (int d = part; d < D; d += parts) {
          s = fmaf(qf[d], kf[j * (D + 1) + d], s);
          dp = fmaf(dof[d], vf[j * (D + 1) + d], dp);
        }
#pragma unroll
        for (int x = parts / 2; x >= 1; x /= 2) {
          s += __shfl_xor_sync(0xffffffffu, s, x);
          dp += __shfl_xor_sync(0xffffffffu, dp, x);
        }
        if (part == 0) {
          const int key = j0 + j;
          const bool valid = key < p.seq_kv && (!p.causal || key <= i + offset);
          const float pr = valid ? __expf(s * p.scale - p.lse[row]) : 0.f;
          ps[j] = pr;
          dss[j] = pr * (dp - p.delta[row]);
        }
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < per_thread; ++u) {
        const int e = t + u * bwd_threads, j = e / D, d = e % D;
        dv[u] = fmaf(ps[j], dof[d], dv[u]);
        dk[u] = fmaf(dss[j], qf[d], dk[u]);
      }
      for (int d = t; d < D; d += bwd_threads) {
        float acc = 0.f;
#pragma unroll 8
        for (int j = 0; j < bwd_keys; ++j) acc = fmaf(dss[j], kf[j * (D + 1) + d], acc);
        if (acc != 0.f) atomicAdd(&p.dq_acc[row * D + d], acc * p.scale);
      }
    }
  }
#pragma unroll
  for (int u = 0; u < per_thread; ++u) {
    const int e = t + u * bwd_threads, j = e / D, d = e % D;
    if (j0 + j >= p.seq_kv) continue;
    p.dk[(kv_row0 + j0 + j) * D + d] = __float2bfloat16_rn(dk[u] * p.scale);
    p.dv[(kv_row0 + j0 + j) * D + d] = __float2bfloat16_rn(dv[u]);
  }
}

__global__ void attn_bwd_dq_round(const float* acc, __nv_bfloat16* dq, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    dq[i] = __float2bfloat16_rn(acc[i]);
}

// The backward's setup shared by both implementations: the parameters, the workspace (D and the fp32
// dQ buffer, zeroed) and the D = rowsum(dO * O) kernel.
inline cudaError_t backward_prologue(bwd_params& p, const AttentionShape& s, const void* q, const void* k,
                                     const void* v, const void* o, const float* lse, const void* d_o,
                                     void* dk, void* dv, float scale, bool causal, cudaStream_t stream) {
  p = bwd_params{};
  p.q = static_cast<const __nv_bfloat16*>(q);
  p.k = static_cast<const __nv_bfloat16*>(k);
  p.v = static_cast<const __nv_bfloat16*>(v);
  p.o = static_cast<const __nv_bfloat16*>(o);
  p.d_o = static_cast<const __nv_bfloat16*>(d_o);
  p.lse = lse;
  p.dk = static_cast<__nv_bfloat16*>(dk);
  p.dv = static_cast<__nv_bfloat16*>(dv);
  p.heads = s.heads, p.kv_heads = s.kv_heads, p.group = s.group(), p.seq_q = s.seq_q, p.seq_kv = s.seq_kv;
  p.causal = causal;
  p.scale = scale;
  const size_t rows = s.lse_elems();
  p.delta = static_cast<float*>(attention_workspace(stream, rows * sizeof(float), 2));
  p.dq_acc = static_cast<float*>(attention_workspace(stream, s.q_elems() * sizeof(float), 3));
  if (cudaError_t e = cudaMemsetAsync(p.dq_acc, 0, s.q_elems() * sizeof(float), stream); e != cudaSuccess)
    return e;
  const unsigned blocks = unsigned((rows + 7) / 8);
  if (s.dim == 64)
    attn_bwd_delta<64><<<blocks, 256, 0, stream>>>(p, rows);
  else if (s.dim == 128)
    attn_bwd_delta<128><<<blocks, 256, 0, stream>>>(p, rows);
  else
    attn_bwd_delta<256><<<blocks, 256, 0, stream>>>(p, rows);
  return cudaGetLastError();
}

// dQ from the fp32 buffer to bf16.
inline cudaError_t backward_epilogue(const bwd_params& p, const AttentionShape& s, void* dq,
                                     cudaStream_t stream) {
  attn_bwd_dq_round<<<1024, 256, 0, stream>>>(p.dq_acc, static_cast<__nv_bfloat16*>(dq), s.q_elems());
  return cudaGetLastError();
}

// The CUDA-core backward (attention_backward_impl::cuda_core).
cudaError_t launch_backward(const AttentionShape& s, const void* q, const void* k, const void* v,
                            const void* o, const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                            float scale, bool causal, cudaStream_t stream) {
  MP_USER_CHECK(s.kv_heads < 65536 && s.batch < 65536, "attention backward: ", s.str(),
                " needs more blocks than a launch grid has (batch and kv_heads below 65536)");
  bwd_params p;
  if (cudaError_t e = backward_prologue(p, s, q, k, v, o, lse, d_o, dk, dv, scale, causal, stream);
      e != cudaSuccess)
    return e;
  const dim3 grid(unsigned((s.seq_kv + bwd_keys - 1) / bwd_keys), unsigned(s.kv_heads), unsigned(s.batch));
  auto go = [&]<int D>() -> cudaError_t {
    static const cudaError_t attr =
        cudaFuncSetAttribute(attn_bwd_kv<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, bwd_smem_bytes<D>);
    if (attr != cudaSuccess) return attr;
    attn_bwd_kv<D><<<grid, bwd_threads, bwd_smem_bytes<D>, stream>>>(p);
    return cudaGetLastError();
  };
  cudaError_t e = s.dim == 64    ? go.template operator()<64>()
                  : s.dim == 128 ? go.template operator()<128>()
                                 : go.template operator()<256>();
  return e != cudaSuccess ? e : backward_epilogue(p, s, dq, stream);
}

}  // namespace
}  // namespace mp::kernels
