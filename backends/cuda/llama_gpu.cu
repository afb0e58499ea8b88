// The GPU Llama engine: weights uploaded (kept in Q8_0 / Q4_1 or converted to bf16) or generated on
// the GPU, the KV cache and activations allocated once, and each position run as the schedule's launch
// groups of one task kernel. per-op: a launch per operation, blocks take its tasks by index.
// per-layer and megakernel: a launch per group whose blocks (all resident) fetch tasks from a queue in
// the schedule's topological order and wait on their producers' counters.
#include <cuda_runtime.h>
#if MP_HAVE_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>

#include "backends/cuda/llama_gpu.h"
#include "backends/cuda/llama_kernels.cuh"
#include "backends/cuda/tp_launch.h"
#include "core/checked.h"
#include "core/error.h"

namespace mp::cuda {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_internal("GPU engine: ", what, ": ", cudaGetErrorString(e));
}
#define MP_CUDA(call) check_cuda((call), #call)

// MinBlocks blocks per SM at least: the register budget (65,536 / (256 x MinBlocks) per thread). At 4,
// 32 warps per SM keep 16-byte weight loads in flight where shared memory allows 4 blocks; 3 (85
// registers) is what 8B's shared memory allows anyway, room for 8 loads in flight per lane
// (--gpu-tune loads=8); 2 allows up to 128 registers and gives 16 warps per SM (--gpu-tune min-blocks=2).
template <int MinBlocks>
__global__ void __launch_bounds__(dev::kThreads, MinBlocks) llama_tasks(dev::Params p) {
  extern __shared__ __align__(128) float smem[];
  dev::init_stream(p, reinterpret_cast<uint8_t*>(smem));
  // A traced task's fetch and ready times (thread 0's), kept in shared memory rather than in registers
  // across the task.
  __shared__ unsigned long long s_time[2];
  __shared__ dev::TaskMeta s_meta;
  if (!p.dynamic) {
    for (int i = blockIdx.x; i < p.group_tasks; i += gridDim.x) {
      const GpuTask task = p.tasks[p.group_first_task + i];
      if (p.trace && threadIdx.x == 0) s_time[0] = s_time[1] = dev::global_ns();
      dev::load_meta(p, task, s_meta);
      __syncthreads();
      dev::run_task<(MinBlocks < 4)>(p, task, s_meta, smem, [] {});
      dev::finish_task(p, task);
      if (p.trace && threadIdx.x == 0)
        p.trace[p.group_first_task + i] = TaskTime{s_time[0], s_time[1], dev::global_ns(), dev::sm_id()};
    }
    return;
  }
  // Lets the next launch of the stream start (per-layer mode's programmatic dependent launches; a no-op
  // otherwise): its blocks are placed as this grid's leave, and wait on the dependency counters. Every
  // block of this grid is then resident, so none of them waits for a block of the next.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // The queue: an index past the group's tasks ends the block. With fetch-ahead, thread 0 takes the next
  // index before the block runs the current task, so the atomic's round trip is off the dependency
  // chain. Still deadlock-free: the fetched tasks are a prefix of the topological order, and the earliest
  // unfinished one is the current task of its block (a block holding it ahead runs an earlier task,
  // which would then be unfinished), whose producers are all earlier, hence finished.
  __shared__ int s_next;
  auto fetch = [&]() {
    const unsigned long long i = atomicAdd(p.heads + p.group, 1ull) - p.head_base;
    return i < static_cast<unsigned long long>(p.group_tasks) ? int(i) : -1;
  };
  if (threadIdx.x == 0) s_next = fetch();
  __syncthreads();
  int i = s_next;
  __syncthreads();
  while (i >= 0) {
    if (p.fetch_ahead && threadIdx.x == 0) s_next = fetch();
    const GpuTask task = p.tasks[p.group_first_task + i];
    if (p.trace && threadIdx.x == 0) s_time[0] = dev::global_ns();
    dev::load_meta(p, task, s_meta);
    __syncthreads();  // published before any thread's read (the compiler may hoist reads above a branch)
    dev::prefetch_weights(p, s_meta, task.index);
    dev::run_task<(MinBlocks < 4)>(p, task, s_meta, smem, [&] {
      dev::wait_for_producers(p, s_meta.op);
      if (p.trace && threadIdx.x == 0) s_time[1] = dev::global_ns();
    });
    dev::finish_task(p, task);
    if (p.trace && threadIdx.x == 0)
      p.trace[p.group_first_task + i] = TaskTime{s_time[0], s_time[1], dev::global_ns(), dev::sm_id()};
    if (!p.fetch_ahead && threadIdx.x == 0) s_next = fetch();
    __syncthreads();
    i = s_next;
    __syncthreads();
  }
}

