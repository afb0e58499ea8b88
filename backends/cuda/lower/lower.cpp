// The IR -> CUDA C++ code generator. Each top-level statement becomes one kernel; the statement's code
// is the interpreter's walk written out: every node a block-cooperative loop over its elements followed
// by a barrier, METAPIPE loops as C++ loops (the outermost one strided over persistent blocks when it
// carries no value, or only running sums, which fold into per-block partials), run-time tile extents
// and origins tracked in scalar variables exactly as ir/eval.cpp tracks them, element functions emitted
// once per DAG node in fp32 (fp64 where a discrete result depends on it), tiles stored as float and
// copied 16 bytes at a time where they are contiguous.
//
// Storage: a value lives in dynamic shared memory, in global scratch per block when the statement's
// values do not all fit, or (a value that crosses top-level statements) in global memory that persists
// between kernels, its run-time extents and origins beside it. Buffer results and loop results share the
// storage of what they name; an elementwise result may take the storage of a dead operand.
#include "backends/cuda/lower/lower.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "ir/printer.h"

namespace mp::cuda {

int64_t device_bytes_of(ir::DType dt) { return dt == ir::DType::bf16 ? 2 : 4; }

namespace {

// The device functions every translation unit starts with. mp_round matches ir::round_to, mp_random
// ir::random_uniform, mp_max / mp_min std::max / std::min (NaN order included), mp_mod the Mod of ExprEval.
const char* kPrelude = R"(// Every value gets run-time extent and origin variables, and every element loop its indices; many
// are never read, which is fine.
#pragma nv_diag_suppress 177, 550
typedef unsigned long long mp_u64;
extern __shared__ float mp_smem[];  // the dynamic shared memory of every kernel below (16-byte slots)

__device__ __forceinline__ float mp_round(float x, int dt) {  // 0 f32, 1 bf16, 2 f16, 3 i32
  unsigned u = __float_as_uint(x);
  if (dt == 0 || (u & 0x7f800000u) == 0x7f800000u) return x;
  if (dt == 3) return rintf(x);
  int drop = dt == 1 ? 16 : 13;
  unsigned half = 1u << (drop - 1), lsb = (u >> drop) & 1u;
  u = (u + half - 1 + lsb) & ~((1u << drop) - 1);
  return __uint_as_float(u);
}
__device__ __forceinline__ double mp_max(double a, double b) { return a < b ? b : a; }
__device__ __forceinline__ double mp_min(double a, double b) { return b < a ? b : a; }
__device__ __forceinline__ float mp_max(float a, float b) { return a < b ? b : a; }
__device__ __forceinline__ float mp_min(float a, float b) { return b < a ? b : a; }
__device__ __forceinline__ double mp_mod(double a, double b) { return a - b * floor(a / b); }
__device__ __forceinline__ double mp_inf() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ double mp_nan() { return __longlong_as_double(0x7ff8000000000000LL); }
__device__ __forceinline__ mp_u64 mp_mix(mp_u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
__device__ double mp_random(mp_u64 seed, const long long* idx, int n) {
  mp_u64 h = mp_mix(seed);
  for (int i = 0; i < n; ++i) h = mp_mix(h ^ (mp_u64)idx[i]);
  return (double)(h >> 11) * (1.0 / 9007199254740992.0);
}
// Tensor storage: f32 and f16 as float, bf16 as its 16 bits, i32 as int; stores round as the host does.
__device__ __forceinline__ float mp_ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float mp_ld(const unsigned short* p, long long i) {
  return __uint_as_float(((unsigned)p[i]) << 16);
}
__device__ __forceinline__ float mp_ld(const int* p, long long i) { return (float)p[i]; }
__device__ __forceinline__ void mp_st(float* p, long long i, float x, int dt) { p[i] = mp_round(x, dt); }
__device__ __forceinline__ void mp_st(unsigned short* p, long long i, float x, int) {
  p[i] = (unsigned short)(__float_as_uint(mp_round(x, 1)) >> 16);
}
__device__ __forceinline__ void mp_st(int* p, long long i, float x, int) { p[i] = (int)rintf(x); }
// The first run-time error wins: code, node id, detail (see mp::cuda::DeviceError).
__device__ void mp_fail(int* err, int code, int node, long long detail) {
  if (atomicCAS(err, 0, code) == 0) {
    err[1] = node;
    ((long long*)err)[1] = detail;
  }
}
__device__ __forceinline__ long long mp_clip(long long room, long long want) {
  return room < want ? (room > 0 ? room : 0) : want;
}
// f32 division, reciprocal and square roots at the hardware's approximations (LowerOptions::fast_math:
// 1-2 ulp over the full range, subnormals kept); the host test of the lowering computes them exactly.
#ifndef MP_HOST_EMULATION
__device__ __forceinline__ float mp_fdiv(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float mp_frcp(float a) {
  float r;
  asm("rcp.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
__device__ __forceinline__ float mp_fsqrt(float a) {
  float r;
  asm("sqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
__device__ __forceinline__ float mp_frsqrt(float a) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(a));
  return r;
}
#else
inline float mp_fdiv(float a, float b) { return a / b; }
inline float mp_frcp(float a) { return 1.0f / a; }
inline float mp_fsqrt(float a) { return std::sqrt(a); }
inline float mp_frsqrt(float a) { return 1.0f / std::sqrt(a); }
#endif
// Asynchronous global -> shared copies (sm_80+ cp.async) for the tile rings of the streaming loops: 16
// bytes through L2 only (.cg), 4-byte copies for a tile's last n % 4 elements; one commit group per
// iteration, waited for with the number of groups still allowed in flight. The host test of the
// lowering provides its own versions (MP_HOST_EMULATION).
#ifndef MP_HOST_EMULATION
__device__ __forceinline__ unsigned mp_smem_addr(const void* p) {
  unsigned a;
  asm("{ .reg .u64 q; cvta.to.shared.u64 q, %1; cvt.u32.u64 %0, q; }" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void mp_cp_async16(float* s, const float* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(mp_smem_addr(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void mp_cp_async4(float* s, const float* g) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(mp_smem_addr(s)), "l"(g) : "memory");
}
__device__ __forceinline__ void mp_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void mp_cp_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Bulk copies (the TMA engine's cp.async.bulk, MP_CUDA_LOWER_COPY=bulk) for the same rings: an mbarrier
// per slot, one thread announcing an iteration's bytes on it (arrive.expect_tx) and issuing one copy per
// tile (16-byte aligned, a multiple of 16 bytes) that completes on it; the readers wait for its phase.
// Writes by ordinary stores to a slot that a bulk copy refills later need the proxy fence in the writer.
__device__ __forceinline__ void mp_bar_init(mp_u64* b, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(mp_smem_addr(b)), "r"(arrivals) : "memory");
}
__device__ __forceinline__ void mp_bar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mp_bar_expect(mp_u64* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(mp_smem_addr(b)),
               "r"(bytes) : "memory");
}
__device__ __forceinline__ void mp_bulk_copy(float* s, const float* g, unsigned bytes, mp_u64* b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(mp_smem_addr(s)), "l"(g), "r"(bytes), "r"(mp_smem_addr(b)) : "memory");
}
__device__ __forceinline__ bool mp_bar_try_wait(mp_u64* b, unsigned parity) {
  unsigned done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
               "selp.u32 %0, 1, 0, p;\n}" : "=r"(done) : "r"(mp_smem_addr(b)), "r"(parity) : "memory");
  return done != 0;
}
__device__ __forceinline__ void mp_fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
// The producer warp's ring (MP_CUDA_LOWER_PRODUCER=warp): a plain arrival on a slot's "empty" mbarrier
// (release: the arriving warp's reads and writes of the slot come before the producer's refill), and the
// named barrier 1 over the computing warps only, which the loop body takes instead of __syncthreads.
__device__ __forceinline__ void mp_bar_arrive(mp_u64* b) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(mp_smem_addr(b)) : "memory");
}
__device__ __forceinline__ void mp_sync_consumers(unsigned threads) {
  asm volatile("bar.sync 1, %0;" ::"r"(threads) : "memory");
}
// One 16-byte store of four floats to global memory (p 16-byte aligned). In PTX, so that the compiler
// neither splits it into four 4-byte stores nor merges it with the element-wise fallback beside it (a
// float4 assignment was both in outerproduct's fused store: four st.f32 in the PTX).
__device__ __forceinline__ void mp_st4(float* p, float a, float b, float c, float d) {
  asm volatile("{ .reg .u64 g; cvta.to.global.u64 g, %0; st.global.v4.f32 [g], {%1, %2, %3, %4}; }"
               ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
#endif
// Until the phase of the given parity of mbarrier *b has completed.
__device__ __forceinline__ void mp_bar_wait(mp_u64* b, unsigned parity) {
  while (!mp_bar_try_wait(b, parity)) {
  }
}
)";

std::string num(double v) {
  if (std::isnan(v)) return "mp_nan()";
  if (std::isinf(v)) return v > 0 ? "mp_inf()" : "(-mp_inf())";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eE") == std::string::npos) s += ".0";
  return s;
}

std::string ll(int64_t v) { return std::to_string(v) + "LL"; }

int dt_code(ir::DType dt) {
  switch (dt) {
    case ir::DType::f32:
      return 0;
    case ir::DType::bf16:
      return 1;
    case ir::DType::f16:
      return 2;
    case ir::DType::i32:
      return 3;
  }
  return 0;
}
const char* dev_type(ir::DType dt) {
  return dt == ir::DType::bf16 ? "unsigned short" : dt == ir::DType::i32 ? "int" : "float";
}

std::vector<int64_t> strides(const ir::Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int a = int(s.size()) - 2; a >= 0; --a) st[a] = st[a + 1] * s[a + 1];
  return st;
}

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  auto nl = s.find('\n');
  if (nl != std::string::npos) s = s.substr(0, nl);
  size_t b = s.find_first_not_of(' ');
  return b == std::string::npos ? s : s.substr(b);
}

std::string affine(const ir::Affine& a, int var = -1, const std::string& as = "") {
  std::string s = ll(a.constant);
  for (auto& [v, c] : a.terms) s += " + " + ll(c) + " * " + (v->id == var ? as : "i" + std::to_string(v->id));
  return "(" + s + ")";
}

// Union-find over value ids: a Buffer's result and a loop's result share their source's storage.
struct Groups {
  std::map<int, int> parent;
  int find(int v) {
    auto it = parent.find(v);
    if (it == parent.end() || it->second == v) return v;
    int r = find(it->second);
    parent[v] = r;
    return r;
  }
  void join(int a, int b) {
    int ra = find(a), rb = find(b);
    if (ra != rb) parent[rb] = ra;
  }
};

enum class Where { Shared, Scratch, Global };
struct Slot {
  Where where = Where::Shared;
  int64_t offset = 0;  // in floats
};

class Gen {
 public:
  Gen(const ir::Program& p, const LowerOptions& opt) : p_(p), opt_(opt) {}

  Lowered run() {
    MP_USER_CHECK(p_.metapipelined, "program '", p_.name,
                  "' is not compiled: run the pass pipeline (passes::compile) before lowering it to cuda");
    MP_USER_CHECK(opt_.threads >= 32 && opt_.threads <= 1024 && opt_.threads % 32 == 0,
                  "cuda lowering: threads per block must be a multiple of 32 in [32, 1024], got ", opt_.threads);
    out_.threads = opt_.threads;
    out_.tensors = p_.tensors;
    for (size_t i = 0; i < p_.tensors.size(); ++i) tensor_index_[p_.tensors[i]->id] = int(i);
    collect();
    count_reads();
    // Run-time extents and origins in 32 bits where every tensor and value extent allows it (fewer
    // registers live across the loops); flat offsets are computed in 64 bits either way.
    int64_t biggest = 0;
    for (auto& t : p_.tensors)
      for (int64_t d : t->shape) biggest = std::max(biggest, d);
    for (auto& [id, val] : values_) {
      (void)id;
      for (int64_t d : val->shape) biggest = std::max(biggest, d);
    }
    meta_type_ = biggest < (int64_t(1) << 30) ? "int" : "long long";
    for (size_t s = 0; s < p_.body.size(); ++s) plan_mma(int(s));
    src_ << "// metapipe program '" << p_.name << "' lowered to CUDA C++ for sm_90a: one kernel per top-level\n"
         << "// statement, launched in order by the metapipe run time (backends/cuda/lower).\n"
         << (mma_.empty() && fa_.empty() ? "// Generated code: compiled with NVRTC at run time; nvcc -arch=sm_90a -std=c++20 -c also accepts it.\n"
                          : "// Generated code: compiled with NVRTC at run time; nvcc -gencode=arch=compute_90a,code=sm_90a\n"
                            "// --expt-relaxed-constexpr -std=c++20 -I<repository root> -c also accepts it.\n");
    if (!p_.params.empty()) {
      src_ << "// parameters:";
      for (auto& [k, v] : p_.params) src_ << " " << k << "=" << v;
      src_ << "\n";
    }
    src_ << "// tensors (kernel argument mp_t[i]):\n";
    for (size_t i = 0; i < p_.tensors.size(); ++i) {
      auto& t = p_.tensors[i];
      src_ << "//   mp_t[" << i << "] " << t->name << ": " << ir::to_string(t->dtype) << ir::to_string(t->shape)
           << " " << ir::to_string(t->role) << " (stored as " << dev_type(t->dtype) << ")\n";
    }
    if (!mma_.empty() || !fa_.empty()) {
      out_.uses_tile_layer = true;
      src_ << "// The tiled matmul and attention statements are lowered onto the tile layer (tile/): compile with the repository\n"
           << "// root on the include path (the run time passes it to NVRTC).\n"
           << "#include \"tile/tile.cuh\"\n";
    }
    src_ << "\n" << kPrelude;
    for (size_t s = 0; s < p_.body.size(); ++s) {
      if (mma_.count(int(s)))
        mma_kernel(int(s));
      else if (fa_.count(int(s)))
        fa_kernel(int(s));
      else
        kernel(int(s));
    }
    out_.source = src_.str();
    return std::move(out_);
  }

 private:
  const ir::Program& p_;
  LowerOptions opt_;
  Lowered out_;
  std::ostringstream src_;
  std::map<int, int> tensor_index_;
  std::map<int, ir::Value> values_;       // every value by id
  std::map<int, int> stmt_of_;            // value id -> top-level statement defining it
  std::set<int> toplevel_;                // values defined by top-level statements (cross kernels)
  Groups groups_;
  std::map<int, Slot> global_slot_;       // group root -> slot in mp_gv
  std::map<int, int64_t> global_meta_;    // value id -> offset in mp_gm
  std::string meta_type_ = "long long";    // of the run-time extent and origin variables
  std::set<int> fold_stmts_;              // top-level loops whose carried values are sums (see foldable)
  std::set<int> partials_;                // their carried arguments: per-block partial sums
  std::map<int, int64_t> fold_counter_;   // statement -> its blocks-done counter in mp_gm
  // Per kernel.
  std::map<int, Slot> slot_;              // group root -> slot
  int64_t fold_meta_ = 0;                 // scratch offset of the partials' run-time extents
  std::string ind_;

  std::string where_of(const ir::Node& n) const { return n.where() + " in " + p_.name; }

  // ---- a tiled matmul onto the tile layer's pipeline (wgmma) ----
  // The statement is the slide-51 loop nest, whatever stages the metapipeline pass cut it into:
  //   METAPIPE i { a = LOAD_TILE(A[MM*i, 0] : [MM, K]);
  //                METAPIPE j { b = LOAD_TILE(B[0, NN*j] : [K, NN]); c = MAT_MUL(a, b); [BUFFER(c)];
  //                             STORE_TILE(C[MM*i, NN*j], c) } }
  // with A, B and C bf16. The whole K extent of the two tiles becomes the pipeline's K loop of 64-wide
  // steps through a shared-memory ring, so neither strip has to fit on chip.
  // Or the blocked form (the gemm program): the K extent in a loop of its own whose carried tile sums
  // the products, stored once after it:
  //   METAPIPE i { METAPIPE j { acc = FILL 0; c = METAPIPE k carry(acc) { a = LOAD_TILE(A[MM*i, KK*k]);
  //                b = LOAD_TILE(B[KK*k, NN*j]); acc + MAT_MUL(a, b) }; STORE_TILE(C[MM*i, NN*j], c) } }
  // Both become the same kernel: the pipeline's K loop of 64-wide steps runs over all of K either way.
  struct MmaPlan {
    const ir::MetaPipe *outer = nullptr, *inner = nullptr;
    const ir::MetaPipe* k_loop = nullptr;  // the blocked form's K loop, else null
    const ir::LoadTile *la = nullptr, *lb = nullptr;
    const ir::MatMul* mm = nullptr;
    const ir::StoreTile* st = nullptr;
    int64_t M = 0, N = 0, K = 0, MM = 0, NN = 0;
  };
  std::map<int, MmaPlan> mma_;           // statement -> plan
  std::map<int, std::string> mma_note_;  // statement with a MatMul left to the element loops -> why

  // coef * v (a loop of one iteration may have had its variable folded away: then the constant 0).
  static bool is_var_times(const ir::Affine& a, const ir::LoopVar& v, int64_t coef) {
    if (a.constant != 0) return false;
    if (a.terms.empty()) return v->trip == 1;
    return a.terms.size() == 1 && a.terms[0].first->id == v->id && a.terms[0].second == coef;
  }
  static bool is_zero(const ir::Affine& a) { return a.constant == 0 && a.terms.empty(); }

  // The blocked form's inner body (see MmaPlan): "" and p filled, or why not.
  std::string mma_blocked_refusal(const std::vector<ir::NodeRef>& ib, MmaPlan& p) const {
    if (ib.size() != 3 || !ib[0]->as<ir::Fill>() || !ib[1]->as<ir::MetaPipe>() || !ib[2]->as<ir::StoreTile>())
      return "the inner loop is neither LoadTile, MatMul, [Buffer,] StoreTile nor Fill, a K loop, StoreTile";
    const ir::Fill& fill = *ib[0]->as<ir::Fill>();
    p.k_loop = ib[1]->as<ir::MetaPipe>();
    p.st = ib[2]->as<ir::StoreTile>();
    const ir::ExprNode& f0 = fill.f.node();
    if (f0.op != ir::ExprOp::Const || f0.value != 0.0) return "the K loop's sum does not start at 0";
    if (p.k_loop->carried.size() != 1) return "the K loop carries other than one sum";
    const ir::Carried& c = p.k_loop->carried[0];
    if (c.init->id != fill.out->id || !foldable(*p.k_loop) || fold_op(*p.k_loop, c) != ir::ExprOp::Add)
      return "the K loop's carried value is not a running sum from the Fill";
    auto kb = p.k_loop->body();
    if (kb.size() != 4 || !kb[0]->as<ir::LoadTile>() || !kb[1]->as<ir::LoadTile>() || !kb[2]->as<ir::MatMul>() ||
        !kb[3]->as<ir::Zip>())
      return "the K loop is not LoadTile, LoadTile, MatMul, Zip";
    p.la = kb[0]->as<ir::LoadTile>();
    p.lb = kb[1]->as<ir::LoadTile>();
    p.mm = kb[2]->as<ir::MatMul>();
    const ir::Zip& z = *kb[3]->as<ir::Zip>();
    if (z.out->id != c.next->id || z.ins[1]->id != p.mm->out->id) return "the K loop does not sum the products";
    if (p.st->in->id != c.result->id) return "the StoreTile does not store the K loop's sum";
    return "";
  }

  // Why the statement `outer` does not take the wgmma path ("" when it does, with p filled).
  std::string mma_refusal(const ir::MetaPipe& outer, MmaPlan& p) const {
    if (!outer.carried.empty()) return "the outer loop carries values";
    auto ob = outer.body();
    p.outer = &outer;
    if (ob.size() == 2 && ob[0]->as<ir::LoadTile>() && ob[1]->as<ir::MetaPipe>()) {
      p.la = ob[0]->as<ir::LoadTile>();
      p.inner = ob[1]->as<ir::MetaPipe>();
    } else if (ob.size() == 1 && ob[0]->as<ir::MetaPipe>()) {
      p.inner = ob[0]->as<ir::MetaPipe>();
    } else {
      return "the outer loop is not [a LoadTile and] an inner loop";
    }
    if (!p.inner->carried.empty()) return "the inner loop carries values";
    auto ib = p.inner->body();
    size_t n = ib.size();
    ir::Value c;
    if (p.la) {
      if (n < 3 || n > 4 || !ib[0]->as<ir::LoadTile>() || !ib[1]->as<ir::MatMul>() || !ib[n - 1]->as<ir::StoreTile>() ||
          (n == 4 && !ib[2]->as<ir::Buffer>()))
        return "the inner loop is not LoadTile, MatMul, [Buffer,] StoreTile";
      p.lb = ib[0]->as<ir::LoadTile>();
      p.mm = ib[1]->as<ir::MatMul>();
      p.st = ib[n - 1]->as<ir::StoreTile>();
      c = n == 4 ? ib[2]->out : p.mm->out;
      if (n == 4 && ib[2]->as<ir::Buffer>()->in->id != p.mm->out->id) return "the Buffer is not the MatMul's";
      if (p.st->in->id != c->id) return "the StoreTile does not store the product";
    } else {
      std::string why = mma_blocked_refusal(ib, p);
      if (!why.empty()) return why;
    }
    if (p.mm->a->id != p.la->out->id || p.mm->b->id != p.lb->out->id) return "the MatMul's operands are not the two tiles";
    if (p.mm->transpose_a || p.mm->transpose_b) return "a transposed MatMul operand";
    const ir::Tensor &A = p.la->src, &B = p.lb->src, &C = p.st->dst;
    if (A->dtype != ir::DType::bf16 || B->dtype != ir::DType::bf16 || C->dtype != ir::DType::bf16)
      return "A, B and C are not all bf16 (wgmma here is bf16 x bf16 -> fp32)";
    if (A->shape.size() != 2 || B->shape.size() != 2 || C->shape.size() != 2) return "a tensor of rank other than 2";
    p.M = A->shape[0], p.K = A->shape[1], p.N = B->shape[1];
    if (B->shape[0] != p.K || C->shape[0] != p.M || C->shape[1] != p.N) return "the tensors' shapes do not chain";
    p.MM = p.la->out->shape[0], p.NN = p.lb->out->shape[1];
    // The K tiles: all of K in one tile, or the K loop's KK-wide tiles covering it once.
    const int64_t KK = p.k_loop ? p.la->out->shape[1] : p.K;
    if (p.la->out->shape[1] != KK || p.lb->out->shape[0] != KK || (p.k_loop && p.k_loop->trip() * KK != p.K))
      return p.k_loop ? "the K loop's tiles do not cover K once" : "the tiles do not span K";
    auto k_offset = [&](const ir::Affine& a) { return p.k_loop ? is_var_times(a, p.k_loop->var, KK) : is_zero(a); };
    if (p.st->in->shape != ir::Shape{p.MM, p.NN}) return "the stored tile is not [MM, NN]";
    if (!is_var_times(p.la->offset[0], outer.var, p.MM) || !k_offset(p.la->offset[1]) || !k_offset(p.lb->offset[0]) ||
        !is_var_times(p.lb->offset[1], p.inner->var, p.NN) || !is_var_times(p.st->offset[0], outer.var, p.MM) ||
        !is_var_times(p.st->offset[1], p.inner->var, p.NN))
      return p.k_loop ? "the tile offsets are not A[MM*i, KK*k], B[KK*k, NN*j], C[MM*i, NN*j]"
                      : "the tile offsets are not A[MM*i, 0], B[0, NN*j], C[MM*i, NN*j]";
    if (outer.trip() != (p.M + p.MM - 1) / p.MM || p.inner->trip() != (p.N + p.NN - 1) / p.NN)
      return "the loops do not cover C's tiles once";
    if (p.MM != 64 && p.MM != 128) return "MM=" + std::to_string(p.MM) + " (wgmma tiles take MM = 64 or 128)";
    if (p.NN != 64 && p.NN != 128 && p.NN != 256)
      return "NN=" + std::to_string(p.NN) + " (wgmma tiles take NN = 64, 128 or 256)";
    if (p.K % 8 != 0 || p.N % 8 != 0)
      return "K=" + std::to_string(p.K) + ", N=" + std::to_string(p.N) +
             " (TMA needs rows of a multiple of 16 bytes: K and N multiples of 8)";
    if (p.M >= (int64_t(1) << 31) || p.N >= (int64_t(1) << 31) || p.K >= (int64_t(1) << 31) ||
        outer.trip() * p.inner->trip() >= (int64_t(1) << 31))
      return "a dimension or the tile count past 2^31";
    return "";
  }
  // ---- an attention fold onto the tile layer's pipeline (wgmma) ----
  // The statement is FlashAttention's loop nest, whatever stages the metapipeline pass cut it into:
  //   METAPIPE i { q = LOAD_TILE(Q[BR*i, 0] : [BR, D]); r0.. = FILL c; o0 = FILL c;
  //                rows.., o = METAPIPE_FOLD j carry(rows.. = r0.., o = o0) {
  //                  k = LOAD_TILE(K[BC*j, 0] : [BC, D]); v = LOAD_TILE(V[BC*j, 0] : [BC, D]);
  //                  s = MAT_MUL(q, k^T); element nodes over s and rows, Reduces of them along the row;
  //                  pv = MAT_MUL(p, v) (p one of the element nodes); o' = g(o, rows) + pv }
  //                element nodes over o and rows; STORE_TILE(O[BR*i, 0], ...) }
  // with Q, K, V and O bf16. Each value of the fold is one of three kinds, by what it is computed from:
  // 'T' the [BR, BC] scores and what is computed from them element by element (wgmma accumulator
  // layout), 'R' a value per query row ([BR, 1]: the Reduces along the row and what is computed from
  // them; two rows per thread), 'O' the [BR, D] output rows (the carried accumulator). 'P' is the P V
  // product, read only by the accumulator's update.
  struct FaPlan {
    const ir::MetaPipe *outer = nullptr, *fold = nullptr;
    const ir::LoadTile *lq = nullptr, *lk = nullptr, *lv = nullptr;
    const ir::MatMul *qk = nullptr, *pv = nullptr;
    const ir::Zip* o_next = nullptr;       // the carried [BR, D] value's update: g(o, rows) + pv
    const ir::ExprNode* o_rest = nullptr;  // g
    const ir::StoreTile* st = nullptr;
    std::vector<const ir::Node*> body;     // the fold's MatMuls, element nodes and Reduces, in order
    std::vector<const ir::Node*> after;    // the element nodes between the fold and the StoreTile
    std::map<int, double> fill;            // Fill result -> its constant
    std::map<int, char> kind;              // value id -> 'Q', 'K', 'V', 'T', 'R', 'O', 'P'
    std::map<int, std::string> name;       // value id -> its variable in the generated code
    int o_carried = -1;                    // the accumulator's index in fold->carried
    int64_t S = 0, Skv = 0, D = 0, BR = 0, BC = 0, stages = 0;
    bool causal_skip = false;  // the item's fold stops at the last key tile that reaches its last row (fa_causal_skip)
  };
  std::map<int, FaPlan> fa_;           // statement -> plan
  std::map<int, std::string> fa_note_;  // statement with an attention-shaped fold left to the element loops -> why

  // Whether the statement looks like an attention fold (a carried inner loop with two MatMuls): then a
  // refusal of the attention pipeline is the reason its kernel gives.
  static bool attention_shaped(const ir::MetaPipe& outer) {
    for (auto& n : outer.body())
      if (auto* m = n->as<ir::MetaPipe>(); m && !m->carried.empty()) {
        int mms = 0;
        for (auto& x : m->body()) mms += x->kind == ir::NodeKind::MatMul;
        if (mms >= 2) return true;
      }
    return false;
  }

  // Why the statement `outer` does not take the attention pipeline ("" when it does, with p filled).
  std::string fa_refusal(const ir::MetaPipe& outer, FaPlan& p) const {
    if (!outer.carried.empty()) return "the outer loop carries values";
    p.outer = &outer;
    for (auto& n : outer.body()) {
      if (auto* l = n->as<ir::LoadTile>()) {
        if (p.lq || p.fold) return "the outer loop loads other than one tile before the fold";
        p.lq = l;
      } else if (auto* f = n->as<ir::Fill>()) {
        if (p.fold) return "a Fill after the fold";
        const ir::ExprNode& e = f->f.node();
        if (e.op != ir::ExprOp::Const) return f->where() + " fills other than a constant";
        p.fill[f->out->id] = e.value;
      } else if (auto* m = n->as<ir::MetaPipe>()) {
        if (p.fold) return "the outer loop has two inner loops";
        p.fold = m;
      } else if (n->as<ir::Map>() || n->as<ir::Zip>()) {
        if (!p.fold || p.st) return n->where() + " outside the fold is not between the fold and the StoreTile";
        p.after.push_back(n.get());
      } else if (auto* s = n->as<ir::StoreTile>()) {
        if (!p.fold || p.st) return "the outer loop does not end in one StoreTile after the fold";
        p.st = s;
      } else {
        return std::string("a ") + ir::to_string(n->kind) + " in the outer loop";
      }
    }
    if (!p.lq || !p.fold || !p.st) return "the outer loop is not a LoadTile, Fills, a fold and a StoreTile";
    const ir::MetaPipe& fold = *p.fold;
    if (fold.carried.empty()) return "the inner loop carries nothing";
    for (auto& n : fold.body()) {
      if (auto* l = n->as<ir::LoadTile>()) {
        if (p.lk && p.lv) return "the fold loads more than two tiles";
        (p.lk ? p.lv : p.lk) = l;
        continue;
      }
      if (auto* mm = n->as<ir::MatMul>()) {
        if (p.qk && p.pv) return "the fold has more than two MatMuls";
        (p.qk ? p.pv : p.qk) = mm;
      } else if (!n->as<ir::Map>() && !n->as<ir::Zip>() && !n->as<ir::Reduce>()) {
        return std::string("a ") + ir::to_string(n->kind) + " in the fold";
      }
      p.body.push_back(n.get());
    }
    if (!p.lk || !p.lv || !p.qk || !p.pv) return "the fold does not load two tiles and run two MatMuls";
    if (p.qk->a->id != p.lq->out->id || p.qk->transpose_a || !p.qk->transpose_b)
      return "the first MatMul is not the query tile times a loaded tile transposed";
    if (p.qk->b->id == p.lv->out->id) std::swap(p.lk, p.lv);
    if (p.qk->b->id != p.lk->out->id) return "the first MatMul's B is not a tile the fold loads";
    if (p.pv->b->id != p.lv->out->id || p.pv->transpose_a || p.pv->transpose_b)
      return "the second MatMul is not a product times the fold's other tile";
    const ir::Tensor &Q = p.lq->src, &K = p.lk->src, &V = p.lv->src, &O = p.st->dst;
    if (Q->dtype != ir::DType::bf16 || K->dtype != ir::DType::bf16 || V->dtype != ir::DType::bf16 ||
        O->dtype != ir::DType::bf16)
      return "Q, K, V and O are not all bf16 (wgmma here is bf16 x bf16 -> fp32)";
    if (Q->shape.size() != 2 || K->shape.size() != 2 || V->shape.size() != 2 || O->shape.size() != 2)
      return "a tensor of rank other than 2";
    p.S = Q->shape[0], p.D = Q->shape[1], p.Skv = K->shape[0];
    p.BR = p.lq->out->shape[0], p.BC = p.lk->out->shape[0];
    if (K->shape != V->shape || K->shape[1] != p.D || O->shape != Q->shape) return "the tensors' shapes do not chain";
    if (p.lq->out->shape[1] != p.D || p.lk->out->shape != ir::Shape{p.BC, p.D} || p.lv->out->shape != p.lk->out->shape)
      return "the tiles do not span D";
    if (!is_var_times(p.lq->offset[0], outer.var, p.BR) || !is_zero(p.lq->offset[1]) ||
        !is_var_times(p.lk->offset[0], fold.var, p.BC) || !is_zero(p.lk->offset[1]) ||
        !is_var_times(p.lv->offset[0], fold.var, p.BC) || !is_zero(p.lv->offset[1]) ||
        !is_var_times(p.st->offset[0], outer.var, p.BR) || !is_zero(p.st->offset[1]))
      return "the tile offsets are not Q[BR*i, 0], K[BC*j, 0], V[BC*j, 0], O[BR*i, 0]";
    if (outer.trip() != (p.S + p.BR - 1) / p.BR || fold.trip() != (p.Skv + p.BC - 1) / p.BC)
      return "the loops do not cover the query and key tiles once";
    // The kinds, in program order.
    p.kind[p.lq->out->id] = 'Q';
    p.kind[p.lk->out->id] = 'K';
    p.kind[p.lv->out->id] = 'V';
    const ir::Shape row_shape{p.BR, 1}, o_shape{p.BR, p.D}, s_shape{p.BR, p.BC};
    int rows = 0;
    for (size_t c = 0; c < fold.carried.size(); ++c) {
      const ir::Carried& cv = fold.carried[c];
      if (!p.fill.count(cv.init->id)) return "a carried value does not start from a constant Fill";
      if (cv.arg->shape == o_shape && p.o_carried < 0) {
        p.o_carried = int(c);
        p.kind[cv.arg->id] = p.kind[cv.result->id] = 'O';
        p.name[cv.arg->id] = p.name[cv.result->id] = "st.o";
      } else if (cv.arg->shape == row_shape) {
        p.kind[cv.arg->id] = p.kind[cv.result->id] = 'R';
        p.name[cv.arg->id] = p.name[cv.result->id] = "st.r" + std::to_string(rows++);
      } else {
        return "a carried value is neither [BR, 1] nor the one [BR, D] accumulator";
      }
    }
    if (p.o_carried < 0) return "no carried [BR, D] accumulator";
    const ir::Carried& oc = fold.carried[size_t(p.o_carried)];
    auto kind_of = [&](const ir::Value& v) { return p.kind.count(v->id) ? p.kind.at(v->id) : '?'; };
    for (const ir::Node* n : p.body) {
      const std::string id = std::to_string(n->out->id);
      if (n == p.qk) {
        p.kind[n->out->id] = 'T';
      } else if (n == p.pv) {
        if (kind_of(p.pv->a) != 'T') return "the second MatMul's A is not computed from the scores";
        p.kind[n->out->id] = 'P';
      } else if (auto* r = n->as<ir::Reduce>()) {
        if (kind_of(r->in) != 'T' || r->axis != 1) return r->where() + " is not a row reduction of the scores";
        if (r->pre || (r->combiner != ir::Combiner::Add && r->combiner != ir::Combiner::Max &&
                       r->combiner != ir::Combiner::Min))
          return r->where() + " is not a sum, max or min";
        p.kind[n->out->id] = 'R';
      } else {
        std::vector<ir::Value> ins = n->as<ir::Map>() ? std::vector<ir::Value>{n->as<ir::Map>()->in} : n->as<ir::Zip>()->ins;
        int t = 0, o = 0, pp = 0;
        for (auto& x : ins) {
          char k = kind_of(x);
          t += k == 'T', o += k == 'O', pp += k == 'P';
          if (k != 'T' && k != 'R' && k != 'O' && k != 'P') return n->where() + " reads a loaded tile or a value from outside the fold";
        }
        if (pp > 0) {
          auto* z = n->as<ir::Zip>();
          if (!z || pp != 1 || t > 0 || z->out->id != oc.next->id)
            return n->where() + " reads the second MatMul but is not the accumulator's update";
          int pi = 0;
          while (ins[size_t(pi)]->id != p.pv->out->id) ++pi;
          const ir::ExprNode& f = z->f.node();
          auto is_pv = [&](const ir::ExprNode& e) { return e.op == ir::ExprOp::Arg && e.index == pi; };
          if (f.op != ir::ExprOp::Add || f.kids.size() != 2 || (!is_pv(*f.kids[0]) && !is_pv(*f.kids[1])))
            return n->where() + " is not g(o, rows) + P V";
          p.o_rest = is_pv(*f.kids[1]) ? f.kids[0].get() : f.kids[1].get();
          std::set<const ir::ExprNode*> seen;
          std::function<bool(const ir::ExprNode&)> reads_pv = [&](const ir::ExprNode& e) {
            if (!seen.insert(&e).second) return false;
            if (is_pv(e)) return true;
            for (auto& k : e.kids)
              if (reads_pv(*k)) return true;
            return false;
          };
          if (reads_pv(*p.o_rest)) return n->where() + " is not g(o, rows) + P V";
          if (z->out->dtype != ir::DType::f32) return "the accumulator is not f32";
          p.o_next = z;
          p.kind[n->out->id] = 'O';
        } else if (t > 0) {
          if (o > 0) return n->where() + " mixes the scores and the output rows";
          if (n->out->shape != s_shape) return n->where() + " is not [BR, BC]";
          p.kind[n->out->id] = 'T';
        } else if (o == 0) {
          if (n->out->shape != row_shape) return n->where() + " broadcasts rows into a tile";
          p.kind[n->out->id] = 'R';
        } else {
          return n->where() + " is an element node over [BR, D] other than the accumulator's update";
        }
      }
      if (!p.name.count(n->out->id)) p.name[n->out->id] = "v" + id;
    }
    if (!p.o_next) return "the accumulator's next value is not g(o, rows) + P V";
    for (const ir::Node* n : p.body)  // the product and the old accumulator are read by the update only
      for (auto& x : n->operands())
        if ((x->id == p.pv->out->id || x->id == oc.arg->id) && n != p.o_next)
          return n->where() + " reads the accumulator or P V";
    for (auto& c : fold.carried)
      if (c.next->id != oc.next->id && kind_of(c.next) != 'R') return "a carried row value's next value is not a row value";
    for (const ir::Node* n : p.after) {
      std::vector<ir::Value> ins = n->as<ir::Map>() ? std::vector<ir::Value>{n->as<ir::Map>()->in} : n->as<ir::Zip>()->ins;
      bool any_o = false;
      for (auto& x : ins) {
        char k = kind_of(x);
        if ((k != 'R' && k != 'O') || !p.name.count(x->id)) return n->where() + " reads other than the fold's results";
        any_o = any_o || k == 'O';
      }
      if (n->out->shape != (any_o ? o_shape : row_shape)) return n->where() + " is neither [BR, D] nor [BR, 1]";
      p.kind[n->out->id] = any_o ? 'O' : 'R';
      p.name[n->out->id] = "v" + std::to_string(n->out->id);
    }
    if (kind_of(p.st->in) != 'O' || p.st->in->shape != o_shape) return "the StoreTile does not store the output rows";
    if (p.D != 64 && p.D != 128 && p.D != 256)
      return "D=" + std::to_string(p.D) + " (the attention pipeline takes D = 64, 128 or 256)";
    if (p.BR != 64 && p.BR != 128)
      return "BR=" + std::to_string(p.BR) + " (one 64-row consumer warpgroup per 64 query rows: BR = 64 or 128)";
    if (p.BC != 64 && p.BC != 128)
      return "BC=" + std::to_string(p.BC) + " (the scores' wgmma width: BC = 64 or 128)";
    const int64_t q_bytes = (p.BR * p.D * 2 + 1023) / 1024 * 1024, stage_bytes = 2 * p.BC * p.D * 2;
    const int64_t budget = std::min<int64_t>(opt_.smem_bytes, 227 * 1024);
    p.stages = std::min<int64_t>(4, (budget - 1024 - q_bytes - 16 * 8) / stage_bytes);
    if (p.stages < 2)
      return "BC=" + std::to_string(p.BC) + ", D=" + std::to_string(p.D) + " (two " + std::to_string(stage_bytes / 1024) +
             " KiB K / V stages do not fit beside the " + std::to_string(q_bytes / 1024) + " KiB of Q tiles)";
    if (p.S >= (int64_t(1) << 30) || p.Skv >= (int64_t(1) << 30)) return "a sequence past 2^30";
    p.causal_skip = fa_causal_skip(p);
    return "";
  }
  // ---- key tiles past a causal diagonal ----
  // Whether the fold's iterations over key tiles whose every key is past every query row of the item
  // (key > row) provably leave every carried value as it is, so that the item's fold may stop at the
  // last key tile that reaches its last row. An abstract run of the fold body over such a tile: a value
  // is a constant, "the carried value k unchanged" (finite: a running value after the first key tile,
  // which always holds key 0, for finite inputs), an index of the scores (index(0) the row, index(1)
  // the key: in such a tile index(1) > index(0) everywhere), or unknown. It holds when a comparison of
  // the two indices took a part (the causal select) and every carried value's next value is itself.
  struct FaAbs {
    enum Kind { Unknown, Const, Same, Index } kind = Unknown;
    double c = 0;  // Const
    int k = 0;     // Same: the carried value; Index: the axis
    bool operator==(const FaAbs& o) const {
      return kind == o.kind && kind != Unknown && (kind == Const ? (c == o.c || (std::isnan(c) && std::isnan(o.c))) : k == o.k);
    }
  };
  static FaAbs fa_const(double c) { return {FaAbs::Const, c, 0}; }
  static FaAbs fa_abs(const ir::ExprNode& n, const std::vector<FaAbs>& args, bool scores, bool& used_causal) {
    using O = ir::ExprOp;
    if (n.op == O::Const) return fa_const(n.value);
    if (n.op == O::Arg) return size_t(n.index) < args.size() ? args[size_t(n.index)] : FaAbs{};
    if (n.op == O::Index) return scores && n.index < 2 ? FaAbs{FaAbs::Index, 0, n.index} : FaAbs{};
    std::vector<FaAbs> k;
    for (auto& kid : n.kids) k.push_back(fa_abs(*kid, args, scores, used_causal));
    auto is = [](const FaAbs& a, double c) { return a.kind == FaAbs::Const && a.c == c; };
    auto all_const = [&] {
      for (auto& x : k)
        if (x.kind != FaAbs::Const) return false;
      return !k.empty();
    };
    switch (n.op) {
      case O::Le:
      case O::Lt:
      case O::Eq:
        if (k[0].kind == FaAbs::Index && k[1].kind == FaAbs::Index && k[0].k != k[1].k) {
          used_causal = true;  // index(1) > index(0): key <= row and key < row are false, row < key true
          if (n.op == O::Eq) return fa_const(0);
          return fa_const(k[0].k == 0 ? 1 : 0);
        }
        if (all_const())
          return fa_const(n.op == O::Le ? k[0].c <= k[1].c : n.op == O::Lt ? k[0].c < k[1].c : k[0].c == k[1].c);
        return {};
      case O::Select:
        if (k[0].kind == FaAbs::Const) return k[0].c != 0 ? k[1] : k[2];
        if (k[1] == k[2]) return k[1];
        return {};
      case O::Max:
        if (is(k[1], -INFINITY)) return k[0];
        if (is(k[0], -INFINITY)) return k[1];
        if (all_const()) return fa_const(k[0].c < k[1].c ? k[1].c : k[0].c);
        return {};
      case O::Min:
        if (is(k[1], INFINITY)) return k[0];
        if (is(k[0], INFINITY)) return k[1];
        if (all_const()) return fa_const(k[1].c < k[0].c ? k[1].c : k[0].c);
        return {};
      case O::Add:
        if (is(k[1], 0)) return k[0];
        if (is(k[0], 0)) return k[1];
        if (all_const()) return fa_const(k[0].c + k[1].c);
        return {};
      case O::Sub:
        if (k[0].kind == FaAbs::Same && k[0] == k[1]) return fa_const(0);  // finite
        if (is(k[0], -INFINITY) && k[1].kind == FaAbs::Same) return fa_const(-INFINITY);
        if (is(k[1], 0)) return k[0];
        if (all_const()) return fa_const(k[0].c - k[1].c);
        return {};
      case O::Mul:
        if (is(k[1], 1)) return k[0];
        if (is(k[0], 1)) return k[1];
        if ((is(k[0], 0) && k[1].kind == FaAbs::Same) || (is(k[1], 0) && k[0].kind == FaAbs::Same)) return fa_const(0);
        if (all_const()) return fa_const(k[0].c * k[1].c);
        return {};
      case O::Div:
        if (is(k[1], 1)) return k[0];
        if (all_const()) return fa_const(k[0].c / k[1].c);
        return {};
      case O::Neg:
        return all_const() ? fa_const(-k[0].c) : FaAbs{};
      case O::Exp:
        return all_const() ? fa_const(std::exp(k[0].c)) : FaAbs{};
      default:
        return {};
    }
  }
  // The abstract run over a tile past the diagonal (see FaAbs): true when the item's fold may stop there.
  static bool fa_causal_skip(const FaPlan& p) {
    std::map<int, FaAbs> val;
    for (size_t c = 0; c < p.fold->carried.size(); ++c) val[p.fold->carried[c].arg->id] = {FaAbs::Same, 0, int(c)};
    auto get = [&](const ir::Value& v) { return val.count(v->id) ? val.at(v->id) : FaAbs{}; };
    bool used_causal = false;
    for (const ir::Node* n : p.body) {
      FaAbs r;
      if (n == p.qk) {
        r = {};  // the scores: finite for finite inputs
      } else if (n == p.pv) {
        if (get(p.pv->a).kind == FaAbs::Const && get(p.pv->a).c == 0) r = fa_const(0);  // 0 x V (finite)
      } else if (auto* red = n->as<ir::Reduce>()) {
        FaAbs in = get(red->in);
        if (in.kind == FaAbs::Const && (red->combiner != ir::Combiner::Add || in.c == 0)) r = in;
      } else {
        std::vector<ir::Value> ins = n->as<ir::Map>() ? std::vector<ir::Value>{n->as<ir::Map>()->in} : n->as<ir::Zip>()->ins;
        std::vector<FaAbs> a;
        for (auto& x : ins) a.push_back(get(x));
        const ir::Expr& f = n->as<ir::Map>() ? n->as<ir::Map>()->f : n->as<ir::Zip>()->f;
        r = fa_abs(f.node(), a, p.kind.at(n->out->id) == 'T', used_causal);
        if (r.kind == FaAbs::Index) r = {};
      }
      val[n->out->id] = r;
    }
    if (!used_causal) return false;
    for (size_t c = 0; c < p.fold->carried.size(); ++c) {
      FaAbs nx = get(p.fold->carried[c].next);
      if (nx.kind != FaAbs::Same || nx.k != int(c)) return false;
    }
    return true;
  }

  void plan_mma(int stmt) {
    auto* m = p_.body[size_t(stmt)]->as<ir::MetaPipe>();
    if (!m) return;
    bool has_matmul = false;
    ir::walk(std::vector<ir::NodeRef>{p_.body[size_t(stmt)]},
             [&](const ir::NodeRef& n, int) { has_matmul = has_matmul || n->kind == ir::NodeKind::MatMul; });
    if (!has_matmul) return;
    if (opt_.matmul == LowerOptions::Matmul::Generic) {
      (attention_shaped(*m) ? fa_note_ : mma_note_)[stmt] = "MP_CUDA_LOWER_MATMUL=generic";
      return;
    }
    MmaPlan plan;
    std::string why = mma_refusal(*m, plan);
    if (why.empty()) {
      mma_[stmt] = plan;
      return;
    }
    if (attention_shaped(*m)) {
      FaPlan fa;
      std::string fa_why = fa_refusal(*m, fa);
      if (fa_why.empty())
        fa_[stmt] = std::move(fa);
      else
        fa_note_[stmt] = fa_why;
      return;
    }
    mma_note_[stmt] = why;
  }

  void define(const ir::Value& v, int stmt) {
    if (!v) return;
    values_[v->id] = v;
    stmt_of_[v->id] = stmt;
  }

  void collect() {
    for (size_t s = 0; s < p_.body.size(); ++s) {
      int stmt = int(s);
      auto& top = p_.body[s];
      if (top->out) toplevel_.insert(top->out->id);
      auto* top_loop = top->as<ir::MetaPipe>();
      if (top_loop)
        for (auto& c : top_loop->carried) toplevel_.insert(c.result->id);
      bool fold = top_loop && foldable(*top_loop);
      if (fold) {
        fold_stmts_.insert(stmt);
        for (auto& c : top_loop->carried) partials_.insert(c.arg->id);
      }
      ir::walk(std::vector<ir::NodeRef>{top}, [&](const ir::NodeRef& n, int) {
        define(n->out, stmt);
        if (auto* b = n->as<ir::Buffer>()) groups_.join(b->in->id, b->out->id);
        if (auto* m = n->as<ir::MetaPipe>()) {
          MP_USER_CHECK(m->scheduled, where_of(*n), " is not metapipelined: run passes::compile first");
          for (auto& c : m->carried) {
            define(c.arg, stmt);
            define(c.result, stmt);
            // A folded loop's argument is a per-block partial sum, not the result's storage.
            if (!(fold && n.get() == top.get())) groups_.join(c.arg->id, c.result->id);
            if (c.init->shape != c.arg->shape || c.next->shape != c.arg->shape)
              throw cuda_not_supported(where_of(*n) + " (a carried value changes shape)");
            // The copies next -> arg run one after another: a next that is another carried argument
            // of the same loop would be overwritten before it is read.
            for (auto& d : m->carried)
              if (&d != &c && d.arg->id == c.next->id)
                throw cuda_not_supported(where_of(*n) + " (carried values that swap)");
          }
        }
        for (auto& v : n->operands()) values_.emplace(v->id, v);
        check_supported(*n);
      });
    }
    // Elementwise results written over a dead operand (after the carried values are known).
    for (auto& top : p_.body)
      ir::walk(std::vector<ir::NodeRef>{top}, [&](const ir::NodeRef& n, int) {
        if (auto* m = n->as<ir::MetaPipe>())
          for (auto& c : m->carried) pinned_.insert({c.init->id, c.arg->id, c.next->id, c.result->id});
      });
    for (auto& top : p_.body)
      ir::walk(std::vector<ir::NodeRef>{top}, [&](const ir::NodeRef& n, int) {
        if (auto* m = n->as<ir::MetaPipe>()) plan_in_place(*m);
      });
    // Groups holding a value that crosses statements live in global memory, in program order.
    int64_t off = 0;
    for (auto& [id, v] : values_) {
      if (!toplevel_.count(id)) continue;
      int r = groups_.find(id);
      if (!global_slot_.count(r)) {
        global_slot_[r] = {Where::Global, off};
        off += (ir::num_elements(values_.at(r)->shape) + 3) / 4 * 4;
      }
    }
    // Every member of a global group (e.g. the loop-carried argument of a top-level loop) is global.
    for (auto& [id, v] : values_) {
      (void)v;
      int r = groups_.find(id);
      if (global_slot_.count(r) && !toplevel_.count(id)) toplevel_.insert(id);
    }
    int64_t meta = 0;
    for (int id : toplevel_) {
      global_meta_[id] = meta;
      meta += 2 * int64_t(values_.at(id)->shape.size());
    }
    for (int s : fold_stmts_) fold_counter_[s] = meta++;  // the blocks-done counter of a folded loop
    out_.global_floats = off;
    out_.global_meta = meta;
  }

  // A Map or Zip in a loop body writes its result over an operand of the same shape whose storage
  // (its group: Buffer aliases included) is read by nothing after it in the iteration: the element loop
  // reads element x of the operand and writes element x of the result in the same thread, so no other
  // thread sees the overwrite. Fewer tiles in shared memory is more blocks per SM (softmax keeps one
  // tile instead of three). Only operands defined in the same loop body: a value from outside an inner
  // loop is read again by its next iteration. Carried and cross-statement values keep their storage.
  std::set<int> pinned_;
  void plan_in_place(const ir::MetaPipe& m) {
    std::vector<const ir::Node*> ops;
    for (auto& st : m.stages)
      for (auto& op : st.ops) ops.push_back(op.get());
    std::map<int, size_t> defined_at;
    std::vector<std::vector<int>> reads(ops.size());
    for (size_t j = 0; j < ops.size(); ++j) {
      if (ops[j]->out) defined_at[ops[j]->out->id] = j;
      auto add = [&](const ir::Node& n) {
        for (auto& x : n.operands()) reads[j].push_back(x->id);
        if (auto* inner = n.as<ir::MetaPipe>())
          for (auto& c : inner->carried) reads[j].insert(reads[j].end(), {c.init->id, c.arg->id, c.next->id});
      };
      add(*ops[j]);
      if (auto* inner = ops[j]->as<ir::MetaPipe>())
        for (auto& st : inner->stages) ir::walk(st.ops, [&](const ir::NodeRef& n, int) { add(*n); });
    }
    for (auto& c : m.carried) reads.back().insert(reads.back().end(), {c.next->id, c.arg->id});
    auto excluded = [&](int id) { return pinned_.count(id) || toplevel_.count(id) || partials_.count(id); };
    for (size_t j = 0; j < ops.size(); ++j) {
      const ir::Node& n = *ops[j];
      std::vector<ir::Value> ins;
      if (auto* mm = n.as<ir::Map>()) ins = {mm->in};
      if (auto* z = n.as<ir::Zip>()) ins = z->ins;
      if (ins.empty() || excluded(n.out->id)) continue;
      for (auto& in : ins) {
        int g = groups_.find(in->id);
        if (in->shape != n.out->shape || excluded(in->id) || g == groups_.find(n.out->id)) continue;
        bool ok = true;
        for (auto& other : ins)
          if (other->id != in->id && groups_.find(other->id) == g) ok = false;
        for (auto& [id, val] : values_) {
          (void)val;
          if (groups_.find(id) != g) continue;
          // Every member defined earlier in this body, none pinned.
          if (!defined_at.count(id) || defined_at.at(id) >= j || excluded(id)) ok = false;
        }
        for (size_t k = j + 1; ok && k < ops.size(); ++k)
          for (int id : reads[k])
            if (groups_.find(id) == g) ok = false;
        if (!ok) continue;
        groups_.join(in->id, n.out->id);
        in_place_.insert(n.out->id);
        break;
      }
    }
  }
  std::set<int> in_place_;  // results that overwrite an operand (named in the emitted comment)

  // How many times each value is read anywhere in the program (operands, a loop's carried inits and next
  // values): a Map / Zip read once, by the Reduce after it, need not be stored (fusion below).
  std::map<int, int> reads_;
  void count_reads() {
    ir::walk(p_.body, [&](const ir::NodeRef& n, int) {
      for (auto& x : n->operands()) ++reads_[x->id];
      if (auto* m = n->as<ir::MetaPipe>())
        for (auto& c : m->carried) ++reads_[c.next->id], ++reads_[c.arg->id], ++reads_[c.result->id];
    });
  }
  static bool is_elementwise(const ir::Node& n) {
    return n.kind == ir::NodeKind::Map || n.kind == ir::NodeKind::Zip;
  }
  static std::vector<ir::Value> elementwise_ins(const ir::Node& n) {
    if (auto* m = n.as<ir::Map>()) return {m->in};
    return n.cast<ir::Zip>().ins;
  }
  static const ir::Expr& elementwise_f(const ir::Node& n) {
    if (auto* m = n.as<ir::Map>()) return m->f;
    return n.cast<ir::Zip>().f;
  }
  // ops[j], a Map / Zip, is computed inside the Reduce or StoreTile ops[j + 1] that reads it and nothing
  // else.
  bool fused_into_reduce(const std::vector<ir::NodeRef>& ops, size_t j) const {
    if (!opt_.fuse_elementwise || j + 1 >= ops.size() || !is_elementwise(*ops[j])) return false;
    int id = ops[j]->out->id;
    auto* rd = ops[j + 1]->as<ir::Reduce>();
    auto* st = ops[j + 1]->as<ir::StoreTile>();
    if (!(rd && rd->in->id == id) && !(st && st->in->id == id)) return false;
    if (toplevel_.count(id) || pinned_.count(id) || partials_.count(id)) return false;
    auto it = reads_.find(id);
    return it != reads_.end() && it->second == 1;
  }
  // No barrier after ops[j] (a stored Map / Zip): the next node is a stored Map / Zip over the same
  // nominal shape, whose element loop gives element x to the thread that wrote element x here. Its
  // operands of that shape are read at x (only the thread that wrote them); operands of other shapes
  // were written before the last barrier (only nodes of this shape are chained).
  bool chained(const std::vector<ir::NodeRef>& ops, size_t j) const {
    if (!opt_.fuse_elementwise || j + 1 >= ops.size() || !is_elementwise(*ops[j]) ||
        !is_elementwise(*ops[j + 1]))
      return false;
    // (a next node fused into a StoreTile keeps the element loop over its shape: still chained)
    if (fused_into_reduce(ops, j)) return false;
    if (fused_into_reduce(ops, j + 1) && ops[j + 2]->kind != ir::NodeKind::StoreTile) return false;
    return ops[j]->out->shape == ops[j + 1]->out->shape;
  }
  const ir::Node* fused_src_ = nullptr;  // the Map / Zip the Reduce being emitted computes in its loop

  // A folded loop's running sum `next = arg + reduce_add(x)` to one f32 value, whose Reduce is read by
  // that update only: each thread keeps its share in a double register (mp_facc<id>_) over all of its
  // block's iterations, and the block reduces it once after the loop into its partial. The sum's order
  // differs from the per-iteration fold (as the fold over blocks already does; fp32's tolerance), and
  // per iteration one barrier remains instead of four.
  std::map<int, std::string> reg_acc_;  // Reduce node id -> its thread's accumulator
  std::set<int> reg_update_;            // the carried updates' Zip node ids (not emitted)
  bool reg_tail_ = false;  // the node being emitted is the iteration's last before the ring's barrier
  std::vector<std::pair<ir::Value, std::string>> reg_partials_;  // carried arg -> accumulator
  void plan_register_fold(const ir::MetaPipe& m) {
    reg_acc_.clear();
    reg_update_.clear();
    reg_partials_.clear();
    if (!opt_.fuse_elementwise) return;
    for (auto& c : m.carried) {
      const ir::Zip* z = nullptr;
      const ir::Reduce* rd = nullptr;
      for (auto& st : m.stages)
        for (auto& op : st.ops)
          if (op->out && op->out->id == c.next->id) z = op->as<ir::Zip>();
      if (!z || fold_op(m, c) != ir::ExprOp::Add) continue;
      for (auto& st : m.stages)
        for (auto& op : st.ops)
          if (op->out && op->out->id == z->ins[1]->id) rd = op->as<ir::Reduce>();
      if (!rd || rd->combiner != ir::Combiner::Add || rd->custom || ir::num_elements(rd->out->shape) != 1 ||
          ir::num_elements(c.arg->shape) != 1 || reads_[rd->out->id] != 1 || c.arg->dtype != ir::DType::f32 ||
          c.next->dtype != ir::DType::f32 || rd->out->dtype != ir::DType::f32)
        continue;
      std::string acc = "mp_facc" + std::to_string(c.arg->id) + "_";
      reg_acc_[rd->id] = acc;
      reg_update_.insert(z->id);
      reg_partials_.push_back({c.arg, acc});
    }
  }
  // After the loop: each register sum reduced over the block (warp shuffles, then warp 0's lanes in
  // order through mp_red) and added to the block's partial.
  void reduce_register_folds() {
    const int warps = opt_.threads / 32;
    for (auto& [arg, acc] : reg_partials_) {
      line("{  // " + ir::value_name(arg) + ": this block's partial += the threads' register sums");
      line("  const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;");
      line("  double s_ = " + acc + ";");
      line("  for (int d_ = 16; d_ > 0; d_ >>= 1) s_ += __shfl_down_sync(0xffffffffu, s_, d_);");
      line("  if (lane_ == 0) mp_red[warp_] = s_;");
      line("  " + sync_stmt());
      line("  if (threadIdx.x == 0) {");
      line("    double t_ = mp_red[0];");
      line("    for (int p_ = 1; p_ < " + std::to_string(warps) + "; ++p_) t_ += mp_red[p_];");
      line("    " + v(arg->id) + "[0] = (float)((double)" + v(arg->id) + "[0] + t_);");
      line("  }");
      line("  " + sync_stmt());
      line("}");
    }
  }

  // A top-level loop whose every carried value is a running sum, `next = zip(arg, x) (arg + x)` in one of
  // its stages with arg read by that Zip only and x of arg's shape (dotproduct's and tpchq6's
  // accumulators): its iterations spread over blocks like a loop without carried values; each block sums
  // its iterations into a partial of its own (in its scratch), and the last block to finish adds the
  // partials in block order to the initial value. Deterministic for a given grid; the order of the
  // additions differs from the reference's one-by-one fold, within the tolerance of the dtype.
  // The carried updates that fold over blocks: a running sum, max or min (associative and commutative;
  // max / min give the sequential fold's bits, NaN order included, since a partial starts from the
  // identity and NaN never enters `mp_max(acc, x)` from the right). A product is left to one block: its
  // partials would change the rounding of long products beyond what the dtype tolerance covers.
  static bool fold_combiner(ir::ExprOp op) {
    return op == ir::ExprOp::Add || op == ir::ExprOp::Max || op == ir::ExprOp::Min;
  }
  // The combining op of a folded carried value (the Zip that makes its next value).
  static ir::ExprOp fold_op(const ir::MetaPipe& m, const ir::Carried& c) {
    for (auto& st : m.stages)
      for (auto& op : st.ops)
        if (op->out && op->out->id == c.next->id) return op->cast<ir::Zip>().f.node().op;
    return ir::ExprOp::Add;
  }
  static std::string fold_identity(ir::ExprOp op) {
    return op == ir::ExprOp::Max ? "(float)(-mp_inf())" : op == ir::ExprOp::Min ? "(float)mp_inf()" : "0.0f";
  }
  static std::string fold_step(ir::ExprOp op, const std::string& acc, const std::string& x) {
    if (op == ir::ExprOp::Max) return acc + " = mp_max(" + acc + ", " + x + ");";
    if (op == ir::ExprOp::Min) return acc + " = mp_min(" + acc + ", " + x + ");";
    return acc + " += " + x + ";";
  }

  static bool foldable(const ir::MetaPipe& m) {
    if (m.carried.empty()) return false;
    std::map<int, int> uses;
    for (auto& st : m.stages)
      ir::walk(st.ops, [&](const ir::NodeRef& n, int) {
        for (auto& x : n->operands()) ++uses[x->id];
        if (auto* inner = n->as<ir::MetaPipe>())
          for (auto& c : inner->carried) ++uses[c.next->id];
      });
    for (auto& c : m.carried) {
      const ir::Zip* z = nullptr;
      for (auto& st : m.stages)
        for (auto& op : st.ops)
          if (op->out && op->out->id == c.next->id) z = op->as<ir::Zip>();
      if (!z || z->ins.size() != 2 || z->ins[0]->id != c.arg->id || z->ins[1]->id == c.arg->id ||
          z->ins[1]->shape != c.arg->shape || c.init->shape != c.arg->shape)
        return false;
      const ir::ExprNode& f = z->f.node();
      if (!fold_combiner(f.op) || f.kids.size() != 2 || f.kids[0]->op != ir::ExprOp::Arg ||
          f.kids[0]->index != 0 || f.kids[1]->op != ir::ExprOp::Arg || f.kids[1]->index != 1)
        return false;
      if (uses[c.arg->id] != 1 || uses[c.next->id] != 0) return false;
      for (auto& d : m.carried)
        if (d.next->id == c.arg->id) return false;
    }
    return true;
  }

  void check_supported(const ir::Node& n) {
    if (auto* g = n.as<ir::Gather>()) {
      if (g->table->shape.size() != 2) throw cuda_not_supported(where_of(n) + " (a table of rank other than 2)");
    }
    if (auto* s = n.as<ir::Scatter>()) {
      if (s->table->shape.size() != 2) throw cuda_not_supported(where_of(n) + " (a table of rank other than 2)");
    }
  }

  // ---- names
  static std::string v(int id) { return "v" + std::to_string(id); }
  static std::string e(int id, size_t a) { return "e" + std::to_string(id) + "_" + std::to_string(a); }
  static std::string o(int id, size_t a) { return "o" + std::to_string(id) + "_" + std::to_string(a); }
  static std::string e(const ir::Value& x, size_t a) { return e(x->id, a); }
  static std::string o(const ir::Value& x, size_t a) { return o(x->id, a); }
  std::string T(const ir::Tensor& t) { return "T" + std::to_string(tensor_index_.at(t->id)); }

  // Offset of element (x0, x1, ...) of value w in its storage (row-major over the IR shape; an axis of
  // extent 1 broadcasts).
  static std::string at(const ir::Value& w, const std::vector<std::string>& idx) {
    auto st = strides(w->shape);
    std::string s;
    for (size_t a = 0; a < w->shape.size(); ++a) {
      if (w->shape[a] == 1) continue;
      s += (s.empty() ? "" : " + ") + idx[a] + (st[a] == 1 ? "" : " * " + ll(st[a]));
    }
    return s.empty() ? "0" : s;
  }

  // "for every element of value `x` (its run-time extents), threads of the block in turn": opens the
  // loop and defines x0, x1, ... ; close() ends it and emits the barrier. The loop runs over the nominal
  // shape, so the index arithmetic divides by constants (32-bit, no run-time 64-bit division per element),
  // and skips the elements past the run-time extents `ext` (default: x's own).
  void open_elements(const ir::Value& x, std::vector<std::string> ext = {}) {
    size_t r = x->shape.size();
    if (ext.empty())
      for (size_t a = 0; a < r; ++a) ext.push_back(e(x, a));
    int64_t n = ir::num_elements(x->shape);
    MP_USER_CHECK(n < (int64_t(1) << 31), "cuda lowering: a tile of ", n,
                  " elements is too large for one block; use a smaller tile");
    int outer = -1;  // the outermost axis of nominal extent > 1: it takes what is left of the flat index
    for (size_t a = 0; a < r; ++a)
      if (x->shape[a] > 1) {
        outer = int(a);
        break;
      }
    line("{");
    // The run-time extents as 32-bit bounds, once before the loop (each at most its nominal extent, < 2^31),
    // so the per-element test is a 32-bit compare.
    for (size_t a = 0; a < r; ++a)
      if (x->shape[a] > 1)
        line("  const int xe" + std::to_string(a) + "_ = (int)mp_clip(" + ext[a] + ", " + std::to_string(x->shape[a]) +
             "LL);");
    line("  for (int f_ = threadIdx.x; f_ < " + std::to_string(n) + "; f_ += " + nthr_ + ") {");
    bool multi = false;
    for (size_t a = 0; a < r; ++a) multi = multi || (x->shape[a] > 1 && int(a) != outer);
    if (multi) line("    int r_ = f_;");
    std::string skip;
    for (int a = int(r) - 1; a >= 0; --a) {
      std::string xa = "x" + std::to_string(a);
      if (x->shape[size_t(a)] == 1)
        line("    const int " + xa + " = 0;");
      else if (a == outer)
        line("    const int " + xa + " = " + (multi ? "r_" : "f_") + ";");
      else
        line("    const int " + xa + " = r_ % " + std::to_string(x->shape[size_t(a)]) + "; r_ /= " +
             std::to_string(x->shape[size_t(a)]) + ";");
      skip += std::string(skip.empty() ? "" : " || ") + xa + " >= " +
              (x->shape[size_t(a)] > 1 ? "xe" + std::to_string(a) + "_" : ext[size_t(a)]);
    }
    if (!skip.empty()) line("    if (" + skip + ") continue;");
  }
  void close_elements(bool sync = true) {
    line("  }");
    line("}");
    if (sync) barrier();
  }
  // The barrier after a node; left out between two LoadTiles of one stage (they read only global memory
  // and write storage of their own), so their loads are in flight together.
  bool skip_barrier_ = false;
  void barrier() {
    if (!skip_barrier_) line(sync_stmt());
  }
  static std::vector<std::string> xs(size_t r) {
    std::vector<std::string> s;
    for (size_t a = 0; a < r; ++a) s.push_back("x" + std::to_string(a));
    return s;
  }

  void line(const std::string& s) { src_ << ind_ << s << "\n"; }

  // ---- element functions
  // An element function is a DAG (a shared subexpression is one node): each node is emitted once as a
  // local, so blackscholes' repeated d1 / d2 terms are computed once per element. Arithmetic is fp32, as
  // the CPU backend's kernels do it, except where fp32 would change a discrete result: global indices and
  // Random (exact in double), comparisons (operands compared in double, so a loaded value and a constant
  // compare as in the reference), Floor and Mod (an integer boundary must not move), and everything
  // computed from these.
  struct Term {
    std::string text;
    bool dbl = false;
    bool is_const = false;
    double value = 0;
  };
  struct ExprScope {
    std::vector<std::string> args;
    std::vector<bool> args_double;
    std::string gidx;
    size_t rank = 0;
    std::string pad;  // indentation of the emitted locals
    std::map<const ir::ExprNode*, Term> memo;
  };
  int expr_counter_ = 0;

  static std::string fnum(double v) {
    if (std::isnan(v) || std::isinf(v)) return "(float)" + num(v);
    return num(v) + "f";
  }
  // A term as an operand of a double (as_double) or float computation.
  static std::string as(const Term& t, bool as_double) {
    if (t.is_const) return as_double ? num(t.value) : fnum(t.value);
    if (t.dbl && !as_double) return "(float)" + t.text;
    if (!t.dbl && as_double) return "(double)" + t.text;
    return t.text;
  }

  Term term(const ir::ExprNode& n, ExprScope& sc, const ir::Node& where) {
    if (auto it = sc.memo.find(&n); it != sc.memo.end()) return it->second;
    Term t;
    switch (n.op) {
      case ir::ExprOp::Const:
        t.is_const = true;
        t.value = n.value;
        return t;
      case ir::ExprOp::Arg:
        MP_INTERNAL_CHECK(n.index >= 0 && size_t(n.index) < sc.args.size(), where.where(), ": arg(", n.index,
                          ") of an element function with ", sc.args.size(), " inputs");
        t.text = sc.args[size_t(n.index)];
        t.dbl = sc.args_double[size_t(n.index)];
        return t;
      case ir::ExprOp::Index:
        t.text = size_t(n.index) < sc.rank ? "(double)" + sc.gidx + "[" + std::to_string(n.index) + "]" : "0.0";
        t.dbl = true;
        return t;
      default:
        break;
    }
    // A comparison of two element indices (a causal mask's index(1) <= index(0)) compares the integers
    // themselves: the same result as in double (indices are exact there), without two conversions and a
    // double compare per element.
    if ((n.op == ir::ExprOp::Lt || n.op == ir::ExprOp::Le || n.op == ir::ExprOp::Eq) && n.kids.size() == 2 &&
        n.kids[0]->op == ir::ExprOp::Index && n.kids[1]->op == ir::ExprOp::Index &&
        size_t(n.kids[0]->index) < sc.rank && size_t(n.kids[1]->index) < sc.rank) {
      const char* rel = n.op == ir::ExprOp::Lt ? " < " : n.op == ir::ExprOp::Le ? " <= " : " == ";
      t.text = "t" + std::to_string(expr_counter_++) + "_";
      line(sc.pad + "const float " + t.text + " = (" + sc.gidx + "[" + std::to_string(n.kids[0]->index) + "]" + rel +
           sc.gidx + "[" + std::to_string(n.kids[1]->index) + "] ? 1.0f : 0.0f);");
      sc.memo[&n] = t;
      return t;
    }
    std::vector<Term> k;
    for (auto& kid : n.kids) k.push_back(term(*kid, sc, where));
    bool d = n.op == ir::ExprOp::Random || n.op == ir::ExprOp::Floor || n.op == ir::ExprOp::Mod;
    for (auto& x : k) d = d || x.dbl;
    bool cmp = n.op == ir::ExprOp::Lt || n.op == ir::ExprOp::Le || n.op == ir::ExprOp::Eq;
    if (cmp) d = false;
    auto a = [&](size_t i) { return as(k[i], d); };
    auto f = [&](const char* dbl_name, const char* flt_name) { return std::string(d ? dbl_name : flt_name); };
    const std::string one = d ? "1.0" : "1.0f";
    const bool fast = opt_.fast_math && !d && !fa_expr_;  // LowerOptions::fast_math: f32 outside the attention pipeline
    std::string x;
    switch (n.op) {
      case ir::ExprOp::Random:
        x = fa_expr_ && sc.rank == 2
                ? "mp_random2(" + std::to_string(n.seed) + "ull, " + sc.gidx + "[0], " + sc.gidx + "[1])"
                : "mp_random(" + std::to_string(n.seed) + "ull, " + sc.gidx + ", " + std::to_string(sc.rank) + ")";
        break;
      case ir::ExprOp::Neg:
        x = "(-" + a(0) + ")";
        break;
      case ir::ExprOp::Exp:
        x = f("exp(", fa_expr_ ? "mp_exp(" : "expf(") + a(0) + ")";
        break;
      case ir::ExprOp::Log:
        x = f("log(", "logf(") + a(0) + ")";
        break;
      case ir::ExprOp::Sqrt:
        x = f("sqrt(", fast ? "mp_fsqrt(" : "sqrtf(") + a(0) + ")";
        break;
      case ir::ExprOp::Rsqrt:
        x = fast ? "mp_frsqrt(" + a(0) + ")" : "(" + one + " / " + f("sqrt(", "sqrtf(") + a(0) + "))";
        break;
      case ir::ExprOp::Recip:
        x = fast ? "mp_frcp(" + a(0) + ")" : "(" + one + " / " + a(0) + ")";
        break;
      case ir::ExprOp::Abs:
        x = f("fabs(", "fabsf(") + a(0) + ")";
        break;
      case ir::ExprOp::Tanh:
        x = f("tanh(", "tanhf(") + a(0) + ")";
        break;
      case ir::ExprOp::Sigmoid:
        x = fast ? "mp_frcp(1.0f + expf(-" + a(0) + "))"
                 : "(" + one + " / (" + one + " + " + f("exp(-", "expf(-") + a(0) + ")))";
        break;
      case ir::ExprOp::Silu:
        x = fast ? "mp_fdiv(" + a(0) + ", 1.0f + expf(-" + a(0) + "))"
                 : "(" + a(0) + " / (" + one + " + " + f("exp(-", "expf(-") + a(0) + ")))";
        break;
      case ir::ExprOp::Cos:
        x = f("cos(", "cosf(") + a(0) + ")";
        break;
      case ir::ExprOp::Sin:
        x = f("sin(", "sinf(") + a(0) + ")";
        break;
      case ir::ExprOp::Floor:
        x = "floor(" + a(0) + ")";
        break;
      case ir::ExprOp::Add:
        x = "(" + a(0) + " + " + a(1) + ")";
        break;
      case ir::ExprOp::Sub:
        x = "(" + a(0) + " - " + a(1) + ")";
        break;
      case ir::ExprOp::Mul:
        x = "(" + a(0) + " * " + a(1) + ")";
        break;
      case ir::ExprOp::Div:
        x = fast ? "mp_fdiv(" + a(0) + ", " + a(1) + ")" : "(" + a(0) + " / " + a(1) + ")";
        break;
      case ir::ExprOp::Max:
        x = "mp_max(" + a(0) + ", " + a(1) + ")";
        break;
      case ir::ExprOp::Min:
        x = "mp_min(" + a(0) + ", " + a(1) + ")";
        break;
      case ir::ExprOp::Pow:
        x = f("pow(", "powf(") + a(0) + ", " + a(1) + ")";
        break;
      case ir::ExprOp::Mod:
        x = "mp_mod(" + a(0) + ", " + a(1) + ")";
        break;
      case ir::ExprOp::Lt:
        x = "(" + as(k[0], true) + " < " + as(k[1], true) + " ? 1.0f : 0.0f)";
        break;
      case ir::ExprOp::Le:
        x = "(" + as(k[0], true) + " <= " + as(k[1], true) + " ? 1.0f : 0.0f)";
        break;
      case ir::ExprOp::Eq:
        x = "(" + as(k[0], true) + " == " + as(k[1], true) + " ? 1.0f : 0.0f)";
        break;
      case ir::ExprOp::And:
        x = "((" + a(0) + " != 0 && " + a(1) + " != 0) ? " + one + " : " + (d ? "0.0" : "0.0f") + ")";
        break;
      case ir::ExprOp::Select:
        x = "(" + as(k[0], k[0].dbl) + " != 0 ? " + a(1) + " : " + a(2) + ")";
        break;
      default:
        throw cuda_not_supported(where_of(where) + " (element function op " + ir::to_string(n.op) + ")");
    }
    t.text = "t" + std::to_string(expr_counter_++) + "_";
    t.dbl = d;
    line(sc.pad + "const " + (d ? "double " : "float ") + t.text + " = " + x + ";");
    sc.memo[&n] = t;
    return t;
  }

  // Emits the locals of element function `f` and returns its value as a float expression (or a double
  // one with as_double).
  std::string expr(const ir::Expr& f, const std::vector<std::string>& args, const std::vector<bool>& args_double,
                   const std::string& gidx, size_t rank, const ir::Node& where, const std::string& pad,
                   bool as_double = false) {
    ExprScope sc;
    sc.args = args;
    sc.args_double = args_double;
    sc.gidx = gidx;
    sc.rank = rank;
    sc.pad = pad;
    return as(term(f.node(), sc, where), as_double);
  }
  static bool uses_index(const ir::ExprNode& n, std::set<const ir::ExprNode*>& seen) {
    if (!seen.insert(&n).second) return false;
    if (n.op == ir::ExprOp::Index || n.op == ir::ExprOp::Random) return true;
    for (auto& k : n.kids)
      if (uses_index(*k, seen)) return true;
    return false;
  }
  static bool uses_index(const ir::Expr& f) {
    std::set<const ir::ExprNode*> seen;
    return uses_index(f.node(), seen);
  }

  // ---- storage of one kernel
  void assign_storage(const ir::NodeRef& top, int stmt, int64_t& smem, int64_t& scratch) {
    slot_.clear();
    std::vector<int> roots;
    for (auto& [id, val] : values_) {
      (void)val;
      if (stmt_of_.count(id) == 0 || stmt_of_.at(id) != stmt) continue;
      int r = groups_.find(id);
      if (global_slot_.count(r) || slot_.count(r)) continue;
      if (row_mode_ && row_values_.count(id)) continue;  // in registers
      slot_[r] = {};
      roots.push_back(r);
    }
    // Shared memory in program order while it fits (after the block's reserved words, reserved_floats);
    // the rest, and a folded loop's partial sums (the last block reads every block's), in global scratch
    // per block.
    smem = reserved_floats();
    scratch = 0;
    for (int r : roots) {
      int64_t n = (ir::num_elements(values_.at(r)->shape) + 3) / 4 * 4;
      if (ring_roots_.count(r)) n *= ring_depth_;
      if (!partials_.count(r) && (smem + n) * 4 <= opt_.smem_bytes) {
        slot_[r] = {Where::Shared, smem};
        smem += n;
      } else {
        slot_[r] = {Where::Scratch, scratch};
        scratch += n;
      }
    }
    fold_meta_ = scratch;
    if (auto* m = top->as<ir::MetaPipe>(); m && fold_stmts_.count(stmt)) {
      int64_t n = 0;
      for (auto& c : m->carried) n += int64_t(c.arg->shape.size());
      scratch += (n + 3) / 4 * 4;
    }
    smem *= 4;
  }
  // The blocks per SM the register allocation must leave room for: as many as shared memory admits (an
  // H100 / H200 SM has 228 KiB, 1 KiB of it per block for the system), at most two of 512 threads (64
  // registers per thread); one where an element function has more nodes than that many registers hold
  // (blackscholes' spills at 64, not at 128).
  static size_t expr_nodes(const ir::ExprNode& n, std::set<const ir::ExprNode*>& seen) {
    if (!seen.insert(&n).second) return 0;
    size_t c = 1;
    for (auto& k : n.kids) c += expr_nodes(*k, seen);
    return c;
  }
  static size_t largest_expr(const ir::NodeRef& top) {
    size_t most = 0;
    auto count = [&](const ir::Expr& f) {
      std::set<const ir::ExprNode*> seen;
      most = std::max(most, expr_nodes(f.node(), seen));
    };
    ir::walk(std::vector<ir::NodeRef>{top}, [&](const ir::NodeRef& n, int) {
      if (auto* m = n->as<ir::Map>()) count(m->f);
      if (auto* z = n->as<ir::Zip>()) count(z->f);
      if (auto* r = n->as<ir::Reduce>()) {
        if (r->pre) count(*r->pre);
        if (r->custom) count(*r->custom);
      }
    });
    return most;
  }
  int min_blocks(const KernelLaunch& k, const ir::NodeRef& top) const {
    return blocks_per_sm(k.smem_bytes, top);
  }
  int blocks_per_sm(int64_t smem_bytes, const ir::NodeRef& top) const {
    if (largest_expr(top) > 48) return 1;
    int64_t by_smem = (228 * 1024) / (smem_bytes + 1024);
    // (the producer warp counts towards the threads an SM holds; the register budget stays that of the
    // computing threads, so the launch bound asks the compiler for 60 registers a thread instead of 64
    // where two blocks of 512 + 32 threads share an SM)
    const int all = opt_.threads + extra_threads_;
    int64_t most = std::max(1, std::min(2048 / all, 65536 / (opt_.threads * 64)));
    return int(std::clamp<int64_t>(by_smem, 1, most));
  }
  // mp_red (a double per warp, Reduce's warp results), then one float: the folded loop's last-block flag;
  // then, for a ring of bulk copies, its mbarriers (one per slot, 8 bytes each; on the producer path two
  // per slot, "full" then "empty").
  int64_t reserved_floats() const {
    const int64_t bars = bulk_ring() ? (producer() ? 2 : 1) * int64_t(ring_depth_) : 0;  // full (and empty)
    return bar_float() + (2 * bars + 3) / 4 * 4;
  }
  int64_t flag_float() const { return 2 * (opt_.threads / 32); }
  int64_t bar_float() const { return (2 * (opt_.threads / 32) + 1 + 3) / 4 * 4; }
  bool bulk_ring() const {
    return opt_.copy == LowerOptions::Copy::Bulk && ring_depth_ >= 2 && !ring_tiles_.empty();
  }

  std::string storage(int id) {
    int r = groups_.find(id);
    Slot s;
    if (auto it = global_slot_.find(r); it != global_slot_.end())
      s = it->second;
    else if (auto jt = slot_.find(r); jt != slot_.end())
      s = jt->second;
    else
      fail_internal("cuda lowering: value %", id, " has no storage in this kernel");
    const char* base = s.where == Where::Shared ? "mp_smem" : s.where == Where::Scratch ? "mp_bs" : "mp_gv";
    return std::string(base) + " + " + ll(s.offset);
  }
  std::string where_name(int id) {
    int r = groups_.find(id);
    if (global_slot_.count(r)) return "global, between statements";
    std::string w = slot_.at(r).where == Where::Shared ? "shared" : "global scratch of this block";
    return in_place_.count(id) ? w + ", written over its dead operand" : w;
  }

  // ---- the tile ring of a streaming loop
  // A top-level loop spread over blocks whose first stage is LoadTiles: each LoadTile whose address is
  // known from the loop index alone, one contiguous run of a float-stored tensor, always at a 16-byte
  // aligned element offset, with its inner axes full, gets a ring of `ring_depth_` slots in shared
  // memory, filled by cp.async: a block issues the copies of its iteration k + depth - 1 before it
  // computes iteration k, so the loads of later iterations are in flight while this one computes and
  // stores. Only the elements within the run-time extents are copied (every consumer skips the others,
  // as it does on the direct path). A tile the ring cannot serve takes the direct copy, and the kernel's
  // comment says why.
  std::vector<const ir::LoadTile*> ring_tiles_;
  std::set<int> ring_roots_;           // storage groups of the ring tiles
  std::set<int> ring_nodes_;           // their LoadTile node ids
  int ring_depth_ = 0;
  int64_t ring_bytes_ = 0;               // bytes one iteration copies through the ring
  std::string ring_plan_;                // how the depth was chosen (the kernel's comment)
  std::vector<std::string> ring_notes_;  // why a loop or a tile took the direct path
  bool stage_has_direct_ = false;        // the stage being emitted has a LoadTile off the ring
  // The producer warp (LowerOptions::producer_warp): 32 while the kernel's ring may take it (the block's
  // threads are opt_.threads computing plus these), else 0; why a ring of bulk copies keeps thread 0.
  int extra_threads_ = 0;
  std::string producer_note_;
  // The thread count and the barrier of the code that computes: the whole block, or on the producer
  // path the computing warps only (threadIdx.x < opt_.threads) and their named barrier.
  std::string nthr_ = "blockDim.x";
  bool consumer_sync_ = false;
  std::string sync_stmt() const {
    return consumer_sync_ ? "mp_sync_consumers(" + std::to_string(opt_.threads) + "u);" : "__syncthreads();";
  }
  bool producer() const { return extra_threads_ > 0 && bulk_ring(); }

  std::string ring_refusal(const ir::LoadTile& l, const ir::MetaPipe& m) {
    const auto& t = l.src;
    size_t r = t->shape.size();
    if (std::string(dev_type(t->dtype)) != "float") return "its tensor is not stored as float";
    int lead = -1;
    for (size_t a = 0; a < r; ++a)
      if (l.out->shape[a] > 1) {
        lead = int(a);
        break;
      }
    if (lead < 0) return "a one-element tile";
    for (size_t a = size_t(lead + 1); a < r; ++a)
      if (l.out->shape[a] != t->shape[a] || !l.offset[a].is_const() || l.offset[a].constant != 0)
        return "the tile is not one contiguous run of its tensor";
    auto tst = strides(t->shape);
    for (size_t a = 0; a < r; ++a) {
      if (l.offset[a].constant * tst[a] % 4 != 0) return "its offset is not always 16-byte aligned";
      for (auto& [var, c] : l.offset[a].terms) {
        if (var->id != m.var->id) return "its offset depends on an inner loop";
        if (c * tst[a] % 4 != 0) return "its offset is not always 16-byte aligned";
      }
    }
    int g = groups_.find(l.out->id);
    for (auto& [id, val] : values_) {
      (void)val;
      if (groups_.find(id) == g &&
          (pinned_.count(id) || toplevel_.count(id) || partials_.count(id)))
        return "its storage is shared with a carried value";
    }
    return "";
  }

  void plan_ring(const ir::MetaPipe& m) {
    ring_tiles_.clear();
    ring_roots_.clear();
    ring_nodes_.clear();
    ring_notes_.clear();
    ring_depth_ = 0;
    if (m.stages.empty() || m.stages[0].ops.empty()) return;
    for (auto& op : m.stages[0].ops)
      if (op->kind != ir::NodeKind::LoadTile) {
        ring_notes_.push_back("no tile ring: the first stage is not LoadTiles only");
        return;
      }
    int64_t bytes = 0;
    for (auto& op : m.stages[0].ops) {
      auto& l = op->cast<ir::LoadTile>();
      std::string why = ring_refusal(l, m);
      if (!why.empty()) {
        ring_notes_.push_back(l.where() + " takes the direct copy: " + why);
        continue;
      }
      ring_tiles_.push_back(&l);
      ring_roots_.insert(groups_.find(l.out->id));
      ring_nodes_.insert(l.id);
      bytes += (ir::num_elements(l.out->shape) + 3) / 4 * 16;
    }
    ring_bytes_ = bytes;
    if (!ring_tiles_.empty()) ring_depth_ = 2;  // chosen by choose_ring_depth once storage is known
  }
  // Passes of the loop body over tile-sized values (Map, Zip, Reduce and MatMul nodes with an operand at
  // least half as large as the smallest ring tile): softmax's max, exp, sum and divide are four,
  // dotproduct's product and sum two.
  int tile_passes(const ir::MetaPipe& m) const {
    int64_t smallest = INT64_MAX;
    for (auto* l : ring_tiles_) smallest = std::min(smallest, ir::num_elements(l->out->shape));
    int n = 0;
    for (auto& st : m.stages)
      for (auto& op : st.ops) {
        if (op->kind != ir::NodeKind::Map && op->kind != ir::NodeKind::Zip &&
            op->kind != ir::NodeKind::Reduce && op->kind != ir::NodeKind::MatMul)
          continue;
        for (auto& x : op->operands())
          if (2 * ir::num_elements(x->shape) >= smallest) {
            ++n;
            break;
          }
      }
    return n;
  }
  // The ring's depth (docs/cuda-lowering.md): the fewest slots, 2 to 8 and no more than the loop has
  // iterations, whose copies beyond the slot being computed on reach the KiB per SM asked for, counting
  // the blocks per SM that the ring's shared memory admits; else the depth with the most in flight. In
  // Auto, a ring that leaves fewer blocks per SM than the direct path, with fewer bytes in flight than the
  // direct path's blocks each loading one iteration, over a loop body of three or more passes over its
  // tiles, is dropped: such a body is bound by the warps that compute, not by the loads (softmax's 64 KiB
  // tiles: 2 slots left one block of 512 threads per SM, and ran slower than the direct path's two).
  void choose_ring_depth(const ir::MetaPipe& m, const ir::NodeRef& top, int stmt, KernelLaunch& k) {
    auto ring_fits = [&] {
      for (int r : ring_roots_)
        if (slot_.at(r).where != Where::Shared) return false;
      return true;
    };
    if (opt_.ring == LowerOptions::Ring::Off) {
      drop_ring("switched off (MP_CUDA_LOWER_RING=off)");
      assign_storage(top, stmt, k.smem_bytes, k.scratch_floats);
      return;
    }
    ring_depth_ = 1;  // the direct path's storage: one copy of each tile
    assign_storage(top, stmt, k.smem_bytes, k.scratch_floats);
    const int direct_blocks = blocks_per_sm(k.smem_bytes, top);
    const int64_t direct_flight = direct_blocks * ring_bytes_;
    const int64_t target = opt_.ring_kib_per_sm * 1024;
    const int cap = int(std::clamp<int64_t>(m.trip(), 2, 8));
    int best = 0, best_blocks = 0;
    int64_t best_flight = 0;
    for (int d = 2; d <= cap; ++d) {
      ring_depth_ = d;
      assign_storage(top, stmt, k.smem_bytes, k.scratch_floats);
      if (!ring_fits()) break;  // a deeper ring does not fit either
      int b = blocks_per_sm(k.smem_bytes, top);
      int64_t flight = int64_t(b) * (d - 1) * ring_bytes_;
      if (flight > best_flight) best = d, best_blocks = b, best_flight = flight;
      if (flight >= target) break;
    }
    if (best == 0) {
      ring_depth_ = 2;
      drop_ring("2 slots of its tiles do not fit in " + std::to_string(opt_.smem_bytes) +
                " bytes of shared memory");
    } else if (int passes = tile_passes(m); opt_.ring == LowerOptions::Ring::Auto &&
                                            best_blocks < direct_blocks && best_flight < direct_flight &&
                                            passes >= 3) {
      drop_ring(std::to_string(best) + " slots would leave " + std::to_string(best_blocks) +
                " block(s) per SM instead of the direct path's " + std::to_string(direct_blocks) + ", with " +
                std::to_string(best_flight / 1024) + " KiB per SM in flight against " +
                std::to_string(direct_flight / 1024) + ", and the loop body makes " + std::to_string(passes) +
                " passes over its tiles: the warps that compute bound it more than the loads");
    } else {
      ring_depth_ = best;
      ring_plan_ = std::to_string(best_blocks) + " block(s) per SM by shared memory and registers, " +
                   std::to_string(best_flight / 1024) +
                   " KiB per SM in flight beyond the slots computed on (asked: " +
                   std::to_string(opt_.ring_kib_per_sm) + ")";
    }
    assign_storage(top, stmt, k.smem_bytes, k.scratch_floats);
  }
  void drop_ring(const std::string& why) {
    ring_notes_.push_back("no tile ring: " + why);
    extra_threads_ = 0;
    ring_tiles_.clear();
    ring_roots_.clear();
    ring_nodes_.clear();
    ring_depth_ = 0;
  }
  int64_t ring_slot_floats(const ir::LoadTile& l) const { return (ir::num_elements(l.out->shape) + 3) / 4 * 4; }

  // Where a ring tile of iteration `iter` (an expression) lies in its tensor: its first axis of extent
  // above 1 (`lead`, the one the mask cuts) and that axis' offset, the elements per step along it
  // (`inner`), the flat offset of its first element (`g0`) and the bounds of its other axes (`ok`, a
  // conjunction to append).
  struct RingSpan {
    std::string g0, ok, lead_offset;
    int lead = 0;
    int64_t inner = 1;
  };
  RingSpan ring_span(const ir::LoadTile& l, const ir::MetaPipe& m, const std::string& iter) {
    RingSpan sp;
    const auto& t = l.src;
    size_t r = t->shape.size();
    auto tst = strides(t->shape);
    while (l.out->shape[size_t(sp.lead)] == 1) ++sp.lead;
    for (size_t a = size_t(sp.lead + 1); a < r; ++a) sp.inner *= t->shape[a];
    for (size_t a = 0; a < r; ++a) {
      std::string sa = affine(l.offset[a], m.var->id, iter);
      sp.g0 += std::string(a ? " + " : "") + sa + (tst[a] == 1 ? "" : " * " + ll(tst[a]));
      if (int(a) != sp.lead) sp.ok += " && " + sa + " >= 0 && " + sa + " < " + ll(t->shape[a]);
    }
    sp.lead_offset = affine(l.offset[size_t(sp.lead)], m.var->id, iter);
    return sp;
  }

  // The cp.async copies of iteration `iter` (an expression) of the ring tiles into slot `slot`, then the
  // commit of their group (an empty group where the iteration is past the end, so that every thread
  // counts the same groups).
  void ring_issue(const ir::MetaPipe& m, const std::string& iter, const std::string& slot) {
    if (bulk_ring()) return ring_issue_bulk(m, iter, slot);
    line("if (" + iter + " < " + ll(m.trip()) + ") {");
    for (auto* l : ring_tiles_) {
      const auto& t = l->src;
      const RingSpan sp = ring_span(*l, m, iter);
      const std::string &g0 = sp.g0, &ok = sp.ok, &sl = sp.lead_offset;
      const int lead = sp.lead;
      const int64_t inner = sp.inner;
      line("  {  // " + l->where() + ": " + t->name);
      line("    const long long s_ = " + sl + ", g0_ = " + g0 + ";");
      line("    const int n_ = s_ >= 0" + ok + " ? (int)mp_clip(" + ll(t->shape[size_t(lead)]) + " - s_, " +
           ll(l->out->shape[size_t(lead)]) + ") * " + std::to_string(inner) + " : 0, n4_ = n_ >> 2;");
      int64_t base = slot_.at(groups_.find(l->out->id)).offset;
      line("    float* d_ = mp_smem + " + ll(base) + " + (long long)(" + slot + ") * " + ll(ring_slot_floats(*l)) + ";");
      line("    const float* g_ = " + T(t) + " + g0_;");
      line("    for (int q_ = threadIdx.x; q_ < n4_; q_ += blockDim.x) mp_cp_async16(d_ + 4 * q_, g_ + 4 * q_);");
      line("    for (int f_ = 4 * n4_ + threadIdx.x; f_ < n_; f_ += blockDim.x) mp_cp_async4(d_ + f_, g_ + f_);");
      line("  }");
    }
    line("}");
    line("mp_cp_commit();");
  }
  // The bulk copies of iteration `iter` of the ring tiles into slot `slot`: thread 0 arrives on the
  // slot's mbarrier expecting the bytes of all of the iteration's tiles, then issues one bulk copy per
  // tile, of its largest multiple of 16 bytes within the run-time extents; the last n % 4 elements of a
  // tile (its masked tail) are plain loads by the threads, published by the barrier that precedes the
  // iteration's compute, as the slot is. An iteration past the end neither arrives nor is waited for.
  void ring_issue_bulk(const ir::MetaPipe& m, const std::string& iter, const std::string& slot) {
    line("if (" + iter + " < " + ll(m.trip()) + ") {");
    std::string bytes;
    std::vector<std::string> copies, tails;
    for (size_t k = 0; k < ring_tiles_.size(); ++k) {
      auto* l = ring_tiles_[k];
      const auto& t = l->src;
      const RingSpan sp = ring_span(*l, m, iter);
      const std::string &g0 = sp.g0, &ok = sp.ok;
      const int lead = sp.lead;
      const int64_t inner = sp.inner;
      const std::string q = std::to_string(k), n = "n" + q + "_", d = "d" + q + "_", g = "g" + q + "_";
      const std::string& sl = sp.lead_offset;
      line("  // " + l->where() + ": " + t->name);
      line("  const long long s" + q + "_ = " + sl + ";");
      line("  const int " + n + " = s" + q + "_ >= 0" + ok + " ? (int)mp_clip(" + ll(t->shape[size_t(lead)]) +
           " - s" + q + "_, " + ll(l->out->shape[size_t(lead)]) + ") * " + std::to_string(inner) + " : 0;");
      int64_t base = slot_.at(groups_.find(l->out->id)).offset;
      line("  float* " + d + " = mp_smem + " + ll(base) + " + (long long)(" + slot + ") * " +
           ll(ring_slot_floats(*l)) + ";");
      line("  const float* " + g + " = " + T(t) + " + (" + g0 + ");");
      bytes += std::string(k ? " + " : "") + "(" + n + " >> 2)";
      copies.push_back("    if (" + n + " >= 4) mp_bulk_copy(" + d + ", " + g + ", 16u * (unsigned)(" + n +
                       " >> 2), b_);");
      tails.push_back("  for (int f_ = (" + n + " & ~3) + threadIdx.x; f_ < " + n + "; f_ += blockDim.x) " + d +
                      "[f_] = " + g + "[f_];");
    }
    line("  mp_u64* b_ = mp_bar + (" + slot + ");");
    line("  if (threadIdx.x == 0) {  // one thread: the iteration's bytes on the slot's mbarrier, one bulk copy a tile");
    line("    mp_bar_expect(b_, 16u * (unsigned)(" + bytes + "));");
    for (auto& c : copies) line(c);
    line("  }");
    line("  // the tiles' last n % 4 elements (masked tails): plain loads, published by the barrier before the compute");
    for (auto& t : tails) line(t);
    line("}");
  }
  // The producer warp's fill of iteration `iter` (below the trip count) into slot `slot`, once the slot
  // is free: its 32 lanes load the tiles' masked tails with plain stores, __syncwarp orders those before
  // lane 0's arrive.expect_tx (a release: a computing thread that waits for the phase sees them), and
  // lane 0 issues one bulk copy per tile, completing on the slot's "full" mbarrier.
  void ring_issue_producer(const ir::MetaPipe& m, const std::string& iter, const std::string& slot) {
    std::string bytes;
    std::vector<std::string> copies;
    for (size_t k = 0; k < ring_tiles_.size(); ++k) {
      auto* l = ring_tiles_[k];
      const auto& t = l->src;
      const RingSpan sp = ring_span(*l, m, iter);
      const std::string q = std::to_string(k), n = "n" + q + "_", d = "d" + q + "_", g = "g" + q + "_";
      line("// " + l->where() + ": " + t->name);
      line("const long long s" + q + "_ = " + sp.lead_offset + ";");
      line("const int " + n + " = s" + q + "_ >= 0" + sp.ok + " ? (int)mp_clip(" + ll(t->shape[size_t(sp.lead)]) +
           " - s" + q + "_, " + ll(l->out->shape[size_t(sp.lead)]) + ") * " + std::to_string(sp.inner) + " : 0;");
      int64_t base = slot_.at(groups_.find(l->out->id)).offset;
      line("float* " + d + " = mp_smem + " + ll(base) + " + (long long)(" + slot + ") * " + ll(ring_slot_floats(*l)) +
           ";");
      line("const float* " + g + " = " + T(t) + " + (" + sp.g0 + ");");
      line("for (int f_ = (" + n + " & ~3) + lane_; f_ < " + n + "; f_ += 32) " + d + "[f_] = " + g +
           "[f_];  // masked tail");
      bytes += std::string(k ? " + " : "") + "(" + n + " >> 2)";
      copies.push_back("  if (" + n + " >= 4) mp_bulk_copy(" + d + ", " + g + ", 16u * (unsigned)(" + n +
                       " >> 2), b_);");
    }
    line("mp_u64* b_ = mp_bar + (" + slot + ");");
    line("__syncwarp();  // the lanes' tail stores before lane 0's arrival (its release publishes them)");
    line("if (lane_ == 0) {  // the iteration's bytes on the slot's full mbarrier, one bulk copy a tile");
    line("  mp_bar_expect(b_, 16u * (unsigned)(" + bytes + "));");
    for (auto& c : copies) line(c);
    line("}");
  }
  // Whether the loop body writes into a ring slot (a result over a dead ring tile): then the computing
  // threads fence the generic proxy against the later bulk copies before they arrive on "empty".
  bool body_writes_ring(const std::set<int>& used) {
    for (int id : used) {
      if (!ring_roots_.count(groups_.find(id))) continue;
      bool loaded = false;
      for (auto* l : ring_tiles_) loaded = loaded || l->out->id == id;
      if (!loaded) return true;
    }
    return false;
  }

  // Points every value of a ring tile's storage group at slot `slot`.
  void ring_point(const std::set<int>& used, const std::string& slot) {
    for (auto* l : ring_tiles_) {
      int g = groups_.find(l->out->id);
      int64_t base = slot_.at(g).offset;
      for (int id : used)
        if (groups_.find(id) == g)
          line(v(id) + " = mp_smem + " + ll(base) + " + (long long)(" + slot + ") * " + ll(ring_slot_floats(*l)) + ";");
    }
  }

  // ---- a row-wise loop body in registers (LowerOptions::warp_rows)
  // A top-level loop spread over blocks, without carried values, whose body works row by row on
  // [TR, C] tiles: LoadTiles of [TR, C] tiles that are whole rows of [R, C] tensors, Map / Zip nodes
  // whose values are [TR, C] tiles or [TR, 1] row values (operands defined in the body), Reduces of a
  // [TR, C] value along its rows to [TR, 1] (Add, Mul, Max, Min), Buffers and StoreTiles of [TR, C]
  // values as whole rows (softmax: exp, the row sum, the quotient). The loop's rows (iteration i, row y
  // of its tile) are spread over all the warps of the grid; a warp holds its row of every [TR, C] value
  // in registers (C / 32 per lane: four consecutive elements per chunk, float4 loads and stores, where
  // the tensors are float-stored and C is a multiple of 4; else one element per chunk), reduces it
  // with shuffles (fp64, as the Reduce node accumulates) and stores its rows from the registers: no
  // shared memory, no block barrier. Extents, origins and bounds checks as on the tile path; a warp
  // loads rows within its LoadTiles' run-time extents and stores rows within its StoreTiles' clipped ones.
  bool row_mode_ = false;
  int64_t row_TR_ = 0, row_C_ = 0;
  int row_W_ = 1, row_K_ = 0;  // elements per chunk, chunks per lane
  std::set<int> row_values_;   // the body's values (registers, no storage)
  std::map<int, std::string> row_name_;  // value id -> its register array / scalar
  std::string row_refusal_;              // why a loop without carried values is not row-wise

  std::string row_refusal(const ir::MetaPipe& m) {
    if (!m.carried.empty()) return "the loop carries values";
    std::vector<const ir::Node*> ops;
    for (auto& st : m.stages)
      for (auto& op : st.ops) ops.push_back(op.get());
    if (ops.empty() || ops[0]->kind != ir::NodeKind::LoadTile) return "the body does not start with a LoadTile";
    const ir::Shape tile = ops[0]->out->shape;
    if (tile.size() != 2 || tile[1] < 2) return "its first tile is not [rows, C]";
    const int64_t TR = tile[0], C = tile[1];
    const ir::Shape rowv = {TR, 1};
    std::set<int> defined;
    bool has_reduce = false, vec = C % 4 == 0;
    auto whole_rows = [&](const ir::Tensor& t, const std::vector<ir::Affine>& off) {
      return t->shape.size() == 2 && t->shape[1] == C && off.size() == 2 && off[1].is_const() && off[1].constant == 0;
    };
    for (auto* n : ops) {
      for (auto& x : n->operands())
        if (!defined.count(x->id)) return n->where() + " reads a value from outside the body";
      switch (n->kind) {
        case ir::NodeKind::LoadTile: {
          auto& l = n->cast<ir::LoadTile>();
          if (l.out->shape != tile || !whole_rows(l.src, l.offset)) return l.where() + " is not whole rows of its tensor";
          if (std::string(dev_type(l.src->dtype)) != "float") vec = false;
          break;
        }
        case ir::NodeKind::Map:
        case ir::NodeKind::Zip: {
          if (n->out->shape != tile && n->out->shape != rowv) return n->where() + " is neither [rows, C] nor [rows, 1]";
          for (auto& x : n->operands()) {
            if (x->shape != tile && x->shape != rowv) return n->where() + " has an operand of another shape";
            if (n->out->shape == rowv && x->shape == tile) return n->where() + " narrows a tile";
          }
          if (uses_index(elementwise_f(*n))) return n->where() + " uses the element index";
          break;
        }
        case ir::NodeKind::Reduce: {
          auto& rd = n->cast<ir::Reduce>();
          if (rd.axis != 1 || rd.in->shape != tile || rd.out->shape != rowv) return rd.where() + " is not along the rows";
          if (rd.combiner == ir::Combiner::Custom) return rd.where() + " has a custom combiner";
          if (rd.pre && uses_index(*rd.pre)) return rd.where() + " uses the element index";
          has_reduce = true;
          break;
        }
        case ir::NodeKind::Buffer:
          break;
        case ir::NodeKind::StoreTile: {
          auto& st = n->cast<ir::StoreTile>();
          if (st.in->shape != tile || !whole_rows(st.dst, st.offset)) return st.where() + " is not whole rows of its tensor";
          if (st.dst->dtype != ir::DType::f32) vec = false;
          break;
        }
        default:
          return n->where() + " is not a LoadTile, Map, Zip, Reduce, Buffer or StoreTile";
      }
      if (n->out) {
        if (toplevel_.count(n->out->id) || pinned_.count(n->out->id)) return n->where() + "'s value is read elsewhere";
        defined.insert(n->out->id);
      }
    }
    if (!has_reduce) return "no Reduce along the rows";
    const int W = vec ? 4 : 1;
    const int64_t K = (C + 32 * W - 1) / (32 * W);
    if (K * W > 32) return "C=" + std::to_string(C) + " (more than 32 registers per lane a row, C <= 1024)";
    row_TR_ = TR, row_C_ = C, row_W_ = W, row_K_ = int(K);
    row_values_ = defined;
    return "";
  }

  // Column of register j_ (an expression or a constant) of this lane's row chunk.
  std::string row_col(const std::string& j) const {
    if (row_W_ == 1) return "(lane_ + 32 * (" + j + "))";
    return "(4 * (lane_ + 32 * ((" + j + ") >> 2)) + ((" + j + ") & 3))";
  }
  // The guard of register j_ where C is not a multiple of the lane's span (else none).
  std::string row_guard(const std::string& j) const {
    if (row_C_ % (32 * row_W_) == 0) return "";
    return row_col(j) + " < " + std::to_string(row_C_);
  }
  std::string row_of(const ir::Value& x) const { return row_name_.at(x->id); }
  bool row_tile(const ir::Value& x) const { return x->shape[1] == row_C_; }

  void row_node(const ir::Node& n) {
    line("// " + n.where() + ": " + one_line(ir::print(n)));
    const int KW = row_K_ * row_W_;
    const std::string kw = std::to_string(KW), C = std::to_string(row_C_);
    if (auto* l = n.as<ir::LoadTile>()) {
      load_meta(*l, "lane_ == 0");
      std::string r = "r" + std::to_string(l->out->id) + "_";
      row_name_[l->out->id] = r;
      line("float " + r + "[" + kw + "];");
      line("if (y_ < " + e(l->out, 0) + ") {");
      line("  const " + std::string(dev_type(l->src->dtype)) + "* g_ = " + T(l->src) + " + (long long)(" + o(l->out, 0) +
           " + y_) * " + ll(row_C_) + ";");
      line("#pragma unroll");
      if (row_W_ == 4) {
        line("  for (int k_ = 0; k_ < " + std::to_string(row_K_) + "; ++k_) {");
        line("    const int c_ = 4 * (lane_ + 32 * k_);");
        line("    float4 q_;");
        if (row_C_ % 128 == 0)  // every chunk of every lane within the row
          line("    q_ = *(const float4*)(g_ + c_);");
        else
          line("    if (c_ < " + C + ") q_ = *(const float4*)(g_ + c_); else q_.x = q_.y = q_.z = q_.w = 0.0f;");
        line("    " + r + "[4 * k_] = q_.x; " + r + "[4 * k_ + 1] = q_.y; " + r + "[4 * k_ + 2] = q_.z; " + r +
             "[4 * k_ + 3] = q_.w;");
        line("  }");
      } else {
        line("  for (int j_ = 0; j_ < " + kw + "; ++j_) " + r + "[j_] = " + row_col("j_") + " < " + C + " ? mp_ld(g_, " +
             row_col("j_") + ") : 0.0f;");
      }
      line("} else {");
      line("#pragma unroll");
      line("  for (int j_ = 0; j_ < " + kw + "; ++j_) " + r + "[j_] = 0.0f;");
      line("}");
      return;
    }
    if (is_elementwise(n)) {
      auto ins = elementwise_ins(n);
      elementwise_meta(n, ins);
      std::string r = "r" + std::to_string(n.out->id) + "_";
      row_name_[n.out->id] = r;
      const bool tile = row_tile(n.out);
      if (tile) {
        line("float " + r + "[" + kw + "];");
        line("#pragma unroll");
        line("for (int j_ = 0; j_ < " + kw + "; ++j_) {");
      } else {
        line("float " + r + ";");
        line("{");
      }
      std::vector<std::string> args;
      for (size_t i = 0; i < ins.size(); ++i) {
        std::string a = "a" + std::to_string(i) + "_";
        line("  const float " + a + " = " + row_of(ins[i]) + (row_tile(ins[i]) ? "[j_]" : "") + ";");
        args.push_back(a);
      }
      std::string val = expr(elementwise_f(n), args, std::vector<bool>(args.size(), false), "g_", 2, n, "  ");
      line("  " + r + (tile ? "[j_]" : "") + " = mp_round(" + val + ", " + std::to_string(dt_code(n.out->dtype)) + ");");
      line("}");
      return;
    }
    if (auto* rd = n.as<ir::Reduce>()) {
      line(e(rd->out, 0) + " = " + e(rd->in, 0) + "; " + o(rd->out, 0) + " = " + o(rd->in, 0) + ";");
      line(e(rd->out, 1) + " = 1LL; " + o(rd->out, 1) + " = 0LL;");
      auto comb = [&](const std::string& acc, const std::string& x) -> std::string {
        switch (rd->combiner) {
          case ir::Combiner::Add:
            return acc + " + " + x;
          case ir::Combiner::Mul:
            return acc + " * " + x;
          case ir::Combiner::Max:
            return "mp_max(" + acc + ", " + x + ")";
          default:
            return "mp_min(" + acc + ", " + x + ")";
        }
      };
      std::string r = "r" + std::to_string(rd->out->id) + "_";
      row_name_[rd->out->id] = r;
      line("float " + r + ";");
      line("{  // this lane's columns within the extent, then the warp's lanes (shuffles)");
      line("  double acc_ = " + num(rd->identity) + ";");
      line("#pragma unroll");
      line("  for (int j_ = 0; j_ < " + kw + "; ++j_) {");
      std::string guard = row_guard("j_");
      line("    if (" + (guard.empty() ? std::string("") : guard + " && ") + row_col("j_") + " < " + e(rd->in, 1) + ") {");
      line("      const float xin_ = " + row_of(rd->in) + "[j_];");
      if (rd->pre)
        line("      const double x_ = " + expr(*rd->pre, {"xin_"}, {false}, "g_", 2, *rd, "      ", true) + ";");
      else
        line("      const double x_ = xin_;");
      line("      acc_ = " + comb("acc_", "x_") + ";");
      line("    }");
      line("  }");
      line("  for (int d_ = 16; d_ > 0; d_ >>= 1) acc_ = " + comb("acc_", "__shfl_xor_sync(0xffffffffu, acc_, d_)") + ";");
      line("  " + r + " = (float)acc_;");
      line("}");
      return;
    }
    if (auto* b = n.as<ir::Buffer>()) {
      copy_meta(b->out, b->in);
      row_name_[b->out->id] = row_of(b->in);
      return;
    }
    auto& st = n.cast<ir::StoreTile>();
    line("{");
    std::vector<std::string> start, ext;
    store_meta(st, start, ext, "lane_ == 0");
    const std::string r = row_of(st.in);
    line("  if (y_ < " + ext[0] + ") {");
    line("    " + std::string(dev_type(st.dst->dtype)) + "* g_ = " + T(st.dst) + " + (" + start[0] + " + y_) * " +
         ll(row_C_) + ";");
    line("#pragma unroll");
    if (row_W_ == 4) {
      line("    for (int k_ = 0; k_ < " + std::to_string(row_K_) + "; ++k_) {");
      line("      const int c_ = 4 * (lane_ + 32 * k_);");
      line("      if (c_ + 4 <= " + ext[1] + ") {");
      // (a float4 assignment, not mp_st4: the PTX store's ordering cost softmax's 1024-column rows a
      // 4-byte spill at 64 registers; this way ptxas keeps them without one)
      line("        float4 q_;");
      line("        q_.x = " + r + "[4 * k_]; q_.y = " + r + "[4 * k_ + 1]; q_.z = " + r + "[4 * k_ + 2]; q_.w = " + r +
           "[4 * k_ + 3];");
      line("        *(float4*)(g_ + c_) = q_;");
      line("      } else {");
      line("        for (int u_ = 0; u_ < 4 && c_ + u_ < " + ext[1] + "; ++u_) mp_st(g_, c_ + u_, " + r + "[4 * k_ + u_], " +
           std::to_string(dt_code(st.dst->dtype)) + ");");
      line("      }");
      line("    }");
    } else {
      line("    for (int j_ = 0; j_ < " + kw + "; ++j_)");
      line("      if (" + row_col("j_") + " < " + ext[1] + ") mp_st(g_, " + row_col("j_") + ", " + r + "[j_], " +
           std::to_string(dt_code(st.dst->dtype)) + ");");
    }
    line("  }");
    line("}");
  }

  // The loop of a row-wise statement: task t_ is row y_ of iteration i's tile, the tasks strided over
  // every warp of the grid (a tile of fewer rows than a block has warps still keeps every warp busy).
  void row_loop(const ir::MetaPipe& m) {
    const std::string i = "i" + std::to_string(m.var->id);
    const int64_t tasks = m.trip() * row_TR_;
    line("// " + m.where() + ": the rows of its iterations' tiles over the warps of the grid");
    line("{");
    ind_ += "  ";
    line("const int lane_ = threadIdx.x & 31;");
    // The task index in 32 bits where it fits (a margin for the grid's warps beyond the last task): one
    // register fewer across the body keeps softmax's 1024-column rows at 64 registers without a spill.
    const bool narrow = tasks < (int64_t(1) << 31) - (int64_t(1) << 24);
    const std::string ty = narrow ? "int" : "long long";
    const std::string n = narrow ? std::to_string(tasks) : ll(tasks);
    const std::string tr = narrow ? std::to_string(row_TR_) : ll(row_TR_);
    line("const " + ty + " warps_ = (" + ty + ")gridDim.x * (blockDim.x >> 5);");
    line("for (" + ty + " t_ = (" + ty + ")blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t_ < " + n +
         "; t_ += warps_) {");
    ind_ += "  ";
    line("const " + ty + " " + i + " = t_ / " + tr + ";");
    line("const int y_ = (int)(t_ % " + tr + ");  // the row of iteration " + i + "'s tile");
    row_name_.clear();
    for (auto& st : m.stages) {
      line("// stage " + st.name);
      for (auto& op : st.ops) row_node(*op);
    }
    ind_.resize(ind_.size() - 2);
    line("}");
    ind_.resize(ind_.size() - 2);
    line("}");
  }

  // ---- one kernel per top-level statement
  // The launch of statement `stmt`, named: its entry symbol and the statement's node.
  KernelLaunch launch_of(int stmt) const {
    KernelLaunch k;
    k.entry = "mp_" + p_.name + "_s" + std::to_string(stmt);
    for (auto& c : k.entry)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    k.statement = p_.body[size_t(stmt)]->where();
    return k;
  }

  void kernel(int stmt) {
    const ir::NodeRef& top = p_.body[size_t(stmt)];
    KernelLaunch k = launch_of(stmt);
    auto* mp = top->as<ir::MetaPipe>();
    k.fold = fold_stmts_.count(stmt) > 0;
    k.distributed = mp && (mp->carried.empty() || k.fold);
    k.trip = k.distributed ? mp->trip() : 1;
    ring_tiles_.clear();
    ring_roots_.clear();
    ring_nodes_.clear();
    ring_notes_.clear();
    ring_depth_ = 0;
    ring_plan_.clear();
    row_mode_ = false;
    row_values_.clear();
    row_refusal_.clear();
    if (k.distributed && !k.fold && opt_.warp_rows) {
      row_refusal_ = row_refusal(*mp);
      row_mode_ = row_refusal_.empty();
    }
    if (k.distributed && !row_mode_) plan_ring(*mp);
    extra_threads_ = 0;
    producer_note_.clear();
    nthr_ = "blockDim.x";
    consumer_sync_ = false;
    if (!ring_tiles_.empty() && opt_.copy == LowerOptions::Copy::Bulk) {
      if (!opt_.producer_warp)
        producer_note_ = "switched off (MP_CUDA_LOWER_PRODUCER=thread)";
      else if (opt_.threads + 32 > 1024)
        producer_note_ = "a block of " + std::to_string(opt_.threads) + " threads leaves no room for a 33rd warp";
      else
        extra_threads_ = 32;
    }
    if (!ring_tiles_.empty())
      choose_ring_depth(*mp, top, stmt, k);
    else
      assign_storage(top, stmt, k.smem_bytes, k.scratch_floats);

    src_ << "\n// ---------------------------------------------------------------------------------------------\n";
    src_ << "// statement " << stmt << ": " << one_line(ir::print(*top)) << "\n";
    if (k.fold)
      src_ << "// its " << k.trip << " iterations carry running sums / maxima / minima only: persistent blocks stride\n"
           << "// over them, each folding into a partial of its own; the last block to finish combines the partials\n"
           << "// in block order.\n";
    else if (k.distributed)
      src_ << "// its " << k.trip << " iterations carry no value: persistent blocks stride over them.\n";
    else if (mp)
      src_ << "// loop-carried values: one block runs the iterations in order.\n";
    else
      src_ << "// one block.\n";
    if (row_mode_) {
      src_ << "// path: rows in registers: each warp takes whole rows of the tiles (" << row_TR_ << " x " << row_C_
           << "), " << row_K_ * row_W_ << " registers a lane per row\n// value, " << (row_W_ == 4 ? "16-byte" : "4-byte")
           << " loads and stores, the reductions by warp shuffles; no shared memory, no block barrier\n"
           << "// (MP_CUDA_LOWER_ROWS=tile: the tile path).\n";
    } else if (producer()) {
      k.threads = opt_.threads + extra_threads_;
      src_ << "// path: tile ring (bulk copies (TMA)), " << ring_depth_ << " slots per tile:";
      for (auto* l : ring_tiles_) src_ << " " << l->src->name;
      src_ << "; filled by a producer warp, up to " << ring_depth_ << " iterations ahead of the computing warps;\n// "
           << ring_plan_ << ".\n"
           << "// producer warp: the block's last warp (threads " << opt_.threads << ".." << k.threads - 1
           << ") issues the bulk copies of the block's iterations in\n"
           << "// order into slot k % " << ring_depth_ << " once the slot's \"empty\" mbarrier shows it free, its lanes loading the masked\n"
           << "// tails before lane 0 arrives on the slot's \"full\" mbarrier; the " << opt_.threads / 32
           << " computing warps wait on \"full\", compute, and arrive on\n"
           << "// \"empty\" (lane 0 after __syncwarp); no block barrier per iteration: the loop body's barriers are named\n"
           << "// barrier 1 over the computing warps (MP_CUDA_LOWER_PRODUCER=thread: thread 0 issues).\n";
    } else if (!ring_tiles_.empty()) {
      src_ << "// path: tile ring (" << (bulk_ring() ? "bulk copies (TMA)" : "cp.async") << "), " << ring_depth_
           << " slots per tile:";
      for (auto* l : ring_tiles_) src_ << " " << l->src->name;
      src_ << "; the copies of a block's iteration k + " << ring_depth_ - 1
           << " are issued before it computes iteration k;\n// " << ring_plan_ << ".\n";
      if (bulk_ring() && !producer_note_.empty())
        src_ << "// no producer warp: " << producer_note_ << ".\n";
      if (bulk_ring())
        src_ << "// bulk copies: thread 0 issues one per tile of an iteration, completing on the slot's mbarrier, whose\n"
             << "// phase every thread waits for; a tile's last n % 4 elements (a masked tail) are plain loads by the\n"
             << "// threads at issue time, published with the slot by the barrier before the iteration is computed.\n";
    } else if (k.distributed) {
      src_ << "// path: direct tile copies, loads then compute then store in every iteration.\n";
    }
    if (k.distributed && !k.fold && opt_.warp_rows && !row_mode_)
      src_ << "// not rows in registers: " << row_refusal_ << ".\n";
    for (auto& note : ring_notes_) src_ << "// " << note << ".\n";
    if (mma_note_.count(stmt))
      src_ << "// the MatMul takes the element loops, not the tile layer's wgmma pipeline: " << mma_note_.at(stmt) << ".\n";
    if (fa_note_.count(stmt))
      src_ << "// the fold takes the element loops, not the tile layer's wgmma attention pipeline: " << fa_note_.at(stmt)
           << ".\n";
    if (k.scratch_floats > 0 && !k.fold)
      src_ << "// the values of this statement do not all fit in " << opt_.smem_bytes
           << " bytes of shared memory: the rest (" << k.scratch_floats * 4
           << " bytes per block) live in global scratch, mp_bs.\n";
    src_ << "extern \"C\" __global__ void __launch_bounds__(" << (producer() ? k.threads : opt_.threads) << ", "
         << min_blocks(k, top) << ") " << k.entry
         << "(void* const* mp_t, float* mp_gv, long long* mp_gm, float* mp_scratch, long long mp_scratch_per_block, "
            "int* mp_err) {\n";
    ind_ = "  ";
    line("float* mp_bs = mp_scratch + (long long)blockIdx.x * mp_scratch_per_block;");
    line("double* mp_red = (double*)mp_smem;  // Reduce's warp results");
    line("(void)mp_bs; (void)mp_red;");
    // Tensors this statement touches.
    std::set<int> tens;
    std::set<int> used;  // values read or defined here
    ir::walk(std::vector<ir::NodeRef>{top}, [&](const ir::NodeRef& n, int) {
      if (auto* l = n->as<ir::LoadTile>()) tens.insert(l->src->id);
      if (auto* s = n->as<ir::StoreTile>()) tens.insert(s->dst->id);
      if (auto* g = n->as<ir::Gather>()) tens.insert(g->table->id);
      if (auto* s = n->as<ir::Scatter>()) tens.insert(s->table->id);
      if (n->out) used.insert(n->out->id);
      for (auto& x : n->operands()) used.insert(x->id);
      if (auto* m = n->as<ir::MetaPipe>())
        for (auto& c : m->carried) used.insert({c.init->id, c.arg->id, c.next->id, c.result->id});
    });
    for (size_t i = 0; i < p_.tensors.size(); ++i) {
      auto& t = p_.tensors[i];
      if (!tens.count(t->id)) continue;
      line(std::string(dev_type(t->dtype)) + "* T" + std::to_string(i) + " = (" + dev_type(t->dtype) + "*)mp_t[" +
           std::to_string(i) + "];  // " + t->name);
    }
    for (int id : used) {
      auto& val = values_.at(id);
      if (row_mode_ && row_values_.count(id)) {
        line("// " + ir::value_name(val) + " " + ir::to_string(val->dtype) + ir::to_string(val->shape) +
             ": a row of it in each warp's registers");
      } else {
        line("float* " + v(id) + " = " + storage(id) + ";  // " + ir::value_name(val) + " " +
             ir::to_string(val->dtype) + ir::to_string(val->shape) + " (" + where_name(id) + ")");
      }
      std::string m = meta_type_;
      for (size_t a = 0; a < val->shape.size(); ++a)
        m += std::string(a ? "," : "") + " " + e(id, a) + " = 0, " + o(id, a) + " = 0";
      if (!val->shape.empty()) line(m + ";");
      if (!(row_mode_ && row_values_.count(id))) line("(void)" + v(id) + ";");
      // A value from an earlier statement: its run-time extents and origin come from mp_gm.
      if (toplevel_.count(id) && stmt_of_.at(id) < stmt) {
        int64_t mo = global_meta_.at(id);
        for (size_t a = 0; a < val->shape.size(); ++a)
          line(e(id, a) + " = mp_gm[" + std::to_string(mo + 2 * int64_t(a)) + "]; " + o(id, a) + " = mp_gm[" +
               std::to_string(mo + 2 * int64_t(a) + 1) + "];");
      }
    }
    // The extents and origins of the values later statements read.
    std::vector<int> publish;
    for (int id : used)
      if (toplevel_.count(id) && stmt_of_.at(id) == stmt) publish.push_back(id);
    auto emit_publish = [&](const std::string& cond) {
      if (publish.empty()) return;
      line("if (" + cond + ") {");
      for (int id : publish) {
        int64_t mo = global_meta_.at(id);
        for (size_t a = 0; a < values_.at(id)->shape.size(); ++a)
          line("  mp_gm[" + std::to_string(mo + 2 * int64_t(a)) + "] = " + e(id, a) + "; mp_gm[" +
               std::to_string(mo + 2 * int64_t(a) + 1) + "] = " + o(id, a) + ";");
      }
      line("}");
    };
    if (row_mode_) {
      row_loop(*mp);
    } else if (k.distributed) {
      auto& m = *mp;
      std::string i = "i" + std::to_string(m.var->id);
      if (k.fold)
        for (auto& c : m.carried) {
          auto op = fold_op(m, c);
          line("// " + ir::value_name(c.arg) + ": this block's partial " + ir::to_string(op) + ", from its identity over the extents of " +
               ir::value_name(c.init));
          copy_meta(c.arg, c.init);
          open_elements(c.arg);
          line("    " + v(c.arg->id) + "[" + at(c.arg, xs(c.arg->shape.size())) + "] = " + fold_identity(op) + ";");
          close_elements();
        }
      if (k.fold) plan_register_fold(m);
      for (auto& [arg, acc] : reg_partials_)
        line("double " + acc + " = 0.0;  // this thread's share of " + ir::value_name(arg) +
             "'s running sum");
      line("// " + m.where() + ": iterations of " + i + " over the blocks");
      const bool producer_path = producer();
      if (producer_path) {
        producer_loop(m, i, used);
      } else {
        int N = ring_depth_;
        if (N > 0) {
          if (bulk_ring()) {
            line("mp_u64* mp_bar = (mp_u64*)(mp_smem + " + std::to_string(bar_float()) +
                 ");  // slot s's mbarrier: one arrival (thread 0's) and the slot's bytes a phase");
            line("if (threadIdx.x == 0) {");
            line("  for (int s_ = 0; s_ < " + std::to_string(N) + "; ++s_) mp_bar_init(mp_bar + s_, 1);");
            line("  mp_bar_fence_init();");
            line("}");
            line("__syncthreads();  // the mbarriers initialized before anyone uses them");
          }
          line("// the tile ring: the first " + std::to_string(N - 1) + " iterations of this block in flight");
          line("for (int p_ = 0; p_ < " + std::to_string(N - 1) + "; ++p_) {");
          ind_ += "  ";
          line("const long long n_i_ = (long long)blockIdx.x + (long long)p_ * gridDim.x;");
          ring_issue(m, "n_i_", "p_");
          ind_.resize(ind_.size() - 2);
          line("}");
          line("int mp_k = 0;  // this block's iterations so far: iteration mp_k reads slot mp_k % " + std::to_string(N));
        }
        line("for (long long " + i + " = blockIdx.x; " + i + " < " + ll(m.trip()) + "; " + i + " += gridDim.x) {");
        ind_ += "  ";
        const bool one_barrier = N >= 3 && opt_.one_barrier_ring;
        auto issue_ahead = [&] {
          line("{  // issue iteration mp_k + " + std::to_string(N - 1) + " into the slot that iteration mp_k - 1 read");
          ind_ += "  ";
          line("const long long n_i_ = " + i + " + (long long)" + std::to_string(N - 1) + " * gridDim.x;");
          ring_issue(m, "n_i_", "(mp_k + " + std::to_string(N - 1) + ") % " + std::to_string(N));
          ind_.resize(ind_.size() - 2);
          line("}");
        };
        // With bulk copies: the phase of slot mp_k % N that iteration mp_k's copies complete, the slot's uses
        // so far being mp_k / N; each thread's proxy fence orders its stores to the slot the next issue
        // refills (results written over a ring tile, the masked tails) before that issue's bulk copies.
        const std::string bar_wait = "mp_bar_wait(mp_bar + mp_k % " + std::to_string(N) + ", (unsigned)(mp_k / " +
                                     std::to_string(N) + ") & 1u);  // iteration mp_k's bulk copies have landed";
        const std::string fence = "mp_fence_proxy_async();  // this thread's stores to slots before later bulk copies";
        if (one_barrier) {
          // Iteration mp_k's copies, then the barrier every thread passes only after computing iteration
          // mp_k - 1: its slot, and any shared value the body reuses, are free to rewrite after it.
          if (bulk_ring()) {
            line(bar_wait);
            line(fence);
          } else {
            line("mp_cp_wait<" + std::to_string(N - 2) + ">();  // this thread's copies of iteration mp_k have landed");
          }
          line("__syncthreads();  // ... and every thread's; iteration mp_k - 1 is done everywhere");
          issue_ahead();
          ring_point(used, "mp_k % " + std::to_string(N));
        } else if (N > 0) {
          issue_ahead();
          if (bulk_ring())
            line(bar_wait);
          else
            line("mp_cp_wait<" + std::to_string(N - 1) + ">();  // this thread's copies of iteration mp_k have landed");
          line("__syncthreads();  // ... and every thread's");
          ring_point(used, "mp_k % " + std::to_string(N));
        }
        loop_body(m);
        if (one_barrier) {
          line("++mp_k;  // (the next iteration's barrier keeps this one's slot from being refilled early)");
        } else if (N > 0) {
          line("++mp_k;");
          if (bulk_ring()) line(fence);
          line("__syncthreads();  // slot mp_k % " + std::to_string(N) + " is read no more: the next issue refills it");
        }
        ind_.resize(ind_.size() - 2);
        line("}");
        if (bulk_ring())
          line("// every bulk copy has been waited for (the iterations past the end issue none)");
        else if (N > 0)
          line("mp_cp_wait<0>();  // no copy outlives the kernel (the groups past the end are empty)");
        if (one_barrier) line("__syncthreads();  // the last iteration done everywhere before what follows");
      }
      reduce_register_folds();
      reg_acc_.clear();
      reg_update_.clear();
      reg_partials_.clear();
      if (k.fold) fold_combine(m, stmt);
    } else {
      node(*top);
    }
    if (k.fold)
      ind_ += "  ";  // inside the last block's branch that fold_combine opened
    emit_publish(k.fold ? "threadIdx.x == 0" : "blockIdx.x == 0 && threadIdx.x == 0");
    if (k.fold) {
      line("if (threadIdx.x == 0) mp_gm[" + std::to_string(fold_counter_.at(stmt)) + "] = 0;  // ready for a relaunch");
      ind_.resize(ind_.size() - 2);
      line("}");
    }
    if (consumer_sync_) {  // the computing warps' branch that producer_loop opened
      ind_.resize(ind_.size() - 2);
      line("}");
      consumer_sync_ = false;
      nthr_ = "blockDim.x";
    }
    ind_ = "";
    src_ << "}\n";
    out_.kernels.push_back(k);
    row_mode_ = false;  // the next statement decides for itself
    row_values_.clear();
  }

  // The ring loop of a producer warp (LowerOptions::producer_warp, docs/cuda-lowering.md): the mbarriers
  // ("full" s: one arrival, the producer's lane 0, and the slot's bytes; "empty" s: one arrival per
  // computing warp), then the producer warp's loop, then the computing warps' branch, left open: what
  // follows the loop in the kernel (register sums, the fold over blocks, the publishing) runs in it, on
  // the computing warps' named barrier. The producer fills iteration k into slot k % N once the
  // computing warps have left iteration k - N there (empty's phase (k / N - 1) & 1); a computing warp
  // waits for full's phase (k / N) & 1, as on the thread path. Every iteration is issued and waited for
  // exactly once, none past the end: nothing is in flight or pending when the kernel ends.
  void producer_loop(const ir::MetaPipe& m, const std::string& i, const std::set<int>& used) {
    const int N = ring_depth_, CT = opt_.threads;
    const std::string Ns = std::to_string(N), trip = ll(m.trip());
    line("mp_u64* mp_bar = (mp_u64*)(mp_smem + " + std::to_string(bar_float()) +
         ");  // slot s: full mp_bar[s], empty mp_bar[" + Ns + " + s]");
    line("if (threadIdx.x == 0) {");
    line("  for (int s_ = 0; s_ < " + Ns + "; ++s_) {");
    line("    mp_bar_init(mp_bar + s_, 1);  // the producer's arrival and the slot's bytes a phase");
    line("    mp_bar_init(mp_bar + " + Ns + " + s_, " + std::to_string(CT / 32) + ");  // one arrival per computing warp");
    line("  }");
    line("  mp_bar_fence_init();");
    line("}");
    line("__syncthreads();  // the mbarriers initialized before anyone uses them (the last block-wide barrier)");
    line("if (threadIdx.x >= " + std::to_string(CT) + ") {  // the producer warp");
    ind_ += "  ";
    line("const int lane_ = (int)threadIdx.x - " + std::to_string(CT) + ";");
    line("int mp_k = 0;  // this block's iterations issued so far");
    line("for (long long n_i_ = blockIdx.x; n_i_ < " + trip + "; n_i_ += gridDim.x, ++mp_k) {");
    ind_ += "  ";
    line("if (mp_k >= " + Ns + ")  // the computing warps have left iteration mp_k - " + Ns + " in this slot");
    line("  mp_bar_wait(mp_bar + " + Ns + " + mp_k % " + Ns + ", (unsigned)(mp_k / " + Ns + " - 1) & 1u);");
    ring_issue_producer(m, "n_i_", "mp_k % " + Ns);
    ind_.resize(ind_.size() - 2);
    line("}");
    ind_.resize(ind_.size() - 2);
    line("} else {  // the computing warps");
    ind_ += "  ";
    nthr_ = std::to_string(CT);
    consumer_sync_ = true;
    line("int mp_k = 0;  // this block's iterations so far: iteration mp_k reads slot mp_k % " + Ns);
    line("for (long long " + i + " = blockIdx.x; " + i + " < " + trip + "; " + i + " += gridDim.x) {");
    ind_ += "  ";
    line("mp_bar_wait(mp_bar + mp_k % " + Ns + ", (unsigned)(mp_k / " + Ns + ") & 1u);  // iteration mp_k's tiles have landed");
    ring_point(used, "mp_k % " + Ns);
    loop_body(m);
    if (body_writes_ring(used))
      line("mp_fence_proxy_async();  // this thread's stores to the slot before the bulk copies that refill it");
    line("__syncwarp();  // the warp has left slot mp_k % " + Ns);
    line("if ((threadIdx.x & 31) == 0) mp_bar_arrive(mp_bar + " + Ns + " + mp_k % " + Ns + ");");
    line("++mp_k;");
    ind_.resize(ind_.size() - 2);
    line("}");
    line("// every bulk copy has been waited for, every empty phase completed (the producer issues no iteration past the end)");
    line(sync_stmt() + "  // the last iteration done in every computing warp before what follows");
  }

  // The kernel of a statement that plan_mma matched: a load / compute / finish struct on the tile
  // layer's pipeline template (tile/pipeline.cuh), as the hand-written GEMM is (kernels/gemm_sm90.cu),
  // with the shapes, tiles and loop order taken from the IR. The entry is extern "C" with the common
  // parameters and one tensor map per tensor after them (KernelLaunch::maps, encoded by the run time).
  // The end of a pipeline-template unit's struct K (its shared-memory size and threads checked against
  // the template's), and the head of its extern "C" entry: the common parameters, then one tensor map per
  // name (mp_map_<name>). Shared by the matmul and the attention kernels.
  void template_tail_and_entry(const KernelLaunch& k, const std::string& ns, const std::vector<std::string>& maps) {
    src_ << "static_assert(mp::tile::pc::traits<K>::shared_bytes == " << k.smem_bytes
         << ", \"the lowering's shared-memory size of the ring differs from the pipeline template's\");\n"
         << "static_assert(mp::tile::pc::traits<K>::threads == " << k.threads << ");\n"
         << "}  // namespace " << ns << "\n";
    src_ << "extern \"C\" __global__ void __launch_bounds__(" << k.threads << ", 1) " << k.entry
         << "(void* const* mp_t, float* mp_gv, long long* mp_gm, float* mp_scratch, long long mp_scratch_per_block, "
            "int* mp_err";
    for (size_t i = 0; i < maps.size(); ++i)
      src_ << ", const __grid_constant__ CUtensorMap mp_map_" << maps[i];
    src_ << ") {\n";
  }

  void mma_kernel(int stmt) {
    const MmaPlan& p = mma_.at(stmt);
    const ir::NodeRef& top = p_.body[size_t(stmt)];
    KernelLaunch k = launch_of(stmt);
    const int64_t tiles_m = p.outer->trip(), tiles_n = p.inner->trip(), k_iters = (p.K + 63) / 64;
    const int consumers = int(p.MM / 64);
    k.distributed = true;
    k.trip = tiles_m * tiles_n;
    k.threads = (consumers + 1) * 128;
    // The ring as deep as shared memory allows beside the finish's output buffers (two 64 x 64 bf16
    // chunks per consumer), at most 16 stages: the layout pc::traits computes, checked by a static_assert
    // in the unit. The IR's BUFFER depth is the dataflow accelerator's; here it is what fits.
    const int64_t stage_bytes = (p.MM + p.NN) * 64 * 2;
    const int64_t finish_bytes = (int64_t(consumers) * 2 * 64 * 64 * 2 + 1023) / 1024 * 1024;
    const int64_t budget = std::min<int64_t>(opt_.smem_bytes, 227 * 1024);
    const int64_t stages = std::min<int64_t>(16, (budget - 1024 - finish_bytes - 16 * 16) / stage_bytes);
    MP_INTERNAL_CHECK(stages >= 2, "cuda lowering: ", stage_bytes, "-byte matmul stages do not fit ", budget,
                      " bytes of shared memory twice");
    k.smem_bytes = stage_bytes * stages + finish_bytes + 2 * stages * 8 + 1024;
    const int ta = tensor_index_.at(p.la->src->id), tb = tensor_index_.at(p.lb->src->id),
              tc = tensor_index_.at(p.st->dst->id);
    k.maps = {{ta, p.M, p.K, int(p.MM), 64}, {tb, p.K, p.N, 64, 64}, {tc, p.M, p.N, 64, 64}};
    const std::string ns = "mp_s" + std::to_string(stmt);
    const std::string iv = p.outer->var->name, jv = p.inner->var->name;
    src_ << "\n// ---------------------------------------------------------------------------------------------\n";
    src_ << "// statement " << stmt << ": " << one_line(ir::print(*top)) << "\n";
    const int64_t KK = p.la->out->shape[1];
    src_ << "// path: the tile layer's pipeline (tile/pipeline.cuh). " << p.mm->where() << " of the [" << p.MM << ", "
         << KK << "] tile" << (p.k_loop ? "s" : "") << " of " << p.la->src->name << " (" << p.la->where() << ") and the ["
         << KK << ", " << p.NN << "] tile" << (p.k_loop ? "s" : "") << " of " << p.lb->src->name << " (" << p.lb->where()
         << ")\n";
    if (p.k_loop)
      src_ << "// summed over the " << p.k_loop->trip() << " iterations of " << p.k_loop->where()
           << " (its carried tile: the accumulator, in registers)\n";
    src_ << "// becomes a K loop of " << k_iters << " steps of 64: one producer thread issues the TMA loads of "
         << (p.MM == 64 ? "a " : "an ") << p.MM << " x 64 tile of " << p.la->src->name << " and a 64 x " << p.NN << " tile of " << p.lb->src->name
         << "\n// into a " << stages << "-stage shared-memory ring on mbarriers; " << consumers
         << " consumer warpgroup(s) of 64 rows run wgmma m64n" << p.NN << "k16 (bf16 x bf16 -> fp32)\n"
         << "// from the 128-byte-swizzled stages into fp32 registers; the finish (" << p.st->where()
         << ") rounds to bf16 and stores 64 x 64 chunks of " << p.st->dst->name
         << "\n// through shared memory with TMA. Work items: the " << tiles_m << " x " << tiles_n << " iterations of ("
         << iv << ", " << jv << "), " << iv << " outer, strided over persistent blocks (one per SM).\n"
         << "// Partial tiles: TMA reads what lies past the tensors' ends as zeros and drops the stores past C's.\n";
    src_ << "namespace " << ns << " {\n"
         << "using namespace mp::tile;\n"
         << "struct K {\n"
         << "  static constexpr int BM = " << p.MM << ", BN = " << p.NN << ", BK = 64, consumers = " << consumers
         << ", stages = " << stages << ";\n"
         << "  static constexpr int producer_registers = 40, consumer_registers = 232;\n"
         << (p.NN == 256 ? "  // The K loop rolled, as the GEMM's 128 x 256 kernel with this epilogue was measured fastest.\n"
                           "  static constexpr bool unroll_ring = false;\n"
                         : "")
         << "  static constexpr int tiles_n = " << tiles_n << ", work = " << tiles_m * tiles_n
         << ", k_iters = " << k_iters << ";\n"
         << "  using a_tile = st_bf<BM, BK>;  // " << p.la->src->name << "[" << iv << " * BM + r, it * BK + c]\n"
         << "  using b_tile = st_bf<BK, BN>;  // " << p.lb->src->name << "[it * BK + r, " << jv << " * BN + c], read MN-major\n"
         << "  using c_tile = st_bf<64, 64>;  // an output chunk\n"
         << "  struct stage {\n    a_tile a;\n    b_tile b;\n  };\n"
         << "  struct finish_smem {\n    c_tile c[consumers][2];  // two per consumer: a chunk's store overlaps the next one's writes\n  };\n"
         << "  struct globals {\n"
         << "    const CUtensorMap *a, *b, *c;  // the kernel's __grid_constant__ parameters\n"
         << "    bool skip_mma;  // never true (see the entry): a run-time test around the wgmma\n"
         << "  };\n"
         << "  struct state {\n    rt_fl<16, BN> acc;\n    bool skip_mma;\n  };\n"
         << "  struct item {\n    int row, col;  // of the tile's first element of C\n  };\n"
         << "  __host__ __device__ static int work_count(const globals&) { return work; }\n"
         << "  __device__ static item item_of(const globals&, int w) { return {(w / tiles_n) * BM, (w % tiles_n) * BN}; }\n"
         << "  __device__ static int iters(const item&) { return k_iters; }\n"
         << "  __device__ static void begin(state& st, const globals& g) { st.skip_mma = g.skip_mma; }\n"
         << "  __device__ static void prefetch(const globals& g) {\n"
         << "    tma::prefetch_map(g.a);\n    tma::prefetch_map(g.b);\n    tma::prefetch_map(g.c);\n  }\n"
         << "  __device__ static void load(stage& s, const globals& g, const item& w, int it, semaphore& full) {\n"
         << "    expect_bytes(full, tma::bytes<a_tile>() + tma::bytes<b_tile>());\n"
         << "    tma::load_async(s.a, g.a, full, w.row, it * BK);\n"
         << "    tma::load_async(s.b, g.b, full, it * BK, w.col);\n"
         << "  }\n"
         << "  __device__ static void compute(state& st, stage& s, const globals&, const item&, int it, int consumer) {\n"
         << "    if (st.skip_mma) return;\n"
         << "    warpgroup::fence_accumulator(st.acc);\n"
         << "    warpgroup::mma_fence();\n"
         << "    warpgroup::mma_AB(st.acc, s.a.template subtile_rows<64>(consumer), s.b, it > 0);\n"
         << "    warpgroup::mma_commit_group();\n"
         << "    warpgroup::fence_accumulator(st.acc);\n"
         << "  }\n"
         << "  // Each consumer stores its 64 rows as BN / 64 chunks taking turns in its two buffers.\n"
         << "  __device__ static void finish(state& st, finish_smem& fs, const globals& g, const item& w, int consumer) {\n"
         << "    warpgroup::fence_accumulator(st.acc);\n"
         << "    const bool leader = warpgroup::thread_in_group() == 0;\n"
         << "    const int row = w.row + consumer * 64;\n"
         << "#pragma unroll\n"
         << "    for (int j = 0; j < BN / 64; ++j) {\n"
         << "      c_tile& buf = fs.c[consumer][j % 2];\n"
         << "      if (leader) tma::wait_read<1>();  // the store that last read this buffer is done with it\n"
         << "      named_barrier_sync(1 + consumer, warpgroup_threads);\n"
         << "      warpgroup::write_chunk<bf16>(buf, [&](int jb, int f) {\n"
         << "        const __nv_bfloat162 b = __float22bfloat162_rn(st.acc.tiles[0][j * 4 + jb][f]);\n"
         << "        return *reinterpret_cast<const uint32_t*>(&b);\n"
         << "      });\n"
         << "      fence_async_shared();  // the chunk's writes visible to the TMA engine\n"
         << "      named_barrier_sync(1 + consumer, warpgroup_threads);\n"
         << "      if (leader) {\n"
         << "        tma::store_async(g.c, buf, row, w.col + j * 64);\n"
         << "        tma::commit_group();\n"
         << "      }\n"
         << "    }\n"
         << "  }\n"
         << "};\n";
    template_tail_and_entry(k, ns, {"a", "b", "c"});
    src_ << "  (void)mp_t; (void)mp_gv; (void)mp_gm; (void)mp_scratch; (void)mp_scratch_per_block;\n"
         << "  // mp_err is never null: the wgmma sit under a run-time test as in the GEMM, whose ring kernels ptxas\n"
         << "  // serialized without one (warning C7514, docs/development.md).\n"
         << "  const " << ns << "::K::globals g{&mp_map_a, &mp_map_b, &mp_map_c, mp_err == nullptr};\n"
         << "  mp::tile::pc::run_block<" << ns << "::K>(g);\n"
         << "}\n";
    out_.kernels.push_back(k);
  }

  // ---- the attention kernel (fa_refusal's plan): load / compute / finish on the pipeline template ----
  // Element expressions of the plan's nodes, one loop per node over the thread's fragment elements
  // (fully unrolled: every value is registers, and ptxas reuses those of the values that die).
  bool fa_expr_ = false;  // term(): exp as exp2 (ex2.approx), Random of the two indices in registers

  // A value's element in the current loop: a T or O value at fragment (j_, f_, e_), an R value at row h_.
  static std::string fa_at(const FaPlan& p, const ir::Value& v) {
    const std::string& n = p.name.at(v->id);
    return p.kind.at(v->id) == 'R' ? n + "[h_]" : "mp_el(" + n + ".tiles[0][j_][f_], e_)";
  }
  std::vector<std::string> fa_args(const FaPlan& p, const ir::Node& n) const {
    std::vector<ir::Value> ins = n.as<ir::Map>() ? std::vector<ir::Value>{n.as<ir::Map>()->in} : n.as<ir::Zip>()->ins;
    std::vector<std::string> a;
    for (auto& x : ins) a.push_back(fa_at(p, x));
    return a;
  }
  // The element loop of a [BR, N] value in the accumulator layout: lane l holds rows l / 4 and + 8 of
  // its warp's 16, columns 16 j + 2 (l % 4) + 8 (f >> 1) + e; gi_ is the element's global index.
  void fa_open_tile(const std::string& n16, const std::string& col0) {
    line("#pragma unroll");
    line("for (int j_ = 0; j_ < " + n16 + "; ++j_)");
    line("#pragma unroll");
    line("  for (int f_ = 0; f_ < 4; ++f_)");
    line("#pragma unroll");
    line("    for (int e_ = 0; e_ < 2; ++e_) {");
    line("      const int h_ = f_ & 1;");
    line("      const int c_ = " + col0 + " + 16 * j_ + 8 * (f_ >> 1) + e_;");
    line("      const long long gi_[2] = {(long long)(row0 + 8 * h_), (long long)c_};");
    line("      (void)h_; (void)c_; (void)gi_;");
  }
  void fa_open_rows() {
    line("#pragma unroll");
    line("for (int h_ = 0; h_ < 2; ++h_) {");
    line("  const long long gi_[2] = {(long long)(row0 + 8 * h_), 0ll};");
    line("  (void)gi_;");
  }
  // One element node's value at the current element, rounded to its dtype.
  std::string fa_value(const FaPlan& p, const ir::Node& n, const ir::Expr& f, const std::string& pad) {
    std::vector<std::string> a = fa_args(p, n);
    std::string x = expr(f, a, std::vector<bool>(a.size(), false), "gi_", 2, n, pad);
    int dt = dt_code(n.out->dtype);
    return dt == 0 ? x : "mp_round(" + x + ", " + std::to_string(dt) + ")";
  }
  // A Map / Zip of the plan (not the accumulator's update): a new register value.
  void fa_element_node(const FaPlan& p, const ir::Node& n, const std::string& scores16, const std::string& o16) {
    const ir::Expr& f = n.as<ir::Map>() ? n.as<ir::Map>()->f : n.as<ir::Zip>()->f;
    const std::string& nm = p.name.at(n.out->id);
    const char k = p.kind.at(n.out->id);
    line("// " + one_line(ir::print(n)));
    if (k == 'R') {
      line("float " + nm + "[2];");
      fa_open_rows();
      std::string x = fa_value(p, n, f, "  ");
      line("  " + nm + "[h_] = " + x + ";");
      line("}");
      return;
    }
    line("rt_fl<16, " + std::string(k == 'T' ? "BN" : "D") + "> " + nm + ";");
    fa_open_tile(k == 'T' ? scores16 : o16, k == 'T' ? "col0" : "ocol0");
    std::string x = fa_value(p, n, f, "      ");
    line("      mp_el(" + nm + ".tiles[0][j_][f_], e_) = " + x + ";");
    line("    }");
  }

  void fa_kernel(int stmt) {
    const FaPlan& p = fa_.at(stmt);
    const ir::NodeRef& top = p_.body[size_t(stmt)];
    KernelLaunch k = launch_of(stmt);
    const int consumers = int(p.BR / 64);
    const ir::MetaPipe& fold = *p.fold;
    k.distributed = true;
    k.block_per_item = true;
    k.trip = p.outer->trip();
    k.threads = (consumers + 1) * 128;
    const int64_t q_bytes = (p.BR * p.D * 2 + 1023) / 1024 * 1024, stage_bytes = 2 * p.BC * p.D * 2;
    k.smem_bytes = stage_bytes * p.stages + q_bytes + 2 * p.stages * 8 + 1024;
    const int tq = tensor_index_.at(p.lq->src->id), tk = tensor_index_.at(p.lk->src->id),
              tv = tensor_index_.at(p.lv->src->id), to = tensor_index_.at(p.st->dst->id);
    k.maps = {{tq, p.S, p.D, 64, 64}, {tk, p.Skv, p.D, int(p.BC), 64}, {tv, p.Skv, p.D, int(p.BC), 64}};
    const std::string ns = "mp_s" + std::to_string(stmt);
    const ir::Carried& oc = fold.carried[size_t(p.o_carried)];
    src_ << "\n// ---------------------------------------------------------------------------------------------\n";
    src_ << "// statement " << stmt << ": " << one_line(ir::print(*top)) << "\n";
    src_ << "// path: the tile layer's wgmma attention pipeline (tile/pipeline.cuh). The fold " << fold.where() << " over "
         << fold.trip() << " key tiles of " << p.BC << " carries " << fold.carried.size() - 1
         << " row value(s) in registers (two rows a thread) and its [" << p.BR << ", " << p.D
         << "] accumulator as wgmma fp32 registers.\n"
         << "// Work items: the " << p.outer->trip() << " query tiles of " << p.BR << " rows of " << p.lq->src->name
         << " (" << p.outer->where() << "), one block each; one producer thread TMA-loads (128-byte swizzle) the item's\n"
         << "// Q tile once and the K / V tiles of " << p.lk->src->name << " and " << p.lv->src->name << " into a "
         << p.stages << "-stage ring on mbarriers; " << consumers << " consumer warpgroup(s) of 64 rows run\n"
         << "// " << p.qk->where() << " as wgmma m64n" << p.BC << "k16 into fp32 registers, the element nodes per accumulator element\n"
         << "// (index(0) the query row, index(1) the key), the Reduces by quad shuffles, P rounded to bf16 in registers\n"
         << "// and " << p.pv->where() << " as wgmma m64n" << p.D << "k16 with A from registers and V MN-major, the\n"
         << "// accumulator's update g(o, rows) applied before it. Deviations from the interpreter: P is rounded to bf16\n"
         << "// before the second product, exp is exp2(x * log2 e) (ex2.approx), sums in fp32 in another order.\n"
         << (p.causal_skip ? "// The key tiles past an item's last query row are skipped: over them the fold provably leaves its carried\n"
                             "// values unchanged (the causal select gives -inf everywhere there; see fa_causal_skip).\n"
                           : "// Every item runs every key tile (no key tile was proven to leave the carried values unchanged).\n")
         << "// Partial tiles: TMA reads zeros past the tensors' ends; the Reduces skip the keys past "
         << p.Skv << " and P is 0 there; rows past " << p.S << " are not stored.\n";
    src_ << "namespace " << ns << " {\n"
         << "using namespace mp::tile;\n"
         << "__device__ __forceinline__ float& mp_el(float2& p, int e) { return e ? p.y : p.x; }\n"
         << "__device__ __forceinline__ float mp_exp(float x) { return mp::tile::exp2_ftz(x * 1.4426950408889634f); }\n"
         << "// ir::random_uniform of the element's two indices (mp_random without the index array).\n"
         << "__device__ __forceinline__ double mp_random2(mp_u64 seed, long long i0, long long i1) {\n"
         << "  mp_u64 h = mp_mix(mp_mix(mp_mix(seed) ^ (mp_u64)i0) ^ (mp_u64)i1);\n"
         << "  return (double)(h >> 11) * (1.0 / 9007199254740992.0);\n"
         << "}\n"
         << "struct K {\n"
         << "  static constexpr int BM = " << p.BR << ", BN = " << p.BC << ", D = " << p.D << ", consumers = " << consumers
         << ", stages = " << p.stages << ";\n"
         << "  static constexpr int producer_registers = 24, consumer_registers = 240;\n"
         << "  // Rolled K loop: the element nodes between the two wgmma are long (as the hand-written attention's).\n"
         << "  static constexpr bool unroll_ring = false;\n"
         << "  // Two consumers take turns issuing S = Q K^T (named barriers 3 and 4, as the hand-written attention's\n"
         << "  // ping-pong), so that one's element nodes overlap the other's wgmma.\n"
         << "  static constexpr bool pingpong = consumers == 2;\n"
         << "  static constexpr int seq_q = " << p.S << ", seq_kv = " << p.Skv << ", work = " << p.outer->trip()
         << ", kv_iters = " << fold.trip() << ";\n"
         << "  using q_tile = st_bf<64, D>;   // " << p.lq->src->name << "[q0 + 64 c + r, c]\n"
         << "  using kv_tile = st_bf<BN, D>;  // " << p.lk->src->name << " and " << p.lv->src->name << "[it * BN + r, c]\n"
         << "  struct stage {\n    kv_tile k, v;\n  };\n"
         << "  struct finish_smem {\n    q_tile q[consumers];  // the item's query rows, one tile per consumer\n  };\n"
         << "  struct globals {\n    const CUtensorMap *q, *k, *v;  // the kernel's __grid_constant__ parameters\n"
         << "    __nv_bfloat16* o;\n  };\n"
         << "  struct state {\n    rt_fl<16, D> o;  // " << ir::value_name(oc.arg) << "\n";
    for (auto& c : fold.carried)
      if (&c != &oc) src_ << "    float " << p.name.at(c.arg->id).substr(3) << "[2];  // " << ir::value_name(c.arg) << "\n";
    src_ << "  };\n"
         << "  struct item {\n    int q0, iters;  // the tile's first query row, its key tiles\n  };\n"
         << "  __host__ __device__ static int work_count(const globals&) { return work; }\n";
    if (p.causal_skip)
      src_ << "  // The key tiles past the item's last row leave the carried values as they are (the lowering's\n"
           << "  // abstract run of the fold over them): the fold stops at the last tile that reaches that row. The\n"
           << "  // longest items first, so that the short ones fill the last wave.\n"
           << "  __device__ static item item_of(const globals&, int w) {\n"
           << "    const int q0 = (work - 1 - w) * BM, last = min(q0 + BM, seq_q) - 1;\n"
           << "    return {q0, min(kv_iters, last / BN + 1)};\n"
           << "  }\n";
    else
      src_ << "  __device__ static item item_of(const globals&, int w) { return {w * BM, kv_iters}; }\n";
    src_ << "  __device__ static int iters(const item& w) { return w.iters; }\n"
         << "  __device__ static void prefetch(const globals& g) {\n"
         << "    tma::prefetch_map(g.q);\n    tma::prefetch_map(g.k);\n    tma::prefetch_map(g.v);\n  }\n"
         << "  __device__ static void load(stage& s, finish_smem& f, const globals& g, const item& w, int it, semaphore& full) {\n"
         << "    constexpr uint32_t kv_bytes = 2 * tma::bytes<kv_tile>();\n"
         << "    if (it == 0) {  // the item's Q tiles on the first stage's semaphore\n"
         << "      expect_bytes(full, kv_bytes + consumers * tma::bytes<q_tile>());\n"
         << "      for (int c = 0; c < consumers; ++c) tma::load_async(f.q[c], g.q, full, w.q0 + 64 * c, 0);\n"
         << "    } else {\n"
         << "      expect_bytes(full, kv_bytes);\n"
         << "    }\n"
         << "    tma::load_async(s.k, g.k, full, it * BN, 0);\n"
         << "    tma::load_async(s.v, g.v, full, it * BN, 0);\n"
         << "  }\n"
         << "  // The carried values' initial Fills (the launch is one block per item: begin runs once per item).\n"
         << "  __device__ static void begin(state& st, const globals&) {\n";
    ind_ = "    ";
    {
      line("#pragma unroll");
      line("for (int j_ = 0; j_ < D / 16; ++j_)");
      line("#pragma unroll");
      line("  for (int f_ = 0; f_ < 4; ++f_) st.o.tiles[0][j_][f_] = make_float2(" + fnum(p.fill.at(oc.init->id)) + ", " +
           fnum(p.fill.at(oc.init->id)) + ");");
      for (auto& c : fold.carried)
        if (&c != &oc) {
          const std::string& n = p.name.at(c.arg->id);
          line(n + "[0] = " + n + "[1] = " + fnum(p.fill.at(c.init->id)) + ";");
        }
    }
    src_ << "  }\n"
         << "  __device__ static void compute(state& st, stage& s, finish_smem& f, const globals&, const item& w, int it, int consumer) {\n";
    fa_expr_ = true;
    line("const int lane = threadIdx.x % warp_threads;");
    line("const int row0 = w.q0 + 64 * consumer + 16 * warpgroup::warpid() + lane / 4;  // the lane's first row");
    line("const int col0 = it * BN + 2 * (lane % 4), ocol0 = 2 * (lane % 4);  // its first key and column of D");
    line("const bool edge = it * BN + BN > seq_kv;  // keys past the end in this tile");
    line("(void)ocol0;");
    line("rt_bf<16, BN> pb_;  // P in bf16, the A operand of the second wgmma");
    for (const ir::Node* n : p.body) {
      const std::string& nm = p.name.at(n->out->id);
      if (n == p.qk) {
        line("// " + one_line(ir::print(*n)) + "; waiting for it also retires the previous P V");
        line("// The turn: consumer c waits on barrier 3 + c, hands over on the other's; every wait has its arrival.");
        line("if constexpr (pingpong)");
        line("  if (consumer == 1 || it > 0) named_barrier_sync(3 + consumer, 2 * warpgroup_threads);");
        line("rt_fl<16, BN> " + nm + ";");
        line("warpgroup::fence_accumulator(" + nm + ");");
        line("warpgroup::mma_fence();");
        line("warpgroup::mm_ABt(" + nm + ", f.q[consumer], s.k);");
        line("warpgroup::mma_commit_group();");
        line("if constexpr (pingpong)");
        line("  if (consumer == 0 || it + 1 < w.iters) named_barrier_arrive(4 - consumer, 2 * warpgroup_threads);");
        line("warpgroup::mma_async_wait<0>();");
        line("warpgroup::fence_accumulator(" + nm + ");");
        line("warpgroup::fence_accumulator(st.o);");
      } else if (n == p.pv) {
        const std::string& a = p.name.at(p.pv->a->id);
        line("// " + one_line(ir::print(*n)) + ": A rounded to bf16 (0 past the keys' end), issued after the accumulator's update");
        line("{");
        line("  rt_fl<16, BN> pm_ = " + a + ";");
        line("  if (edge) {");
        ind_ += "    ";
        fa_open_tile("BN / 16", "col0");
        line("      if (c_ >= seq_kv) mp_el(pm_.tiles[0][j_][f_], e_) = 0.0f;");
        line("    }");
        ind_.resize(ind_.size() - 4);
        line("  }");
        line("  warp::copy(pb_, pm_);");
        line("}");
      } else if (auto* r = n->as<ir::Reduce>()) {
        const std::string& in = p.name.at(r->in->id);
        std::string comb = r->combiner == ir::Combiner::Add ? "a_ + x_" : r->combiner == ir::Combiner::Max ? "mp_max(a_, x_)" : "mp_min(a_, x_)";
        line("// " + one_line(ir::print(*n)) + ": the lane's keys, then its quad's");
        line("float " + nm + "[2];");
        line("#pragma unroll");
        line("for (int h_ = 0; h_ < 2; ++h_) {");
        line("  float a_ = " + fnum(r->identity) + ";");
        line("#pragma unroll");
        line("  for (int j_ = 0; j_ < BN / 16; ++j_)");
        line("#pragma unroll");
        line("    for (int f_ = h_; f_ < 4; f_ += 2)");
        line("#pragma unroll");
        line("      for (int e_ = 0; e_ < 2; ++e_) {");
        line("        const float x_ = mp_el(" + in + ".tiles[0][j_][f_], e_);");
        line("        if (!edge || col0 + 16 * j_ + 8 * (f_ >> 1) + e_ < seq_kv) a_ = " + comb + ";");
        line("      }");
        line("  float x_ = __shfl_xor_sync(0xffffffffu, a_, 1);");
        line("  a_ = " + comb + ";");
        line("  x_ = __shfl_xor_sync(0xffffffffu, a_, 2);");
        line("  a_ = " + comb + ";");
        line("  " + nm + "[h_] = a_;");
        line("}");
      } else if (n == p.o_next) {
        line("// " + one_line(ir::print(*n)) + ": o = g(o, rows) now, + P V by the wgmma below");
        fa_open_tile("D / 16", "ocol0");
        std::vector<std::string> a = fa_args(p, *n);
        ExprScope sc;
        sc.args = a;
        sc.args_double.assign(a.size(), false);
        sc.gidx = "gi_";
        sc.rank = 2;
        sc.pad = "      ";
        std::string x = as(term(*p.o_rest, sc, *n), false);
        line("      mp_el(st.o.tiles[0][j_][f_], e_) = " + x + ";");
        line("    }");
      } else {
        fa_element_node(p, *n, "BN / 16", "D / 16");
      }
    }
    line("// O += P V, left in flight: the template frees the stage behind it, the next S = Q K^T waits for it");
    line("warpgroup::fence_accumulator(st.o);");
    line("warpgroup::mma_fence();");
    line("warpgroup::mma_AB(st.o, pb_, s.v, true);");
    line("warpgroup::mma_commit_group();");
    line("warpgroup::fence_accumulator(st.o);");
    for (auto& c : fold.carried)
      if (&c != &oc && p.name.at(c.next->id) != p.name.at(c.arg->id)) {
        const std::string &n = p.name.at(c.arg->id), &x = p.name.at(c.next->id);
        line(n + "[0] = " + x + "[0];");
        line(n + "[1] = " + x + "[1];");
      }
    src_ << "  }\n"
         << "  // " << p.st->where() << ": the rows below " << p.S << " as bf16, from the registers to global memory.\n"
         << "  __device__ static void finish(state& st, finish_smem&, const globals& g, const item& w, int consumer) {\n";
    line("warpgroup::fence_accumulator(st.o);");
    line("const int lane = threadIdx.x % warp_threads;");
    line("const int row0 = w.q0 + 64 * consumer + 16 * warpgroup::warpid() + lane / 4;");
    line("const int ocol0 = 2 * (lane % 4);");
    for (const ir::Node* n : p.after) fa_element_node(p, *n, "BN / 16", "D / 16");
    const std::string& out = p.name.at(p.st->in->id);
    line("#pragma unroll");
    line("for (int h_ = 0; h_ < 2; ++h_) {");
    line("  const int row = row0 + 8 * h_;");
    line("  if (row >= seq_q) continue;");
    line("  __nv_bfloat16* out = g.o + (size_t)row * D + ocol0;");
    line("#pragma unroll");
    line("  for (int j_ = 0; j_ < D / 16; ++j_)");
    line("#pragma unroll");
    line("    for (int f_ = h_; f_ < 4; f_ += 2)");
    line("      *reinterpret_cast<__nv_bfloat162*>(out + 16 * j_ + 8 * (f_ >> 1)) = __float22bfloat162_rn(" + out +
         ".tiles[0][j_][f_]);");
    line("}");
    fa_expr_ = false;
    ind_.clear();
    src_ << "  }\n"
         << "};\n";
    template_tail_and_entry(k, ns, {"q", "k", "v"});
    src_ << "  (void)mp_gv; (void)mp_gm; (void)mp_scratch; (void)mp_scratch_per_block; (void)mp_err;\n"
         << "  // One block per work item (the Q tiles live in the finish region; tile/pipeline.cuh).\n"
         << "  const " << ns << "::K::globals g{&mp_map_q, &mp_map_k, &mp_map_v, static_cast<__nv_bfloat16*>(mp_t[" << to
         << "])};\n"
         << "  mp::tile::pc::run_block<" << ns << "::K>(g);\n"
         << "}\n";
    out_.kernels.push_back(k);
  }

  // The end of a folded loop: every block publishes its partials' extents, counts itself done; the last
  // one (the counter's old value is gridDim.x - 1) adds init and every block's partial, in block order,
  // into the result, and leaves its branch open for the publishing of the result's extents.
  void fold_combine(const ir::MetaPipe& m, int stmt) {
    line("// every block's partials are complete: the last block to finish combines them");
    int64_t j = 0;
    for (auto& c : m.carried)
      for (size_t a = 0; a < c.arg->shape.size(); ++a, ++j)
        line("if (threadIdx.x == 0) mp_bs[" + ll(fold_meta_ + j) + "] = (float)" + e(c.arg, a) + ";");
    line("__threadfence();");
    line(sync_stmt());
    std::string flag = "mp_smem[" + std::to_string(flag_float()) + "]";
    line("if (threadIdx.x == 0)");
    line("  " + flag + " = atomicAdd((unsigned long long*)(mp_gm + " + std::to_string(fold_counter_.at(stmt)) +
         "), 1ull) == gridDim.x - 1 ? 1.0f : 0.0f;");
    line(sync_stmt());
    line("if (" + flag + " != 0.0f) {");
    ind_ += "  ";
    line("__threadfence();");
    j = 0;
    for (auto& c : m.carried) {
      size_t r = c.arg->shape.size();
      line("// " + ir::value_name(c.result) + " = " + ir::value_name(c.init) + " combined (" + ir::to_string(fold_op(m, c)) +
           ") with the partials of blocks 0, 1, ...");
      for (size_t a = 0; a < r; ++a) line(e(c.result, a) + " = " + e(c.init, a) + "; " + o(c.result, a) + " = " + o(c.init, a) + ";");
      // The partials are read 16 blocks at a time, all 16 loads issued before the first is used: one
      // L2 round trip per 16 blocks instead of one per block (a thread issues in order, so a load
      // followed by its use in a loop waits a round trip each time; measured on the H200, 132 blocks
      // of dotproduct's scalar fold took most of the kernel). The fold still runs in block order.
      const std::string rr = std::to_string(r);
      line("for (unsigned b0_ = 0; b0_ < gridDim.x; b0_ += 16) {");
      line("  float q_[16 * " + rr + "];");
      line("#pragma unroll");
      line("  for (int u_ = 0; u_ < 16; ++u_)");
      line("#pragma unroll");
      line("    for (int a_ = 0; a_ < " + rr + "; ++a_)");
      line("      q_[u_ * " + rr + " + a_] = b0_ + u_ < gridDim.x ? ((const volatile float*)(mp_scratch + (long long)(b0_ + u_) * "
           "mp_scratch_per_block + " + ll(fold_meta_ + j) + "))[a_] : 0.0f;");
      line("#pragma unroll");
      line("  for (int u_ = 0; u_ < 16; ++u_) {");
      line("    if (b0_ + u_ >= gridDim.x) break;");
      for (size_t a = 0; a < r; ++a)
        line("    if ((long long)q_[u_ * " + rr + " + " + std::to_string(a) + "] < " + e(c.result, a) + ") " + e(c.result, a) +
             " = (long long)q_[u_ * " + rr + " + " + std::to_string(a) + "];");
      line("  }");
      line("}");
      j += int64_t(r);
      int64_t part = slot_.at(groups_.find(c.arg->id)).offset;
      open_elements(c.result);
      line("    float s_ = " + v(c.init->id) + "[" + at(c.init, xs(r)) + "];");
      line("    for (unsigned b0_ = 0; b0_ < gridDim.x; b0_ += 16) {");
      line("      float t_[16];");
      line("#pragma unroll");
      line("      for (int u_ = 0; u_ < 16; ++u_)");
      line("        t_[u_] = b0_ + u_ < gridDim.x ? ((const volatile float*)(mp_scratch + (long long)(b0_ + u_) * "
           "mp_scratch_per_block + " + ll(part) + "))[" + at(c.arg, xs(r)) + "] : 0.0f;");
      line("#pragma unroll");
      line("      for (int u_ = 0; u_ < 16; ++u_)");
      line("        if (b0_ + u_ < gridDim.x) " + fold_step(fold_op(m, c), "s_", "t_[u_]"));
      line("    }");
      line("    " + v(c.result->id) + "[" + at(c.result, xs(r)) + "] = mp_round(s_, " +
           std::to_string(dt_code(c.result->dtype)) + ");");
      close_elements();
    }
    ind_.resize(ind_.size() - 2);
  }

  void copy_meta(const ir::Value& dst, const ir::Value& src) {
    for (size_t a = 0; a < dst->shape.size(); ++a) line(e(dst, a) + " = " + e(src, a) + "; " + o(dst, a) + " = " + o(src, a) + ";");
  }

  // Element copy between two values of one shape (loop-carried values).
  void copy_value(const ir::Value& dst, const ir::Value& src) {
    copy_meta(dst, src);
    if (groups_.find(dst->id) == groups_.find(src->id)) return;
    line(sync_stmt());
    open_elements(src);
    line("    " + v(dst->id) + "[" + at(dst, xs(dst->shape.size())) + "] = " + v(src->id) + "[" +
         at(src, xs(src->shape.size())) + "];");
    close_elements();
  }

  void loop_body(const ir::MetaPipe& m) {
    for (auto& c : m.carried) line("// carried " + ir::value_name(c.arg) + " = " + ir::value_name(c.init) + " at the start");
    // The body's nodes in order across its stages (which run one after the other here): a Map / Zip at
    // the end of a stage fuses into the StoreTile that starts the next.
    std::vector<ir::NodeRef> flat;
    for (auto& st : m.stages) flat.insert(flat.end(), st.ops.begin(), st.ops.end());
    size_t g = 0;
    for (size_t s = 0; s < m.stages.size(); ++s) {
      line("// stage " + m.stages[s].name);
      auto& ops = m.stages[s].ops;
      stage_has_direct_ = false;
      for (auto& op : ops) stage_has_direct_ = stage_has_direct_ || (op->kind == ir::NodeKind::LoadTile && !ring_nodes_.count(op->id));
      for (size_t j = 0; j < ops.size(); ++j, ++g) {
        if (fused_into_reduce(flat, g)) {
          line("// " + ops[j]->where() + ": " + one_line(ir::print(*ops[j])));
          line("// ... computed in the loop of " + flat[g + 1]->where() +
               ", its only reader: never stored in shared memory");
          elementwise_meta(*ops[j], elementwise_ins(*ops[j]));
          fused_src_ = ops[j].get();
          continue;
        }
        if (reg_update_.count(ops[j]->id)) {
          line("// " + ops[j]->where() + ": " + one_line(ir::print(*ops[j])));
          line("// ... the running sum stays in the threads' registers (added up after the loop)");
          elementwise_meta(*ops[j], elementwise_ins(*ops[j]));
          continue;
        }
        reg_tail_ = ring_depth_ > 0;
        for (size_t q = g + 1; q < flat.size(); ++q) reg_tail_ = reg_tail_ && reg_update_.count(flat[q]->id);
        // On the producer path no block barrier follows the iteration: the last node may leave out its
        // barrier only where it reads ring slots alone (their "empty" mbarrier keeps them until every
        // computing warp has left them).
        if (reg_tail_ && consumer_sync_) {
          std::vector<ir::Value> reads = ops[j]->operands();
          if (fused_src_)
            for (auto& x : fused_src_->operands()) reads.push_back(x);
          for (auto& x : reads)
            if (!(fused_src_ && x->id == fused_src_->out->id) && !ring_roots_.count(groups_.find(x->id)))
              reg_tail_ = false;
        }
        skip_barrier_ = (ops[j]->kind == ir::NodeKind::LoadTile && j + 1 < ops.size() &&
                         ops[j + 1]->kind == ir::NodeKind::LoadTile) ||
                        chained(flat, g);
        node(*ops[j]);
        if (chained(flat, g))
          line("// no barrier here: " + flat[g + 1]->where() + " reads only the elements each thread wrote");
        skip_barrier_ = false;
        fused_src_ = nullptr;
      }
    }
    for (auto& c : m.carried) {
      line("// carried " + ir::value_name(c.arg) + " <- " + ir::value_name(c.next));
      bool in_registers = false;
      for (auto& rp : reg_partials_) in_registers = in_registers || rp.first->id == c.arg->id;
      if (in_registers)
        copy_meta(c.arg, c.next);
      else
        copy_value(c.arg, c.next);
    }
  }

  // The LoadTiles of an inner loop's first stage whose next tile is prefetched into registers
  // (LowerOptions::prefetch): one contiguous run of a float-stored tensor, its inner axes full, at most
  // four elements per thread. LoadTile id -> its loop.
  std::map<int, const ir::MetaPipe*> prefetch_;
  bool prefetchable(const ir::LoadTile& l) const {
    const auto& t = l.src;
    if (std::string(dev_type(t->dtype)) != "float" || ir::num_elements(l.out->shape) > 4 * int64_t(opt_.threads))
      return false;
    int lead = -1;
    for (size_t a = 0; a < t->shape.size(); ++a)
      if (l.out->shape[a] > 1) {
        lead = int(a);
        break;
      }
    if (lead < 0) return false;
    for (size_t a = size_t(lead + 1); a < t->shape.size(); ++a)
      if (l.out->shape[a] != t->shape[a] || !l.offset[a].is_const() || l.offset[a].constant != 0) return false;
    return true;
  }
  void metapipe(const ir::MetaPipe& m) {
    std::string i = "i" + std::to_string(m.var->id);
    for (auto& c : m.carried) copy_value(c.arg, c.init);
    std::vector<const ir::LoadTile*> pf;
    if (opt_.prefetch && m.trip() >= 2 && !m.stages.empty())
      for (auto& op : m.stages[0].ops)
        if (auto* l = op->as<ir::LoadTile>(); l && prefetchable(*l)) pf.push_back(l);
    if (!pf.empty()) {
      line("{  // the next iteration's tiles are loaded into registers while this one computes: " +
           [&] {
             std::string names;
             for (auto* l : pf) names += (names.empty() ? "" : ", ") + l->where() + " (" + l->src->name + ")";
             return names;
           }());
      ind_ += "  ";
      for (auto* l : pf) {
        const std::string q = std::to_string(l->out->id);
        line("float4 pf" + q + "_; int pfn" + q + "_ = 0;  // this thread's four elements of the prefetched tile, and its length");
        line("pf" + q + "_.x = pf" + q + "_.y = pf" + q + "_.z = pf" + q + "_.w = 0.0f;");
        prefetch_[l->id] = &m;
      }
    }
    line("for (long long " + i + " = 0; " + i + " < " + ll(m.trip()) + "; ++" + i + ") {");
    ind_ += "  ";
    loop_body(m);
    ind_.resize(ind_.size() - 2);
    line("}");
    if (!pf.empty()) {
      for (auto* l : pf) prefetch_.erase(l->id);
      ind_.resize(ind_.size() - 2);
      line("}");
    }
    for (auto& c : m.carried) copy_meta(c.result, c.arg);
  }
  // A prefetched LoadTile (prefetch_): iteration 0 copies its tile as the direct path does; a later one
  // writes the registers that the previous iteration filled (the barrier that ended it keeps the tile
  // from being rewritten while read). Then the loads of the next iteration's tile into registers, which
  // stay in flight while this iteration computes and stores; then the stage's barrier.
  void load_prefetched(const ir::LoadTile& l, const ir::MetaPipe& m, const std::function<void()>& copy) {
    const std::string i = "i" + std::to_string(m.var->id), q = std::to_string(l.out->id);
    const std::string pfv = "pf" + q + "_", pfn = "pfn" + q + "_", d = v(l.out->id);
    line("if (" + i + " == 0) {");
    ind_ += "  ";
    bool keep = skip_barrier_;
    skip_barrier_ = true;
    copy();
    skip_barrier_ = keep;
    ind_.resize(ind_.size() - 2);
    line("} else {  // the tile the previous iteration prefetched into registers");
    line("  const int f_ = 4 * (int)threadIdx.x;");
    line("  if (f_ < " + pfn + ") " + d + "[f_] = " + pfv + ".x;");
    line("  if (f_ + 1 < " + pfn + ") " + d + "[f_ + 1] = " + pfv + ".y;");
    line("  if (f_ + 2 < " + pfn + ") " + d + "[f_ + 2] = " + pfv + ".z;");
    line("  if (f_ + 3 < " + pfn + ") " + d + "[f_ + 3] = " + pfv + ".w;");
    line("}");
    const RingSpan sp = ring_span(l, m, "(" + i + " + 1)");
    line("if (" + i + " + 1 < " + ll(m.trip()) + ") {  // prefetch: iteration " + i + " + 1's tile, in flight during this one");
    line("  const long long s_ = " + sp.lead_offset + ", g0_ = " + sp.g0 + ";");
    line("  " + pfn + " = s_ >= 0" + sp.ok + " ? (int)mp_clip(" + ll(l.src->shape[size_t(sp.lead)]) + " - s_, " +
         ll(l.out->shape[size_t(sp.lead)]) + ") * " + std::to_string(sp.inner) + " : 0;");
    line("  const float* g_ = " + T(l.src) + " + g0_;");
    line("  const int f_ = 4 * (int)threadIdx.x;");
    line("  if ((g0_ & 3) == 0 && f_ + 4 <= " + pfn + ") {");
    line("    " + pfv + " = *(const float4*)(g_ + f_);");
    line("  } else {");
    line("    " + pfv + ".x = f_ < " + pfn + " ? g_[f_] : 0.0f;");
    line("    " + pfv + ".y = f_ + 1 < " + pfn + " ? g_[f_ + 1] : 0.0f;");
    line("    " + pfv + ".z = f_ + 2 < " + pfn + " ? g_[f_ + 2] : 0.0f;");
    line("    " + pfv + ".w = f_ + 3 < " + pfn + " ? g_[f_ + 3] : 0.0f;");
    line("  }");
    line("}");
    barrier();
  }

  void node(const ir::Node& n) {
    line("// " + n.where() + ": " + one_line(ir::print(n)));
    switch (n.kind) {
      case ir::NodeKind::MetaPipe:
        metapipe(n.cast<ir::MetaPipe>());
        return;
      case ir::NodeKind::Fill: {
        auto& f = n.cast<ir::Fill>();
        for (size_t a = 0; a < f.out->shape.size(); ++a) {
          std::string org = a < f.out->origin.size() ? affine(f.out->origin[a]) : "0LL";
          line(e(f.out, a) + " = " + ll(f.out->shape[a]) + "; " + o(f.out, a) + " = " + org + ";");
        }
        elementwise(n, {}, f.f);
        return;
      }
      case ir::NodeKind::Map: {
        auto& mm = n.cast<ir::Map>();
        elementwise_meta(n, {mm.in});
        elementwise(n, {mm.in}, mm.f);
        return;
      }
      case ir::NodeKind::Zip: {
        auto& z = n.cast<ir::Zip>();
        elementwise_meta(n, z.ins);
        elementwise(n, z.ins, z.f);
        return;
      }
      case ir::NodeKind::LoadTile:
        load(n.cast<ir::LoadTile>());
        return;
      case ir::NodeKind::StoreTile:
        store(n.cast<ir::StoreTile>());
        return;
      case ir::NodeKind::Reduce:
        reduce(n.cast<ir::Reduce>());
        return;
      case ir::NodeKind::MatMul:
        matmul(n.cast<ir::MatMul>());
        return;
      case ir::NodeKind::Gather:
        gather(n.cast<ir::Gather>());
        return;
      case ir::NodeKind::Scatter:
        scatter(n.cast<ir::Scatter>());
        return;
      case ir::NodeKind::Buffer: {
        auto& b = n.cast<ir::Buffer>();
        line("// a stage boundary: " + ir::value_name(b.out) + " is " + ir::value_name(b.in) + "'s storage");
        copy_meta(b.out, b.in);
        return;
      }
    }
    throw cuda_not_supported(where_of(n));
  }

  // Run-time extent / origin of an elementwise result, as ir/eval.cpp: per axis, the smallest extent
  // among the operands that are not broadcast there, the origin of the first of them.
  void elementwise_meta(const ir::Node& n, const std::vector<ir::Value>& ins) {
    const auto& nom = n.out->shape;
    for (size_t a = 0; a < nom.size(); ++a) {
      std::string ext, org = "0LL";
      for (auto& in : ins)
        if (in->shape[a] == nom[a]) {
          if (ext.empty()) {
            ext = e(in, a);
            org = o(in, a);
          } else if (ext.find(e(in, a)) == std::string::npos) {
            ext = "(" + ext + " < " + e(in, a) + " ? " + ext + " : " + e(in, a) + ")";
          }
        }
      if (ext.empty()) ext = ll(nom[a]);
      line(e(n.out, a) + " = " + ext + "; " + o(n.out, a) + " = " + org + ";");
    }
  }

  void gidx_decl(const ir::Value& x, const std::string& name) {
    size_t r = x->shape.size();
    std::string s = "    const long long " + name + "[" + std::to_string(std::max<size_t>(r, 1)) + "] = {";
    for (size_t a = 0; a < r; ++a) s += std::string(a ? ", " : "") + o(x, a) + " + x" + std::to_string(a);
    if (r == 0) s += "0";
    line(s + "};");
  }

  void elementwise(const ir::Node& n, const std::vector<ir::Value>& ins, const ir::Expr& f) {
    const ir::Value& out = n.out;
    size_t r = out->shape.size();
    open_elements(out);
    std::vector<std::string> args;
    for (size_t i = 0; i < ins.size(); ++i) {
      std::string a = "a" + std::to_string(i) + "_";
      line("    const float " + a + " = " + v(ins[i]->id) + "[" + at(ins[i], xs(r)) + "];");
      args.push_back(a);
    }
    if (uses_index(f)) gidx_decl(out, "g_");
    std::string val = expr(f, args, std::vector<bool>(args.size(), false), "g_", r, n, "    ");
    line("    " + v(out->id) + "[" + at(out, xs(r)) + "] = mp_round(" + val + ", " +
         std::to_string(dt_code(out->dtype)) + ");");
    close_elements();
  }

  // A tile copy between a tensor and a value's storage. Where the tile is one contiguous run of the
  // tensor (every axis after the outermost non-unit one spans the tensor) and the tensor is stored as
  // float, a full or leading-axis-masked tile at a 16-byte aligned offset moves as float4s, four of them
  // issued per thread before any is written (bytes in flight), the last n % 4 elements one by one; any
  // other tile takes the element loop. `scalar` emits the element loop's body (x0, x1, ... defined).
  void tile_copy(const ir::Value& x, const ir::Tensor& t, const std::vector<std::string>& start,
                 const std::vector<std::string>& ext, bool to_tensor, const std::function<void()>& scalar) {
    size_t r = x->shape.size();
    auto tst = strides(t->shape);
    int lead = -1;
    for (size_t a = 0; a < r; ++a)
      if (x->shape[a] > 1) {
        lead = int(a);
        break;
      }
    bool vec = lead >= 0 && (to_tensor ? t->dtype == ir::DType::f32 : std::string(dev_type(t->dtype)) == "float");
    for (size_t a = size_t(lead + 1); vec && a < r; ++a) vec = x->shape[a] == t->shape[a];
    line("{");
    if (vec) {
      std::string g0, cond = "(g0_ & 3) == 0", n = "1LL";
      for (size_t a = 0; a < r; ++a) {
        g0 += std::string(a ? " + " : "") + start[a] + (tst[a] == 1 ? "" : " * " + ll(tst[a]));
        if (int(a) > lead) cond += " && " + ext[a] + " == " + ll(x->shape[a]);
        n += " * " + ext[a];
      }
      std::string vs = v(x->id), ts = T(t);
      line("  // the tile is contiguous in " + t->name + ": 16-byte copies, the tail element by element");
      line("  const long long g0_ = " + g0 + ";");
      line("  if (" + cond + ") {");
      line("    const int n_ = (int)(" + n + "), n4_ = n_ >> 2;");
      line("    const float4* s4_ = (const float4*)(" + (to_tensor ? vs : ts + " + g0_") + ");");
      line("    float4* d4_ = (float4*)(" + (to_tensor ? ts + " + g0_" : vs) + ");");
      line("    for (int q_ = threadIdx.x; q_ < n4_; q_ += 4 * (int)" + nthr_ + ") {");
      line("      float4 r_[4];");
      line("#pragma unroll");
      line("      for (int u_ = 0; u_ < 4; ++u_) { const int j_ = q_ + u_ * (int)" + nthr_ + "; if (j_ < n4_) r_[u_] = s4_[j_]; }");
      line("#pragma unroll");
      line("      for (int u_ = 0; u_ < 4; ++u_) { const int j_ = q_ + u_ * (int)" + nthr_ + "; if (j_ < n4_) d4_[j_] = r_[u_]; }");
      line("    }");
      line("    for (int f_ = 4 * n4_ + threadIdx.x; f_ < n_; f_ += " + nthr_ + ") " +
           (to_tensor ? ts + "[g0_ + f_] = " + vs + "[f_];" : vs + "[f_] = " + ts + "[g0_ + f_];"));
      line("  } else");
    }
    std::string saved = ind_;
    ind_ += "  ";
    open_elements(x, ext);
    scalar();
    close_elements(false);
    ind_ = saved;
    line("}");
    barrier();
  }

  // A LoadTile's bounds checks and run-time extents and origins; `reporter` is the thread that reports a
  // tile out of bounds.
  void load_meta(const ir::LoadTile& l, const std::string& reporter = "threadIdx.x == 0") {
    const auto& t = l.src;
    size_t r = t->shape.size();
    MP_INTERNAL_CHECK(l.offset.size() == r && l.out->shape.size() == r, l.where(), ": offsets / rank differ");
    for (size_t a = 0; a < r; ++a) {
      // The checks in 64 bits, before the origin is narrowed to the metadata type (an origin past the end
      // leaves an extent of 0, so nothing is read through it).
      line("{ const long long s_ = " + affine(l.offset[a]) + ", room_ = " + ll(t->shape[a]) + " - s_;");
      // Out of bounds as ir/eval.cpp defines it: past the end unmasked, or a masked tile with nothing left.
      line("  if (s_ < 0 || room_ < " + (l.masked ? "1LL" : ll(l.out->shape[a])) + ") { if (" + reporter +
           ") mp_fail(mp_err, 2, " + std::to_string(l.id) + ", " + std::to_string(a) + "); }");
      line("  " + o(l.out, a) + " = s_; " + e(l.out, a) + " = s_ < 0 ? 0 : mp_clip(room_, " + ll(l.out->shape[a]) + "); }");
    }
  }
  void load(const ir::LoadTile& l) {
    const auto& t = l.src;
    auto tst = strides(t->shape);
    size_t r = t->shape.size();
    load_meta(l);
    std::vector<std::string> start, ext;
    for (size_t a = 0; a < r; ++a) {
      start.push_back(o(l.out, a));
      ext.push_back(e(l.out, a));
    }
    if (ring_nodes_.count(l.id)) {
      line(std::string("// the data: this iteration's ring slot, copied by ") +
           (bulk_ring() ? "bulk copies" : "cp.async") + " (waited for above)");
      if (stage_has_direct_) barrier();  // for a direct copy before it in the stage (none of its own)
      return;
    }
    auto copy = [&] {
      tile_copy(l.out, t, start, ext, false, [&] {
        std::string g;
        for (size_t a = 0; a < r; ++a)
          g += std::string(a ? " + " : "") + "(" + o(l.out, a) + " + x" + std::to_string(a) + ")" +
               (tst[a] == 1 ? "" : " * " + ll(tst[a]));
        if (g.empty()) g = "0";
        line("    " + v(l.out->id) + "[" + at(l.out, xs(r)) + "] = mp_ld(" + T(t) + ", " + g + ");");
      });
    };
    if (auto it = prefetch_.find(l.id); it != prefetch_.end())
      load_prefetched(l, *it->second, copy);
    else
      copy();
  }

  // A StoreTile's bounds checks (inside a block the caller opened): its start s<a>_ and clipped extent
  // c<a>_ per axis, returned as names.
  void store_meta(const ir::StoreTile& s, std::vector<std::string>& start, std::vector<std::string>& ext,
                  const std::string& reporter = "threadIdx.x == 0") {
    const auto& t = s.dst;
    for (size_t a = 0; a < t->shape.size(); ++a) {
      std::string st = "s" + std::to_string(a) + "_", ex = "c" + std::to_string(a) + "_";
      line("  const long long " + st + " = " + affine(s.offset[a]) + ";");
      line("  const long long " + ex + "w = " + e(s.in, a) + ", " + ex + "r = " + ll(t->shape[a]) + " - " + st + ";");
      line("  if (" + st + " < 0 || (" + ex + "r < " + ex + "w && " + (s.masked ? ex + "r <= 0" : std::string("true")) +
           ")) { if (" + reporter + ") mp_fail(mp_err, 2, " + std::to_string(s.id) + ", " + std::to_string(a) + "); }");
      line("  const long long " + ex + " = " + st + " < 0 ? 0 : mp_clip(" + ex + "r, " + ex + "w);");
      start.push_back(st);
      ext.push_back(ex);
    }
  }
  void store(const ir::StoreTile& s) {
    const auto& t = s.dst;
    auto tst = strides(t->shape);
    size_t r = t->shape.size();
    MP_INTERNAL_CHECK(s.offset.size() == r && s.in->shape.size() == r, s.where(), ": offsets / rank differ");
    line("{");
    std::vector<std::string> start, ext;
    store_meta(s, start, ext);
    std::string saved = ind_;
    ind_ += "  ";
    bool keep = skip_barrier_;
    skip_barrier_ = true;  // the barrier after the closing brace below
    auto global_offset = [&] {
      std::string g;
      for (size_t a = 0; a < r; ++a)
        g += std::string(a ? " + " : "") + "(" + start[a] + " + x" + std::to_string(a) + ")" +
             (tst[a] == 1 ? "" : " * " + ll(tst[a]));
      return g.empty() ? std::string("0") : g;
    };
    const ir::Node* src = fused_src_ && fused_src_->out->id == s.in->id ? fused_src_ : nullptr;
    fused_src_ = nullptr;
    if (src && vector_store(s, *src)) {
      store_vector(s, *src, start, ext);
    } else if (src) {
      // The fused Map / Zip's elements go from its operands to the tensor (4-byte stores, consecutive
      // threads on consecutive elements), rounded to its dtype as its stored value would be.
      line("// " + src->where() + "'s elements, computed here and stored to " + t->name);
      open_elements(s.in, ext);
      auto ins = elementwise_ins(*src);
      std::vector<std::string> args;
      for (size_t i = 0; i < ins.size(); ++i) {
        std::string a = "a" + std::to_string(i) + "_";
        line("    const float " + a + " = " + v(ins[i]->id) + "[" + at(ins[i], xs(r)) + "];");
        args.push_back(a);
      }
      if (uses_index(elementwise_f(*src))) gidx_decl(s.in, "g_");
      std::string val =
          expr(elementwise_f(*src), args, std::vector<bool>(args.size(), false), "g_", r, *src, "    ");
      line("    mp_st(" + T(t) + ", " + global_offset() + ", mp_round(" + val + ", " +
           std::to_string(dt_code(s.in->dtype)) + "), " + std::to_string(dt_code(t->dtype)) + ");");
      close_elements(false);
    } else {
      tile_copy(s.in, t, start, ext, true, [&] {
        line("    mp_st(" + T(t) + ", " + global_offset() + ", " + v(s.in->id) + "[" + at(s.in, xs(r)) +
             "], " + std::to_string(dt_code(t->dtype)) + ");");
      });
    }
    skip_barrier_ = keep;
    ind_ = saved;
    line("}");
    barrier();
  }

  // A fused Map / Zip stored four elements per thread (LowerOptions::vector_stores): into an f32 tensor,
  // the stored tile's last axis a multiple of 4 long and contiguous in the tensor, an element function
  // small enough that four of it at once stay in registers (blackscholes' price keeps one element per
  // thread) and without Index / Random (their global index per element).
  bool vector_store(const ir::StoreTile& s, const ir::Node& src) const {
    if (!opt_.vector_stores || s.dst->dtype != ir::DType::f32) return false;
    const auto& sh = s.in->shape;
    if (sh.empty() || sh.back() < 4 || sh.back() % 4 != 0) return false;
    std::set<const ir::ExprNode*> seen;
    return expr_nodes(elementwise_f(src).node(), seen) <= 16 && !uses_index(elementwise_f(src));
  }
  // Thread q_ of the loop takes the four elements 4 q_ .. 4 q_ + 3 of the stored tile's last axis (the
  // other axes as the element loop decomposes them): it computes the four (operands read from their
  // storage as in the element loop; those past the run-time extents are computed and dropped), then
  // stores them as one float4 where all four are within the clipped extents and the tensor offset is a
  // multiple of four elements, else one by one within the extents. A warp's 16-byte stores cover 512
  // consecutive bytes of a row.
  void store_vector(const ir::StoreTile& s, const ir::Node& src, const std::vector<std::string>& start,
                    const std::vector<std::string>& ext) {
    const auto& t = s.dst;
    const auto& x = s.in;
    const size_t r = x->shape.size();
    auto tst = strides(t->shape);
    const int64_t L = x->shape[r - 1], chunks = ir::num_elements(x->shape) / 4;
    MP_USER_CHECK(chunks < (int64_t(1) << 31), "cuda lowering: a tile of ", 4 * chunks,
                  " elements is too large for one block; use a smaller tile");
    int outer = -1;
    for (size_t a = 0; a < r; ++a)
      if (x->shape[a] > 1) {
        outer = int(a);
        break;
      }
    const std::string last = "x" + std::to_string(r - 1);
    line("// " + src.where() + "'s elements, computed here four at a time and stored to " + t->name +
         " as 16-byte stores");
    line("{");
    line("  for (int f_ = threadIdx.x; f_ < " + std::to_string(chunks) + "; f_ += " + nthr_ + ") {");
    line("    int r_ = f_;");
    std::string skip;
    for (int a = int(r) - 1; a >= 0; --a) {
      std::string xa = "x" + std::to_string(a);
      const int64_t n = a == int(r) - 1 ? L / 4 : x->shape[size_t(a)];
      std::string val = a == outer ? "r_" : "r_ % " + std::to_string(n);
      if (a == int(r) - 1) val = "4 * (" + val + ")";
      if (x->shape[size_t(a)] == 1)
        line("    const int " + xa + "b_ = 0;");
      else
        line("    const int " + xa + "b_ = " + val + ";" + (a == outer ? "" : " r_ /= " + std::to_string(n) + ";"));
      skip += std::string(skip.empty() ? "" : " || ") + xa + "b_ >= " + ext[size_t(a)];
    }
    line("    (void)r_;");
    line("    if (" + skip + ") continue;");
    for (size_t a = 0; a + 1 < r; ++a) line("    const int x" + std::to_string(a) + " = x" + std::to_string(a) + "b_;");
    line("    float w_[4];");
    line("#pragma unroll");
    line("    for (int u_ = 0; u_ < 4; ++u_) {");
    line("      const int " + last + " = " + last + "b_ + u_;");
    auto ins = elementwise_ins(src);
    std::vector<std::string> args;
    for (size_t i = 0; i < ins.size(); ++i) {
      std::string a = "a" + std::to_string(i) + "_";
      line("      const float " + a + " = " + v(ins[i]->id) + "[" + at(ins[i], xs(r)) + "];");
      args.push_back(a);
    }
    std::string val = expr(elementwise_f(src), args, std::vector<bool>(args.size(), false), "g_", r, src, "      ");
    line("      w_[u_] = mp_round(" + val + ", " + std::to_string(dt_code(x->dtype)) + ");");
    line("    }");
    std::string g;
    for (size_t a = 0; a < r; ++a)
      g += std::string(a ? " + " : "") + "(" + start[a] + " + x" + std::to_string(a) + "b_)" +
           (tst[a] == 1 ? "" : " * " + ll(tst[a]));
    line("    const long long g_ = " + g + ";");
    line("    if (" + last + "b_ + 4 <= " + ext[r - 1] + " && (g_ & 3) == 0) {");
    line("      mp_st4(" + T(t) + " + g_, w_[0], w_[1], w_[2], w_[3]);");
    line("    } else {");
    line("      for (int u_ = 0; u_ < 4 && " + last + "b_ + u_ < " + ext[r - 1] + "; ++u_) " + T(t) + "[g_ + u_] = w_[u_];");
    line("    }");
    line("  }");
    line("}");
  }

  // The associative combiners: G warps per output element (G a power of two, as many as the block has
  // warps to spare, so a reduction to a few values, dotproduct's to one, uses the whole block), lanes
  // strided over the axis, a shuffle tree per warp, then the G warp results combined in order through
  // mp_red. fp64 accumulators, as the reference accumulates. A custom combiner runs in order on one lane
  // (associativity is not assumed of it).
  void reduce(const ir::Reduce& rd) {
    const auto& in = rd.in;
    const auto& out = rd.out;
    size_t r = in->shape.size();
    for (size_t a = 0; a < r; ++a)
      line(e(out, a) + " = " + (int(a) == rd.axis ? std::string("1LL") : e(in, a)) + "; " + o(out, a) + " = " +
           (int(a) == rd.axis ? std::string("0LL") : o(in, a)) + ";");
    bool custom = rd.combiner == ir::Combiner::Custom;
    auto comb = [&](const std::string& acc, const std::string& x, const std::string& pad) -> std::string {
      switch (rd.combiner) {
        case ir::Combiner::Add:
          return acc + " + " + x;
        case ir::Combiner::Mul:
          return acc + " * " + x;
        case ir::Combiner::Max:
          return "mp_max(" + acc + ", " + x + ")";
        case ir::Combiner::Min:
          return "mp_min(" + acc + ", " + x + ")";
        case ir::Combiner::Custom:
          MP_INTERNAL_CHECK(rd.custom.has_value(), rd.where(), ": custom combiner without a function");
          return expr(*rd.custom, {acc, x}, {true, true}, "g_", r, rd, pad, true);
      }
      return acc;
    };
    const int warps = opt_.threads / 32;
    const int64_t nout = ir::num_elements(out->shape);
    int G = 1;
    if (!custom)
      while (int64_t(G) * 2 * nout <= warps) G *= 2;
    // Output element w_ -> y0, y1, ... (the reduced axis is 0) and whether it lies within the extents.
    auto decompose = [&](const std::string& pad) {
      line(pad + "int r_ = w_;");
      std::string valid;
      for (int a = int(r) - 1; a >= 0; --a) {
        if (a == rd.axis) continue;
        std::string ya = "y" + std::to_string(a), sz = std::to_string(out->shape[size_t(a)]);
        line(pad + "const int " + ya + " = r_ % " + sz + "; r_ /= " + sz + ";");
        valid += std::string(valid.empty() ? "" : " && ") + ya + " < " + e(out, size_t(a));
      }
      line(pad + "(void)r_;");
      return valid.empty() ? std::string("true") : valid;
    };
    std::vector<std::string> ys;
    for (size_t a = 0; a < r; ++a) ys.push_back(int(a) == rd.axis ? "k_" : "y" + std::to_string(a));
    std::vector<std::string> ys_out = ys;
    ys_out[size_t(rd.axis)] = "0";
    // The loop's element k_ as the double x_ (the fused Map / Zip computed here, else the stored value).
    const ir::Node* src = fused_src_ && fused_src_->out->id == in->id ? fused_src_ : nullptr;
    fused_src_ = nullptr;
    auto element = [&] {
      bool src_index = src && uses_index(elementwise_f(*src));
      if (rd.pre || custom || src_index) {
        std::string s = "      const long long g_[" + std::to_string(std::max<size_t>(r, 1)) + "] = {";
        for (size_t a = 0; a < r; ++a) s += std::string(a ? ", " : "") + o(in, a) + " + " + ys[a];
        if (r == 0) s += "0";
        line(s + "};");
        line("      (void)g_;");
      }
      if (src) {  // the fused Map / Zip's element at (ys), rounded to its dtype as its stored value would be
        auto ins = elementwise_ins(*src);
        std::vector<std::string> args;
        for (size_t i = 0; i < ins.size(); ++i) {
          std::string a = "a" + std::to_string(i) + "_";
          line("      const float " + a + " = " + v(ins[i]->id) + "[" + at(ins[i], ys) + "];");
          args.push_back(a);
        }
        std::string val =
            expr(elementwise_f(*src), args, std::vector<bool>(args.size(), false), "g_", r, *src, "      ");
        line("      const float xin_ = mp_round(" + val + ", " + std::to_string(dt_code(src->out->dtype)) +
             ");");
      } else {
        line("      const float xin_ = " + v(in->id) + "[" + at(in, ys) + "];");
      }
      if (rd.pre)
        line("      const double x_ = " + expr(*rd.pre, {"xin_"}, {false}, "g_", r, rd, "      ", true) +
             ";");
      else
        line("      const double x_ = xin_;");
    };
    if (auto it = reg_acc_.find(rd.id); it != reg_acc_.end()) {
      // A running sum's Reduce to one value, kept in this thread's register across the iterations
      // (mp_facc*), reduced over the block once after the loop: no warp shuffle, mp_red or barrier per
      // iteration. The extents above still follow eval.cpp's; its one reader, the carried update, is
      // not emitted.
      std::string valid;
      for (size_t a = 0; a < r; ++a)
        if (int(a) != rd.axis) valid += " && 0 < " + e(out, a);
      line("{");
      for (size_t a = 0; a < r; ++a)
        if (int(a) != rd.axis)
          line("  const int y" + std::to_string(a) + " = 0; (void)y" + std::to_string(a) + ";");
      line("  if (true" + valid + ")");
      line("    for (long long k_ = threadIdx.x; k_ < " + e(in, size_t(rd.axis)) + "; k_ += " + nthr_ + ") {");
      element();
      line("      " + it->second + " += x_;");
      line("    }");
      line("}");
      if (reg_tail_)
        line(consumer_sync_ ? "// (it read ring slots only, kept until every computing warp arrives on their empty mbarrier)"
                            : "// (the ring's next barrier keeps what this read from being rewritten)");
      else
        line(sync_stmt() + "  // the values read here may be rewritten by the nodes after it");
      return;
    }
    line("{");
    line("  const int lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;");
    line("  for (int w_ = warp_ / " + std::to_string(G) + "; w_ < " + std::to_string(nout) + "; w_ += " +
         std::to_string(warps / G) + ") {");
    std::string valid = decompose("    ");
    line("    const bool valid_ = " + valid + ";");
    line("    double acc_ = " + num(rd.identity) + ";");
    std::string first = custom ? "0" : (G > 1 ? "(warp_ % " + std::to_string(G) + ") * 32 + lane_" : "lane_");
    std::string step = custom ? "1" : std::to_string(32 * G);
    line(std::string("    if (valid_") + (custom ? " && lane_ == 0" : "") + ")");
    line("    for (long long k_ = " + first + "; k_ < " + e(in, size_t(rd.axis)) + "; k_ += " + step + ") {");
    element();
    line("      acc_ = " + comb("acc_", "x_", "      ") + ";");
    line("    }");
    if (!custom) {
      line("    for (int d_ = 16; d_ > 0; d_ >>= 1) {");
      line("      const double y_ = __shfl_down_sync(0xffffffffu, acc_, d_);");
      line("      acc_ = " + comb("acc_", "y_", "      ") + ";");
      line("    }");
    }
    if (G == 1) {
      line("    if (lane_ == 0 && valid_) " + v(out->id) + "[" + at(out, ys_out) + "] = (float)acc_;");
      line("  }");
    } else {
      line("    if (lane_ == 0) mp_red[warp_] = acc_;");
      line("  }");
      line("  " + sync_stmt());
      line("  for (int w_ = threadIdx.x; w_ < " + std::to_string(nout) + "; w_ += " + nthr_ + ") {");
      std::string valid2 = decompose("    ");
      line("    if (!(" + valid2 + ")) continue;");
      line("    double acc_ = mp_red[w_ * " + std::to_string(G) + "];");
      line("    for (int p_ = 1; p_ < " + std::to_string(G) + "; ++p_) acc_ = " +
           comb("acc_", "mp_red[w_ * " + std::to_string(G) + " + p_]", "    ") + ";");
      line("    " + v(out->id) + "[" + at(out, ys_out) + "] = (float)acc_;");
      line("  }");
    }
    line("}");
    line(sync_stmt());
  }

  // A block-cooperative loop: one thread per output element, fp64 accumulation like the reference.
  void matmul(const ir::MatMul& mm) {
    const auto &a = mm.a, &b = mm.b, &out = mm.out;
    size_t am = mm.transpose_a ? 1 : 0, ak = 1 - am, bn = mm.transpose_b ? 0 : 1, bk = 1 - bn;
    const std::string ka = e(a, ak), kb = e(b, bk);
    if (ka != kb)
      line("if (" + ka + " != " + kb + " && threadIdx.x == 0) mp_fail(mp_err, 3, " + std::to_string(mm.id) + ", 0);");
    line(e(out, 0) + " = " + e(a, am) + "; " + o(out, 0) + " = " + o(a, am) + ";");
    line(e(out, 1) + " = " + e(b, bn) + "; " + o(out, 1) + " = " + o(b, bn) + ";");
    auto sa = strides(a->shape), sb = strides(b->shape);
    open_elements(out);
    line("    double acc_ = 0.0;");
    line("    const long long K_ = " + (ka == kb ? ka : ka + " < " + kb + " ? " + ka + " : " + kb) + ";");
    line("    for (long long k_ = 0; k_ < K_; ++k_)");
    line("      acc_ += (double)" + v(a->id) + "[x0 * " + ll(sa[am]) + " + k_ * " + ll(sa[ak]) + "] * (double)" +
         v(b->id) + "[k_ * " + ll(sb[bk]) + " + x1 * " + ll(sb[bn]) + "];");
    line("    " + v(out->id) + "[" + at(out, xs(2)) + "] = (float)acc_;");
    close_elements();
  }

  void index_check(const ir::Node& n, const ir::Tensor& table) {
    line("    const long long row_ = (long long)fi_;");
    line("    if ((float)row_ != fi_ || row_ < 0 || row_ >= " + ll(table->shape[0]) + ") { mp_fail(mp_err, 1, " +
         std::to_string(n.id) + ", r); continue; }");
  }

  void gather(const ir::Gather& g) {
    const auto& t = g.table;
    int64_t C = t->shape[1];
    line(e(g.out, 0) + " = " + e(g.index, 0) + "; " + o(g.out, 0) + " = " + o(g.index, 0) + ";");
    line(e(g.out, 1) + " = " + ll(C) + "; " + o(g.out, 1) + " = 0LL;");
    int64_t is = strides(g.index->shape)[0];
    open_elements(g.out);
    line("    const long long r = x0;");
    line("    const float fi_ = " + v(g.index->id) + "[r * " + ll(is) + "];");
    index_check(g, t);
    line("    " + v(g.out->id) + "[" + at(g.out, xs(2)) + "] = mp_ld(" + T(t) + ", row_ * " + ll(C) + " + x1);");
    close_elements();
  }

  // One thread per column, rows in order: a later row with the same index wins, as in the reference.
  void scatter(const ir::Scatter& s) {
    const auto& t = s.table;
    int64_t C = t->shape[1];
    int64_t is = strides(s.index->shape)[0];
    line("if ((" + e(s.rows, 0) + " != " + e(s.index, 0) + " || " + e(s.rows, 1) + " != " + ll(C) +
         ") && threadIdx.x == 0) mp_fail(mp_err, 3, " + std::to_string(s.id) + ", 0);");
    line("for (long long x1 = threadIdx.x; x1 < " + ll(C) + "; x1 += " + nthr_ + ")");
    line("  for (long long r = 0; r < " + e(s.index, 0) + " && r < " + e(s.rows, 0) + "; ++r) {");
    line("    const long long x0 = r;");
    line("    const float fi_ = " + v(s.index->id) + "[r * " + ll(is) + "];");
    index_check(s, t);
    line("    mp_st(" + T(t) + ", row_ * " + ll(C) + " + x1, " + v(s.rows->id) + "[" + at(s.rows, xs(2)) + "], " +
         std::to_string(dt_code(t->dtype)) + ");");
    line("  }");
    line(sync_stmt());
  }
};

}  // namespace

Lowered lower(const ir::Program& p, const LowerOptions& opt) { return Gen(p, opt).run(); }

namespace {
// A whole decimal number in [lo, hi], else -1.
int64_t whole_number(const std::string& s, int64_t lo, int64_t hi) {
  if (s.empty() || s.size() > 7 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  int64_t v = std::stoll(s);
  return v >= lo && v <= hi ? v : -1;
}
}  // namespace

void set_ring_option(LowerOptions& o, const std::string& value) {
  if (value == "off") {
    o.ring = LowerOptions::Ring::Off;
  } else if (value == "auto") {
    o.ring = LowerOptions::Ring::Auto;
  } else {
    int64_t kib = whole_number(value, 1, 4096);
    MP_USER_CHECK(
        kib > 0, "MP_CUDA_LOWER_RING='", value,
        "' is not one of off, auto or a number of KiB per SM in [1, 4096] (e.g. MP_CUDA_LOWER_RING=128)");
    o.ring = LowerOptions::Ring::PerSm;
    o.ring_kib_per_sm = kib;
  }
}

void set_copy_option(LowerOptions& o, const std::string& value) {
  MP_USER_CHECK(value == "cp" || value == "bulk", "MP_CUDA_LOWER_COPY='", value,
                "' is not cp or bulk (how the tile ring copies: cp.async, or bulk copies on mbarriers)");
  o.copy = value == "bulk" ? LowerOptions::Copy::Bulk : LowerOptions::Copy::Cp;
}

void set_matmul_option(LowerOptions& o, const std::string& value) {
  MP_USER_CHECK(value == "wgmma" || value == "generic", "MP_CUDA_LOWER_MATMUL='", value,
                "' is not wgmma or generic (how a tiled bf16 matmul lowers: the tile layer's pipeline, or "
                "element loops)");
  o.matmul = value == "wgmma" ? LowerOptions::Matmul::Wgmma : LowerOptions::Matmul::Generic;
}

LowerOptions options_from_env(LowerOptions base) {
  if (const char* r = std::getenv("MP_CUDA_LOWER_RING"); r && *r) set_ring_option(base, r);
  if (const char* t = std::getenv("MP_CUDA_LOWER_THREADS"); t && *t) {
    int64_t n = whole_number(t, 64, 1024);
    MP_USER_CHECK(
        n > 0 && n % 32 == 0, "MP_CUDA_LOWER_THREADS='", t,
        "' is not a multiple of 32 in [64, 1024] (threads per block, e.g. MP_CUDA_LOWER_THREADS=256)");
    base.threads = int(n);
  }
  // A switch of two values: unset (or empty) leaves `flag`, `yes` sets it, `no` clears it, anything else
  // is a user error naming the variable, the two values and, where given, what the switch chooses.
  auto two_way = [](const char* name, const char* yes, const char* no, const char* why, bool& flag) {
    const char* e = std::getenv(name);
    if (!e || !*e) return;
    const std::string v = e;
    MP_USER_CHECK(v == yes || v == no, name, "='", v, "' is not ", yes, " or ", no, *why ? " (" : "", why,
                  *why ? ")" : "");
    flag = v == yes;
  };
  two_way("MP_CUDA_LOWER_FUSE", "on", "off", "", base.fuse_elementwise);
  two_way("MP_CUDA_LOWER_BARRIERS", "1", "2", "barriers per iteration of a ring of 3 or more slots",
          base.one_barrier_ring);
  if (const char* c = std::getenv("MP_CUDA_LOWER_COPY"); c && *c) set_copy_option(base, c);
  if (const char* m = std::getenv("MP_CUDA_LOWER_MATMUL"); m && *m) set_matmul_option(base, m);
  two_way("MP_CUDA_LOWER_STORE", "vec", "scalar",
          "a fused StoreTile's stores: 16 bytes of four elements, or 4 bytes", base.vector_stores);
  two_way("MP_CUDA_LOWER_PREFETCH", "on", "off",
          "an inner loop's small tiles of the next iteration loaded into registers", base.prefetch);
  two_way("MP_CUDA_LOWER_ROWS", "warp", "tile",
          "a row-wise loop body: rows in each warp's registers, or the tile path through shared memory",
          base.warp_rows);
  two_way("MP_CUDA_LOWER_PRODUCER", "warp", "thread",
          "who fills a tile ring of bulk copies: a producer warp of its own, or thread 0 between block barriers",
          base.producer_warp);
  two_way("MP_CUDA_LOWER_MATH", "fast", "exact",
          "f32 division, reciprocal and square roots: the hardware approximations (1-2 ulp) or IEEE rounded",
          base.fast_math);
  return base;
}

}  // namespace mp::cuda
