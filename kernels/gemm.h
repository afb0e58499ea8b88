// bf16 GEMM on Hopper, written with the tile layer: C = A * B or C = A * B^T with fp32 accumulation and a
// bf16 or fp32 result, on device pointers and a stream. Row-major throughout: A is M x K, B is K x N
// (b_layout::kn) or N x K (b_layout::nk), C is M x N. M, N and K must be multiples of 16.
// This header needs no CUDA headers, so CPU code (the CLI, tests) can include it in any build.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

struct CUstream_st;

namespace mp::kernels {

enum class b_layout { kn, nk };  // B stored K x N (C = A*B) or N x K (C = A*B^T)
enum class out_type { bf16, f32 };

// Whether the last, partial wave of tiles is shared out by K ranges (GemmSchedule::stream_k; stream_k_tiles).
// automatic (the default): where that wave leaves at least a third of the grid idle (and keeps a quarter
// busy). Under the H200's power cap the SMs left idle by a partial wave give their power to the busy
// ones, which then clock higher; so sharing the wave out pays only where it is far from full. Measured
// (bench/RESULTS.md, GEMM, stream-K threshold): 8192^3 (52 % full) 1.027 -> 1.042 and 4096 x 14336 x 4096
// (58 %) 0.998 -> 1.004, 1792 x 3840 x 4096 (59 %) 2 % faster, but 70-80 % full last waves 3.5-4.5 %
// slower and 4096^3 (88 %) 1.00 -> 0.96. on: wherever there is a partial wave after whole ones. off:
// never.
enum class stream_k_mode { automatic, off, on };

// How a tile's result goes out (GemmSchedule::epilogue). automatic (the default): whole where plan_gemm
// picks it (below), otherwise immediate.
enum class epilogue_mode { automatic, immediate, whole };

// The L2 eviction priority a GEMM's TMA traffic gives an operand's lines (createpolicy with
// .L2::cache_hint, tile/tma.cuh): normal (no hint), evict_first (the first lines L2 replaces: data used once)
// or evict_last (the last: data used again); automatic: chosen from the shape (plan_gemm).
enum class l2_priority { normal = 0, evict_first = 1, evict_last = 2, automatic = 3 };
// The L2 of the GPU plan_gemm assumes when none is given (an H200's, 60 MiB).
constexpr long long h200_l2_bytes = 60ll << 20;

// How the tiles are handed to blocks; the defaults are what the library uses (0 / -1 / automatic: chosen
// from the shape by plan_gemm). The tutorial and the benchmarks set them to measure what each buys.
struct GemmSchedule {
  bool persistent = true;  // one block per SM walking tiles; false: one block per tile
  int group_m = 16;        // tiles are walked in groups of this many M-tiles (L2 reuse); 1 = row by row
  int split_k = 0;         // 0: chosen from the shape; 1: never split K; >1: split K this many ways
  // K steps (of 64) by which each split but the one that adds the partials up is shorter than an even
  // share (ceil(K steps / splits)); the adding split takes the rest. The shorter splits finish first and
  // write their partials while the adding one still computes, so it does not wait for them. -1: chosen
  // from the plan; 0: even splits (the last may be shorter when the splits do not divide the K steps).
  int split_lead = -1;
  // Which item of a split tile (persistent grid) or a stream-K tile adds the partials up: a fixed one
  // (true: split-K's last K range; stream-K's part that its block reaches last, see stream_k_part), which
  // waits only for the others' writes, or whichever arrives last (false: one more global round trip on
  // the way to the store, to count the arrival).
  bool fixed_reducer = true;
  // Tile shape. block_m 128: two consumer warpgroups share a 128 x block_n tile (block_n 128 or 256);
  // block_m 64: one consumer warpgroup, a 64 x 128 tile with a deeper ring, for shapes whose 128-row
  // tiles are too few to fill the GPU (small M or N). 0: chosen from the shape.
  int block_m = 0;
  int block_n = 0;
  // Diagnostic: move every A and B tile through the ring as usual but issue no wgmma, so the time is
  // that of the data movement alone (the result is NOT computed). Never set outside measurements.
  bool data_only = false;
  // Diagnostic: the opposite, all the wgmma on whatever the ring's shared memory holds, with no loads (the
  // producer only signals each stage full). The result is NOT computed.
  bool compute_only = false;
  // Stream-K for the last, partial wave (stream_k_mode): when the tile count leaves the last wave of the
  // persistent grid partly idle, its T % P tiles are cut into equal K ranges, one per block (shorter than
  // a tile), and the blocks that share a tile add their fp32 partials in a workspace (in-kernel; the block
  // holding the tile's first K range stores it, or with fixed_reducer false the last to finish;
  // stream_k_part). Applies with persistent 128-row tiles and no split-K.
  stream_k_mode stream_k = stream_k_mode::automatic;
  // When and how a tile's result goes out (through shared memory and TMA stores, 64-column chunks):
  // - immediate: after its last K step, the tensor cores idle meanwhile; each consumer's chunks take
  //   turns in two shared buffers, so the third waits until the first's store has read its buffer.
  // - whole (bf16 output, 128 x 256 tiles, no K split; stream-K allowed): every chunk has a buffer of its
  //   own, so the tile is written with no such waits and its stores go out together, at the cost of a
  //   ring stage (3 instead of 4, which the K loop does not miss). Measured 1-2 points of cuBLAS faster
  //   at the large shapes, slower at 2048^3 where a block has one tile (bench/RESULTS.md, GEMM).
  // - automatic (the default): whole where it applies on the persistent grid with more tiles than SMs,
  //   otherwise immediate (plan_gemm; f32 output is always immediate).
  epilogue_mode epilogue = epilogue_mode::automatic;
  // L2 eviction priorities of the A and B tiles the producer loads and of the C tiles the epilogue stores
  // (the split partials take none). automatic (each one's default) is plan_gemm's choice: where the
  // operands do not fit in L2 together (A + B + C > L2 / 2) and the A rows one group of tiles reuses do
  // with room to spare (group_m 128-row tiles x K x 2 bytes <= L2 / 3), A is kept (evict_last) and B and C
  // go first (evict_first); otherwise no hints. That suits the grouped tile walk: a wave's blocks read
  // each B column panel at nearly the same time (the group's M-tiles of one N column run together) and
  // each A row panel again in every column of the group; the output C is not read again by this kernel.
  // Measured (bench/RESULTS.md, GEMM, L2 priorities): at 4096^3 A·B the DRAM reads of a launch fell from
  // 145 to 112 MB and the ratio to cuBLAS rose from 0.996-1.001 to 1.004-1.011; where the A panel is
  // large (8192^3: 32 MiB; the down-projection: 56 MiB) keeping it cost 2 points, hence the limit. The
  // trade: C leaves L2 sooner, so a kernel that reads it next is likelier to find it in DRAM; l2_c =
  // normal keeps it. An explicit priority overrides the automatic one of its operand.
  l2_priority l2_a = l2_priority::automatic;
  l2_priority l2_b = l2_priority::automatic;
  l2_priority l2_c = l2_priority::automatic;
  // Diagnostic timeline: a device buffer of trace_blocks * gemm_trace_points values; block b < trace_blocks
  // writes the global timer (ns) at each point of gemm_trace_point_names (the SM number last). null: off.
  unsigned long long* trace = nullptr;
  int trace_blocks = 0;
};

// The timeline GemmSchedule::trace records per block (tile/pipeline.cuh, pc::trace_point): 9 times (ns,
// named by gemm_trace_point_names), the SM number, then for each of the last item's first
// gemm_trace_step_count K steps three SM clock readings: its stage full (consumer), its wgmma wait done,
// the producer's wait for the stage done.
constexpr int gemm_trace_times = 9, gemm_trace_step_count = 64;
constexpr int gemm_trace_points = gemm_trace_times + 1 + 3 * gemm_trace_step_count;
extern const char* const gemm_trace_point_names[gemm_trace_times];

// "auto" / "0" / "1" (stream_k_mode automatic, off, on), and back (false for an unknown name).
const char* stream_k_mode_name(stream_k_mode m);
bool parse_stream_k_mode(const std::string& name, stream_k_mode& out);
// "normal" / "first" / "last" / "auto", and back (false for an unknown name).
const char* l2_priority_name(l2_priority p);
bool parse_l2_priority(const std::string& name, l2_priority& out);
// "auto" / "immediate" / "whole", and back (false for an unknown name).
const char* epilogue_mode_name(epilogue_mode e);
bool parse_epilogue_mode(const std::string& name, epilogue_mode& out);

// The schedule keys apply_schedule takes, with their values, for help texts (one line per key).
// The keys apply_schedule takes, with their values, for help texts (one line per key).
inline constexpr const char* gemm_schedule_keys =
    "    block_m=0|64|128     tile height (0: from the shape; 64: one consumer warpgroup, 128 wide)\n"
    "    block_n=0|128|256    tile width\n"
    "    split_k=N            split K N ways (0: from the shape; 1: never)\n"
    "    split_lead=N|auto    K steps by which the splits that do not add up finish early\n"
    "    group_m=N            walk tiles in groups of N M-tiles (L2 reuse; 1: row by row)\n"
    "    stream_k=auto|0|1    share the last, partial wave's tiles out by K ranges\n"
    "    epilogue=auto|immediate|whole   how a tile's result goes out\n"
    "    l2=auto|none         L2 eviction priorities of A, B and C together\n"
    "    l2_a|l2_b|l2_c=auto|normal|first|last   one operand's L2 eviction priority\n"
    "    persistent=0|1       one block per SM walking tiles (1), or one block per tile\n"
    "    fixed_reducer=0|1    split and stream-K tiles: a fixed item adds the partials up (1), or the last\n";
// Applies overrides written as "key=value,key=value" (gemm_schedule_keys: block_m=64, split_k=2,
// stream_k=0, l2=none, l2_a=last, ...) to `s`, left to right. Throws mp::user_error naming the key or
// value that is wrong and what it may be; `s` is then unspecified.
void apply_schedule(const std::string& text, GemmSchedule& s);

// Throws mp::user_error unless m, n, k are positive multiples of 16 (the message names the dimension).
void check_gemm_shape(long long m, long long n, long long k);

// Run the tile-layer GEMM. Throws mp::user_error for bad shapes or misaligned pointers, and
// mp::not_supported when the build has no CUDA. Asynchronous on `stream`.
void gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, b_layout bl, out_type out,
               CUstream_st* stream = nullptr, const GemmSchedule& sched = {});

