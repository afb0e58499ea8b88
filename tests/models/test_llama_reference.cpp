// The trained model (SmolLM2-135M-Instruct, Q4_1) on the CPU engine against the independent NumPy
// reference (tests/models/reference_llama.py: the gguf package's dequantization, float32 activations),
// run live on a few prompts: the last prompt position's logits agree within a tolerance, and the greedy
// continuations agree for 32 tokens.
//
// Tolerance: the engine quantizes each matmul's input activations to 8-bit blocks of 32 (as llama.cpp
// does for Q4_1 / Q8_0 weights), half a step of 1/127 of the block's largest value per element: measured
// 0.35-0.55% relative RMS error per matvec on this model's matrices, compounding over 30 layers to logits
// that differ from the reference's float activations by up to ~0.8 (on logits of magnitude 20-35, RMS
// 1-4%). With float weights bound instead, the same program agrees to 4e-5, so the difference is the
// activation quantization alone. We allow max |diff| <= 1.5 and 6% relative RMS.
//
// Greedy tokens: they must agree step by step; the only accepted divergence is at a step where the
// reference's own top-2 margin is below the logit tolerance (a near-tie that 8-bit activations can
// flip, as they can for llama.cpp). There the sequences part and the comparison stops; every prompt must
// agree for at least 4 tokens and at least one for all 32. Measured: both prompts agree for all 32 tokens
// (logits max |diff| 0.71 and 0.80, relative RMS 1.4% and 1.5%); with earlier kernels' rounding the code
// prompt parted after 27 tokens at a reference margin of 0.03, and "The capital of France is" (not in
// the test) parts after 5 at a margin of 0.22.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "models/gguf.h"
#include "models/llama_runner.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"

