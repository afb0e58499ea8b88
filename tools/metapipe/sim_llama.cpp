// `metapipe sim llama`: the Llama generator (models/llama.h) for a model file's shapes or a preset,
// compiled with streamed weights onto the simulated dataflow accelerator at a fusion level (one kernel
// call per operation, per decoder layer, or all decoders in one), and one decode token timed: calls per
// token, ms per token, tokens/s, the fraction of the HBM roof, why each call ends and where each tensor
// lives. Two programs are simulated cycle by cycle (the model with one layer, and one decoder layer
// alone); the other layers are extrapolated from the lone layer (docs/rdu.md, "Llama on the SN40L").
// With --sockets S the model is split tensor-parallel and one socket's shard is simulated, with the
// all-reduces over the socket-to-socket links; once more without them, to measure how much is hidden.
#include "tools/metapipe/sim_llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <sstream>

#include "backends/cpu/interpreter.h"
#include "backends/rdu/arch.h"
#include "backends/rdu/lower.h"
#include "backends/rdu/rdu.h"
#include "backends/rdu/report.h"
#include "core/quant.h"
#include "core/table.h"
#include "core/text.h"
#include "ir/analysis.h"
#include "models/gguf.h"
#include "models/llama.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"
#include "passes/pipeline.h"

namespace mp::cli {
namespace {

enum class Fuse { PerOp, PerLayer, All };

Fuse parse_fuse(const std::string& s) {
  if (s == "per-op") return Fuse::PerOp;
  if (s == "per-layer") return Fuse::PerLayer;
  if (s == "all") return Fuse::All;
  throw usage_error("--fuse must be per-op, per-layer or all (got '" + s + "')");
}
const char* fuse_name(Fuse f) {
  return f == Fuse::PerOp ? "per-op" : f == Fuse::PerLayer ? "per-layer" : "all";
}

// The part of the model each top-level statement of a compiled llama program belongs to: -1 before the
// first decoder layer (embedding), the layer index, or `layers` after the last (final norm, LM head). A
// statement that touches no tensor (a norm's reduction) belongs with the next statement that does.
// In a program of the decoder layers alone, what comes before the first layer or after the last (the
// input's load, the output's store) belongs to that layer.
std::vector<int> statement_groups(const ir::Program& p, int64_t layers, bool decoders_only) {
  const int n = int(p.body.size());
  std::vector<int> layer(size_t(n), -2);  // -2: no layer tensor; -3: no tensor at all
  for (int i = 0; i < n; ++i) {
    bool any = false;
    ir::walk({p.body[size_t(i)]}, [&](const ir::NodeRef& x, int) {
      auto acc = ir::access_of(*x);
      if (!acc) return;
      any = true;
      const std::string& name = acc->tensor->name;
      if (name.rfind("blk.", 0) == 0)
        layer[size_t(i)] = std::max(layer[size_t(i)], std::stoi(name.substr(4)));
    });
    if (!any) layer[size_t(i)] = -3;
  }
  int first = n, last = -1;
  for (int i = 0; i < n; ++i)
    if (layer[size_t(i)] >= 0) first = std::min(first, i), last = std::max(last, i);
  std::vector<int> g(size_t(n), 0);
  for (int i = n - 1; i >= 0; --i) {
    const int l = layer[size_t(i)];
    if (l >= 0)
      g[size_t(i)] = l;
    else if (l == -2)
      g[size_t(i)] = i < first ? -1 : i > last ? int(layers) : (i + 1 < n ? g[size_t(i + 1)] : int(layers));
    else
      g[size_t(i)] = i + 1 < n ? g[size_t(i + 1)] : int(layers);
  }
  if (decoders_only)
    for (auto& x : g) x = std::clamp(x, 0, int(layers) - 1);
  return g;
}

std::string group_name(int g, int64_t layers) {
  if (g < 0) return "the embedding";
  if (g >= layers) return "the final norm and LM head";
  return "decoder layer " + std::to_string(g);
}

struct PartRun {
  rdu::RunResult r;
  int64_t statements = 0;
  int64_t all_reduces = 0;       // all-reduces the program's shard takes part in
  int64_t all_reduce_bytes = 0;  // of one (the partial sum of a projection's output)
};

// Cycles of an all-reduce of `bytes` over S sockets, each step paying the link's latency: the faster of
// a ring (a reduce-scatter and an all-gather of S - 1 steps each, every step a chunk of bytes / S) and,
// for a power-of-two S, recursive doubling (log2 S steps, every step the whole bytes to one partner),
// which wins for the small vectors of decode, where the latency dominates.
double all_reduce_cycles(const rdu::Arch& a, int64_t S, int64_t bytes) {
  if (S <= 1) return 0;
  // one step moving b bytes (GB/s = bytes per ns)
  const auto step_ns = [&](double b) { return a.socket_link_latency_ns + b / a.socket_link_gbs; };
  double ns = double(2 * (S - 1)) * step_ns(std::ceil(double(bytes) / double(S)));
  if ((S & (S - 1)) == 0) ns = std::min(ns, std::log2(double(S)) * step_ns(double(bytes)));
  return ns * a.clock_ghz;
}

// Tensor parallelism: the outputs of the attention's output projection and of the FFN's down projection
// are partial sums on each socket; the all-reduce sits between their store and the residual add that
// reads them. It is modelled as the delay of that ordering token ("done <store>"): the readers of the
// partial sum wait for it, while every other stream, the next projections' weight tiles included, goes
// on as far as its buffers allow, and the transfer takes no HBM bandwidth or capacity.
void add_all_reduces(rdu::Graph& g, const rdu::Arch& a, int64_t S, PartRun& out) {
  for (auto& st : g.stages) {
    if (!st.is_control() || st.inputs.size() != 1) continue;
    const int w = g.producer_of(st.inputs.front().buffer);
    if (w < 0 || g.stages[size_t(w)].kind != rdu::StageKind::Store || g.stages[size_t(w)].tensor < 0)
      continue;
    const rdu::Tensor& t = g.tensors[size_t(g.stages[size_t(w)].tensor)];
    const auto ends = [&](const std::string& suffix) {
      return t.name.size() > suffix.size() &&
             t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (!ends(".attn_out") && !ends(".ffn_out")) continue;
    out.all_reduce_bytes = t.bytes;
    st.delay_cycles = int64_t(std::ceil(all_reduce_cycles(a, S, t.bytes)));
    ++out.all_reduces;
  }
}

PartRun simulate_part(const rdu::Arch& arch, const models::LlamaConfig& c,
                      const models::LlamaProgramOptions& o, Fuse f, const passes::CompileOptions& co,
                      bool place, int64_t sockets) {
  ir::Program cp = passes::compile(models::build_llama_program(c, o), co);
  const std::vector<int> groups =
      statement_groups(cp, c.layers, o.part == models::LlamaProgramOptions::Part::Decoders);
  std::vector<std::string> kinds;
  for (auto& n : cp.body) kinds.push_back(ir::to_string(n->kind));
  rdu::Graph g = rdu::lower(cp);
  PartRun out;
  add_all_reduces(g, arch, sockets, out);
  // every decoder layer of the shard has its two all-reduces, whatever the fusion level
  if (out.all_reduces != 2 * c.layers)
    throw internal_error("sim llama: found " + std::to_string(out.all_reduces) + " all-reduce points in " +
                         std::to_string(c.layers) + " decoder layer(s), expected two per layer");
  rdu::RunOptions ro;
  ro.place = place;
  const int64_t L = c.layers;
  ro.map.split_between = [groups, kinds, f, L](int a, int b) -> std::string {
    if (f == Fuse::PerOp)
      return "per-op fusion: statement " + std::to_string(b) + " (" + kinds[size_t(b)] + ") is its own call";
    const int ga = groups[size_t(a)], gb = groups[size_t(b)];
    if (f == Fuse::PerLayer && ga != gb) return "per-layer fusion: " + group_name(ga, L) + " ends";
    // all decoders in one call, the embedding and the head in their own (slide 58: 3 calls per token)
    if (f == Fuse::All && ((ga < 0) != (gb < 0) || (ga >= L) != (gb >= L)))
      return "all-decoder fusion: " + std::string(ga < 0 ? "the embedding" : "the decoder layers") + " end" +
             (ga < 0 ? "s" : "");
    return "";
  };
  out.r = rdu::run(arch, g, ro);
  out.statements = int64_t(cp.body.size());
  return out;
}

// Split reasons with the fusion level's statement boundaries counted rather than listed.
std::vector<std::string> summarize_reasons(const std::vector<std::string>& reasons) {
  std::vector<std::string> out;
  int per_op = 0;
  for (auto& r : reasons)
    if (r.find("per-op fusion: ") != std::string::npos)
      ++per_op;
    else
      out.push_back(r);
  if (per_op)
    out.insert(out.begin(), std::to_string(per_op) + " calls end at a statement boundary (per-op fusion)");
  return out;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string upper(std::string s) {
  for (auto& ch : s) ch = char(std::toupper(static_cast<unsigned char>(ch)));
  return s;
}

// --functional: every simulated unit computes real values (loads copy tensor rows into N-buffer slots,
// compute stages evaluate their IR nodes when the simulator fires them, stores write back), decoding
// greedily one token per step with the KV cache kept in the simulated memory between steps; the CPU
// interpreter runs the same program on its own copy of the memory, and the two token streams must agree.
// Tensors are f32 here (the values the CPU computes with), not the bf16 of the timing simulation.
int run_functional(const rdu::Arch& arch, const models::LlamaConfig& c, const models::GgufFile* file,
                   int64_t tokens, int64_t context, int64_t wtile, const passes::CompileOptions& co,
                   bool json) {
  models::LlamaProgramOptions o;
  o.tokens = 1;
  o.context = context;
  o.weight_tile = wtile;
  const ir::Program p = models::build_llama_program(c, o);
  const ir::Program cp = passes::compile(p, co);
  std::map<std::string, std::vector<float>> in;
  if (file) {
    for (const std::string& name : models::weight_names(c)) {
      const models::GgufTensor& t = file->tensor(name);
      const int64_t rows = t.rows(), cols = t.dims.at(0);
      std::vector<float> v(size_t(rows * cols));
      const uint64_t row_bytes = t.nbytes / uint64_t(rows);
      for (int64_t r = 0; r < rows; ++r)
        quant::dequantize_row(t.type, t.data + uint64_t(r) * row_bytes, v.data() + r * cols, cols);
      in[name] = std::move(v);
    }
  } else {
    // a preset's shapes: random weights, scaled so that activations keep unit size
    in = ir::random_inputs(p, 1);
    for (auto& t : p.tensors)
      if (t->role == ir::TensorRole::Input && t->shape.size() == 2 &&
          t->name.find("weight") != std::string::npos)
        for (auto& x : in[t->name]) x *= float(2.0 / std::sqrt(double(t->shape[1])));
  }
  for (auto& t : p.tensors)
    if (t->role == ir::TensorRole::InOut) in[t->name].assign(size_t(ir::num_elements(t->shape)), 0.f);
  in["tokens"] = {0.f};
  in["pos"] = {0.f};
  ir::Memory sim_mem = ir::make_memory(cp, in), cpu_mem = ir::make_memory(p, in);
  std::optional<models::Tokenizer> tok;
  if (file) tok = models::Tokenizer::from_gguf(*file);
  int32_t sim_next = tok && tok->bos() >= 0 ? tok->bos() : 1, cpu_next = sim_next;
  std::vector<int32_t> sim_ids, cpu_ids;
  double worst = 0, sim_cycles = 0;
  int64_t match = 0;
  const auto argmax = [](const std::vector<float>& v) {
    return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
  };
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t step = 0; step < tokens; ++step) {
    for (auto* m : {&sim_mem, &cpu_mem}) {
      m->at("tokens").data = {float(m == &sim_mem ? sim_next : cpu_next)};
      m->at("pos").data = {float(step)};
    }
    rdu::Graph g = rdu::lower(cp, &sim_mem);
    rdu::RunOptions ro;
    ro.functional = true;
    ro.place = false;  // the values do not depend on placement
    sim_cycles += rdu::run(arch, g, ro).cycles;
    cpu::interpret(p, cpu_mem);
    const std::vector<float>&ls = sim_mem.at("logits").data, &lc = cpu_mem.at("logits").data;
    for (size_t i = 0; i < ls.size(); ++i) worst = std::max(worst, double(std::fabs(ls[i] - lc[i])));
    sim_next = argmax(ls), cpu_next = argmax(lc);
    sim_ids.push_back(sim_next), cpu_ids.push_back(cpu_next);
    if (sim_next != cpu_next) break;
    ++match;
  }
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const bool ok = match == tokens;
  const auto list = [](const std::vector<int32_t>& v) {
    std::string out;
    for (auto x : v) out += (out.empty() ? "" : ", ") + std::to_string(x);
    return out;
  };
  if (json) {
    std::cout << "{\n  \"model\": \"" << json_escape(c.name)
              << "\",\n  \"functional\": true,\n  \"tokens\": " << tokens
              << ",\n  \"matching_tokens\": " << match << ",\n  \"match\": " << (ok ? "true" : "false")
              << ",\n  \"tokens_simulated\": [" << list(sim_ids) << "],\n  \"tokens_cpu\": [" << list(cpu_ids)
              << "],\n  \"max_logit_abs_diff\": " << fmt("%.3g", worst)
              << ",\n  \"simulated_cycles\": " << fmt("%.0f", sim_cycles)
              << ",\n  \"simulation_s\": " << fmt("%.3g", sim_s) << "\n}\n";
  } else {
    std::cout << c.name << " (" << c.summary() << ") on " << arch.name
              << ", functional: greedy decoding, one token per step, f32 tensors\n";
    std::cout << "  simulated: " << list(sim_ids) << "\n  CPU interpreter: " << list(cpu_ids) << "\n";
    if (tok) std::cout << "  text: " << tok->decode(sim_ids) << "\n";
    std::cout << "  functional check vs the CPU interpreter: "
              << (ok ? std::to_string(match) + " of " + std::to_string(tokens) + " tokens equal"
                     : "token " + std::to_string(match) + " differs")
              << " (largest logit difference " << fmt("%.2g", worst) << "); " << fmt("%.4g", sim_cycles)
              << " simulated cycles, " << fmt("%.3g", sim_s) << " s\n";
  }
  return ok ? 0 : 1;
}

}  // namespace

bool is_sim_llama(Args a) {
  // consume the values of every option either form of `sim` takes, so that they are not positionals
  for (auto* o : {"--arch", "--set", "--svg", "--seed", "--max-work", "--max-memory", "--model", "--shapes",
                  "--tokens", "--context", "--fuse", "--sockets", "--weight-tile", "--layers"})
    a.values({o});
  auto pos = a.positionals();
  return !pos.empty() && pos.front() == "llama";
}

int run_sim_llama(Args& a) {
  const auto arch_name = a.value({"--arch"});
  const auto model = a.value({"--model"});
  const auto shapes = a.value({"--shapes"});
  const auto tokens_opt = a.integer({"--tokens"});
  const auto context_opt = a.integer({"--context"});
  const auto fuse_opt = a.value({"--fuse"});
  const auto sockets_opt = a.integer({"--sockets"});
  const auto tile_opt = a.integer({"--weight-tile"});
  const auto layers_opt = a.integer({"--layers"});
  const auto sets = a.values({"--set"});
  const bool functional = a.flag({"--functional"});
  const bool json = a.flag({"--json"});
  const bool no_place = a.flag({"--no-place"});
  const bool details = a.flag({"--details"});
  auto pos = a.positionals();
  a.finish();
  if (pos.size() != 1)
    throw usage_error("metapipe sim llama takes no other argument (see metapipe sim --help)");
  if (model && shapes) throw usage_error("give either --model or --shapes, not both");
  const Fuse fuse = parse_fuse(fuse_opt.value_or("all"));
  const long long sockets = sockets_opt.value_or(1);
  if (sockets < 1 || sockets > 1024)
    throw usage_error("--sockets must be in [1, 1024] (got " + std::to_string(sockets) + ")");
  const long long N = tokens_opt.value_or(functional ? 16 : 1);
  if (N < 1 || N > (1 << 24))
    throw usage_error("--tokens must be in [1, 16777216] (got " + std::to_string(N) + ")");
  const long long wtile = tile_opt.value_or(512);
  if (wtile < 1 || wtile > (1 << 20))
    throw usage_error("--weight-tile must be in [1, 1048576] rows (got " + std::to_string(wtile) + ")");
  if (functional && sockets > 1)
    throw usage_error("--functional runs one socket (drop --sockets " + std::to_string(sockets) + ")");

  rdu::Arch arch = rdu::load_arch(arch_name.value_or("sn40l"));
  for (auto& s : sets) rdu::apply_override(arch, s);
  models::LlamaConfig c;
  std::optional<models::GgufFile> file;
  if (model || (functional && !shapes))
    file = models::GgufFile::open(model ? *model : models::default_model_path());
  if (file) {
    c = models::LlamaConfig::from_gguf(*file);
  } else {
    c = models::LlamaConfig::preset(shapes.value_or("llama3.1-8b"));
  }
  // Tensor parallelism over S sockets: each socket holds heads / S query heads with their KV heads (and
  // those heads' share of the cache), ffn / S FFN columns, and vocab / S rows of the LM head (rounded up:
  // the last socket's share padded); the embedding's row gather and the norms run on every socket.
  if (c.heads % sockets || c.kv_heads % sockets || c.ffn % sockets) {
    std::string fits;
    for (int64_t s = 1; s <= c.kv_heads; ++s)
      if (c.heads % s == 0 && c.kv_heads % s == 0 && c.ffn % s == 0)
        fits += (fits.empty() ? "" : ", ") + std::to_string(s);
    throw usage_error("--sockets " + std::to_string(sockets) + " must divide the model's heads (" +
                      std::to_string(c.heads) + "), KV heads (" + std::to_string(c.kv_heads) +
                      ") and FFN width (" + std::to_string(c.ffn) + "): use one of " + fits);
  }
  const models::LlamaConfig full = c;
  c.heads /= sockets;
  c.kv_heads /= sockets;
  c.ffn /= sockets;
  c.vocab = (c.vocab + sockets - 1) / sockets;
  if (layers_opt) {
    if (*layers_opt < 1 || *layers_opt > c.layers)
      throw usage_error("--layers must be in [1, " + std::to_string(c.layers) +
                        "] (the model's layers; got " + std::to_string(*layers_opt) + ")");
    c.layers = *layers_opt;
  }
  // functional: a cache just long enough for the tokens decoded
  const long long C =
      context_opt.value_or(functional ? std::min<int64_t>(c.context, std::max<long long>(N, 16))
                                      : std::min<int64_t>(c.context, 1024));
  if (C < 1 || C > c.context)
    throw usage_error("--context must be in [1, " + std::to_string(c.context) +
                      "] (the model's context; got " + std::to_string(C) + ")");

  // Weights and the KV cache in bf16 (what the SN40L streams); one decode step (1 token per call).
  models::LlamaProgramOptions o;
  o.tokens = 1;
  o.context = C;
  o.weight_tile = wtile;
  o.weight_dtype = ir::DType::bf16;
  o.cache_dtype = ir::DType::bf16;
  passes::CompileOptions co;
  co.tile.onchip_budget = int64_t(arch.pmus()) * arch.pmu_bytes();  // what the PMUs hold in all
  co.parallelize.lanes = arch.pcu_lanes;
  // A weight tile's matmul spread over as many PCUs as the tile has lane groups (rows / lanes): each copy
  // reads its rows over its own PMU link, which is what keeps a tile's compute ahead of its HBM stream.
  co.parallelize.max_par = int(std::clamp<long long>(wtile / arch.pcu_lanes, 1, 64));
  if (functional) {
    if (N > C)
      throw usage_error("--functional decodes one token per cache position: --tokens " + std::to_string(N) +
                        " needs --context >= " + std::to_string(N) + " (got " + std::to_string(C) + ")");
    return run_functional(arch, c, file ? &*file : nullptr, N, C, wtile, co, json);
  }

  // Tiers: every program tensor lives in the program memory; DDR holds what HBM cannot.
  const rdu::Memory& pm = arch.memory();
  const int64_t L = c.layers, d = c.d_model, kvw = c.kv_heads * c.head_dim, qw = c.heads * c.head_dim;
  const int64_t layer_w = 2 * (qw * d + 2 * kvw * d + d * qw + 3 * c.ffn * d + 2 * d);
  const int64_t head_w = 2 * (c.vocab * d * (c.tied_embeddings ? 1 : 2) + d);
  const int64_t cache = 2 * 2 * int64_t(C) * kvw;
  const double model_gb = (double(L) * double(layer_w + cache) + double(head_w)) / 1e9;
  if (model_gb > pm.capacity_gb)
    throw not_supported("a model of " + fmt("%.1f", model_gb) + " GB (weights and KV cache) beyond the " +
                        fmt("%.0f", pm.capacity_gb) + " GB of " + upper(pm.name) +
                        ": tensors resident in a slower tier (DDR) streamed into it");

  const auto t0 = std::chrono::steady_clock::now();
  models::LlamaConfig c1 = c;
  c1.layers = 1;
  PartRun whole = simulate_part(arch, c1, o, fuse, co, !no_place, sockets);
  models::LlamaProgramOptions od = o;
  od.part = models::LlamaProgramOptions::Part::Decoders;
  PartRun layer = simulate_part(arch, c1, od, fuse, co, !no_place, sockets);
  // The same programs without the all-reduces' delay: what the all-reduces cost on top is what the
  // overlap does not hide.
  PartRun whole0 = whole, layer0 = layer;
  if (sockets > 1) {
    whole0 = simulate_part(arch, c1, o, fuse, co, !no_place, 1);
    layer0 = simulate_part(arch, c1, od, fuse, co, !no_place, 1);
  }
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // The cost of a kernel call: loading its configuration (config.load_cycles, charged per call, the first
  // one included) plus its pipeline fill and drain, which the simulation contains (a call starts with
  // empty buffers and ends when its last store lands). rdu::run charges the loads between its calls.
  const double cfg = double(arch.config_cycles);
  const bool layer_in_place = fuse == Fuse::All && layer.r.kernel_calls == 1;
  const double extra_cycles = layer.r.cycles + (layer_in_place ? 0 : cfg);
  const int64_t extra_calls = layer_in_place ? 0 : layer.r.kernel_calls;
  // Greedy decoding over a vocabulary split across sockets: each socket's best logit and its index
  // (8 bytes) reduced to the best of all, after everything else (nothing left to overlap it with).
  const double gather_cycles = all_reduce_cycles(arch, sockets, 8);
  const double cycles = cfg + whole.r.cycles + double(L - 1) * extra_cycles + gather_cycles;
  const int64_t all_reduces = whole.all_reduces + (L - 1) * layer.all_reduces;
  const double ar_each = all_reduce_cycles(arch, sockets, layer.all_reduce_bytes);
  const double ar_cycles = double(all_reduces) * ar_each;
  // What the all-reduces add to the token: the difference of the simulations with and without them (bounded
  // by their own time: memory scheduling can move a simulation a few cycles either way).
  const double ar_exposed =
      std::clamp((whole.r.cycles - whole0.r.cycles) + double(L - 1) * (layer.r.cycles - layer0.r.cycles), 0.0,
                 ar_cycles);
  const double ar_hidden = ar_cycles > 0 ? 1 - ar_exposed / ar_cycles : 1.0;
  const auto to_ms = [&](double cy) { return cy / (arch.clock_ghz * 1e6); };
  const int64_t calls = whole.r.kernel_calls + (L - 1) * extra_calls;
  const double bytes = double(whole.r.bytes_read + whole.r.bytes_written) +
                       double(L - 1) * double(layer.r.bytes_read + layer.r.bytes_written);
  const double peak_bpc = pm.peak_gbs() / arch.clock_ghz;
  const double roof = bytes / peak_bpc;
  const double ms = cycles / (arch.clock_ghz * 1e6);
  const double hbm_fraction = roof / cycles;
  const double config_share = double(calls) * cfg / cycles;

  // Where each tensor of the one-layer model lives (layer 0 stands for every layer).
  struct TierRow {
    std::string tensor, tier;
    int64_t bytes = 0, tile = 0;
    int depth = 0;
    bool gathered = false;  // rows picked by index (the embedding, the KV cache's scatter)
  };
  std::vector<TierRow> tiers;
  std::map<std::string, size_t> row_of;
  int64_t sram_bytes = 0;
  for (auto& cf : whole.r.mapping.configs) {
    int64_t here = 0;
    for (size_t b = 0; b < cf.graph.buffers.size(); ++b)
      here += cf.graph.buffers[b].control ? 0 : cf.graph.buffers[b].bytes * cf.graph.buffers[b].depth;
    sram_bytes = std::max(sram_bytes, here);
    for (size_t s = 0; s < cf.graph.stages.size(); ++s) {
      const rdu::Stage& st = cf.graph.stages[s];
      if (st.kind == rdu::StageKind::Compute || st.tensor < 0) continue;
      const rdu::Tensor& t = cf.graph.tensors[size_t(st.tensor)];
      auto it = row_of.find(t.name);
      if (it == row_of.end()) {
        it = row_of.emplace(t.name, tiers.size()).first;
        tiers.push_back({t.name, upper(pm.name), t.bytes, 0, 0});
      }
      TierRow& row = tiers[it->second];
      if (st.access.row_at) row.gathered = true;
      if (st.iterations > 1 && st.access.bytes() > row.tile) {
        row.tile = st.access.bytes();
        const int buf = st.kind == rdu::StageKind::Load ? (st.outputs.empty() ? -1 : st.outputs.front())
                                                        : (st.inputs.empty() ? -1 : st.inputs.front().buffer);
        row.depth = buf >= 0 ? cf.graph.buffers[size_t(buf)].depth : 0;
      }
    }
  }
  std::sort(tiers.begin(), tiers.end(), [](auto& x, auto& y) { return x.bytes > y.bytes; });

  const std::string what =
      "simulated cycle by cycle: the model with one decoder layer (embedding, layer 0, "
      "final norm, LM head; " +
      std::to_string(whole.r.kernel_calls) + " call" + (whole.r.kernel_calls > 1 ? "s" : "") +
      ") and one decoder layer alone (" + std::to_string(layer.r.kernel_calls) + " call" +
      (layer.r.kernel_calls > 1 ? "s" : "") + "); extrapolated: layers 1.." + std::to_string(L - 1) +
      " as copies of the lone layer" +
      (layer_in_place ? " run back to back in the same configuration (no overlap across a "
                        "layer boundary is assumed)"
                      : ", each loading its configuration") +
      (sockets > 1 ? "; one socket's shard of " + std::to_string(sockets) +
                         " (the shards are identical), its all-reduces simulated as delays of "
                         "the tokens that order the residual adds after them"
                   : "");
  const auto reasons_whole = summarize_reasons(whole.r.split_reasons);
  const auto reasons_layer = summarize_reasons(layer.r.split_reasons);
  if (json) {
    std::ostringstream js;
    js << "{\n  \"model\": \"" << json_escape(c.name) << "\",\n  \"shapes\": \""
       << json_escape(full.summary()) << "\",\n  \"arch\": \"" << json_escape(arch.name)
       << "\",\n  \"fuse\": \"" << fuse_name(fuse) << "\",\n  \"sockets\": " << sockets
       << ",\n  \"shard\": \"" << json_escape(c.summary())
       << "\",\n  \"socket_link_gbs\": " << fmt("%.6g", arch.socket_link_gbs)
       << ",\n  \"socket_link_latency_ns\": " << fmt("%.6g", arch.socket_link_latency_ns)
       << ",\n  \"all_reduces_per_token\": " << all_reduces
       << ",\n  \"all_reduce_bytes\": " << (sockets > 1 ? layer.all_reduce_bytes : 0)
       << ",\n  \"all_reduce_us_each\": " << fmt("%.6g", to_ms(ar_each) * 1e3)
       << ",\n  \"all_reduce_ms_per_token\": " << fmt("%.6g", to_ms(ar_cycles))
       << ",\n  \"all_reduce_exposed_ms_per_token\": " << fmt("%.6g", to_ms(ar_exposed))
       << ",\n  \"all_reduce_hidden_fraction\": " << fmt("%.4f", ar_hidden)
       << ",\n  \"top1_across_sockets_ms\": " << fmt("%.6g", to_ms(gather_cycles))
       << ",\n  \"context\": " << C << ",\n  \"tokens\": " << N << ",\n  \"calls_per_token\": " << calls
       << ",\n  \"cycles_per_token\": " << fmt("%.0f", cycles) << ",\n  \"ms_per_token\": " << fmt("%.6g", ms)
       << ",\n  \"tokens_per_s\": " << fmt("%.6g", 1e3 / ms)
       << ",\n  \"ms_total\": " << fmt("%.6g", ms * double(N))
       << ",\n  \"bytes_per_token\": " << fmt("%.0f", bytes)
       << ",\n  \"hbm_roof_ms\": " << fmt("%.6g", roof / (arch.clock_ghz * 1e6))
       << ",\n  \"hbm_fraction\": " << fmt("%.4f", hbm_fraction)
       << ",\n  \"config_load_cycles\": " << arch.config_cycles
       << ",\n  \"config_load_fraction\": " << fmt("%.4f", config_share)
       << ",\n  \"one_layer_model\": {\"calls\": " << whole.r.kernel_calls
       << ", \"cycles\": " << fmt("%.0f", whole.r.cycles)
       << "},\n  \"lone_layer\": {\"calls\": " << layer.r.kernel_calls
       << ", \"cycles\": " << fmt("%.0f", layer.r.cycles) << "},\n  \"method\": \"" << json_escape(what)
       << "\",\n  \"split_reasons\": [";
    bool first = true;
    for (auto* rs : {&reasons_whole, &reasons_layer})
      for (auto& r : *rs) js << (first ? "" : ", ") << "\"" << json_escape(r) << "\"", first = false;
    js << "],\n  \"tiers\": [";
    for (size_t i = 0; i < tiers.size(); ++i)
      js << (i ? ", " : "") << "{\"tensor\": \"" << json_escape(tiers[i].tensor) << "\", \"tier\": \""
         << tiers[i].tier << "\", \"bytes\": " << tiers[i].bytes << ", \"tile_bytes\": " << tiers[i].tile
         << ", \"depth\": " << tiers[i].depth << "}";
    js << "],\n  \"sram_bytes\": " << sram_bytes << ",\n  \"simulation_s\": " << fmt("%.3g", sim_s)
       << "\n}\n";
    std::cout << js.str();
    return 0;
  }
  std::cout << c.name << " (" << full.summary() << ") on " << arch.name << ", --fuse " << fuse_name(fuse)
            << ", batch 1, bf16 weights and KV cache, " << C << " cache positions read per token\n";
  if (sockets > 1) {
    std::cout << "  " << sockets << " sockets, tensor-parallel; one socket's shard (" << c.heads << "/"
              << c.kv_heads << " heads, FFN " << c.ffn << ", vocab " << c.vocab
              << ") simulated, the shards being identical; HBM figures below are per socket\n";
    std::cout << "  all-reduce: " << all_reduces
              << " per token (after the attention output and down projections) of "
              << format_count(layer.all_reduce_bytes) << " B over " << arch.socket_link_gbs
              << " GB/s links with " << arch.socket_link_latency_ns
              << " ns per transfer: " << fmt("%.3g", to_ms(ar_each) * 1e3) << " us each, "
              << fmt("%.4g", to_ms(ar_cycles)) << " ms per token, " << fmt("%.1f", 100 * ar_hidden)
              << " % hidden behind weight loads and compute (exposed " << fmt("%.4g", to_ms(ar_exposed))
              << " ms); the logits' top-1 across sockets " << fmt("%.3g", to_ms(gather_cycles) * 1e3)
              << " us\n";
  }
  std::cout << "  calls per token: " << calls << "\n";
  std::cout << "  per token: " << fmt("%.4g", ms) << " ms (" << format_count((long long)std::llround(cycles))
            << " cycles at " << arch.clock_ghz << " GHz), " << fmt("%.4g", 1e3 / ms) << " tokens/s";
  if (N > 1) std::cout << "; " << N << " tokens: " << fmt("%.4g", ms * double(N)) << " ms";
  std::cout << "\n  " << upper(pm.name) << ": " << fmt("%.4g", bytes / 1e9) << " GB per token, roof "
            << fmt("%.4g", roof / (arch.clock_ghz * 1e6)) << " ms at " << pm.peak_gbs()
            << " GB/s: " << fmt("%.1f", 100 * hbm_fraction) << " % of the " << upper(pm.name) << " roof\n";
  std::cout
      << "  kernel-call cost: " << format_count(arch.config_cycles) << " cycles ("
      << fmt("%.3g", double(arch.config_cycles) / (arch.clock_ghz * 1e3))
      << " us, config.load_cycles) to load each call's configuration, " << fmt("%.1f", 100 * config_share)
      << " % of the token; pipeline fill and drain are simulated (each call starts with empty buffers)\n";
  std::cout << "  how: " << what << "; simulation took " << fmt("%.3g", sim_s) << " s\n";
  for (auto& r : reasons_whole) std::cout << "  one-layer model: " << r << "\n";
  for (auto& r : reasons_layer) std::cout << "  lone layer: " << r << "\n";
  std::cout << "\n";
  Table t({"tensor", "tier", "bytes", "streamed through SRAM (PMUs)"});
  for (auto& r : tiers)
    t.add({r.tensor, r.tier, format_count(r.bytes),
           r.tile       ? format_count(r.tile) + " B tiles x " + std::to_string(r.depth) + " buffers"
           : r.gathered ? "rows by index"
                        : "whole"});
  t.add({"on-chip buffers (largest call)", "SRAM", format_count(sram_bytes),
         "of " + format_count(int64_t(arch.pmus()) * arch.pmu_bytes()) + " B in " +
             std::to_string(arch.pmus()) + " PMUs"});
  t.print(std::cout);
  if (details) {
    std::cout << "\nthe lone decoder layer, simulated:\n";
    rdu::print_text(std::cout, arch, layer.r);
  }
  return 0;
}

}  // namespace mp::cli
