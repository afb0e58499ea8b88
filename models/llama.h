// The Llama model as one metapipe IR program, generated for a configuration read from a GGUF file's
// metadata or taken from a preset. The same program runs on the CPU interpreter (toy sizes), on the CPU
// engine with quantized weights (backends/cpu/llm_engine.h) and is what other backends compile.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace mp::models {

class GgufFile;

// Llama 3's RoPE frequency scaling (rope.scaling.type "llama3"): long wavelengths are divided by
// `factor`, short ones kept, a smooth blend between the two wavelength thresholds.
struct RopeScaling {
  double factor = 8, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_context = 8192;
};

struct LlamaConfig {
  std::string name;  // preset name or the file's general.name
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0;
  int64_t context = 0;  // the model's trained context length
  double rope_theta = 10000, rms_eps = 1e-5;
  std::optional<RopeScaling> rope_scaling;
  bool tied_embeddings = true;  // the LM head reads token_embd.weight (no output.weight)

  // From the GGUF metadata (general.architecture must be "llama"; user_error naming the key otherwise).
  static LlamaConfig from_gguf(const GgufFile& f);
  // "smollm2-135m", "llama3.1-8b", "toy" (2 layers, d 64, 4/2 heads of 16, FFN 128, vocab 96, context 64).
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  void check() const;           // user_error naming the first inconsistent field
  std::string summary() const;  // "30 layers, d 576, 9/3 heads of 64, FFN 1536, vocab 49152, ctx 8192"
};

// What one program instance computes: `tokens` new tokens (at the positions in the "pos" input) against
// a KV cache of `context` positions, and the logits of the last of them.
struct LlamaProgramOptions {
  int64_t tokens = 1;
  int64_t context = 0;    // cache positions; 0 = the model's context
  int64_t attn_tile = 0;  // cache positions per attention tile; 0 = the largest divisor of context <= 256
  // Weight rows per streamed tile; 0 = every projection reads its weight whole (the form the CPU engine
  // binds to its quantized kernels). With a tile, each projection is a METAPIPE over row tiles of its
  // weight (LOAD_TILE, double-buffered by the metapipeline pass), so no weight has to fit on chip at once:
  // the form a dataflow accelerator streams from HBM. A tile is the largest divisor of the weight's rows
  // not above this (a multiple of head_dim for Q and K, whose RoPE runs in the same loop).
  int64_t weight_tile = 0;
  // Element type of the weight tensors (f32 for the interpreter and the CPU engine's binding; bf16 for
  // what an accelerator streams, which halves the bytes a simulation moves).
  ir::DType weight_dtype = ir::DType::f32;
  ir::DType cache_dtype = ir::DType::f32;  // of the KV cache, likewise
  // Which part of the model the program holds: the whole model (tokens in, logits out), or only the
  // decoder layers (input "x" [tokens, d_model] in place of the embedding, output "x_out" after the last
  // layer; no final norm, no LM head), which a simulation times apart from the rest.
  enum class Part { Whole, Decoders };
  Part part = Part::Whole;
};

// Names of the program's tensors: weights carry their GGUF names ("blk.3.attn_q.weight"), so a file's
// tensors bind by name. Inputs "tokens" and "pos" ([T, 1] i32), per layer "blk.L.cache_k" / cache_v
// (InOut [context, kv_heads*head_dim]), output "logits" ([1, vocab]).
std::string layer_tensor(int64_t layer, const std::string& what);  // "blk.3.attn_q.weight"
std::vector<std::string> weight_names(const LlamaConfig& c);       // every weight the program reads

// Weight matrices [rows, cols] are GGUF's [dims[1], dims[0]] (a row is one output feature), so every
// projection is MAT_MUL(x, W, transpose_b). RoPE rotates adjacent pairs (2i, 2i+1), as GGUF's Llama
// tensors are stored for.
ir::Program build_llama_program(const LlamaConfig& c, const LlamaProgramOptions& o);

// RoPE frequency of pair i (angle = position * frequency), with the config's scaling applied.
double rope_frequency(const LlamaConfig& c, int64_t pair);

}  // namespace mp::models