namespace mp::models {
namespace {

std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    status = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  status = pclose(f);
  return out;
}

// A float32 .npy file (C order): its shape and data.
std::vector<float> read_npy(const std::string& path, std::vector<int64_t>& shape) {
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_GE(all.size(), 10u);
  EXPECT_EQ(all.substr(1, 5), "NUMPY");
  int major = all[6];
  size_t hlen = major == 1
                    ? size_t(uint8_t(all[8])) | size_t(uint8_t(all[9])) << 8
                    : size_t(uint8_t(all[8])) | size_t(uint8_t(all[9])) << 8 | size_t(uint8_t(all[10])) << 16;
  size_t start = major == 1 ? 10 : 12;
  std::string header = all.substr(start, hlen);
  EXPECT_NE(header.find("'<f4'"), std::string::npos) << header;
  auto lp = header.find('('), rp = header.find(')');
  shape.clear();
  std::stringstream ss(header.substr(lp + 1, rp - lp - 1));
  std::string item;
  while (std::getline(ss, item, ','))
    if (item.find_first_not_of(' ') != std::string::npos) shape.push_back(std::stoll(item));
  size_t count = 1;
  for (auto d : shape) count *= size_t(d);
  std::vector<float> v(count);
  EXPECT_EQ(all.size(), start + hlen + count * 4);
  if (all.size() >= start + hlen + count * 4) std::memcpy(v.data(), all.data() + start + hlen, count * 4);
  return v;
}

std::vector<int32_t> parse_ids(const std::string& json, const std::string& key) {
  std::vector<int32_t> ids;
  auto k = json.find("\"" + key + "\": [");
  if (k == std::string::npos) return ids;
  auto b = json.find('[', k), e = json.find(']', b);
  std::stringstream ss(json.substr(b + 1, e - b - 1));
  std::string item;
  while (std::getline(ss, item, ',')) ids.push_back(std::stoi(item));
  return ids;
}

TEST(LlamaReference, SmolLM2LogitsAndGreedyTokens) {
  std::string python = MP_PYTHON;
  if (python.empty() || !std::ifstream(python))
    GTEST_SKIP() << "no reference venv (run scripts/install-deps)";
  std::string model;
  try {
    model = default_model_path();
  } catch (const user_error& e) {
    GTEST_SKIP() << e.what();
  }
  GgufFile f = GgufFile::open(model);
  Tokenizer tok = Tokenizer::from_gguf(f);
  const int n = 32;
  // Two prompts keep the test near two minutes on two cores (the reference dequantizes the file anew
  // for each); the demo row checks a third ("The capital of France is").
  const std::vector<std::string> prompts = {
      "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
      tok.chat_prompt("What are the three primary colors?")};
  const double kLogitTol = 1.5;
  int all_agree = 0;
  for (size_t k = 0; k < prompts.size(); ++k) {
    SCOPED_TRACE("prompt " + std::to_string(k));
    std::vector<int32_t> prompt = tok.encode(prompts[k], true);
    std::string ids;
    for (auto t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
    std::string npy = testing::TempDir() + "llama_ref_logits_" + std::to_string(k) + ".npy";
    int status = 0;
    std::string out =
        run_command(python + " " + MP_REFERENCE_SCRIPT + " --model '" + model + "' --tokens " + ids + " -n " +
                        std::to_string(n) + " --all-logits-out '" + npy + "' --json",
                    status);
    ASSERT_EQ(status, 0) << out;
    std::vector<int32_t> ref_tokens = parse_ids(out, "tokens");
    ASSERT_EQ(int(ref_tokens.size()), n) << out;
    std::vector<int64_t> shape;
    std::vector<float> ref = read_npy(npy, shape);
    std::remove(npy.c_str());
    ASSERT_EQ(shape.size(), 2u);
    const int64_t V = shape[1];
    ASSERT_EQ(V, int64_t(tok.vocab_size()));

    RunnerOptions o;
    o.threads = 2;
    o.context = 256;
    auto r = LlamaRunner::from_gguf(f, o);
    std::vector<float> logits = r->forward(prompt);
    ASSERT_EQ(int64_t(logits.size()), V);
    double mx = 0, md = 0, se = 0, sr = 0;
    for (int64_t i = 0; i < V; ++i) {
      double d = double(logits[size_t(i)]) - ref[size_t(i)];
      mx = std::max(mx, std::fabs(double(ref[size_t(i)])));
      md = std::max(md, std::fabs(d));
      se += d * d, sr += double(ref[size_t(i)]) * ref[size_t(i)];
    }
    EXPECT_LT(md, kLogitTol) << "max |logit| " << mx;
    EXPECT_LT(std::sqrt(se / sr), 0.06);
    std::printf(
        "prompt %zu (%zu tokens): last-position logits max |diff| %.4f (max |logit| %.2f), rel RMS %.2e\n", k,
        prompt.size(), md, mx, std::sqrt(se / sr));

    std::vector<int32_t> got;
    for (int i = 0; i < n; ++i) {
      int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      got.push_back(id);
      if (id != ref_tokens[size_t(i)]) {
        // The reference's own margin at this step says how close the call was.
        const float* row = &ref[size_t(i) * size_t(V)];
        std::vector<float> s(row, row + V);
        std::nth_element(s.begin(), s.begin() + 1, s.end(), std::greater<float>());
        float margin = s[0] - s[1];
        EXPECT_LT(margin, kLogitTol) << "greedy token " << i << ": metapipe " << id << ", reference "
                                     << ref_tokens[size_t(i)] << " although the reference's top-2 margin is "
                                     << margin;
        EXPECT_GE(i, 4) << "greedy tokens part after only " << i << " tokens (reference margin " << margin
                        << ")";
        std::printf("  greedy: %d tokens agree, then a near-tie (reference top-2 margin %.3f)\n", i, margin);
        break;
      }
      if (i + 1 < n) logits = r->forward({id});
    }
    if (got == ref_tokens) {
      ++all_agree;
      std::printf("  greedy: all %d tokens agree\n", n);
    }
  }
  EXPECT_GE(all_agree, 1) << "no prompt's greedy continuation agrees for all " << n << " tokens";
}

}  // namespace
}  // namespace mp::models