// splitmix64 of (seed, tensor, element): uniform in [-1, 1).
__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + i * 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(double(z >> 11) * 0x1p-52 - 1.0);
}
// A [rows, cols] block at (row0, col0) of a matrix `full_cols` wide: element i of the block is element
// (row0 + i / cols) * full_cols + col0 + i % cols of the whole (a tensor-parallel shard of the same
// random matrix as the unsharded model's).
__global__ void fill_random_bf16(__nv_bfloat16* w, int64_t n, uint64_t seed, float a, int64_t cols,
                                 int64_t row0, int64_t col0, int64_t full_cols) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] = __float2bfloat16_rn(a * hash_uniform(seed, uint64_t((row0 + i / cols) * full_cols + col0 + i % cols)));
}
// The local all-reduce of one-GPU tensor parallelism: every shard's buffer becomes the sum of all.
__global__ void sum_shards(float* const* bufs, int shards, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = 0.f;
    for (int r = 0; r < shards; ++r) v += bufs[r][i];
    for (int r = 0; r < shards; ++r) bufs[r][i] = v;
  }
}
// Weights into L2 while an all-reduce runs (the bulk-copy engine's prefetch; a hint).
__global__ void prefetch_l2(const uint8_t* base, int64_t bytes) {
  constexpr int64_t kPiece = 1 << 16;
  for (int64_t off = int64_t(blockIdx.x) * kPiece; off < bytes; off += int64_t(gridDim.x) * kPiece)
    if (threadIdx.x == 0) {
      const uint32_t n = uint32_t(min(kPiece, bytes - off)) & ~15u;
      if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n) : "memory");
    }
}
__global__ void fill_random_norm(float* w, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    w[i] = 1.f + 0.1f * hash_uniform(seed, uint64_t(i));
}

// The task kernel's dynamic shared-memory limit is a property of the function, shared by every engine
// of the process: it only grows, so that an engine made later with smaller rows (a tensor-parallel
// shard, a smaller model) does not lower it below what an earlier engine launches with.
void raise_smem_limit(void (*kernel)(dev::Params), size_t bytes) {
  static std::mutex m;
  static std::map<void (*)(dev::Params), size_t> limit;
  std::lock_guard<std::mutex> lock(m);
  size_t& l = limit[kernel];
  if (bytes <= l) return;
  MP_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  l = bytes;
}

// Bytes of a weight on the GPU: its values (`q`: f32, bf16, 8- or 4-bit codes) and, quantized, its
// scales (Q8_0: one fp16 per 32 values; Q4_1: a scale and a minimum).
int64_t value_bytes(const dev::DevWeight& w) {
  const int64_t n = int64_t(w.rows) * w.cols;
  return w.format == dev::kF32 ? n * 4 : w.format == dev::kBF16 ? n * 2 : w.format == dev::kQ8_0 ? n : n / 2;
}
int64_t device_bytes(const dev::DevWeight& w) {
  const int64_t n = int64_t(w.rows) * w.cols;
  return value_bytes(w) + (w.format == dev::kQ8_0 ? n / 16 : w.format == dev::kQ4_1 ? n / 8 : 0);
}

uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

std::string gib(int64_t b) {
  std::ostringstream os;
  os.precision(3);
  os << double(b) / double(1ull << 30) << " GiB";
  return os.str();
}

