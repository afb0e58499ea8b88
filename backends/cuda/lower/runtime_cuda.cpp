// The run time with CUDA: NVRTC compiles the lowered translation unit for sm_90a (the binary cached under
// the hash of source and options), the driver API loads it, copies the tensors in, launches each
// statement's kernel (persistent blocks sized from the device's SM count and occupancy), copies the
// results back and turns a device-side error flag into the IR-level message.
// The driver API is reached through the CUDA runtime's entry-point query rather than by linking
// libcuda: the binary then starts on machines without a driver (CI), where run() says "no CUDA GPU".
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <vector>

#include "backends/cuda/lower/runtime.h"

namespace mp::cuda {
namespace {

// The driver functions used here, looked up once by name for this toolkit's ABI (CUDA_VERSION). Each must
// keep the signature cuda.h declares under its plain name at that version: cuCtxSynchronize does not (at
// 13000 the entry point is cuCtxSynchronize_v2, which takes a context; called as the plain one, it
// crashed in the driver), so the default stream is synchronized instead, where every launch goes.
// clang-format off
#define MP_CU_FUNCTIONS(X) \
  X(cuCtxSetCurrent) X(cuStreamSynchronize) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetCount)         \
  X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) X(cuEventCreate) X(cuEventDestroy) X(cuEventElapsedTime)   \
  X(cuEventRecord) X(cuFuncSetAttribute) X(cuGetErrorString) X(cuInit) X(cuLaunchKernel) X(cuMemAlloc)      \
  X(cuMemFree) X(cuMemcpyDtoH) X(cuMemcpyHtoD) X(cuMemsetD8) X(cuModuleGetFunction) X(cuModuleLoadData)    \
  X(cuModuleUnload) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) X(cuTensorMapEncodeTiled)
// clang-format on
struct Driver {
  bool ok = false;
  std::string why;
#define MP_CU_MEMBER(f) decltype(&::f) f = nullptr;
  MP_CU_FUNCTIONS(MP_CU_MEMBER)
#undef MP_CU_MEMBER
};

const Driver& drv() {
  static const Driver d = [] {
    Driver r;
#define MP_CU_LOAD(f)                                                                                      \
  {                                                                                                        \
    void* p = nullptr;                                                                                     \
    cudaDriverEntryPointQueryResult q{};                                                                   \
    cudaError_t e = cudaGetDriverEntryPointByVersion(#f, &p, CUDA_VERSION, cudaEnableDefault, &q);        \
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !p) {                                      \
      cudaGetLastError();                                                                                  \
      r.why = std::string("the CUDA driver is not usable (") +                                             \
              (e != cudaSuccess ? cudaGetErrorString(e) : "driver entry point " #f " not found") + ")";   \
      return r;                                                                                            \
    }                                                                                                      \
    r.f = reinterpret_cast<decltype(r.f)>(p);                                                              \
  }
    MP_CU_FUNCTIONS(MP_CU_LOAD)
#undef MP_CU_LOAD
    r.ok = true;
    return r;
  }();
  return d;
}

}  // namespace

namespace {

std::string cu_msg(CUresult r) {
  const char* s = nullptr;
  if (drv().ok) drv().cuGetErrorString(r, &s);
  return s ? s : "unknown CUDA error";
}
void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) fail_internal("cuda: ", what, " failed: ", cu_msg(r));
}

struct Device {
  bool ok = false;
  std::string why, name;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  int sms = 0, smem_optin = 0, major = 0, minor = 0;
};

const Device& device() {
  static Device d;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!drv().ok) {
      d.why = drv().why;
      return;
    }
    CUresult r = drv().cuInit(0);
    if (r != CUDA_SUCCESS) {
      d.why = "the CUDA driver did not start (" + cu_msg(r) + ")";
      return;
    }
    int n = 0;
    if (drv().cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
      d.why = "no CUDA device present";
      return;
    }
    drv().cuDeviceGet(&d.dev, 0);
    char name[256] = {};
    drv().cuDeviceGetName(name, sizeof name, d.dev);
    d.name = name;
    drv().cuDeviceGetAttribute(&d.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d.dev);
    drv().cuDeviceGetAttribute(&d.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d.dev);
    drv().cuDeviceGetAttribute(&d.sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d.dev);
    drv().cuDeviceGetAttribute(&d.smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, d.dev);
    if (d.major != 9 || d.minor != 0) {
      d.why = "device 0 (" + d.name + ") is compute capability " + std::to_string(d.major) + "." +
              std::to_string(d.minor) + "; the lowering targets sm_90a (H100 / H200)";
      return;
    }
    if (drv().cuDevicePrimaryCtxRetain(&d.ctx, d.dev) != CUDA_SUCCESS) {
      d.why = "could not create a CUDA context on " + d.name;
      return;
    }
    d.ok = true;
  });
  return d;
}