// The same product through cuBLAS (the reference that benchmarks and checks compare against).
void gemm_bf16_cublas(const void* a, const void* b, void* c, int m, int n, int k, b_layout bl, out_type out,
                      CUstream_st* stream = nullptr);

// The schedule gemm_bf16 picks for a shape on a GPU with `sms` SMs (host only, no GPU needed): the tile
// (bm x bn x 64), the number of tiles, the K splits, and how many tiles stream-K shares out. Throws mp::user_error for a schedule that names an unsupported combination.
struct GemmPlan {
  int bm, bn, splits, tiles;
  int sk_tiles = 0;             // tiles shared out by stream-K over the persistent grid (0: none)
  int split_lead = 0;           // GemmSchedule::split_lead as planned (0 unless splits > 1)
  bool whole_tile = false;      // the whole-tile epilogue (epilogue_mode::whole)
  // GemmSchedule::l2_a, l2_b, l2_c with `automatic` resolved (never automatic here)
  l2_priority l2_a = l2_priority::normal, l2_b = l2_priority::normal, l2_c = l2_priority::normal;
};
// The schedule of an M x N x K GEMM on a GPU with `sms` SMs and `l2_bytes` of L2.
GemmPlan plan_gemm(int m, int n, int k, const GemmSchedule& sched, int sms, out_type out = out_type::bf16,
                   long long l2_bytes = h200_l2_bytes);