class Engine final : public LlamaGpu {
 public:
  // `full`: the model's shapes; with tensor parallelism the engine holds rank `rank`'s shard of them.
  // `shared`: the stream of the engine whose local shard this is (one-GPU tensor parallelism).
  Engine(const LlamaGpuShapes& full, const LlamaGpuOptions& o, int rank = 0, cudaStream_t shared = nullptr)
      : full_(full), shapes_(o.tp >= 1 ? shard_shapes(full, o.tp) : full), opt_(o), rank_(rank) {
    const LlamaGpuShapes& s = shapes_;
    s.check();
    int dev = 0, count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw not_supported("the GPU engine needs a CUDA GPU and none is visible");
    }
    if (o.tp >= 1 && !o.tp_local) {
      check_tp_machine(o.tp);
      MP_USER_CHECK(o.tp_rank >= 0 && o.tp_rank < o.tp, "tensor-parallel rank ", o.tp_rank, " of ", o.tp);
      MP_CUDA(cudaSetDevice(o.tp_rank));
      rank_ = o.tp_rank;
    }
    MP_CUDA(cudaGetDevice(&dev));
    cudaDeviceProp prop{};
    MP_CUDA(cudaGetDeviceProperties(&prop, dev));
    MP_USER_CHECK(prop.major == 9, "not supported yet: the GPU engine is built for Hopper (sm_90a); ",
                  prop.name, " is sm_", prop.major, prop.minor);
    name_ = prop.name;
    ctx_ = o.context ? o.context : s.context;
    MP_USER_CHECK(ctx_ >= 1 && ctx_ <= s.context, "--ctx ", ctx_, " must be in [1, ", s.context,
                  "] (the model's context length)");
    const int64_t max_cols = std::max({s.d_model, s.ffn, s.heads * s.head_dim});
    // A GEMV's input vector and its column slices' sums (at most 256 per task), or the attention's layout
    // (dev::kAttnSmemFloats).
    const int64_t staging = std::max<int64_t>((max_cols + 4 + 256) * 4,
                                              int64_t(dev::kAttnSmemFloats) * 4);
    MP_USER_CHECK(o.stream_depth >= 0 && o.stream_depth <= dev::kMaxStreamDepth, "GPU engine: stream_depth ",
                  o.stream_depth, " must be in [0, ", dev::kMaxStreamDepth, "]");
    MP_USER_CHECK(o.stream_seg_bytes >= 1024 && o.stream_seg_bytes <= 16384 && o.stream_seg_bytes % 1024 == 0,
                  "GPU engine: stream_seg_bytes ", o.stream_seg_bytes, " must be 1, 2, ... or 16 KiB");
    ring_off_ = (staging + 127) / 128 * 128;
    const int64_t ring = o.stream_depth ? dev::kRingHeader + int64_t(dev::kWarps) * o.stream_depth *
                                                                  o.stream_seg_bytes
                                        : 0;
    smem_ = size_t(ring_off_ + ring);
    MP_USER_CHECK(smem_ <= prop.sharedMemPerBlockOptin, "not supported yet: rows of ", max_cols,
                  " elements and a weight ring of ", ring, " bytes need ", smem_,
                  " bytes of shared memory per block; the GPU has ", prop.sharedMemPerBlockOptin,
                  " (lower --gpu-tune stream= or seg-kib=)");
    MP_USER_CHECK(o.min_blocks_per_sm >= 2 && o.min_blocks_per_sm <= 4, "GPU engine: min_blocks_per_sm ",
                  o.min_blocks_per_sm, ": the task kernel is built for 2, 3 or 4 blocks per SM");
    MP_USER_CHECK(o.gemv_loads == 0 || o.gemv_loads == 4 || o.gemv_loads == 8, "GPU engine: gemv_loads ",
                  o.gemv_loads, " must be 4 or 8 (0: chosen by min_blocks_per_sm)");
    MP_USER_CHECK(o.gemv_loads != 8 || o.min_blocks_per_sm < 4, "--gpu-tune loads=8 needs the registers of ",
                  "min-blocks=3 or 2 (the 4-block kernel has 64 per thread)");
    MP_USER_CHECK(o.prefetch_bytes >= -1, "GPU engine: prefetch_bytes ", o.prefetch_bytes,
                  " must be >= 0, or -1 for whole tasks");
    kernel_ = o.min_blocks_per_sm == 4 ? llama_tasks<4> : o.min_blocks_per_sm == 3 ? llama_tasks<3> : llama_tasks<2>;
    raise_smem_limit(kernel_, smem_);
    int per_sm = 0;
    MP_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_, dev::kThreads, smem_));
    MP_INTERNAL_CHECK(per_sm >= 1, "the task kernel fits no SM");
    if (o.blocks_per_sm > 0) per_sm = std::min(per_sm, o.blocks_per_sm);
    stats_.sm_count = prop.multiProcessorCount;
    stats_.workers = workers_ = prop.multiProcessorCount * per_sm;
    // The streamed GEMV reads whole rows.
    sched_ = build_schedule(s, o.launch, ctx_, workers_, o.gemv_split, o.combine,
                            o.stream_depth > 0 ? 1 : o.gemv_slices, o.tp >= 1 ? rank_ : 0, std::max(o.tp, 0),
                            o.rope, o.l2_ahead_bytes);
    if (shared) {
      stream_ = shared;
    } else {
      MP_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
      own_stream_ = true;
    }
  }
  ~Engine() override {
    if (stream_) cudaStreamSynchronize(stream_);
    peers_.clear();
#if MP_HAVE_NCCL
    if (comm_) ncclCommDestroy(comm_);
#endif
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    if (ar_ready_) cudaEventDestroy(ar_ready_);
    if (ar_done_) cudaEventDestroy(ar_done_);
    if (own_stream_) cudaStreamDestroy(stream_);
    for (void* p : allocs_) cudaFree(p);
  }

  // One-GPU tensor parallelism: this engine is shard 0 and makes shards 1 .. tp-1 on the same stream.
  void make_local_peers() {
    if (opt_.tp < 2 || !opt_.tp_local) return;
    for (int r = 1; r < opt_.tp; ++r) peers_.push_back(std::make_unique<Engine>(full_, opt_, r, stream_));
  }
  // Every shard of the run: this engine and its local peers.
  std::vector<Engine*> shards() {
    std::vector<Engine*> v = {this};
    for (auto& e : peers_) v.push_back(e.get());
    return v;
  }

  // NCCL tensor parallelism: rank 0 makes the unique id and writes it, the others read it; then the
  // communicator, a stream for the collectives and the events that order them with the compute.
  void init_comm() {
    if (opt_.tp < 1) return;
    if (!opt_.tp_local) {
#if MP_HAVE_NCCL
      MP_USER_CHECK(!opt_.tp_id_file.empty(), "--tp: no unique-id file given to rank ", rank_);
      ncclUniqueId id;
      std::vector<uint8_t> bytes(sizeof(id.internal));
      if (rank_ == 0) {
        MP_INTERNAL_CHECK(ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId failed");
        std::memcpy(bytes.data(), id.internal, bytes.size());
        tp::write_id(opt_.tp_id_file, bytes);
      } else {
        bytes = tp::read_id(opt_.tp_id_file, bytes.size(), opt_.tp_timeout_s);
        std::memcpy(id.internal, bytes.data(), bytes.size());
      }
      const ncclResult_t r = ncclCommInitRank(&comm_, opt_.tp, id, rank_);
      MP_USER_CHECK(r == ncclSuccess, "--tp: NCCL could not connect rank ", rank_, " of ", opt_.tp, ": ",
                    ncclGetErrorString(r));
#endif
    }
    MP_CUDA(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
    MP_CUDA(cudaEventCreateWithFlags(&ar_ready_, cudaEventDisableTiming));
    MP_CUDA(cudaEventCreateWithFlags(&ar_done_, cudaEventDisableTiming));
  }

  // Memory: the estimate against what is free, before anything large is allocated.
  void check_memory(const WeightBindings* w) {
    size_t free = 0, total = 0;
    MP_CUDA(cudaMemGetInfo(&free, &total));
    const int64_t need = gpu_bytes_needed(shapes_, w, opt_);
    const int64_t kv = shapes_.layers * 2 * ctx_ * shapes_.kv_heads * shapes_.head_dim * 2;
    MP_USER_CHECK(need <= int64_t(free), "the model '", shapes_.name, "' needs ", gib(need),
                  " of GPU memory (weights ", gib(need - kv), ", KV cache ", gib(kv), " for ", ctx_,
                  " positions) but ", name_, " has ", gib(int64_t(free)), " free of ", gib(int64_t(total)),
                  "; lower --ctx or use a smaller model");
  }

  void* alloc(size_t bytes) {
    void* p = nullptr;
    MP_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
    allocs_.push_back(p);
    return p;
  }
  template <class T>
  T* upload(const std::vector<T>& v) {
    T* p = static_cast<T*>(alloc(v.size() * sizeof(T)));
    MP_CUDA(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
  }

  void load_weights(const WeightBindings& wb) {
    for (auto& wr : sched_.weights) {
      auto it = wb.find(wr.name);
      MP_USER_CHECK(it != wb.end(), "the model has no tensor '", wr.name, "' (", wr.rows, " x ", wr.cols,
                    ")");
      const cpu::QMatrix& m = it->second;
      MP_USER_CHECK(m.rows * m.cols == wr.rows * wr.cols && m.cols == wr.cols, "tensor '", wr.name, "' is ",
                    m.rows, " x ", m.cols, "; the model's shapes need ", wr.rows, " x ", wr.cols);
      const uint64_t rb = *quant::row_bytes(m.type, m.cols);
      const auto* src = static_cast<const uint8_t*>(m.data);
      dev::DevWeight d{dev::kF32, int32_t(wr.rows), int32_t(wr.cols), nullptr, nullptr};
      const int64_t n = wr.rows * wr.cols;
      if (wr.rows == 1) {  // norm weights: float
        std::vector<float> f(static_cast<size_t>(n));
        quant::dequantize_row(m.type, src, f.data(), n);
        d.q = reinterpret_cast<const uint8_t*>(upload(f));
      } else if (opt_.weights == GpuWeights::native && m.type == quant::QType::Q8_0) {
        std::vector<uint8_t> q(static_cast<size_t>(n));
        std::vector<uint16_t> sc(static_cast<size_t>(n / 32));
        auto* b = reinterpret_cast<const quant::BlockQ8_0*>(src);
        for (int64_t i = 0; i < n / 32; ++i) {
          sc[size_t(i)] = b[i].d;
          std::memcpy(&q[size_t(i * 32)], b[i].qs, 32);
        }
        d.format = dev::kQ8_0, d.q = upload(q), d.s = upload(sc);
      } else if (opt_.weights == GpuWeights::native && m.type == quant::QType::Q4_1) {
        std::vector<uint8_t> q(static_cast<size_t>(n / 2));
        std::vector<uint16_t> sc(static_cast<size_t>(n / 32 * 2));
        auto* b = reinterpret_cast<const quant::BlockQ4_1*>(src);
        for (int64_t i = 0; i < n / 32; ++i) {
          sc[size_t(2 * i)] = b[i].d, sc[size_t(2 * i + 1)] = b[i].m;
          std::memcpy(&q[size_t(i * 16)], b[i].qs, 16);
        }
        d.format = dev::kQ4_1, d.q = upload(q), d.s = upload(sc);
      } else {  // everything else: bf16
        std::vector<uint16_t> h(static_cast<size_t>(n));
        std::vector<float> row(static_cast<size_t>(m.cols));
        for (int64_t r = 0; r < m.rows; ++r) {
          quant::dequantize_row(m.type, src + r * rb, row.data(), m.cols);
          for (int64_t c = 0; c < m.cols; ++c) h[size_t(r * m.cols + c)] = float_to_bf16(row[size_t(c)]);
        }
        d.format = dev::kBF16, d.q = reinterpret_cast<const uint8_t*>(upload(h));
      }
      dw_.push_back(d);
      count_weight_bytes(wr, d);
    }
  }

  void random_weights(uint64_t seed) {
    for (size_t i = 0; i < sched_.weights.size(); ++i) {
      const WeightRef& wr = sched_.weights[i];
      const int64_t n = wr.rows * wr.cols;
      dev::DevWeight d{dev::kBF16, int32_t(wr.rows), int32_t(wr.cols), nullptr, nullptr};
      const uint64_t s = seed * 0x100000001b3ull + i * 0x9e3779b97f4a7c15ull;
      if (wr.rows == 1) {
        auto* f = static_cast<float*>(alloc(size_t(n) * 4));
        fill_random_norm<<<256, 256, 0, stream_>>>(f, n, s);
        d.format = dev::kF32, d.q = reinterpret_cast<const uint8_t*>(f);
      } else {
        auto* h = static_cast<__nv_bfloat16*>(alloc(size_t(n) * 2));
        // Embedding rows of unit size; projections scaled for unit-variance outputs (of the whole
        // matrix: a tensor-parallel shard is a block of the same random matrix).
        ShardSlice sl = ShardSlice::whole(wr.rows, wr.cols);
        if (opt_.tp >= 1) {
          sl = shard_slice(wr.name, full_, rank_, opt_.tp);
          if (sl.rows < 0) sl = ShardSlice::whole(wr.rows, wr.cols);
          MP_INTERNAL_CHECK(sl.rows == wr.rows && sl.cols == wr.cols, "shard of ", wr.name);
        }
        const bool emb = wr.name == "token_embd.weight";
        const float a = emb ? 1.f : float(std::sqrt(3.0 / double(sl.full_cols)));
        fill_random_bf16<<<4096, 256, 0, stream_>>>(h, n, s, a, wr.cols, sl.row0, sl.col0, sl.full_cols);
        d.q = reinterpret_cast<const uint8_t*>(h);
      }
      MP_CUDA(cudaGetLastError());
      dw_.push_back(d);
      count_weight_bytes(wr, d);
    }
    MP_CUDA(cudaStreamSynchronize(stream_));
  }

  void count_weight_bytes(const WeightRef& wr, const dev::DevWeight& d) {
    int64_t b = device_bytes(d);
    // The embedding table is read one row per position, unless it is also the LM head.
    if (wr.name == "token_embd.weight" && !shapes_.tied_embeddings) b /= wr.rows;
    stats_.weight_bytes += b;
  }

  void allocate_state() {
    const int64_t kvw = shapes_.kv_heads * shapes_.head_dim;
    const size_t kv = size_t(shapes_.layers * ctx_ * kvw);
    p_ = dev::Params{};
    p_.cache_k = static_cast<__nv_bfloat16*>(alloc(kv * 2));
    p_.cache_v = static_cast<__nv_bfloat16*>(alloc(kv * 2));
    for (int b = 0; b < kBufCount; ++b)
      p_.buf[b] = static_cast<float*>(alloc(size_t(sched_.buf_elems[size_t(b)]) * 4));
    p_.argmax_part =
        static_cast<unsigned long long*>(alloc(size_t(sched_.ops[size_t(sched_.lm_head_op)].tasks) * 8));
    p_.ops = upload(sched_.ops);
    p_.deps = upload(sched_.deps.empty() ? std::vector<int32_t>{0} : sched_.deps);
    p_.tasks = upload(sched_.tasks);
    p_.weights = upload(dw_);
    p_.rope_freq = upload(shapes_.rope_freq);
    prompt_ = static_cast<int32_t*>(alloc(size_t(ctx_) * 4));
    p_.prompt = prompt_;
    p_.pred = static_cast<int32_t*>(alloc(size_t(ctx_) * 4));
    p_.done = static_cast<unsigned long long*>(alloc(sched_.ops.size() * 8));
    p_.heads = static_cast<unsigned long long*>(alloc(sched_.groups.size() * 8));
    p_.head_done = static_cast<unsigned long long*>(alloc(size_t(shapes_.layers * shapes_.heads) * 8));
    MP_CUDA(cudaMemset(p_.head_done, 0, size_t(shapes_.layers * shapes_.heads) * 8));
    MP_CUDA(cudaMemset(p_.done, 0, sched_.ops.size() * 8));
    MP_CUDA(cudaMemset(p_.heads, 0, sched_.groups.size() * 8));
    MP_CUDA(cudaMemset(p_.pred, 0, size_t(ctx_) * 4));
    p_.d = int32_t(shapes_.d_model), p_.H = int32_t(shapes_.heads), p_.HKV = int32_t(shapes_.kv_heads);
    p_.Dh = int32_t(shapes_.head_dim), p_.ffn = int32_t(shapes_.ffn), p_.vocab = int32_t(shapes_.vocab);
    p_.context = int32_t(ctx_), p_.attn_chunk = sched_.attn_chunk, p_.attn_chunks = sched_.attn_chunks;
    p_.lm_head_op = sched_.lm_head_op;
    p_.eps = float(shapes_.rms_eps);
    group_launches_.assign(sched_.groups.size(), 0);
    if (opt_.trace) {
      p_.trace = static_cast<TaskTime*>(alloc(sched_.tasks.size() * sizeof(TaskTime)));
      MP_CUDA(cudaMemset(p_.trace, 0, sched_.tasks.size() * sizeof(TaskTime)));
    }
    MP_CUDA(cudaDeviceSynchronize());  // the memsets above ran on the legacy stream
  }

  const LlamaSchedule& schedule() const override { return sched_; }
  int64_t context() const override { return ctx_; }
  int64_t position() const override { return pos_; }
  void reset() override {
    synchronize();
    for (Engine* e : shards()) e->pos_ = 0, e->prompt_end_ = 0;
  }

  void check_room(int64_t n) const {
    MP_USER_CHECK(pos_ + n <= ctx_, "the tokens need ", pos_ + n, " positions but the KV cache holds ", ctx_,
                  "; raise --ctx (at most the model's ", shapes_.context, ") or generate fewer tokens");
  }

  void feed(const std::vector<int32_t>& tokens) override {
    MP_USER_CHECK(!tokens.empty(), "feed: no tokens");
    check_room(int64_t(tokens.size()));
    for (int32_t t : tokens)
      MP_USER_CHECK(t >= 0 && t < shapes_.vocab, "token id ", t, " is outside the vocabulary [0, ",
                    shapes_.vocab, ")");
    MP_CUDA(cudaStreamSynchronize(stream_));  // earlier positions may still read the prompt buffer
    for (Engine* e : shards()) {
      MP_CUDA(cudaMemcpy(e->prompt_ + pos_, tokens.data(), tokens.size() * 4, cudaMemcpyHostToDevice));
      e->prompt_end_ = pos_ + int64_t(tokens.size());
    }
    for (size_t i = 0; i < tokens.size(); ++i) run_position();
  }

  std::vector<int32_t> generate(int64_t n) override {
    MP_USER_CHECK(n >= 0, "generate: ", n, " tokens");
    MP_USER_CHECK(pos_ >= 1, "generate: feed a prompt first");
    check_room(n);
    const int64_t first = pos_;
    for (int64_t i = 0; i < n; ++i) run_position();
    std::vector<int32_t> out(static_cast<size_t>(n));
    if (n)
      MP_CUDA(cudaMemcpyAsync(out.data(), p_.pred + first, size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return out;
  }

  int32_t last_prediction() override {
    MP_USER_CHECK(pos_ >= 1, "no position has run yet");
    int32_t t = 0;
    MP_CUDA(cudaMemcpyAsync(&t, p_.pred + pos_ - 1, 4, cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return t;
  }

  std::vector<float> logits() override {
    std::vector<float> v(static_cast<size_t>(shapes_.vocab));
    MP_CUDA(cudaMemcpyAsync(v.data(), p_.buf[kLogits], v.size() * 4, cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return v;
  }

  void synchronize() override {
    cudaError_t e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) fail_internal("GPU engine: a kernel failed: ", cudaGetErrorString(e));
  }
  void poison() override {
    for (auto& e : peers_) e->poison();
    const int64_t kv = shapes_.layers * ctx_ * shapes_.kv_heads * shapes_.head_dim * 2;
    MP_CUDA(cudaMemsetAsync(p_.cache_k, 0xff, size_t(kv), stream_));
    MP_CUDA(cudaMemsetAsync(p_.cache_v, 0xff, size_t(kv), stream_));
    for (int b = 0; b < kBufCount; ++b)
      MP_CUDA(cudaMemsetAsync(p_.buf[b], 0xff, size_t(sched_.buf_elems[size_t(b)]) * 4, stream_));
    MP_CUDA(cudaMemsetAsync(p_.argmax_part, 0xff, size_t(sched_.ops[size_t(sched_.lm_head_op)].tasks) * 8,
                            stream_));
    MP_CUDA(cudaMemsetAsync(p_.pred, 0xff, size_t(ctx_) * 4, stream_));
    synchronize();
  }
  const LlamaGpuStats& stats() const override { return stats_; }
  std::string device_name() const override { return name_; }
  std::vector<TaskTime> trace() override {
    MP_USER_CHECK(p_.trace, "the GPU engine was made without tracing (LlamaGpuOptions::trace, --gpu-trace)");
    MP_USER_CHECK(positions_run_ >= 1, "trace: no position has run yet");
    std::vector<TaskTime> t(sched_.tasks.size());
    MP_CUDA(cudaMemcpyAsync(t.data(), p_.trace, t.size() * sizeof(TaskTime), cudaMemcpyDeviceToHost, stream_));
    synchronize();
    return t;
  }
  std::vector<int64_t> op_weight_bytes() const override {
    std::vector<int64_t> b(sched_.ops.size(), 0);
    for (size_t i = 0; i < b.size(); ++i) {
      const GpuOp& op = sched_.ops[i];
      if (op.kind != OpKind::gemv) continue;
      b[i] = device_bytes(dw_[size_t(op.weight)]);
    }
    return b;
  }

 private:
  void run_position() {
    auto all = shards();
    for (Engine* e : all) e->set_position();
    for (size_t g = 0; g < sched_.groups.size(); ++g) {
      for (Engine* e : all) e->launch_group(g, stats_);
      if (sched_.groups[g].all_reduce >= 0) all_reduce(g);
    }
    MP_CUDA(cudaGetLastError());
    ++stats_.positions;
    for (Engine* e : all) {  // the figures of the run (one-GPU tensor parallelism: of every shard)
      ++e->pos_, ++e->positions_run_;
      stats_.kv_bytes_read += e->shapes_.layers * 2 * e->pos_ * e->shapes_.kv_heads * e->shapes_.head_dim * 2;
    }
  }

 public:
  // One-GPU tensor parallelism: the weights every shard reads per position.
  void count_peer_weights() {
    for (auto& e : peers_) stats_.weight_bytes += e->stats_.weight_bytes;
  }

 private:

  // Sums buffer sched_.groups[g].all_reduce over the ranks, then prefetches the next group's first
  // weights into L2 while the collective runs (NCCL: on its own stream, the compute stream waiting for it
  // only after the prefetch is issued).
  void all_reduce(size_t g) {
    const int32_t buf = sched_.groups[g].all_reduce;
    const int64_t n = sched_.buf_elems[size_t(buf)];
    ++stats_.all_reduces;
    if (opt_.tp_local) {
      if (peers_.empty()) return;  // one shard: the sum is the buffer itself
      const auto all = shards();
      if (!ar_bufs_) {  // every buffer's pointers in every shard, uploaded once
        std::vector<float*> table;
        for (int b = 0; b < kBufCount; ++b)
          for (Engine* e : all) table.push_back(e->p_.buf[b]);
        ar_bufs_ = upload(table);
      }
      sum_shards<<<int(std::min<int64_t>(ceil_div_i(n, 256), 1024)), 256, 0, stream_>>>(
          ar_bufs_ + size_t(buf) * all.size(), int(all.size()), n);
      return;
    }
#if MP_HAVE_NCCL
    MP_CUDA(cudaEventRecord(ar_ready_, stream_));
    MP_CUDA(cudaStreamWaitEvent(comm_stream_, ar_ready_, 0));
    const ncclResult_t r = ncclAllReduce(p_.buf[buf], p_.buf[buf], size_t(n), ncclFloat, ncclSum, comm_, comm_stream_);
    MP_USER_CHECK(r == ncclSuccess, "--tp: the all-reduce failed on rank ", rank_, ": ", ncclGetErrorString(r));
    MP_CUDA(cudaEventRecord(ar_done_, comm_stream_));
    if (g + 1 < sched_.groups.size() && opt_.tp_prefetch_bytes > 0) {
      int64_t bytes = 0;
      const LaunchGroup& next = sched_.groups[g + 1];
      for (int32_t i = next.first_op; i < next.first_op + next.ops && bytes < opt_.tp_prefetch_bytes; ++i) {
        const GpuOp& op = sched_.ops[size_t(i)];
        if (op.kind != OpKind::gemv) continue;
        const int64_t b = std::min(opt_.tp_prefetch_bytes - bytes, value_bytes(dw_[size_t(op.weight)]));
        prefetch_l2<<<int(std::min<int64_t>(ceil_div_i(b, 1 << 16), 1024)), 32, 0, stream_>>>(dw_[size_t(op.weight)].q, b);
        bytes += b;
      }
    }
    MP_CUDA(cudaStreamWaitEvent(stream_, ar_done_, 0));
#endif
  }

  static int64_t ceil_div_i(int64_t a, int64_t b) { return std::max<int64_t>(1, (a + b - 1) / b); }

  void set_position() {
    p_.pos = int32_t(pos_);
    p_.prompt_end = int32_t(prompt_end_);
    p_.epoch = static_cast<unsigned long long>(positions_run_ + 1);
    p_.dynamic = sched_.launch == Launch::per_op ? 0 : 1;
    p_.prefetch_bytes = opt_.prefetch_bytes;
    p_.fetch_ahead = opt_.fetch_ahead ? 1 : 0;
    p_.stream_depth = opt_.stream_depth;
    p_.stream_seg = int32_t(opt_.stream_seg_bytes);
    p_.ring_off = int32_t(ring_off_);
    p_.loads = opt_.gemv_loads ? opt_.gemv_loads : opt_.min_blocks_per_sm == 2 ? 8 : 4;
    p_.preload = opt_.gemv_preload ? 1 : 0;
    p_.l2_evict_first = opt_.l2_evict_first ? 1 : 0;
  }
  void launch_group(size_t g, LlamaGpuStats& count) {
    const LaunchGroup& lg = sched_.groups[g];
    const int grid = int(std::min<int64_t>(lg.tasks, workers_));
    p_.group = int32_t(g), p_.group_first_task = lg.first_task, p_.group_tasks = lg.tasks;
    p_.head_base = group_launches_[g] * static_cast<unsigned long long>(lg.tasks + grid);
    // per-layer: a layer's launch overlaps the end of the one before (LlamaGpuOptions::overlap_launches).
    // Not a position's first launch: the embedding has no producers in the schedule (stream order puts
    // it after the previous position's argmax), and not across an all-reduce.
    const bool pdl = opt_.overlap_launches && sched_.launch == Launch::per_layer && opt_.tp < 1 && g > 0;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(unsigned(grid)), cfg.blockDim = dim3(dev::kThreads), cfg.dynamicSmemBytes = smem_;
    cfg.stream = stream_;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr, cfg.numAttrs = pdl ? 1 : 0;
    MP_CUDA(cudaLaunchKernelEx(&cfg, kernel_, p_));
    ++group_launches_[g];
    ++count.launches;
  }

 public:
  int rank() const { return rank_; }

 private:

  LlamaGpuShapes full_, shapes_;
  LlamaGpuOptions opt_;
  int rank_ = 0;
  std::vector<std::unique_ptr<Engine>> peers_;
  bool own_stream_ = false;
  cudaStream_t comm_stream_ = nullptr;
  cudaEvent_t ar_ready_ = nullptr, ar_done_ = nullptr;
  float** ar_bufs_ = nullptr;
#if MP_HAVE_NCCL
  ncclComm_t comm_ = nullptr;
#endif
  LlamaSchedule sched_;
  std::string name_;
  int64_t ctx_ = 0, pos_ = 0, prompt_end_ = 0, positions_run_ = 0;
  int workers_ = 0;
  size_t smem_ = 0;
  int64_t ring_off_ = 0;
  void (*kernel_)(dev::Params) = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocs_;
  std::vector<dev::DevWeight> dw_;
  std::vector<unsigned long long> group_launches_;
  dev::Params p_{};
  int32_t* prompt_ = nullptr;
  LlamaGpuStats stats_;
};

}  // namespace

std::unique_ptr<LlamaGpu> LlamaGpu::create(const LlamaGpuShapes& s, const WeightBindings& w,
                                           const LlamaGpuOptions& o) {
  auto e = std::make_unique<Engine>(s, o);
  e->make_local_peers();
  e->init_comm();
  for (Engine* x : e->shards()) {
    if (o.tp < 1) {
      x->check_memory(&w);
      x->load_weights(w);
    } else {
      std::vector<std::vector<uint8_t>> storage;  // column slices, until they are on the GPU
      const WeightBindings sw = shard_weights(w, s, x->rank(), o.tp, storage);
      x->check_memory(&sw);
      x->load_weights(sw);
    }
    x->allocate_state();
  }
  e->count_peer_weights();
  return e;
}

int visible_gpus() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) cudaGetLastError(), n = 0;
  return n;
}
bool have_nccl() {
#if MP_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

std::unique_ptr<LlamaGpu> LlamaGpu::random(const LlamaGpuShapes& s, const LlamaGpuOptions& o, uint64_t seed) {
  auto e = std::make_unique<Engine>(s, o);
  e->make_local_peers();
  e->init_comm();
  for (Engine* x : e->shards()) {
    x->check_memory(nullptr);
    x->random_weights(seed);
    x->allocate_state();
  }
  e->count_peer_weights();
  return e;
}

}  // namespace mp::cuda
