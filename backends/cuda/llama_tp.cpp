// Tensor parallelism's host side: one rank's shard of a Llama model. Megatron-style: Q, K, V and the
// FFN's gate and up are split by rows (whole heads, whole FFN columns), the attention output and down
// projections by columns, so each rank computes a partial sum of the residual's update that one
// all-reduce completes; the embedding, the norms and the LM head stay whole on every rank (each rank then
// computes the same logits and the same greedy token, with no second collective).
#include <cstring>
#include <numeric>
#include <sstream>

#include "backends/cuda/llama_gpu.h"
#include "core/checked.h"
#include "core/error.h"

namespace mp::cuda {

namespace {

// The tp values in [1, 64] that divide every split count.
std::string dividing(const LlamaGpuShapes& s) {
  std::ostringstream os;
  bool first = true;
  for (int t = 1; t <= 64; ++t)
    if (s.heads % t == 0 && s.kv_heads % t == 0 && s.ffn % t == 0 && (s.ffn / t) % 8 == 0) {
      os << (first ? "" : ", ") << t;
      first = false;
    }
  return os.str();
}

// "blk.12.attn_q.weight" -> "attn_q.weight"; "" outside the layers.
std::string layer_tensor(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return "";
  const size_t dot = name.find('.', 4);
  return dot == std::string::npos ? "" : name.substr(dot + 1);
}

}  // namespace

LlamaGpuShapes shard_shapes(const LlamaGpuShapes& full, int tp) {
  full.check();
  MP_USER_CHECK(tp >= 1 && tp <= 64, "--tp ", tp, " must be in [1, 64]");
  auto divides = [&](int64_t v, const char* what) {
    MP_USER_CHECK(v % tp == 0, "--tp ", tp, ": the model '", full.name, "' has ", v, " ", what,
                  ", which do not split over ", tp, " GPUs; --tp values that split it: ", dividing(full));
  };
  divides(full.heads, "query heads");
  divides(full.kv_heads, "KV heads");
  divides(full.ffn, "FFN columns");
  LlamaGpuShapes s = full;
  s.heads /= tp, s.kv_heads /= tp, s.ffn /= tp;
  MP_USER_CHECK(s.ffn % 8 == 0, "--tp ", tp, ": ", s.ffn, " FFN columns per GPU is not a multiple of 8; ",
                "--tp values that split the model '", full.name, "': ", dividing(full));
  if (tp > 1) s.name = full.name + " (shard of " + std::to_string(tp) + ")";
  return s;
}

ShardSlice shard_slice(const std::string& name, const LlamaGpuShapes& full, int rank, int tp) {
  MP_USER_CHECK(tp >= 1 && rank >= 0 && rank < tp, "tensor-parallel rank ", rank, " of ", tp);
  const LlamaGpuShapes s = shard_shapes(full, tp);
  const int64_t d = full.d_model, qw = full.heads * full.head_dim, kvw = full.kv_heads * full.head_dim;
  const std::string t = layer_tensor(name);
  ShardSlice sl;
  auto rows = [&](int64_t all, int64_t part, int64_t cols) {
    sl.full_rows = all, sl.full_cols = cols;
    sl.row0 = rank * part, sl.rows = part, sl.col0 = 0, sl.cols = cols;
  };
  auto cols = [&](int64_t all, int64_t part, int64_t rows_) {
    sl.full_rows = rows_, sl.full_cols = all;
    sl.row0 = 0, sl.rows = rows_, sl.col0 = rank * part, sl.cols = part;
  };
  if (t == "attn_q.weight") {
    rows(qw, s.heads * s.head_dim, d);
  } else if (t == "attn_k.weight" || t == "attn_v.weight") {
    rows(kvw, s.kv_heads * s.head_dim, d);
  } else if (t == "attn_output.weight") {
    cols(qw, s.heads * s.head_dim, d);
  } else if (t == "ffn_gate.weight" || t == "ffn_up.weight") {
    rows(full.ffn, s.ffn, d);
  } else if (t == "ffn_down.weight") {
    cols(full.ffn, s.ffn, d);
  } else {                                                     // whole: the embedding, the norms, the LM head
    sl.full_rows = sl.rows = -1, sl.full_cols = sl.cols = -1;  // the tensor's own shape
  }
  return sl;
}

void check_tp_machine(int tp) {
  if (!have_nccl())
    throw not_supported("--tp: this build has no NCCL (install libnccl-dev or the nvidia-nccl wheel, or set "
                        "MP_NCCL_ROOT, and reconfigure; --tp-local runs the shards on one GPU)");
  const int gpus = visible_gpus();
  MP_USER_CHECK(gpus >= tp, "--tp ", tp, " needs ", tp, " GPUs; this machine has ", gpus,
                " (--tp-local runs the shards on one GPU)");
}

WeightBindings shard_weights(const WeightBindings& w, const LlamaGpuShapes& full, int rank, int tp,
                             std::vector<std::vector<uint8_t>>& storage) {
  WeightBindings out;
  for (const auto& [name, m] : w) {
    const ShardSlice sl = shard_slice(name, full, rank, tp);
    if (sl.rows < 0) {
      out.emplace(name, m);
      continue;
    }
    MP_USER_CHECK(m.rows == sl.full_rows && m.cols == sl.full_cols, "tensor '", name, "' is ", m.rows, " x ",
                  m.cols, "; the model's shapes need ", sl.full_rows, " x ", sl.full_cols);
    const auto rb = quant::row_bytes(m.type, m.cols);
    MP_USER_CHECK(rb.has_value(), "tensor '", name, "': rows of ", m.cols, " ", quant::to_string(m.type),
                  " values are not whole blocks");
    const auto* src = static_cast<const uint8_t*>(m.data);
    if (sl.cols == m.cols) {  // a row slice: a view
      out.emplace(name, cpu::QMatrix{m.type, src + sl.row0 * int64_t(*rb), sl.rows, m.cols});
      continue;
    }
    // A column slice: whole blocks copied where it falls on block boundaries, else f32 values.
    const auto off = quant::row_bytes(m.type, sl.col0), part = quant::row_bytes(m.type, sl.cols);
    std::vector<uint8_t>& buf = storage.emplace_back();
    if (off && part) {
      buf.resize(size_t(*part) * size_t(sl.rows));
      for (int64_t r = 0; r < sl.rows; ++r)
        std::memcpy(buf.data() + size_t(r) * *part, src + r * int64_t(*rb) + int64_t(*off), *part);
      out.emplace(name, cpu::QMatrix{m.type, buf.data(), sl.rows, sl.cols});
    } else {
      buf.resize(size_t(sl.rows * sl.cols) * 4);
      std::vector<float> row(static_cast<size_t>(m.cols));
      for (int64_t r = 0; r < sl.rows; ++r) {
        quant::dequantize_row(m.type, src + r * int64_t(*rb), row.data(), m.cols);
        std::memcpy(buf.data() + size_t(r * sl.cols) * 4, row.data() + sl.col0, size_t(sl.cols) * 4);
      }
      out.emplace(name, cpu::QMatrix{quant::QType::F32, buf.data(), sl.rows, sl.cols});
    }
  }
  return out;
}

}  // namespace mp::cuda
