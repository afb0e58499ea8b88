// Host side of TMA: a tensor map (CUtensorMap) for loading / storing shared tiles of type ST from / to a
// global layout. The driver's encoder is reached through the runtime (no link against libcuda), so
// binaries still start on machines without a GPU driver.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "tile/types.cuh"

namespace mp::tile {

namespace detail {
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !p)
      fail_user(
          "TMA needs the CUDA driver's cuTensorMapEncodeTiled (driver 12.0 or newer), which was not found");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}
template <class T>
constexpr CUtensorMapDataType tma_type() {
  if constexpr (std::is_same_v<T, float>)
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  else if constexpr (std::is_same_v<T, bf16>)
    return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  else
    return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}
constexpr CUtensorMapSwizzle tma_swizzle(swizzle s) {
  return s == swizzle::b128  ? CU_TENSOR_MAP_SWIZZLE_128B
         : s == swizzle::b64 ? CU_TENSOR_MAP_SWIZZLE_64B
         : s == swizzle::b32 ? CU_TENSOR_MAP_SWIZZLE_32B
                             : CU_TENSOR_MAP_SWIZZLE_NONE;
}
}  // namespace detail

// A 4-D tensor map over g whose box is one column chunk of ST (ST::layout::chunk_cols x ST::rows).
template <class ST, class GL>
CUtensorMap make_tma_map(const GL& g) {
  using T = typename GL::elem;
  static_assert(std::is_same_v<T, typename ST::elem>,
                "make_tma_map: the global layout and the shared tile hold different element types");
  using L = typename ST::layout;
  static_assert(L::chunk_cols <= 256 && ST::rows <= 256,
                "make_tma_map: a TMA box is at most 256 elements per dimension");
  MP_USER_CHECK(reinterpret_cast<uintptr_t>(g.data) % 16 == 0,
                "TMA needs a 16-byte aligned base address (got ", static_cast<const void*>(g.data), ")");
  MP_USER_CHECK((size_t(g.cols()) * sizeof(T)) % 16 == 0,
                "TMA needs rows whose size in bytes is a multiple of 16 (", g.cols(), " columns of ",
                sizeof(T), " bytes)");
  CUtensorMap map{};
  cuuint64_t dims[4] = {cuuint64_t(g.cols()), cuuint64_t(g.rows()), cuuint64_t(g.depth()),
                        cuuint64_t(g.batch())};
  cuuint64_t strides[3] = {g.cols() * sizeof(T), size_t(g.rows()) * g.cols() * sizeof(T),
                           size_t(g.depth()) * g.rows() * g.cols() * sizeof(T)};
  cuuint32_t box[4] = {cuuint32_t(L::chunk_cols), cuuint32_t(ST::rows), 1, 1};
  cuuint32_t estride[4] = {1, 1, 1, 1};
  CUresult r =
      detail::tensor_map_encoder()(&map, detail::tma_type<T>(), 4, const_cast<T*>(g.data), dims, strides, box,
                                   estride, CU_TENSOR_MAP_INTERLEAVE_NONE, detail::tma_swizzle(ST::swz),
                                   CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  MP_USER_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (error ", int(r), ") for a ", g.rows(),
                " x ", g.cols(), " global layout and a ", ST::rows, " x ", L::chunk_cols, " box");
  return map;
}

}  // namespace mp::tile