// How split-K cuts a tile's k_iters K steps (of 64) into splits (shared by the kernel and its CPU tests):
// every split but the last takes `per_split` steps, the last the rest. With a lead (plan_gemm keeps
// 0 <= lead < ceil(k_iters / splits)), per_split is an even share less the lead and the last split takes
// more than the others; without one, splits that do not divide the K steps can leave fewer non-empty
// splits than asked (10 K steps in 4: 3 + 3 + 3 + 1; in 6: five of 2), so `splits` is recounted.
struct KSplit {
  int per_split, splits;
  // split s's K range: first step and count
  constexpr int first(int s) const { return s * per_split; }
  constexpr int iters(int k_iters, int s) const { return s == splits - 1 ? k_iters - first(s) : per_split; }
};
constexpr KSplit k_split(int k_iters, int splits, int lead) {
  const int per = (k_iters + splits - 1) / splits - lead;
  return {per, lead > 0 ? splits : (k_iters + per - 1) / per};
}

// Split-K work items: item `work` is K range (split) work / tiles of tile work % tiles, so that a tile's
// splits are `tiles` items apart and its last split, which adds the others up on the persistent grid
// (GemmSchedule::fixed_reducer), has the largest index of them. Block b of a grid of G walks items
// b, b + G, ... in that order; a reducer thus waits only for items of smaller index, which no block
// reaches after it, so with every block resident the waits cannot close a cycle (tested on the CPU).
struct SplitItem {
  int split, tile;
};
constexpr SplitItem split_item(int work, int tiles) { return {work / tiles, work % tiles}; }

