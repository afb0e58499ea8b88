// Running a lowered program on the GPU: NVRTC compiles the translation unit for sm_90a (cached by the
// hash of its source), the CUDA driver API loads it and launches the statements' kernels in order.
// Built without CUDA, run() is a one-line "no CUDA GPU" error.
#pragma once
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "backends/cuda/lower/lower.h"
#include "ir/eval.h"

namespace mp::cuda {

struct RunOptions {
  std::string cache_dir;       // empty: default_cache_dir()
  std::ostream* log = nullptr;  // --verbose: cache file, kernels and launch shapes
  // After the checked run (whose outputs are the ones copied back), launch the whole kernel sequence
  // `timed_runs` more times (two untimed warm-up passes first) and report the median of those device
  // times in RunReport::timed_ms. 0: only the checked run, which includes the cold first launch of
  // each kernel. The extra runs write over InOut / Temp tensors on the device only.
  int timed_runs = 0;
};

struct KernelRun {
  std::string entry, statement;
  int64_t grid = 1, smem_bytes = 0;
  double ms = 0;
};
struct RunReport {
  std::string device;
  std::string cache_file;
  bool cache_hit = false;
  double compile_ms = 0;     // NVRTC (0 on a cache hit)
  double ms = 0;             // all kernels, device time of the checked (first, cold) run
  double timed_ms = 0;       // median device time of RunOptions::timed_runs warm runs (0: none)
  int timed_runs = 0;
  std::vector<KernelRun> kernels;
};

// Whether a CUDA GPU this backend can use (sm_90) is present; `why` says why not.
bool available(std::string* why = nullptr);
// $XDG_CACHE_HOME/metapipe/cuda, else $HOME/.cache/metapipe/cuda.
std::string default_cache_dir();
// 64-bit FNV-1a, hex: the name of a cached binary.
std::string source_hash(const std::string& text);

// NVRTC's sm_90a binary of a lowered unit (needs the CUDA toolkit, not a GPU); the NVRTC log is in the
// internal_error when it does not compile. Built without CUDA: a user_error.
std::string compile_sm90a(const std::string& source);

// A host tensor in the device storage of its dtype (device_bytes_of) and back; an integer tensor's NaN
// poison becomes INT32_MIN.
std::vector<unsigned char> to_device_bytes(const ir::HostTensor& h);
void from_device_bytes(const std::vector<unsigned char>& bytes, ir::HostTensor& h);

// Runs a compiled program (passes::compile) on the GPU against `mem` (ir::make_memory): every tensor is
// copied in (outputs as the NaN poison make_memory left there), the kernels run, every Output / InOut /
// Temp tensor is copied back. A device-side error (index out of range, access out of bounds) is a
// user_error naming the node, as the CPU backends report it.
RunReport run(const ir::Program& compiled, ir::Memory& mem, const RunOptions& opt = {});

}  // namespace mp::cuda
