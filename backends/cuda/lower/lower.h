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
  // The tile ring of a streaming loop (docs/cuda-lowering.md, "The tile ring"). Speed only: every choice
  // computes the same results.
  //   Auto:  a ring deep enough for `ring_kib_per_sm` KiB of copies in flight per SM (the blocks per SM
  //          its shared memory admits taken into account), except where it would leave fewer blocks per
  //          SM than the direct path for a loop body of several passes over its tiles: there the direct
  //          path keeps the warps that compute.
  //   PerSm: the same depth rule, the ring taken wherever it fits.
  //   Off:   the direct tile copies everywhere.
  enum class Ring { Off, Auto, PerSm };
  Ring ring = Ring::Auto;
  int64_t ring_kib_per_sm = 64;
  // Element-wise chains in a loop body: no barrier between consecutive Map / Zip nodes over one shape
  // (each thread reads only the elements it wrote), and a Map / Zip read only by the Reduce after it
  // computed inside the reduction's loop instead of stored. Speed only, as the ring.
  bool fuse_elementwise = true;
  // A ring of 3 or more slots: one barrier per iteration (wait for iteration k's copies, the barrier,
  // then issue iteration k + N - 1 into the slot iteration k - 1 read, which every thread has left at
  // that barrier), instead of two (issue, wait, barrier, compute, barrier). Speed only.
  bool one_barrier_ring = true;
  // How the tile ring's slots are filled. Speed only, as the ring.
  //   Cp:   every thread issues 16-byte cp.async copies of its share, commit / wait_group per iteration.
  //   Bulk: one thread issues one bulk copy (the TMA engine, cp.async.bulk) per tile of an iteration,
  //         completing on the slot's mbarrier; the readers wait on that mbarrier's phase.
  enum class Copy { Cp, Bulk };
  Copy copy = Copy::Bulk;
  // A statement that is a tiled bf16 matmul (the slide-51 loop nest: an [MM, K] tile of A, a [K, NN]
  // tile of B, their MatMul stored as the [MM, NN] tile of C) and fits the tile layer (MM 64 or 128, NN
  // 64, 128 or 256, K and N multiples of 8):
  //   Wgmma:   lowered onto the tile layer's pipeline template: a TMA producer, wgmma consumer
  //            warpgroups, a TMA-store finish (docs/cuda-lowering.md, "MatMul on wgmma").
  //   Generic: the element loops, as every other statement.
  // Speed only: both compute the product with fp32 accumulation, in a different order.
  enum class Matmul { Wgmma, Generic };
  Matmul matmul = Matmul::Wgmma;
  // A Map / Zip computed inside the StoreTile that reads it (fusion above), into an f32 tensor: each
  // thread computes four consecutive elements of the stored tile's last axis and stores them as one
  // 16-byte store where they are within the extents and 16-byte aligned (else element by element).
  // Off: one element per thread and 4-byte stores, as before. Speed only.
  bool vector_stores = true;
  // A loop body that works row by row on [rows, C] tiles (a LoadTile, Map / Zip nodes over the tile and
  // over row values [rows, 1], Reduces along the row, StoreTiles; softmax's): each warp takes whole rows
  // of the tile, keeps a row of every tile-sized value in its registers (C / 32 per lane, C <= 1024),
  // loads it from the tensor and reduces it with warp shuffles, with no shared memory and no block
  // barrier in the body. Off: the tile path (shared memory, a block barrier between the nodes). Speed
  // only, as the ring.
  bool warp_rows = true;
  // An inner loop (a METAPIPE inside the statement's loop) whose first stage loads small tiles (one
  // contiguous run of a float-stored tensor, at most four elements per thread: outerproduct's B tile):
  // each thread loads its share of the next iteration's tile into registers after this iteration's copy,
  // so the loads are in flight while this iteration computes and stores, and writes them into the tile at
  // the top of the next iteration. Off: every iteration loads its tile, then computes. Speed only.
  bool prefetch = true;
  // Who fills a tile ring of bulk copies (Copy::Bulk). Warp: one more warp per block (the block's last,
  // threads + 32 in all) is the producer: it waits for a slot's "empty" mbarrier, on which every warp
  // that computes arrives once it has left the slot, and issues the slot's next bulk copies and masked
  // tails; the other warps wait on the slot's "full" mbarrier, compute and arrive on "empty", with no
  // block barrier per iteration (the loop body's own barriers are named barriers over the computing
  // warps). Off (thread): thread 0 issues the copies between the computing threads' block barriers. A
  // loop whose block has 1024 threads already keeps the thread path. Speed only, as the ring. Off by
  // default: the warp path is checked on the H200 (the SM90_CudaLower tests, compute-sanitizer) but not
  // timed yet, and the thread path is the one bench/RESULTS.md measured.
  bool producer_warp = false;
  // f32 division, reciprocal, square root and reciprocal square root in the element functions. Exact:
  // IEEE round-to-nearest, as the C++ operators (div.rn, rcp.rn, sqrt.rn: a dozen instructions and a
  // slow path each). Fast: the hardware approximations PTX names div.full, rcp.approx, sqrt.approx and
  // rsqrt.approx (1-2 ulp, full range, subnormals kept), as Triton's default division; well inside the
  // f32 check's 1e-5, and fewer instructions where an element function is long (blackscholes' four
  // divisions per element: 210 instructions an element become 150, and 77 % of the copy bandwidth 96 %
  // on the H200, bench/RESULTS.md). f64 and the attention pipeline's own softmax are unaffected. The host
  // test of the lowering computes them exactly; the GPU tests check the approximations.
  bool fast_math = true;
};