// Stream-K's share: of `tiles` tiles of `k_iters` K steps on `grid` blocks, how many are cut into K ranges
// (0: none): the last, partial wave's (tiles % grid, after at least one whole wave), where `mode` asks
// for it (stream_k_mode); never with ranges under one K step.
int stream_k_tiles(int tiles, int grid, int k_iters, stream_k_mode mode);

// Stream-K's items: block b of `grid` owns K steps [b*U/grid, (b+1)*U/grid) of the `shared` tiles laid end
// to end (U = shared * k_iters; with the last wave's share, shared < grid, every range is shorter than a
// tile, so a block touches at most two tiles and a tile has up to stream_k_max_parts parts); its j-th item
// (j = 0, 1, 2) is the part of that range inside the j-th tile it touches: K steps [first, first + iters)
// of shared tile `tile` (iters 0: no such item). A tile's parts are numbered from its last K range
// (which 0) to its first (which count - 1). The block holding the first K range reaches the tile at the
// end of its range; the others hold the tile's later ranges, at the start of theirs or (a range inside
// the tile) as the whole of it, which ends at most one K step after (ranges differ by at most one step).
// So the fixed reducer (which == count - 1, GemmSchedule::fixed_reducer) waits for partials finished
// before its own or at about the same time. It waits only for the first items of higher blocks, and a
// first item is a reducer only where its range starts the tile, when it waits for still higher blocks'
// first items: no wait can close a cycle (both tested on the CPU).
struct StreamKPart {
  int tile, first, iters, which, count;
};
constexpr StreamKPart stream_k_part(int j, int b, int grid, int shared, int k_iters) {
  const long long U = 1ll * shared * k_iters, s = b * U / grid, e = (b + 1) * U / grid;
  const int t = int(s / k_iters) + j;
  const long long ts = 1ll * t * k_iters, te = ts + k_iters;
  if (ts >= e) return {0, 0, 0, 0, 1};
  // the block owning K step u: the largest b with b*U/grid <= u
  auto owner = [&](long long u) { return int(((u + 1) * grid - 1) / U); };
  const int first = owner(ts), last = owner(te - 1);
  const long long from = s > ts ? s : ts, to = e < te ? e : te;
  return {t, int(from - ts), int(to - from), last - b, last - first + 1};
}
// The most parts (blocks) any shared tile has: the workspace slots per tile.
constexpr int stream_k_max_parts(int grid, int shared, int k_iters) {
  const long long U = 1ll * shared * k_iters;
  auto owner = [&](long long u) { return int(((u + 1) * grid - 1) / U); };
  int most = 1;
  for (int t = 0; t < shared; ++t) {
    const int c = owner(1ll * (t + 1) * k_iters - 1) - owner(1ll * t * k_iters) + 1;
    most = c > most ? c : most;
  }
  return most;
}
// "64x128x64 tiles, 64 tiles, split-K 2, persistent grid"
std::string describe_plan(const GemmPlan& p, const GemmSchedule& sched);

// What gemm_bf16 would run for this shape on the current GPU ("128x256x64 tiles, ..."), for reports.
std::string describe_gemm(int m, int n, int k, b_layout bl, out_type out, const GemmSchedule& sched = {});

// CPU fp64 reference on bf16 inputs given as float (already rounded to bf16): C = A*B or A*B^T.
std::vector<double> gemm_reference_cpu(const std::vector<float>& a, const std::vector<float>& b, int m, int n,
                                       int k, b_layout bl);

// bf16 rounding (round to nearest even) and its bit pattern, host side.
uint16_t float_to_bf16_bits(float x);
float bf16_bits_to_float(uint16_t b);

}  // namespace mp::kernels
