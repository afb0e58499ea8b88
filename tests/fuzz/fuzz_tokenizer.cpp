// libFuzzer target for the tokenizer on arbitrary text: with the default model's vocabulary (SmolLM2,
// installed by scripts/install-deps), any bytes must encode and decode back to exactly the same bytes, or
// end in a user_error (a byte the vocabulary has no token for); every id is in range and the tokens' bytes
// concatenate to the decoded text. Built by the `fuzz` preset; replayed over tests/fuzz/corpus_tokenizer by
// test_fuzz_corpus (skipped where the model is not installed).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "models/gguf.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"

namespace mp::fuzz {

// The default model's tokenizer, built once; nullptr when the model is not installed.
const mp::models::Tokenizer* default_tokenizer() {
  static const std::unique_ptr<mp::models::Tokenizer> tok = []() -> std::unique_ptr<mp::models::Tokenizer> {
    try {
      const auto f = mp::models::GgufFile::open(mp::models::default_model_path());
      return std::make_unique<mp::models::Tokenizer>(mp::models::Tokenizer::from_gguf(f));
    } catch (const mp::user_error&) {
      return nullptr;
    }
  }();
  return tok.get();
}

// Any violated property is an internal_error, which neither libFuzzer nor the replay test lets through.
void tokenizer_one(std::string_view text) {
  const mp::models::Tokenizer* tok = default_tokenizer();
  MP_INTERNAL_CHECK(tok != nullptr, "fuzz_tokenizer: no default model");
  std::vector<int32_t> ids;
  try {
    ids = tok->encode(text, false);
  } catch (const mp::user_error&) {
    return;  // a byte without a token: the message names it
  }
  std::string joined;
  for (int32_t id : ids) {
    MP_INTERNAL_CHECK(id >= 0 && id < tok->vocab_size(), "token id ", id, " out of range");
    joined += tok->token_bytes(id);
  }
  const std::string back = tok->decode(ids);
  MP_INTERNAL_CHECK(back == text, "decode(encode(text)) differs from the text");
  MP_INTERNAL_CHECK(joined == back, "token_bytes do not concatenate to decode");
  // With specials added the text is the same after whatever the file puts in front (BOS, if any).
  const std::string with = tok->decode(tok->encode(text, true));
  MP_INTERNAL_CHECK(
      with.size() >= text.size() && std::string_view(with).substr(with.size() - text.size()) == text,
      "decode(encode(text, true)) does not end with the text");
}

}  // namespace mp::fuzz

#ifndef MP_FUZZ_REPLAY
// Nothing to fuzz without a vocabulary: say how to get it instead of reporting every input as a crash.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (!mp::fuzz::default_tokenizer()) {
    std::fprintf(stderr, "fuzz_tokenizer: the default model is missing; run scripts/install-deps\n");
    std::exit(1);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mp::fuzz::tokenizer_one(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
#endif
