// The sizes at which the CUDA lowering's host and GPU tests run each registered program: small enough
// for the host emulation of the generated code (tests/backends/cuda_lower_host.h), non-dividing tiles
// included so the masked paths run. A program not named here runs at its defaults.
#pragma once
#include <functional>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "front/front.h"
#include "passes/pipeline.h"

namespace mp::cuda_test {

// Every registered program (a test checks this list against the registry).
inline const std::vector<std::string>& program_names() {
  static const std::vector<std::string> n = {"blackscholes", "dotproduct",    "flash_attention", "gda",
                                             "gemm",         "kmeans",        "llama_decoder",   "matmul",
                                             "outerproduct", "softmax",       "tpchq6"};
  return n;
}

inline const std::map<std::string, std::vector<std::string>>& small_sets() {
  static const std::map<std::string, std::vector<std::string>> s = {
      {"softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}},
      {"matmul", {"M=72", "N=40", "K=24", "MM=32", "NN=16", "mask=1"}},
      {"gda", {"R=40", "C=8", "TR=16", "mask=1"}},
      {"flash_attention", {"S=36", "D=8", "BR=16", "BC=16", "mask=1"}},
      {"llama_decoder", {"layers=1", "d_model=16", "heads=2", "kv_heads=1", "head_dim=8", "ffn=24", "vocab=20",
                         "context=8", "tokens=2", "past=3"}},
      {"blackscholes", {"N=1000", "TS=128", "mask=1"}},
      {"dotproduct", {"N=1000", "TS=128", "mask=1"}},
      {"gemm", {"M=32", "N=48", "K=64", "MM=16", "NN=16", "KK=16"}},
      {"kmeans", {"iters=1", "N=128", "PT=64"}},
      {"outerproduct", {"M=40", "N=72", "TM=16", "TN=32", "mask=1"}},
      {"tpchq6", {"N=1000", "TS=128", "mask=1"}},
  };
  return s;
}

// More sizes of a program, run by the host test under their own name: the 16-byte tile copies with a
// tail that is not a multiple of four (N=1001), tile offsets that are not 16-byte aligned (TS=126,
// row_tile=5 with C=23: the element path), and the carried sums folded over the blocks with them.
// `ring`, `threads`, `fuse`, `barriers` and `copy`, where set, are the lowering's speed options for that
// unit (MP_CUDA_LOWER_RING's values, threads per block, MP_CUDA_LOWER_FUSE, MP_CUDA_LOWER_BARRIERS,
// MP_CUDA_LOWER_COPY's values).
struct Variant {
  std::string name, program;
  std::vector<std::string> sets;
  std::string ring = "";
  int threads = 0;
  bool fuse = true;
  int barriers = 0;  // 2: two barriers per iteration of a deep ring (LowerOptions::one_barrier_ring off)
  std::string copy = "";  // "bulk" / "cp": how the ring is filled ("": the default, bulk copies)
  std::string rows = "";   // "tile": MP_CUDA_LOWER_ROWS=tile ("": the default, rows in registers)
  std::string store = "";  // "scalar": MP_CUDA_LOWER_STORE=scalar ("": the default, 16-byte stores)
  std::string prefetch = "";  // "off": MP_CUDA_LOWER_PREFETCH=off ("": the default, inner tiles prefetched)
  std::string producer = "";  // "thread" / "warp": MP_CUDA_LOWER_PRODUCER ("": the default, thread 0)
};
inline void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }  // gtest's name of a parameter
inline const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"dotproduct_tail", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "", 0, true},
      {"dotproduct_unaligned", "dotproduct", {"N=1000", "TS=126", "mask=1"}, "", 0, true},
      {"tpchq6_unaligned", "tpchq6", {"N=1001", "TS=126", "mask=1"}, "", 0, true},
      {"softmax_unaligned", "softmax", {"R=40", "C=23", "row_tile=5", "mask=1"}, "", 0, true},
      // The lowering's speed options: the ring switched off, a ring as deep as the shared memory allows
      // (4096 KiB per SM asked for) filled by cp.async (MP_CUDA_LOWER_COPY=cp; bulk copies are the
      // default), and other block sizes, over masked tails.
      {"dotproduct_ring_off", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "off", 0, true},
      {"dotproduct_ring_deep", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "4096", 0, true, 0, "cp"},
      {"tpchq6_ring_deep", "tpchq6", {"N=1001", "TS=64", "mask=1"}, "4096", 0, true, 0, "cp"},
      {"blackscholes_ring_deep", "blackscholes", {"N=1001", "TS=64", "mask=1"}, "4096", 96, true, 0, "cp"},
      // The deep rings with two barriers per iteration (MP_CUDA_LOWER_BARRIERS=2; one is the default).
      {"dotproduct_ring_deep_2barriers", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "4096", 0, true, 2, "cp"},
      {"blackscholes_ring_deep_2barriers", "blackscholes", {"N=1001", "TS=64", "mask=1"}, "4096", 96, true, 2, "cp"},
      // The ring filled by bulk copies on mbarriers (MP_CUDA_LOWER_COPY=bulk): small tiles, so a block
      // runs many iterations and every slot's mbarrier goes through many phases (both parities), the
      // last tiles cut at lengths that are not multiples of four (9 of 16 or 32 elements, softmax's 22
      // of one row; outerproduct's 2 of 4: no bulk copy at all, an arrival that expects no bytes), with
      // one and two barriers per iteration.
      // (thread 0 issuing, MP_CUDA_LOWER_PRODUCER=thread)
      {"dotproduct_bulk", "dotproduct", {"N=1001", "TS=16", "mask=1"}, "4096", 0, true, 0, "bulk", "", "", "", "thread"},
      {"dotproduct_bulk_2barriers", "dotproduct", {"N=1001", "TS=16", "mask=1"}, "4096", 0, true, 2, "bulk", "", "", "",
       "thread"},
      {"dotproduct_bulk_auto", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "", 0, true, 0, "bulk", "", "", "", "thread"},
      {"tpchq6_bulk", "tpchq6", {"N=1001", "TS=32", "mask=1"}, "4096", 0, true, 0, "bulk", "", "", "", "thread"},
      {"blackscholes_bulk", "blackscholes", {"N=1001", "TS=32", "mask=1"}, "4096", 96, true, 0, "bulk", "", "", "",
       "thread"},
      {"blackscholes_bulk_2barriers", "blackscholes", {"N=1001", "TS=32", "mask=1"}, "4096", 96, true, 2, "bulk", "", "",
       "", "thread"},
      {"softmax_bulk", "softmax", {"R=41", "C=22", "row_tile=2", "mask=1"}, "4096", 0, true, 0, "bulk", "tile", "", "",
       "thread"},
      {"outerproduct_bulk", "outerproduct", {"M=42", "N=72", "TM=4", "TN=32", "mask=1"}, "4096", 0, true, 0, "bulk", "",
       "", "", "thread"},
      // The same rings filled by a producer warp (MP_CUDA_LOWER_PRODUCER=warp): one more warp
      // per block issues every iteration's copies and masked tails, the computing warps arrive on each
      // slot's "empty" mbarrier; deep rings of small tiles (each slot's two mbarriers through many phases
      // of both parities, the producer waiting for "empty" from the (N + 1)-th iteration on), the auto
      // depth, three computing warps (blackscholes), the fold over blocks with register sums (dotproduct,
      // tpchq6) and without (fuse off), softmax's tile path, outerproduct's A tile, flash_attention's Q
      // tile and the f32 matmul's A strip.
      {"dotproduct_producer", "dotproduct", {"N=1001", "TS=16", "mask=1"}, "4096", 0, true, 0, "bulk", "", "", "", "warp"},
      {"dotproduct_producer_auto", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "", 0, true, 0, "bulk", "", "", "",
       "warp"},
      {"dotproduct_producer_fuse_off", "dotproduct", {"N=1001", "TS=16", "mask=1"}, "4096", 0, false, 0, "bulk", "", "",
       "", "warp"},
      {"tpchq6_producer", "tpchq6", {"N=1001", "TS=32", "mask=1"}, "4096", 0, true, 0, "bulk", "", "", "", "warp"},
      {"blackscholes_producer", "blackscholes", {"N=1001", "TS=32", "mask=1"}, "4096", 96, true, 0, "bulk", "", "", "",
       "warp"},
      {"blackscholes_producer_scalar", "blackscholes", {"N=1001", "TS=32", "mask=1"}, "4096", 0, true, 0, "bulk", "", "scalar",
       "", "warp"},
      {"softmax_producer", "softmax", {"R=41", "C=22", "row_tile=2", "mask=1"}, "4096", 0, true, 0, "bulk", "tile", "", "",
       "warp"},
      {"outerproduct_producer", "outerproduct", {"M=42", "N=72", "TM=4", "TN=32", "mask=1"}, "4096", 0, true, 0, "bulk",
       "", "", "", "warp"},
      {"flash_attention_producer", "flash_attention", {"S=36", "D=8", "BR=4", "BC=16", "mask=1"}, "4096", 0, true, 0,
       "bulk", "", "", "", "warp"},
      {"matmul_producer", "matmul", {"M=42", "N=40", "K=24", "MM=4", "NN=16", "mask=1"}, "4096", 0, true, 0, "bulk", "",
       "", "", "warp"},
      {"softmax_ring_off", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}, "off", 32, true, 0, "", "tile"},
      {"softmax_threads_128", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}, "", 128, true, 0, "", "tile"},
      // Element-wise fusion and the register sums switched off (MP_CUDA_LOWER_FUSE=off).
      {"dotproduct_fuse_off", "dotproduct", {"N=1001", "TS=128", "mask=1"}, "", 0, false},
      {"tpchq6_fuse_off", "tpchq6", {"N=1001", "TS=64", "mask=1"}, "", 0, false},
      {"flash_attention_fuse_off",
       "flash_attention",
       {"S=36", "D=8", "BR=16", "BC=16", "mask=1"},
       "",
       0,
       false},
      {"blackscholes_fuse_off", "blackscholes", {"N=1001", "TS=128", "mask=1"}, "", 0, false},
      {"softmax_fuse_off", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}, "", 0, false, 0, "", "tile"},
      {"outerproduct_fuse_off", "outerproduct", {"M=40", "N=72", "TM=16", "TN=32", "mask=1"}, "", 0, false},
      // Rows in registers (MP_CUDA_LOWER_ROWS=warp, the default) at row lengths that are not multiples
      // of a warp's span (a lane's last chunk cut: 200 = 128 + 72 columns in 16-byte chunks, 130 one
      // element a chunk: not a multiple of 4), tiles of fewer rows than a block has warps and more, bf16
      // (4-byte loads of its 16 bits), and the tile path beside them (MP_CUDA_LOWER_ROWS=tile, 16-byte
      // stores of the fused quotient).
      {"softmax_rows_vec", "softmax", {"R=37", "C=200", "row_tile=3", "mask=1"}, "", 0, true},
      {"softmax_rows_odd", "softmax", {"R=40", "C=130", "row_tile=16", "mask=1"}, "", 96, true},
      {"softmax_rows_bf16", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1", "dtype=bf16"}, "", 0, true},
      {"softmax_rows_tile", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}, "", 0, true, 0, "", "tile"},
      // The fused StoreTile's 16-byte stores: a tensor whose rows are not 16-byte aligned (N=70: the
      // element fallback on most rows), and 4-byte stores (MP_CUDA_LOWER_STORE=scalar).
      {"outerproduct_vec_odd_rows", "outerproduct", {"M=40", "N=70", "TM=16", "TN=32", "mask=1"}, "", 0, true},
      {"outerproduct_store_scalar", "outerproduct", {"M=40", "N=72", "TM=16", "TN=32", "mask=1"}, "", 0, true, 0, "",
       "", "scalar"},
      // The inner loop's B tile prefetched into registers (the default) at offsets that are not 16-byte
      // aligned (TN=30: the element loads) and a masked last tile of 10, on 32 threads (a tile of 30 is
      // 8 threads' share), and not prefetched (MP_CUDA_LOWER_PREFETCH=off).
      {"outerproduct_prefetch_odd", "outerproduct", {"M=40", "N=70", "TM=16", "TN=30", "mask=1"}, "", 32, true},
      {"outerproduct_prefetch_off", "outerproduct", {"M=40", "N=72", "TM=16", "TN=32", "mask=1"}, "", 0, true, 0, "",
       "", "", "off"},
      {"softmax_store_scalar", "softmax", {"R=40", "C=24", "row_tile=16", "mask=1"}, "", 0, true, 0, "", "tile",
       "scalar"},
  };
  return v;
}

