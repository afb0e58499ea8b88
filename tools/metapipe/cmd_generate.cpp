// `metapipe generate`: text from a Llama GGUF model (SmolLM2-135M-Instruct by default) on the CPU engine,
// streamed as it is produced, then prompt and decode tokens/s. Greedy by default; temperature / top-k /
// top-p sampling with a seed. `--shapes PRESET` runs a preset's shapes with random weights (speed work).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

#include "backends/cpu/interpreter.h"
#include "backends/cpu/quant_matmul.h"
#include "backends/cuda/llama_gpu.h"
#include "backends/cuda/tp_launch.h"
#include "core/random.h"
#include "core/text.h"
#include "core/thread_pool.h"
#include "models/gguf.h"
#include "models/llama_runner.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"
#include "tools/metapipe/cli.h"
#include "tools/metapipe/progress.h"

namespace mp::cli {
namespace {

struct Sampling {
  double temperature = 0;
  int64_t top_k = 0;  // 0: no cut
  double top_p = 1;
  uint64_t seed = 0;
};

// Greedy at temperature 0; otherwise softmax(logits / T) cut to the top k and to the smallest set whose
// probability reaches top_p, then one draw.
int32_t sample(const std::vector<float>& logits, const Sampling& s, std::mt19937_64& rng) {
  if (s.temperature == 0) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  size_t k = s.top_k > 0 ? std::min<size_t>(size_t(s.top_k), ids.size()) : ids.size();
  std::partial_sort(ids.begin(), ids.begin() + long(k), ids.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  ids.resize(k);
  std::vector<double> p(k);
  double mx = logits[size_t(ids[0])], sum = 0;
  for (size_t i = 0; i < k; ++i)
    sum += p[i] = std::exp((double(logits[size_t(ids[i])]) - mx) / s.temperature);
  double cum = 0;
  size_t keep = k;
  for (size_t i = 0; i < k; ++i) {
    cum += p[i] / sum;
    if (cum >= s.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::discrete_distribution<size_t> d(p.begin(), p.begin() + long(keep));
  return ids[d(rng)];
}

std::string jstr(const std::string& s) { return "\"" + json_escape(s) + "\""; }
std::string jnum(double x) {
  std::ostringstream os;
  os << x;
  return std::isfinite(x) ? os.str() : "null";
}
std::string jids(const std::vector<int32_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}
double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// The process's own peak resident memory: VmHWM of /proc/self/status. Not getrusage's ru_maxrss, which
// Linux carries over from the parent across fork and exec (a large parent, such as a benchmark driver,
// would set the figure); getrusage only where /proc is absent.
long max_rss_kib() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

// This program's path, to start the ranks of --tp with.
std::string self_exe() {
  std::vector<char> b(4096);
  const ssize_t n = readlink("/proc/self/exe", b.data(), b.size() - 1);
  MP_USER_CHECK(n > 0, "--tp: cannot find this program's path (/proc/self/exe)");
  return std::string(b.data(), size_t(n));
}

// --target cuda: the GPU engine in one launch mode, greedy. The prompt runs position by position; then
// tokens come in chunks (each a run of positions with no host round trip between them), streamed as each
// chunk completes; decoding stops at the end-of-generation token.
int generate_cuda(const models::LlamaConfig& cfg, const models::GgufFile* file, const models::Tokenizer* tok,
                  const std::string& text, const std::vector<int32_t>& prompt, int64_t n,
                  const cuda::LlamaGpuOptions& o, bool json, bool quiet, uint64_t seed,
                  const std::optional<std::string>& trace_file) {
  auto shapes = cuda::shapes_of(cfg, models::rope_frequency);
  double t_load = now_ms();
  std::unique_ptr<cuda::LlamaGpu> gpu;
  if (file) {
    models::RunnerOptions ro;
    ro.context = 1;  // only the weight bindings are used
    auto bind = models::LlamaRunner::from_gguf(*file, ro);
    gpu = cuda::LlamaGpu::create(shapes, bind->weights(), o);
  } else {
    gpu = cuda::LlamaGpu::random(shapes, o, seed);
  }
  t_load = now_ms() - t_load;
  auto emit = [&](int32_t id) {
    if (!quiet) std::cout << (tok ? tok->token_bytes(id) : " " + std::to_string(id)) << std::flush;
  };
  if (!quiet) std::cout << (tok ? tok->decode(prompt) : text) << std::flush;
  double t0 = now_ms();
  gpu->feed(prompt);
  std::vector<int32_t> out = {gpu->last_prediction()};
  const double t_prompt = now_ms() - t0;
  emit(out[0]);
  bool ended = tok && tok->is_end_of_generation(out[0]);
  const int64_t kv0 = gpu->stats().kv_bytes_read, launches0 = gpu->stats().launches;
  int64_t decoded = 0;
  double t_decode = 0;
  while (!ended && int64_t(out.size()) < n) {
    const int64_t k = std::min<int64_t>(8, n - int64_t(out.size()));
    double t = now_ms();
    auto more = gpu->generate(k);
    t_decode += now_ms() - t;
    decoded += k;
    for (int32_t id : more) {
      out.push_back(id);
      emit(id);
      if (tok && tok->is_end_of_generation(id)) {
        ended = true;
        break;
      }
    }
  }
  const auto& st = gpu->stats();
  const double ms_tok = decoded ? t_decode / double(decoded) : 0.0;
  const double launches_tok = decoded ? double(st.launches - launches0) / double(decoded)
                                      : double(gpu->schedule().launches_per_token());
  const double bytes = double(st.weight_bytes) * double(decoded) + double(st.kv_bytes_read - kv0);
  const double gbps = t_decode > 0 ? bytes / (t_decode / 1e3) / 1e9 : 0.0;
  std::string gen_text;
  if (tok) {
    gen_text = tok->decode(out);
  } else {
    for (auto id : out) gen_text += (gen_text.empty() ? "" : " ") + std::to_string(id);
  }
  std::ostringstream s;
  s << "\n\nmodel: " << cfg.name << " (" << cfg.summary() << "), "
    << (file ? std::string("GGUF weights (") + cuda::to_string(o.weights) + ")" : "random bf16 weights")
    << "\n";
  s << "gpu: " << gpu->device_name() << ", " << st.sm_count << " SMs, " << st.workers << " blocks; "
    << gpu->schedule().summary() << "\n";
  if (o.tp >= 1)
    s << "tensor parallel: " << o.tp << (o.tp_local ? " shards on this GPU (one process)" : " GPUs (NCCL)")
      << ", " << gpu->schedule().all_reduces_per_token() << " all-reduces per token\n";
  s << "load: " << format_ms(t_load) << "\n";
  s << "prompt eval: " << prompt.size() << " tokens in " << format_ms(t_prompt) << "\n";
  s << "decode: " << decoded << " tokens in " << format_ms(t_decode) << " (" << jnum(ms_tok) << " ms/token, "
    << jnum(decoded ? 1e3 / ms_tok : 0.0) << " tokens/s)\n";
  s << "launches per token: " << jnum(launches_tok) << "\n";
  s << "bandwidth: " << jnum(gbps) << " GB/s (" << jnum(double(st.weight_bytes) / 1e9)
    << " GB of weights per token, plus the KV cache read)\n";
  if (trace_file) {
    // The last position run: a decode step when there was one, else the prompt's last position. The
    // ranks of --tp other than 0 write FILE.rankN (each its own tasks).
    const auto times = gpu->trace();
    const std::string path =
        o.tp >= 1 && !o.tp_local && o.tp_rank > 0 ? *trace_file + ".rank" + std::to_string(o.tp_rank) : *trace_file;
    std::ofstream f(path);
    if (!f) throw user_error("--gpu-trace: cannot write '" + path + "'");
    f << cuda::trace_csv(gpu->schedule(), times);
    if (!f.flush()) throw user_error("--gpu-trace: writing '" + path + "' failed");
    s << cuda::trace_summary(gpu->schedule(), times, gpu->op_weight_bytes()) << "(per task: " << path
      << ")\n";
  }
  std::cout << s.str();
  if (json) {
    std::cout << "{\"model\": " << jstr(cfg.name)
              << ", \"target\": \"cuda\", \"launch\": " << jstr(cuda::to_string(o.launch))
              << ", \"prompt_tokens\": " << jids(prompt) << ", \"tokens\": " << jids(out)
              << ", \"text\": " << jstr(gen_text) << ", \"prompt_ms\": " << jnum(t_prompt)
              << ", \"decode_ms\": " << jnum(t_decode) << ", \"decode_calls\": " << decoded
              << ", \"ms_per_token\": " << jnum(ms_tok)
              << ", \"decode_tokens_per_s\": " << jnum(decoded ? 1e3 / ms_tok : 0.0)
              << ", \"launches_per_token\": " << jnum(launches_tok) << ", \"tp\": " << std::max(o.tp, 1)
              << ", \"all_reduces_per_token\": " << gpu->schedule().all_reduces_per_token()
              << ", \"bandwidth_gb_per_s\": " << jnum(gbps) << ", \"weight_bytes\": " << st.weight_bytes
              << ", \"context\": " << gpu->context() << "}\n";
  }
  return 0;
}

int run_generate(Args& a) {
  auto model_opt = a.value({"--model", "-m"});
  auto shapes = a.value({"--shapes"});
  auto prompt_opt = a.value({"--prompt", "-p"});
  auto chat_opt = a.value({"--chat"});
  auto n_opt = a.integer({"-n", "--n-predict"});
  auto temp_opt = a.value({"--temperature", "--temp"});
  auto topk_opt = a.integer({"--top-k"});
  auto topp_opt = a.value({"--top-p"});
  auto seed_opt = a.integer({"--seed"});
  auto threads_opt = a.integer({"--threads", "-t"});
  auto ctx_opt = a.integer({"--ctx", "-c"});
  auto target = a.value({"--target"}).value_or("cpu");
  auto launch_opt = a.value({"--launch"});
  auto gpu_weights_opt = a.value({"--gpu-weights"});
  auto gpu_tune_opt = a.value({"--gpu-tune"});
  auto gpu_trace_opt = a.value({"--gpu-trace"});
  auto tp_opt = a.integer({"--tp"});
  bool tp_local = a.flag({"--tp-local"});
  bool json = a.flag({"--json"});
  bool quiet = a.flag({"--quiet"});
  auto pos = a.positionals();
  a.finish();
  if (!pos.empty())
    throw usage_error("unexpected argument '" + pos[0] + "' (the prompt goes after --prompt)");
  if (target != "cpu" && target != "cuda")
    throw usage_error("unknown --target '" + target + "' for generate (cpu, cuda)");
  if ((launch_opt || gpu_weights_opt || gpu_tune_opt || gpu_trace_opt || tp_opt || tp_local) &&
      target != "cuda")
    throw usage_error(std::string(launch_opt        ? "--launch"
                                  : gpu_weights_opt ? "--gpu-weights"
                                  : gpu_tune_opt    ? "--gpu-tune"
                                  : gpu_trace_opt   ? "--gpu-trace"
                                  : tp_opt          ? "--tp"
                                                    : "--tp-local") +
                      " needs --target cuda");
  if (tp_opt && (*tp_opt < 1 || *tp_opt > 64))
    throw usage_error("--tp " + std::to_string(*tp_opt) +
                      " must be in [1, 64] (GPUs to split the model over)");
  if (tp_local && !tp_opt) throw usage_error("--tp-local needs --tp N (the shards to run on this GPU)");
  if (gpu_trace_opt && gpu_trace_opt->empty()) throw usage_error("--gpu-trace needs a file name for the CSV");
  cuda::LlamaGpuOptions gpu_opt;
  if (launch_opt) gpu_opt.launch = cuda::parse_launch(*launch_opt);
  if (gpu_weights_opt && *gpu_weights_opt != "native" && *gpu_weights_opt != "bf16")
    throw usage_error("--gpu-weights '" + *gpu_weights_opt + "': native (Q8_0 / Q4_1 kept) or bf16");
  if (gpu_weights_opt == "bf16") gpu_opt.weights = cuda::GpuWeights::bf16;
  if (gpu_tune_opt) cuda::apply_tuning(*gpu_tune_opt, gpu_opt);
  gpu_opt.trace = gpu_trace_opt.has_value();
  if (prompt_opt && chat_opt) throw usage_error("give either --prompt or --chat, not both");
  if (model_opt && shapes) throw usage_error("give either --model or --shapes, not both");

  auto parse_double = [](const std::string& name, const std::string& v) {
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x))
      throw usage_error(name + " expects a number, got '" + v + "'");
    return x;
  };
  int64_t n = n_opt.value_or(64);
  if (n < 1 || n > 1000000)
    throw usage_error("-n " + std::to_string(n) +
                      ": the number of tokens to generate must be in [1, 1000000]");
  Sampling smp;
  if (temp_opt) smp.temperature = parse_double("--temperature", *temp_opt);
  if (smp.temperature < 0 || smp.temperature > 100)
    throw usage_error("--temperature " + jnum(smp.temperature) + " must be in [0, 100] (0 = greedy)");
  if (topk_opt) smp.top_k = *topk_opt;
  if (smp.top_k < 0) throw usage_error("--top-k " + std::to_string(smp.top_k) + " must be >= 0 (0 = no cut)");
  if (topp_opt) smp.top_p = parse_double("--top-p", *topp_opt);
  if (!(smp.top_p > 0 && smp.top_p <= 1))
    throw usage_error("--top-p " + jnum(smp.top_p) + " must be in (0, 1]");
  if (seed_opt && *seed_opt < 0) throw usage_error("--seed must be >= 0");
  smp.seed = seed_opt ? uint64_t(*seed_opt) : fresh_seed();
  int64_t threads = threads_opt.value_or(ThreadPool::default_threads());
  if (threads < 1 || threads > 1024)
    throw usage_error("--threads " + std::to_string(threads) + " must be in [1, 1024]");
  if (ctx_opt && *ctx_opt < 1) throw usage_error("--ctx must be >= 1");

  // The model: a GGUF file (default: the installed SmolLM2) or a preset's shapes with random weights.
  std::optional<models::GgufFile> file;
  std::optional<models::Tokenizer> tok;
  models::LlamaConfig cfg;
  if (shapes) {
    cfg = models::LlamaConfig::preset(*shapes);
  } else {
    std::string path = model_opt ? *model_opt : models::default_model_path();
    file.emplace(models::GgufFile::open(path));
    cfg = models::LlamaConfig::from_gguf(*file);
    tok.emplace(models::Tokenizer::from_gguf(*file));
  }

  std::string text = chat_opt ? *chat_opt : prompt_opt.value_or("Once upon a time");
  std::vector<int32_t> prompt;
  if (tok) {
    prompt = chat_opt ? tok->encode(tok->chat_prompt(text), true) : tok->encode(text, true);
  } else {  // random weights have no tokenizer: one token per byte of the prompt
    for (unsigned char ch : text) prompt.push_back(int32_t(ch % uint32_t(cfg.vocab)));
  }
  MP_USER_CHECK(!prompt.empty(), "the prompt is empty; give --prompt TEXT");
  const int64_t P = int64_t(prompt.size());
  MP_USER_CHECK(P < cfg.context, "the prompt has ", P, " tokens but the model's context is ", cfg.context,
                " tokens; shorten the prompt");
  int64_t ctx = ctx_opt ? *ctx_opt : std::min<int64_t>(cfg.context, (P + n + 255) / 256 * 256);
  MP_USER_CHECK(ctx <= cfg.context, "--ctx ", ctx, " exceeds the model's context of ", cfg.context,
                " tokens");
  MP_USER_CHECK(P + n - 1 <= ctx, "the prompt (", P, " tokens) and ", n, " new tokens need ", P + n - 1,
                " positions but the context is ", ctx, " tokens; lower -n or raise --ctx");

  if (target == "cuda") {
    if (smp.temperature != 0) throw not_supported("sampling on the GPU (--target cuda decodes greedily)");
    gpu_opt.context = ctx;
    if (tp_opt) {
      // Checked before any process starts: the split, NCCL, the GPUs.
      cuda::shard_shapes(cuda::shapes_of(cfg, models::rope_frequency), int(*tp_opt));
      gpu_opt.tp = int(*tp_opt);
      gpu_opt.tp_local = tp_local;
      if (!tp_local) {
        auto env = cuda::tp::rank_env();
        if (!env) {  // the supervisor: one process per GPU, this command line each
          cuda::check_tp_machine(int(*tp_opt));
          std::vector<std::string> argv = {self_exe(), "generate"};
          for (auto& t : a.tokens()) argv.push_back(t);
          // Random weights: every rank draws its shard of the same matrices (a seed --seed accepts: >= 0
          // as a signed 64-bit number).
          if (!seed_opt) argv.insert(argv.end(), {"--seed", std::to_string(smp.seed >> 1)});
          return cuda::tp::run_ranks(argv, int(*tp_opt));
        }
        MP_USER_CHECK(env->size == *tp_opt, "--tp ", *tp_opt, " but this rank was started as one of ",
                      env->size);
        gpu_opt.tp_rank = env->rank;
        gpu_opt.tp_id_file = env->id_file;
      }
    }
    return generate_cuda(cfg, file ? &*file : nullptr, tok ? &*tok : nullptr, text, prompt, n, gpu_opt, json,
                         quiet, smp.seed, gpu_trace_opt);
  }

  models::RunnerOptions ro;
  ro.threads = int(threads);
  ro.context = ctx;
  auto runner = file ? models::LlamaRunner::from_gguf(*file, ro)
                     : models::LlamaRunner::random(cfg, ro, smp.seed, quant::QType::Q4_1, true);
  double t_load = now_ms();
  runner->prepare(P);
  runner->prepare(1);
  t_load = now_ms() - t_load;

  std::mt19937_64 rng(smp.seed);
  auto emit = [&](int32_t id) {
    if (quiet) return;
    std::cout << (tok ? tok->token_bytes(id) : " " + std::to_string(id)) << std::flush;
  };
  if (!quiet) std::cout << (tok ? tok->decode(prompt) : text) << std::flush;
  // On a terminal the streamed text shows the progress; the line is for output going elsewhere.
  Progress bar("metapipe generate", quiet || isatty(1) == 1);
  double t0 = now_ms();
  std::vector<float> logits = runner->forward(prompt);
  double t_prompt = now_ms() - t0;
  std::vector<int32_t> out;
  double t_decode = 0;
  int64_t decode_calls = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t id = sample(logits, smp, rng);
    out.push_back(id);
    emit(id);
    bar.update(double(i + 1), double(n));
    if ((tok && tok->is_end_of_generation(id)) || i + 1 == n) break;
    double t = now_ms();
    logits = runner->forward({id});
    t_decode += now_ms() - t;
    ++decode_calls;
  }
  bar.finish();
  double prompt_tps = double(P) / (t_prompt / 1e3);
  double decode_tps = decode_calls ? double(decode_calls) / (t_decode / 1e3) : 0.0;
  std::string gen_text;
  if (tok) {
    gen_text = tok->decode(out);
  } else {
    for (auto id : out) gen_text += (gen_text.empty() ? "" : " ") + std::to_string(id);
  }
  std::ostringstream st;
  st << "\n\nmodel: " << cfg.name << " (" << cfg.summary() << "), "
     << (file ? "GGUF weights" : "random Q4_1 weights") << ", " << threads << " threads, kernels "
     << cpu::kernel_isa() << "\n";
  st << "plan: " << format_ms(t_load) << " (" << runner->stats(1).str() << ")\n";
  st << "prompt eval: " << P << " tokens in " << format_ms(t_prompt) << " (" << jnum(prompt_tps)
     << " tokens/s)\n";
  st << "decode: " << decode_calls << " tokens in " << format_ms(t_decode) << " (" << jnum(decode_tps)
     << " tokens/s)\n";
  st << "memory: max RSS " << max_rss_kib() / 1024 << " MiB (weights " << runner->weight_bytes() / (1 << 20)
     << " MiB, KV cache " << runner->kv_cache_bytes() / (1 << 20) << " MiB for " << ctx << " positions)\n";
  std::cout << st.str();
  if (json) {
    std::cout << "{\"model\": " << jstr(cfg.name) << ", \"prompt_tokens\": " << jids(prompt)
              << ", \"tokens\": " << jids(out) << ", \"text\": " << jstr(gen_text)
              << ", \"prompt_tokens_per_s\": " << jnum(prompt_tps)
              << ", \"decode_tokens_per_s\": " << jnum(decode_tps) << ", \"prompt_ms\": " << jnum(t_prompt)
              << ", \"decode_ms\": " << jnum(t_decode) << ", \"decode_calls\": " << decode_calls
              << ", \"threads\": " << threads << ", \"context\": " << ctx
              << ", \"isa\": " << jstr(cpu::kernel_isa()) << ", \"max_rss_kib\": " << max_rss_kib()
              << ", \"weight_bytes\": " << runner->weight_bytes()
              << ", \"kv_cache_bytes\": " << runner->kv_cache_bytes() << "}\n";
  }
  return 0;
}

// The demo row: SmolLM2 (the installed GGUF) greedy from a fixed prompt on the CPU engine, checked against
// the NumPy reference (tests/models/reference_llama.py) run live when its venv and the source tree are
// present; otherwise, and with --quick, against the reference interpreter running the same program on
// the dequantized weights (prompt logits and first token). Measures decode and prompt tokens/s.
std::string reference_python() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string cache = xdg && *xdg ? xdg : std::string(home ? home : "") + "/.cache";
  std::string py = cache + "/metapipe/venv/bin/python";
  return std::ifstream(py) ? py : "";
}
std::string reference_script() {
#ifdef MP_SOURCE_DIR
  std::string s = std::string(MP_SOURCE_DIR) + "/tests/models/reference_llama.py";
  if (std::ifstream(s)) return s;
#endif
  return "";
}

std::vector<DemoRow> smollm2_rows(const DemoContext& ctx) {
  if (!ctx.wants("cpu")) return {};
  DemoRow row{"smollm2-135m", "cpu", "", "", true};
  std::string path;
  try {
    path = models::default_model_path();
  } catch (const user_error& e) {
    row.check = std::string("skipped: ") + e.what();
    return {row};
  }
  try {
    auto f = models::GgufFile::open(path);
    auto cfg = models::LlamaConfig::from_gguf(f);
    auto tok = models::Tokenizer::from_gguf(f);
    const std::vector<int32_t> prompt = tok.encode("The capital of France is", true);
    const int n_check = 4, n_time = ctx.quick ? 8 : 32;
    models::RunnerOptions ro{ThreadPool::default_threads(), 256};
    auto r = models::LlamaRunner::from_gguf(f, ro);
    r->prepare(int64_t(prompt.size()));
    r->prepare(1);
    double t0 = now_ms();
    std::vector<float> logits = r->forward(prompt);
    double t_prompt = now_ms() - t0;
    const std::vector<float> first_logits = logits;
    std::vector<int32_t> got;
    double t_dec = 0;
    for (int i = 0; i < n_time; ++i) {
      got.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 == n_time) break;
      double t = now_ms();
      logits = r->forward({got.back()});
      t_dec += now_ms() - t;
    }
    std::ostringstream m;
    m.precision(3);
    m << double(n_time - 1) / (t_dec / 1e3) << " tok/s decode, " << double(prompt.size()) / (t_prompt / 1e3)
      << " tok/s prompt";
    row.measure = m.str();
    std::vector<int32_t> ours(got.begin(), got.begin() + n_check);
    std::string py = reference_python(), script = reference_script();
    if (!ctx.quick && !py.empty() && !script.empty()) {
      std::string ids;
      for (auto t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
      std::string cmd = py + " '" + script + "' --model '" + path + "' --tokens " + ids + " -n " +
                        std::to_string(n_check) + " 2>&1";
      std::string out;
      FILE* p = popen(cmd.c_str(), "r");
      char buf[4096];
      size_t k;
      while (p && (k = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, k);
      int status = p ? pclose(p) : -1;
      std::vector<int32_t> ref;
      std::stringstream ss(out);
      std::string item;
      while (status == 0 && std::getline(ss, item, ',')) ref.push_back(std::stoi(item));
      row.ok = status == 0 && ref == ours;
      row.check =
          row.ok ? "ok (" + std::to_string(n_check) + " greedy tokens = NumPy reference, live)"
                 : "FAIL: greedy tokens " + jids(ours) + " vs NumPy reference " + (status ? out : jids(ref));
      return {row};
    }
    // The same program on the reference interpreter, weights dequantized to float.
    models::LlamaProgramOptions po;
    po.tokens = int64_t(prompt.size());
    po.context = 256;
    ir::Program prog = models::build_llama_program(cfg, po);
    std::map<std::string, std::vector<float>> in;
    for (auto& [name, q] : r->weights()) {
      std::vector<float> w(size_t(q.rows * q.cols));
      uint64_t rb = *quant::row_bytes(q.type, q.cols);
      for (int64_t i = 0; i < q.rows; ++i)
        quant::dequantize_row(q.type, static_cast<const uint8_t*>(q.data) + i * rb, &w[size_t(i * q.cols)],
                              q.cols);
      in[name] = std::move(w);
    }
    for (int64_t l = 0; l < cfg.layers; ++l)
      for (const char* c : {"cache_k", "cache_v"})
        in[models::layer_tensor(l, c)].assign(size_t(256 * cfg.kv_heads * cfg.head_dim), 0.f);
    for (size_t t = 0; t < prompt.size(); ++t)
      in["tokens"].push_back(float(prompt[t])), in["pos"].push_back(float(t));
    cpu::Memory mem = cpu::make_memory(prog, in);
    in.clear();
    cpu::interpret(prog, mem);
    const auto& want = mem.at("logits").data;
    double md = 0;
    for (size_t i = 0; i < want.size(); ++i) md = std::max(md, std::fabs(double(want[i]) - first_logits[i]));
    int32_t want_first = int32_t(std::max_element(want.begin(), want.end()) - want.begin());
    row.ok = want_first == got[0] && md < 1.5;
    std::ostringstream c;
    c.precision(3);
    c << (row.ok ? "ok (" : "FAIL: (") << "first token " << got[0] << (want_first == got[0] ? " = " : " vs ")
      << "interpreter's " << want_first << ", prompt logits max diff " << md << " <= 1.5"
      << (py.empty() || script.empty() ? "; no NumPy reference here" : "") << ")";
    row.check = c.str();
  } catch (const std::exception& e) {
    row.ok = false;
    row.check = std::string("FAIL: ") + e.what();
  }
  return {row};
}
MP_REGISTER_DEMO("smollm2-cpu", 20, smollm2_rows);

// The GPU rows: SmolLM2 greedy in each launch mode, the first tokens checked against the CPU engine's,
// then ms/token and launches per token over a short decode.
std::vector<DemoRow> smollm2_gpu_rows(const DemoContext& ctx) {
  if (!ctx.gpu || !ctx.wants("cuda")) return {};
  std::vector<DemoRow> rows;
  try {
    auto f = models::GgufFile::open(models::default_model_path());
    auto cfg = models::LlamaConfig::from_gguf(f);
    auto tok = models::Tokenizer::from_gguf(f);
    const std::vector<int32_t> prompt = tok.encode("The capital of France is", true);
    const int n_check = 8, n_time = ctx.quick ? 16 : 64;
    models::RunnerOptions ro{ThreadPool::default_threads(), 256};
    auto cpu_runner = models::LlamaRunner::from_gguf(f, ro);
    std::vector<float> logits = cpu_runner->forward(prompt);
    std::vector<int32_t> want;
    for (int i = 0; i < n_check; ++i) {
      want.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      if (i + 1 < n_check) logits = cpu_runner->forward({want.back()});
    }
    for (auto mode : {cuda::Launch::per_op, cuda::Launch::per_layer, cuda::Launch::megakernel}) {
      DemoRow row{"smollm2-135m", std::string("cuda:") + cuda::to_string(mode), "", "", true};
      try {
        cuda::LlamaGpuOptions o;
        o.launch = mode, o.context = 256;
        auto g =
            cuda::LlamaGpu::create(cuda::shapes_of(cfg, models::rope_frequency), cpu_runner->weights(), o);
        g->feed(prompt);
        std::vector<int32_t> got = {g->last_prediction()};
        auto more = g->generate(n_check - 1);
        got.insert(got.end(), more.begin(), more.end());
        const int64_t l0 = g->stats().launches;
        double t = now_ms();
        g->generate(n_time);
        t = now_ms() - t;
        row.ok = got == want;
        row.check = row.ok ? "ok (" + std::to_string(n_check) + " greedy tokens = CPU engine)"
                           : "FAIL: greedy tokens " + jids(got) + " vs CPU " + jids(want);
        std::ostringstream m;
        m.precision(3);
        m << t / n_time << " ms/token, " << double(g->stats().launches - l0) / n_time << " launches/token";
        row.measure = m.str();
      } catch (const std::exception& e) {
        row.ok = false;
        row.check = std::string("FAIL: ") + e.what();
      }
      rows.push_back(row);
    }
  } catch (const user_error& e) {
    rows.push_back({"smollm2-135m", "cuda", std::string("skipped: ") + e.what(), "", true});
  }
  return rows;
}
MP_REGISTER_DEMO("smollm2-cuda", 21, smollm2_gpu_rows);

// `metapipe info`: what `generate --tp` can use here.
std::vector<std::string> tp_info() {
  const int gpus = cuda::visible_gpus();
  return {std::string("NCCL ") + (cuda::have_nccl() ? "in this build" : "not in this build (--tp is an error)") +
              "; " + std::to_string(gpus) + " GPU" + (gpus == 1 ? "" : "s") + " visible" +
              (cuda::have_nccl() && gpus >= 1 ? ": generate --target cuda --tp N for N up to " + std::to_string(gpus)
                                              : ""),
          "--tp N --tp-local: the N shards on one GPU in one process (no NCCL needed; a check of the sharding)"};
}
MP_REGISTER_INFO("tensor parallelism (generate --tp)", tp_info);

}  // namespace

MP_REGISTER_COMMAND(
    "generate", "generate text from a Llama GGUF model on the CPU or GPU (SmolLM2-135M by default)",
    "usage: metapipe generate [--model FILE.gguf | --shapes PRESET] [--prompt TEXT | --chat TEXT] [-n N]\n"
    "                         [--temperature T] [--top-k K] [--top-p P] [--seed S] [--threads N]\n"
    "                         [--ctx N] [--target cpu|cuda] [--launch MODE] [--gpu-weights W]\n"
    "                         [--gpu-tune LIST] [--gpu-trace FILE] [--tp N [--tp-local]] [--json]\n"
    "                         [--quiet]\n\n"
    "Runs the Llama program that metapipe generates for the model's shapes on the CPU engine with the\n"
    "file's quantized weights, streams the text, then prints prompt and decode tokens/s.\n\n"
    "  --model FILE     a GGUF file (general.architecture llama); default: SmolLM2-135M-Instruct Q4_1,\n"
    "                   installed by scripts/install-deps\n"
    "  --shapes PRESET  random Q4_1 weights of a preset's shapes: smollm2-135m, llama3.1-8b, toy (the\n"
    "                   layers share one set of matrices; the prompt's bytes are the token ids)\n"
    "  --prompt TEXT    the text to continue (default \"Once upon a time\")\n"
    "  --chat TEXT      a user message in the model's chat format\n"
    "  -n N             tokens to generate (default 64); stops early at the end-of-generation token\n"
    "  --temperature T  0 (default) = greedy; > 0 samples from softmax(logits / T)\n"
    "  --top-k K        sample among the K most likely tokens (0 = all, the default)\n"
    "  --top-p P        sample from the smallest set whose probability reaches P (default 1)\n"
    "  --seed S         seed of the sampler (default: fresh)\n"
    "  --threads N      worker threads (default: all cores)\n"
    "  --ctx N          KV-cache positions (default: prompt + N rounded up to 256, at most the model's)\n"
    "  --target cuda    decode on the GPU (greedy), printing ms/token, launches per token, bandwidth;\n"
    "                   --shapes then gives random bf16 weights made on the GPU, each layer its own\n"
    "  --launch MODE    with --target cuda: per-op (a kernel per operation), per-layer (one per decoder\n"
    "                   layer) or megakernel (one persistent kernel per token; the default)\n"
    "  --gpu-weights W  with --target cuda: native (Q8_0 / Q4_1 stay quantized; the default) or bf16\n"
    "  --gpu-tune LIST  with --target cuda: tuning switches, comma-separated: min-blocks=2|3|4,\n"
    "                   loads=4|8 (8 needs min-blocks 3 or 2; by default 8 with min-blocks=2, else\n"
    "                   4), prefetch-kib=N|all,\n"
    "                   split=balanced|two-per-worker, fetch-ahead=0|1, stream=0..8 (bf16 rows through\n"
    "                   a shared-memory ring), seg-kib=1..16, combine=separate|fused|last,\n"
    "                   rope=attention|separate (RoPE and the KV append in the attention tasks or a step\n"
    "                   of their own), slices=auto|1|2|4|8 (column slices per GEMV row),\n"
    "                   l2-ahead-kib=N (the O projection's first N KiB into L2 during the attention;\n"
    "                   0 none), l2-hint=first|normal (the weights' loads L2 evict-first or not),\n"
    "                   preload=0|1 (short bf16 rows' first loads before the task's wait),\n"
    "                   pdl=0|1 (per-layer: each layer's launch overlaps the end of the one before)\n"
    "                   (defaults min-blocks=2,loads=8,prefetch-kib=32,split=balanced,\n"
    "                   fetch-ahead=0,stream=0,seg-kib=4,combine=last,rope=attention,slices=auto,\n"
    "                   l2-ahead-kib=0,l2-hint=first,preload=1,pdl=1;\n"
    "                   docs/llama-gpu.md)\n"
    "  --gpu-trace FILE with --target cuda: time every task of the last position (GPU timer), print where\n"
    "                   the time went per operation role and write one CSV row per task to FILE\n"
    "  --tp N           with --target cuda: tensor parallelism over N GPUs (heads and FFN columns split,\n"
    "                   an all-reduce through NCCL after the attention output and the down projection);\n"
    "                   metapipe starts one process per GPU itself; rank 0 prints\n"
    "  --tp-local       with --tp N: all N shards on this one GPU in one process, summed without NCCL\n"
    "                   (checks the sharding where there are fewer GPUs; not faster)\n"
    "  --json           last line of stdout: {prompt_tokens, tokens, text, prompt_tokens_per_s,\n"
    "                   decode_tokens_per_s, ...}\n"
    "  --quiet          do not stream the text, and no progress line (shown on stderr when it is a\n"
    "                   terminal and stdout is not, once a generation takes 2 s)\n",
    run_generate);

}  // namespace mp::cli