const Device& usable() {
  const Device& d = device();
  MP_USER_CHECK(d.ok, "no CUDA GPU: ", d.why, " (use --target cpu)");
  check(drv().cuCtxSetCurrent(d.ctx), "cuCtxSetCurrent");
  return d;
}

const char* kNvrtcOptions[] = {"--gpu-architecture=sm_90a", "-std=c++17"};

// A unit that includes the tile layer's headers (Lowered::uses_tile_layer; the generator emits the line).
bool uses_tile_layer(const std::string& src) { return src.find("#include \"tile/") != std::string::npos; }

// The repository root whose tile/ headers such a unit includes: $MP_SOURCE_ROOT, else the source tree
// this binary was built from.
std::string tile_root() {
  const char* env = std::getenv("MP_SOURCE_ROOT");
  std::string root = env && *env ? env : MP_SOURCE_DIR;
  MP_USER_CHECK(std::filesystem::exists(std::filesystem::path(root) / "tile" / "pipeline.cuh"),
                "cuda: the lowered matmul includes the tile layer's headers, which are not under '", root,
                "' (set MP_SOURCE_ROOT to a metapipe source tree, or MP_CUDA_LOWER_MATMUL=generic)");
  return root;
}

// What such a unit adds to kNvrtcOptions: C++20 (the tile layer's concepts and template lambdas),
// unannotated constexpr helpers as device functions, and the include path. NVRTC has no C++ standard
// library, so the three standard headers the tile layer includes are given to it as libcu++'s
// equivalents (tile_headers below).
std::vector<std::string> tile_options() {
  const std::string cuda = MP_CUDA_INCLUDE_DIR;
  return {"-std=c++20", "-default-device", "-I" + tile_root(), "-I" + cuda, "-I" + cuda + "/cccl"};
}
const char* kStdShim =
    "#pragma once\n#include <cuda/std/cstdint>\n#include <cuda/std/type_traits>\n#include <cuda/std/utility>\n"
    "namespace std { using namespace ::cuda::std; }\n";
const char* kStdShimNames[] = {"cstdint", "type_traits", "utility"};

// The contents of the tile layer's headers, for the cache key of a unit that includes them (a changed
// header must not reuse a binary compiled from the old one).
std::string tile_headers_text() {
  std::string all;
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"tile", "tile/detail"}) {
    std::error_code ec;
    for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(tile_root()) / dir, ec))
      if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  for (auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::ostringstream os;
    os << in.rdbuf();
    all += f.filename().string() + "\n" + os.str();
  }
  return all;
}

std::string nvrtc_version() {
  int ma = 0, mi = 0;
  nvrtcVersion(&ma, &mi);
  return std::to_string(ma) + "." + std::to_string(mi);
}

}  // namespace

std::string compile_sm90a(const std::string& src) {
  nvrtcProgram prog;
  const bool tile = uses_tile_layer(src);
  const char* shims[] = {kStdShim, kStdShim, kStdShim};
  MP_INTERNAL_CHECK(nvrtcCreateProgram(&prog, src.c_str(), "metapipe_lowered.cu", tile ? 3 : 0, tile ? shims : nullptr,
                                       tile ? kStdShimNames : nullptr) == NVRTC_SUCCESS,
                    "nvrtcCreateProgram failed");
  std::vector<std::string> extra = tile ? tile_options() : std::vector<std::string>{};
  std::vector<const char*> opts;
  for (const char* o : kNvrtcOptions)
    if (!tile || std::string(o) != "-std=c++17") opts.push_back(o);  // the tile options give -std=c++20
  for (auto& o : extra) opts.push_back(o.c_str());
  nvrtcResult r = nvrtcCompileProgram(prog, int(opts.size()), opts.data());
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    fail_internal("NVRTC could not compile the lowered program (", nvrtcGetErrorString(r), "):\n", log);
  }
  size_t n = 0;
  nvrtcGetCUBINSize(prog, &n);
  std::string bin(n, '\0');
  nvrtcGetCUBIN(prog, bin.data());
  nvrtcDestroyProgram(&prog);
  return bin;
}