// The options above with the environment's choices applied, for timing the variants in one build:
// MP_CUDA_LOWER_RING=off|auto|<KiB per SM>, MP_CUDA_LOWER_THREADS=<a multiple of 32 in [64, 1024]>,
// MP_CUDA_LOWER_FUSE=on|off, MP_CUDA_LOWER_BARRIERS=1|2 (one_barrier_ring), MP_CUDA_LOWER_COPY=cp|bulk
// (copy), MP_CUDA_LOWER_MATMUL=wgmma|generic (matmul), MP_CUDA_LOWER_STORE=vec|scalar (vector_stores) and
// MP_CUDA_LOWER_ROWS=warp|tile (warp_rows), MP_CUDA_LOWER_PREFETCH=on|off (prefetch),
// MP_CUDA_LOWER_PRODUCER=warp|thread (producer_warp), MP_CUDA_LOWER_MATH=fast|exact (fast_math). A value that is neither is a user error naming the variable.
LowerOptions options_from_env(LowerOptions base = {});
// One value of MP_CUDA_LOWER_RING applied to `o` (the parser of options_from_env).
void set_ring_option(LowerOptions& o, const std::string& value);
// One value of MP_CUDA_LOWER_COPY applied to `o` (the parser of options_from_env).
void set_copy_option(LowerOptions& o, const std::string& value);
// One value of MP_CUDA_LOWER_MATMUL applied to `o` (the parser of options_from_env).
void set_matmul_option(LowerOptions& o, const std::string& value);

// A TMA tensor map the run time encodes for a kernel and passes after the common parameters (in this
// order, as `const __grid_constant__ CUtensorMap`): the 2-D bf16 tensor `tensor` (an index into
// Lowered::tensors, row-major, rows x cols), boxes of box_rows x box_cols elements, 128-byte swizzle.
struct TensorMapSpec {
  int tensor = 0;
  int64_t rows = 0, cols = 0;
  int box_rows = 0, box_cols = 0;
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
  int threads = 0;             // threads per block; 0: Lowered::threads
  std::vector<TensorMapSpec> maps;  // tensor maps after the common parameters (the wgmma matmul, attention)
  bool block_per_item = false;      // distributed: one block per iteration (trip blocks), not the
                                    // persistent grid (the attention pipeline keeps an item's Q in its block)
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
  // Whether the source includes the tile layer's headers (then NVRTC and nvcc need the repository root
  // on the include path; the run time passes it).
  bool uses_tile_layer = false;
};

// The device storage type of a tensor: f32 and f16 as float (f16 values rounded to 10 mantissa bits as
// the host does), bf16 as its 16 bits, i32 as int.
int64_t device_bytes_of(ir::DType dt);

// Requires a metapipelined program (passes::compile); throws cuda_not_supported for what it cannot lower.
Lowered lower(const ir::Program& p, const LowerOptions& opt = {});

}  // namespace mp::cuda
