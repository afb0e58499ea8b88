// libFuzzer target for the GGUF reader and the tokenizer built from a file: any input must either open or
// end in a user_error; an opened file is read through every accessor and every tensor's bytes so that the
// address sanitizer sees a read outside what the reader checked. Built by the `fuzz` preset
// (docs/development.md); replayed over tests/fuzz/corpus_gguf by test_fuzz_corpus.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "models/gguf.h"
#include "models/tokenizer.h"

namespace mp::fuzz {

void gguf_one(const uint8_t* data, size_t size) {
  using namespace mp::models;
  // libFuzzer's buffer is exactly `size` long, so a read past the end is reported.
  try {
    const GgufFile f = GgufFile::from_bytes("fuzz.gguf", data, size);
    for (const auto& k : f.keys()) {
      try {
        (void)f.get_int(k);
      } catch (const mp::user_error&) {
      }
      try {
        (void)f.get_float(k);
      } catch (const mp::user_error&) {
      }
      try {
        (void)f.get_string(k);
      } catch (const mp::user_error&) {
      }
      try {
        (void)f.get_int_array(k);
      } catch (const mp::user_error&) {
      }
      try {
        (void)f.get_float_array(k);
      } catch (const mp::user_error&) {
      }
      try {
        (void)f.get_string_array(k);
      } catch (const mp::user_error&) {
      }
    }
    volatile uint8_t sink = 0;
    for (const GgufTensor& t : f.tensors()) {
      if (f.data_offset() + t.offset + t.nbytes > f.file_bytes()) __builtin_trap();
      if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];
    }
    if (f.has("tokenizer.ggml.tokens")) {
      try {
        const Tokenizer tok = Tokenizer::from_gguf(f);
        (void)tok.decode(tok.encode("Hello 123 <|im_start|>  x\n\xff", true));
        for (int32_t id = 0; id < tok.vocab_size() && id < 64; ++id) (void)tok.token_bytes(id);
        (void)tok.chat_prompt("hi");
      } catch (const mp::user_error&) {
      }
    }
  } catch (const mp::user_error&) {
  }
}

}  // namespace mp::fuzz

#ifndef MP_FUZZ_REPLAY
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mp::fuzz::gguf_one(data, size);
  return 0;
}
#endif