namespace {

// The cubin for `src`, from the cache or compiled now.
std::string cubin_for(const std::string& src, const std::string& dir, RunReport& rep) {
  std::string key = src + "\n// nvrtc " + nvrtc_version();
  for (const char* o : kNvrtcOptions) key += std::string(" ") + o;
  if (uses_tile_layer(src)) {
    for (auto& o : tile_options()) key += " " + o;
    key += "\n" + tile_headers_text();
  }
  std::filesystem::path file = std::filesystem::path(dir) / (source_hash(key) + ".cubin");
  rep.cache_file = file.string();
  {
    std::ifstream in(file, std::ios::binary);
    if (in) {
      std::ostringstream os;
      os << in.rdbuf();
      if (!os.str().empty()) {
        rep.cache_hit = true;
        return os.str();
      }
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  std::string bin = compile_sm90a(src);
  rep.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // Written beside, then renamed: a concurrent run never reads half a file.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) {
    auto tmp = file;
    tmp += ".tmp" + std::to_string(::getpid());
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(bin.data(), std::streamsize(bin.size()));
    }
    std::filesystem::rename(tmp, file, ec);
    if (ec) std::filesystem::remove(tmp, ec);
  }
  return bin;
}

// Device allocations freed on every path out.
struct DeviceBuffers {
  std::vector<CUdeviceptr> ptrs;
  CUmodule mod = nullptr;
  std::vector<CUevent> events;
  CUdeviceptr alloc(size_t bytes) {
    CUdeviceptr p = 0;
    check(drv().cuMemAlloc(&p, std::max<size_t>(bytes, 16)), "cuMemAlloc");
    ptrs.push_back(p);
    return p;
  }
  ~DeviceBuffers() {
    for (auto e : events) drv().cuEventDestroy(e);
    for (auto p : ptrs) drv().cuMemFree(p);
    if (mod) drv().cuModuleUnload(mod);
  }
};

const ir::Node* find_node(const ir::Program& p, int id) {
  const ir::Node* found = nullptr;
  ir::walk(p.body, [&](const ir::NodeRef& n, int) {
    if (n->id == id) found = n.get();
  });
  return found;
}

}  // namespace

bool available(std::string* why) {
  const Device& d = device();
  if (!d.ok && why) *why = d.why;
  return d.ok;
}

