// The GGUF side of the Llama model: the configuration from a file's metadata, and a runner whose
// weights are the file's tensors bound in place (the memory map, never copied).
#include "models/gguf.h"
#include "models/llama.h"
#include "models/llama_runner.h"

namespace mp::models {

LlamaConfig LlamaConfig::from_gguf(const GgufFile& f) {
  std::string arch = f.get_string("general.architecture");
  MP_USER_CHECK(arch == "llama", f.path(), ": general.architecture is '", arch,
                "'; metapipe runs 'llama' models only");
  LlamaConfig c;
  c.name = f.find_string("general.name").value_or(f.path());
  c.layers = f.get_int("llama.block_count");
  c.d_model = f.get_int("llama.embedding_length");
  c.heads = f.get_int("llama.attention.head_count");
  c.kv_heads = f.find_int("llama.attention.head_count_kv").value_or(c.heads);
  c.ffn = f.get_int("llama.feed_forward_length");
  c.context = f.get_int("llama.context_length");
  c.rope_theta = f.find_float("llama.rope.freq_base").value_or(10000.0);
  c.rms_eps = f.get_float("llama.attention.layer_norm_rms_epsilon");
  MP_USER_CHECK(c.heads >= 1 && c.d_model % c.heads == 0, f.path(), ": embedding_length ", c.d_model,
                " is not a multiple of head_count ", c.heads);
  c.head_dim = c.d_model / c.heads;
  if (auto rd = f.find_int("llama.rope.dimension_count"))
    MP_USER_CHECK(*rd == c.head_dim, f.path(), ": llama.rope.dimension_count ", *rd,
                  " differs from the head dimension ", c.head_dim, "; partial RoPE is not supported yet");
  if (auto st = f.find_string("llama.rope.scaling.type")) {
    if (*st == "llama3") {
      RopeScaling s;
      s.factor = f.find_float("llama.rope.scaling.factor").value_or(s.factor);
      s.low_freq_factor = f.find_float("llama.rope.scaling.low_freq_factor").value_or(s.low_freq_factor);
      s.high_freq_factor = f.find_float("llama.rope.scaling.high_freq_factor").value_or(s.high_freq_factor);
      s.original_context =
          f.find_int("llama.rope.scaling.original_context_length").value_or(s.original_context);
      c.rope_scaling = s;
    } else if (*st != "none") {
      throw not_supported("RoPE scaling type '" + *st + "' (" + f.path() + ")");
    }
  }
  if (f.find_tensor("rope_freqs.weight"))
    throw not_supported("per-file RoPE frequency factors (rope_freqs.weight in " + f.path() + ")");
  const GgufTensor& emb = f.tensor("token_embd.weight");
  MP_USER_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.d_model, f.path(),
                ": token_embd.weight has the wrong shape (its rows must be embedding_length ", c.d_model,
                " long)");
  c.vocab = emb.dims[1];
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.check();
  return c;
}

std::unique_ptr<LlamaRunner> LlamaRunner::from_gguf(const GgufFile& f, const RunnerOptions& o) {
  LlamaConfig c = LlamaConfig::from_gguf(f);
  cpu::WeightBindings w;
  for (auto& name : weight_names(c)) {
    const GgufTensor& t = f.tensor(name);
    int64_t cols = t.dims.empty() ? 0 : t.dims[0];
    int64_t rows = t.dims.size() >= 2 ? t.rows() : 1;
    switch (t.type) {
      case quant::QType::F32:
      case quant::QType::F16:
      case quant::QType::BF16:
      case quant::QType::Q4_0:
      case quant::QType::Q4_1:
      case quant::QType::Q8_0:
      case quant::QType::Q4_K:
      case quant::QType::Q6_K:
        break;
      default:
        throw not_supported(f.path() + ": tensor " + name + " of type " + quant::to_string(t.type));
    }
    MP_USER_CHECK(t.dims.size() <= 2, f.path(), ": tensor ", name, " has ", t.dims.size(),
                  " dimensions; a Llama weight has 1 or 2");
    w[name] = cpu::QMatrix{t.type, t.data, rows, cols};
  }
  return std::unique_ptr<LlamaRunner>(new LlamaRunner(std::move(c), std::move(w), o));
}

}  // namespace mp::models
