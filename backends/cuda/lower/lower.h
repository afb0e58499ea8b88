// Lowering of a compiled (tiled, fused, parallelized, metapipelined) IR program to one CUDA C++
// translation unit: one `extern "C" __global__` entry per top-level statement, plus the launch sequence
// kept as data. Pure C++: generating the source needs no CUDA toolkit (docs/cuda-lowering.md).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "ir/ir.h"

namespace mp::cuda {

// "not supported yet on cuda: <node> in <program>": a valid program the lowering cannot handle yet.
struct cuda_not_supported : user_error {
  explicit cuda_not_supported(const std::string& what) : user_error("not supported yet on cuda: " + what) {}
};

struct LowerOptions {
  // Dynamic shared memory one block may use; values that do not fit go to global scratch per block.
  // The default is Hopper's opt-in maximum per block; the run time passes the device's own value.
  int64_t smem_bytes = 227 * 1024;
  // Threads per block (a multiple of 32). 512: a block whose tiles take most of an SM's shared memory
  // (softmax's, dotproduct's at large tiles) still has 16 warps issuing loads.
  int threads = 512;
};

// One kernel of the launch sequence: top-level statement `statement` of the program.
struct KernelLaunch {
  std::string entry;           // the extern "C" symbol
  std::string statement;       // "MetaPipe #4" (for messages and --verbose)
  bool distributed = false;    // the statement's METAPIPE iterations are spread over persistent blocks
  bool fold = false;           // ... and its carried running sums are per-block partials, combined by the
                               // last block to finish (the counter in mp_gm, the partials in scratch)
  int64_t trip = 1;            // iterations to spread (distributed), else 1
  int64_t smem_bytes = 0;      // dynamic shared memory per block
  int64_t scratch_floats = 0;  // global scratch per block (values that did not fit in shared memory)
};

// How a run-time error raised by the device code maps back to the IR (mp_fail codes in the source).
enum class DeviceError : int { None = 0, IndexOutOfRange = 1, OutOfBounds = 2, InnerExtentMismatch = 3 };

struct Lowered {
  std::string source;                   // the translation unit
  std::vector<KernelLaunch> kernels;    // in program order
  std::vector<ir::Tensor> tensors;      // the order of the tensor pointer table (program order)
  int64_t global_floats = 0;            // values that live between statements (mp_gv)
  int64_t global_meta = 0;              // their run-time extents and origins (mp_gm), in int64s
  int threads = 512;
};

// The device storage type of a tensor: f32 and f16 as float (f16 values rounded to 10 mantissa bits as
// the host does), bf16 as its 16 bits, i32 as int.
int64_t device_bytes_of(ir::DType dt);

// Requires a metapipelined program (passes::compile); throws cuda_not_supported for what it cannot lower.
Lowered lower(const ir::Program& p, const LowerOptions& opt = {});

}  // namespace mp::cuda
