// Which SMs are near which half of the L2 (bench/RESULTS.md, GEMM): the latency of the same
// lines differs by the reading SM, and the SMs fall into two groups of 66 on the H200. One block per SM
// (all resident at once: each waits for its turn on a global counter, in block order); thread 0 reads 256
// fixed lines through L2 (ld.global.cg), 16 dependent reads of each line, in two rounds, and times each
// round. Prints, one SM per line, its id and the cycles of both rounds for every line:
//   smid round1[0..255] | round2[0..255]
// (Placing tiles by L2 half from it did not pay: bench/RESULTS.md, GEMM.)
//   usage: build/bench/gemm/l2_partition_probe (built with the benchmarks; needs a GPU)
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

constexpr int lines = 256;

__device__ __forceinline__ unsigned long long clk() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t)::"memory");
  return t;
}
__device__ __forceinline__ unsigned ld_cg(const unsigned* p) {
  unsigned v;
  asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__global__ void probe(const unsigned* buf, unsigned* turn, unsigned* sm, unsigned* round1, unsigned* round2,
                      unsigned* sink) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x != 0) return;
  unsigned id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  sm[blockIdx.x] = id;
  smem[0] = 1;
  while (atomicAdd(turn, 0) != blockIdx.x) __nanosleep(100);
  __shared__ volatile unsigned keep[1];
  unsigned acc = 0;
  for (int i = 0; i < lines; ++i) {
    const unsigned* p = buf + size_t(i) * (65536 + 32 * (i % 32)) / 4;
    // 16 dependent reads of one line (it holds zeros: each address is p + the previous value); the store
    // to shared memory needs the last value, so the second clock read comes after it
    unsigned v = 0;
    unsigned long long t0 = clk();
#pragma unroll 1
    for (int r = 0; r < 16; ++r) v = ld_cg(p + v);
    keep[0] = v;
    unsigned long long t1 = clk();
    round1[blockIdx.x * lines + i] = unsigned(t1 - t0);
    t0 = clk();
#pragma unroll 1
    for (int r = 0; r < 16; ++r) v = ld_cg(p + v);
    keep[0] = v;
    t1 = clk();
    round2[blockIdx.x * lines + i] = unsigned(t1 - t0);
    acc += v;
  }
  sink[blockIdx.x] = acc;
  __threadfence();
  atomicAdd(turn, 1);
}

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int smem = 200 * 1024;  // one block per SM (227 KiB would leave no room for the static word)
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  unsigned *buf, *turn, *sm, *round1, *round2, *sink;
  const size_t bytes = size_t(lines) * (65536 + 32 * 32) + 4096;
  cudaMalloc(&buf, bytes);
  cudaMemset(buf, 0, bytes);
  cudaMalloc(&turn, 4);
  cudaMemset(turn, 0, 4);
  cudaMalloc(&sm, 4 * sms);
  cudaMalloc(&round1, 4 * sms * lines);
  cudaMalloc(&round2, 4 * sms * lines);
  cudaMalloc(&sink, 4 * sms);
  probe<<<sms, 32, smem>>>(buf, turn, sm, round1, round2, sink);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("probe failed: %s\n", cudaGetErrorString(e));
    return 1;
  }
  std::vector<unsigned> hs(sms), hf(sms * lines), hb(sms * lines);
  cudaMemcpy(hs.data(), sm, 4 * sms, cudaMemcpyDeviceToHost);
  cudaMemcpy(hf.data(), round1, 4 * sms * lines, cudaMemcpyDeviceToHost);
  cudaMemcpy(hb.data(), round2, 4 * sms * lines, cudaMemcpyDeviceToHost);
  for (int b = 0; b < sms; ++b) {
    std::printf("%u", hs[b]);
    for (int i = 0; i < lines; ++i) std::printf(" %u", hf[b * lines + i]);
    std::printf(" |");
    for (int i = 0; i < lines; ++i) std::printf(" %u", hb[b * lines + i]);
    std::printf("\n");
  }
  return 0;
}