// Programs built here rather than registered, for lowering paths no registered program takes: a loop
// whose carried values are a running max and a running min (folded over the blocks like dotproduct's
// sum), over masked tiles (1000 is not a multiple of 128).
struct Extra {
  std::string name;
  std::function<ir::Program()> build;
};
inline ir::Program build_fold_max_min() {
  using namespace mp::front;
  const int64_t N = 1000, TS = 128;
  ProgramBuilder b("fold_max_min");
  auto A = b.input("A", {N, 1});
  auto hi = b.output("hi", {1, 1});
  auto lo = b.output("lo", {1, 1});
  auto h0 = FILL({1, 1}, -1e30);
  auto l0 = FILL({1, 1}, 1e30);
  auto acc = METAPIPE_FOLD(cdiv(N, TS), {h0, l0}, [&](Idx, const std::vector<Value>& s) -> std::vector<Value> {
    auto a = LOAD_TILE(A, {TS, 1}, masked = true);
    auto top = ZIP(s[0], MAX(a, 0), [](Expr x, Expr y) { return max(x, y); });
    auto bottom = ZIP(s[1], REDUCE(a, 0, Combiner::Min), [](Expr x, Expr y) { return min(x, y); });
    return {top, bottom};
  });
  STORE_TILE(hi, acc[0]);
  STORE_TILE(lo, acc[1]);
  return b.finish();
}
inline const std::vector<Extra>& extra_programs() {
  static const std::vector<Extra> e = {{"fold_max_min", build_fold_max_min}};
  return e;
}
inline ir::Program compiled_extra(const std::string& name) {
  passes::CompileOptions o;
  o.tile.masking = true;
  for (auto& x : extra_programs())
    if (x.name == name) return passes::compile(x.build(), o);
  throw internal_error("no extra program " + name);
}

}  // namespace mp::cuda_test
