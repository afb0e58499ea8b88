// How many thread-block clusters of 1, 2, 4 and 8 blocks can be resident at once on this GPU when each block
// takes a whole SM (384 threads, 227 KiB of dynamic shared memory, as the GEMM's blocks do), and on which
// SMs the blocks of a 2-block cluster and of a plain launch land (blocks 2i and 2i + 1 of both share a TPC:
// SMs 2j and 2j + 1; a plain launch deals consecutive pairs out to different GPCs, a cluster launch fills
// the SMs in order). A persistent grid sized as "SMs / cluster" clusters runs a second wave when fewer fit.
//   usage: build/bench/gemm/cluster_occupancy (built with the benchmarks; needs a GPU)
#include <cuda_runtime.h>
#include <cstdio>
#include <vector>

__global__ void probe(unsigned* sm) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0) {
    unsigned id;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
    sm[blockIdx.x] = id;
    smem[0] = 1;
  }
}

int main() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const int smem = 227 * 1024;
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  std::printf("SMs: %d\n", sms);
  for (int cs : {1, 2, 4, 8}) {
    cudaLaunchConfig_t cfg{};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cs;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.gridDim = dim3(sms / cs * cs);
    cfg.blockDim = dim3(384);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    int clusters = -1;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, probe, &cfg);
    std::printf("cluster %d: max active clusters %d (%d blocks)%s%s\n", cs, clusters, clusters * cs,
                e == cudaSuccess ? "" : " error: ", e == cudaSuccess ? "" : cudaGetErrorString(e));
    if (cs <= 2) {  // where blocks land: pairs for clusters of 2, every block of a plain launch
      unsigned* d = nullptr;
      cudaMalloc(&d, sizeof(unsigned) * sms);
      cfg.gridDim = dim3(sms / 2 * 2);
      if (cs == 1) cfg.numAttrs = 0;
      cudaLaunchKernelEx(&cfg, probe, d);
      std::vector<unsigned> h(sms);
      cudaMemcpy(h.data(), d, sizeof(unsigned) * sms, cudaMemcpyDeviceToHost);
      std::printf("%s, %d blocks, SM of blocks 2i/2i+1:", cs == 1 ? "plain launch" : "cluster 2", sms / 2 * 2);
      for (int b = 0; b + 1 < sms; b += 2) std::printf(" %u/%u", h[b], h[b + 1]);
      std::printf("\n");
      cudaFree(d);
    }
  }
  return 0;
}