RunReport run(const ir::Program& compiled, ir::Memory& mem, const RunOptions& opt) {
  const Device& d = usable();
  RunReport rep;
  rep.device = d.name;
  LowerOptions lo = options_from_env();  // MP_CUDA_LOWER_RING / _THREADS: speed variants, same results
  lo.smem_bytes = d.smem_optin;
  Lowered low = lower(compiled, lo);
  std::string dir = opt.cache_dir.empty() ? default_cache_dir() : opt.cache_dir;
  std::string bin = cubin_for(low.source, dir, rep);
  if (opt.log)
    *opt.log << "cuda: device " << d.name << " (" << d.sms << " SMs, " << d.smem_optin / 1024
             << " KiB shared memory per block)\ncuda: NVRTC cache " << dir << ": " << rep.cache_file << " ("
             << (rep.cache_hit ? "hit" : "compiled in " + std::to_string(int(rep.compile_ms)) + " ms") << ")\n";
  if (opt.log && low.uses_tile_layer) *opt.log << "cuda: the tile layer's headers from " << tile_root() << "/tile\n";

  DeviceBuffers db;
  check(drv().cuModuleLoadData(&db.mod, bin.data()), "cuModuleLoadData");
  // Tensors, in the order of the pointer table.
  std::vector<CUdeviceptr> tptr;
  for (auto& t : low.tensors) {
    auto& h = mem.at(t->name);
    auto bytes = to_device_bytes(h);
    CUdeviceptr p = db.alloc(bytes.size());
    check(drv().cuMemcpyHtoD(p, bytes.data(), bytes.size()), "cuMemcpyHtoD");
    tptr.push_back(p);
  }
  CUdeviceptr d_t = db.alloc(tptr.size() * sizeof(CUdeviceptr));
  if (!tptr.empty()) check(drv().cuMemcpyHtoD(d_t, tptr.data(), tptr.size() * sizeof(CUdeviceptr)), "cuMemcpyHtoD");
  // Values between statements and per-block scratch start as NaN bytes, so a read before a write shows.
  CUdeviceptr d_gv = db.alloc(size_t(low.global_floats) * 4);
  check(drv().cuMemsetD8(d_gv, 0xff, std::max<size_t>(size_t(low.global_floats) * 4, 16)), "cuMemsetD8");
  CUdeviceptr d_gm = db.alloc(size_t(low.global_meta) * 8);
  check(drv().cuMemsetD8(d_gm, 0, std::max<size_t>(size_t(low.global_meta) * 8, 16)), "cuMemsetD8");
  CUdeviceptr d_err = db.alloc(16);
  check(drv().cuMemsetD8(d_err, 0, 16), "cuMemsetD8");

  // The kernels' tensor maps (KernelLaunch::maps): 2-D bf16 tensors as the tile layer's 4-D maps
  // (tile/tma_host.h: depth and batch 1), 128-byte swizzle, boxes of one 64-column chunk.
  std::vector<std::vector<CUtensorMap>> maps;
  for (auto& k : low.kernels) {
    maps.emplace_back();
    for (auto& m : k.maps) {
      MP_INTERNAL_CHECK(m.tensor >= 0 && size_t(m.tensor) < tptr.size(), "cuda: tensor map of tensor ", m.tensor);
      CUtensorMap map{};
      cuuint64_t dims[4] = {cuuint64_t(m.cols), cuuint64_t(m.rows), 1, 1};
      cuuint64_t strides[3] = {cuuint64_t(m.cols) * 2, cuuint64_t(m.rows * m.cols) * 2, cuuint64_t(m.rows * m.cols) * 2};
      cuuint32_t box[4] = {cuuint32_t(m.box_cols), cuuint32_t(m.box_rows), 1, 1};
      cuuint32_t estride[4] = {1, 1, 1, 1};
      CUresult r = drv().cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                                                reinterpret_cast<void*>(tptr[size_t(m.tensor)]), dims, strides, box,
                                                estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
      MP_USER_CHECK(r == CUDA_SUCCESS, "cuda: cuTensorMapEncodeTiled failed (", cu_msg(r), ") for ",
                    low.tensors[size_t(m.tensor)]->name, " (", m.rows, " x ", m.cols, ", boxes of ", m.box_rows, " x ",
                    m.box_cols, ")");
      maps.back().push_back(map);
    }
  }
  struct Prepared {
    CUfunction f;
    int grid;
    int threads;
  };
  std::vector<Prepared> prep;
  int64_t scratch_floats = 0;
  for (auto& k : low.kernels) {
    CUfunction f;
    check(drv().cuModuleGetFunction(&f, db.mod, k.entry.c_str()), "cuModuleGetFunction");
    MP_INTERNAL_CHECK(k.smem_bytes <= d.smem_optin, k.entry, " needs ", k.smem_bytes, " bytes of shared memory");
    check(drv().cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(k.smem_bytes)),
          "cuFuncSetAttribute");
    int grid = 1;
    const int threads = k.threads > 0 ? k.threads : low.threads;
    if (k.distributed) {
      int per_sm = 0;
      check(drv().cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, threads, size_t(k.smem_bytes)),
            "cuOccupancyMaxActiveBlocksPerMultiprocessor");
      grid = int(std::min<int64_t>(k.trip, int64_t(std::max(per_sm, 1)) * d.sms));
      if (k.block_per_item) grid = int(k.trip);
    }
    scratch_floats = std::max(scratch_floats, k.scratch_floats * grid);
    prep.push_back({f, grid, threads});
  }
  CUdeviceptr d_scratch = db.alloc(size_t(scratch_floats) * 4);
  check(drv().cuMemsetD8(d_scratch, 0xff, std::max<size_t>(size_t(scratch_floats) * 4, 16)), "cuMemsetD8");

  for (size_t i = 0; i <= low.kernels.size(); ++i) {
    CUevent e;
    check(drv().cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate");
    db.events.push_back(e);
  }
  // Every kernel in order on the default stream; with per_kernel_events, event i + 1 after kernel i.
  auto launch_all = [&](bool per_kernel_events) {
    for (size_t i = 0; i < low.kernels.size(); ++i) {
      auto& k = low.kernels[i];
      long long per_block = k.scratch_floats;
      std::vector<void*> args = {&d_t, &d_gv, &d_gm, &d_scratch, &per_block, &d_err};
      for (auto& m : maps[i]) args.push_back(&m);
      check(drv().cuLaunchKernel(prep[i].f, unsigned(prep[i].grid), 1, 1, unsigned(prep[i].threads), 1, 1,
                                 unsigned(k.smem_bytes), nullptr, args.data(), nullptr),
            "cuLaunchKernel");
      if (per_kernel_events) check(drv().cuEventRecord(db.events[i + 1], nullptr), "cuEventRecord");
    }
  };
  check(drv().cuEventRecord(db.events[0], nullptr), "cuEventRecord");
  launch_all(true);
  check(drv().cuStreamSynchronize(nullptr), "running the lowered kernels");
  for (size_t i = 0; i < low.kernels.size(); ++i) {
    float ms = 0;
    check(drv().cuEventElapsedTime(&ms, db.events[i], db.events[i + 1]), "cuEventElapsedTime");
    auto& k = low.kernels[i];
    rep.kernels.push_back({k.entry, k.statement, prep[i].grid, k.smem_bytes, ms});
    rep.ms += ms;
    if (opt.log)
      *opt.log << "cuda: " << k.entry << " (" << k.statement << "): " << prep[i].grid << " x " << prep[i].threads
               << " threads, " << k.smem_bytes << " B shared, " << k.scratch_floats * 4 << " B scratch per block, "
               << ms << " ms\n";
  }

  int32_t err[4];
  check(drv().cuMemcpyDtoH(err, d_err, 16), "cuMemcpyDtoH");
  if (err[0] != 0) {
    int64_t detail;
    std::memcpy(&detail, &err[2], 8);
    const ir::Node* n = find_node(compiled, err[1]);
    std::string where = n ? n->where() : "node #" + std::to_string(err[1]);
    switch (DeviceError(err[0])) {
      case DeviceError::IndexOutOfRange: {
        std::string table;
        if (n && n->as<ir::Gather>()) table = n->as<ir::Gather>()->table->name;
        if (n && n->as<ir::Scatter>()) table = n->as<ir::Scatter>()->table->name;
        fail_user(where, ": index at row ", detail, " is out of range of '", table, "' (on cuda)");
      }
      case DeviceError::OutOfBounds:
        fail_user(where, " accesses its tensor on axis ", detail, " beyond its extent (out of bounds, on cuda)");
      default:
        fail_internal(where, ": run-time extents of the operands disagree (device error ", err[0], ")");
    }
  }
  for (size_t i = 0; i < low.tensors.size(); ++i) {
    auto& t = low.tensors[i];
    if (t->role == ir::TensorRole::Input) continue;
    auto& h = mem.at(t->name);
    std::vector<unsigned char> b(h.data.size() * size_t(device_bytes_of(h.dtype)));
    check(drv().cuMemcpyDtoH(b.data(), tptr[i], b.size()), "cuMemcpyDtoH");
    from_device_bytes(b, h);
  }
  if (opt.timed_runs > 0) {
    for (int w = 0; w < 2; ++w) launch_all(false);
    std::vector<double> times;
    // Each sample is a batch of passes launched back to back between two events, divided by the batch:
    // a single pass after a synchronize would also time the host's submission of its first launch to an
    // idle GPU (tens of microseconds against passes of 50-300 us), which is not the kernels' time.
    constexpr int kPassesPerSample = 10;
    for (int r = 0; r < opt.timed_runs; ++r) {
      check(drv().cuEventRecord(db.events[0], nullptr), "cuEventRecord");
      for (int b = 0; b < kPassesPerSample; ++b) launch_all(false);
      check(drv().cuEventRecord(db.events[1], nullptr), "cuEventRecord");
      check(drv().cuStreamSynchronize(nullptr), "timing the lowered kernels");
      float ms = 0;
      check(drv().cuEventElapsedTime(&ms, db.events[0], db.events[1]), "cuEventElapsedTime");
      times.push_back(ms / kPassesPerSample);
    }
    std::sort(times.begin(), times.end());
    rep.timed_runs = opt.timed_runs;
    rep.timed_ms = times[times.size() / 2];
    if (opt.log)
      *opt.log << "cuda: median of " << opt.timed_runs << " batches of " << kPassesPerSample
               << " warm runs: " << rep.timed_ms << " ms a run\n";
  }
  return rep;
}

}  // namespace mp::cuda
