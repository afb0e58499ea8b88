// The tokenizer a GGUF file describes in its metadata: GPT-2 byte-level BPE with the pre-tokenizer the file
// names (tokenizer.ggml.pre), special/control tokens matched whole, and the file's chat format.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/gguf.h"

namespace mp::models {

class Tokenizer {
 public:
  static Tokenizer from_gguf(
      const GgufFile& f);  // tokenizer.ggml.model == "gpt2" (byte-level BPE); others: not_supported
  // add_special: BOS when the metadata says so; special tokens in the text are matched as tokens.
  std::vector<int32_t> encode(std::string_view text, bool add_special) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // exact bytes
  std::string token_bytes(int32_t id) const;                  // the bytes one token stands for (streaming)
  int32_t bos() const;
  int32_t eos() const;
  bool is_end_of_generation(int32_t id) const;
  int32_t vocab_size() const;
  // The file's chat format (<|im_start|>user ... <|im_end|> <|im_start|>assistant\n).
  std::string chat_prompt(std::string_view user_text) const;

  // Additions: the pre-tokenizer's split of a text without specials (for tests), the token's text as stored.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  const std::string& token_text(int32_t id) const;
  std::string_view pre() const { return pre_; }

 private:
  std::vector<std::pair<size_t, size_t>> pre_spans(std::string_view text) const;  // (byte offset, length)
  std::vector<int32_t> encode_piece(std::string_view piece, size_t at) const;
  void check_id(int32_t id) const;

  std::vector<std::string> tokens_;  // as stored: GPT-2 byte-to-unicode mapped text
  std::vector<std::string> bytes_;   // the bytes each token stands for
  std::vector<int32_t> types_;  // tokenizer.ggml.token_type (1 normal, 3 control, 4 user defined, 6 byte)
  std::unordered_map<std::string, int32_t> by_text_;
  std::unordered_map<std::string, int32_t> merge_rank_;    // "left right" -> rank
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  bool special_first_[256] = {};                           // bytes a special token can start with
  std::vector<int32_t> byte_token_;  // byte value -> token id of its single mapped character
  std::vector<int32_t> end_ids_;
  int32_t bos_ = -1, eos_ = -1;
  bool add_bos_ = false;
  std::string pre_;
  std::string chat_system_;      // default system message of the template, "" when none
  bool chat_renderable_ = true;  // false: the file's template is not the <|im_start|> format
  std::string file_;
};

}  // namespace mp::models
