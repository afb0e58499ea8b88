// GPT-2 byte-level BPE from a GGUF file's metadata. Text is first cut at special tokens, then split by the
// file's pre-tokenizer (written out by hand over code points; Unicode categories from utf8proc), then each
// piece's bytes are mapped to GPT-2's printable characters and merged by the file's merge ranks.
#include "models/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <limits>
#include <queue>

#include "core/error.h"

namespace mp::models {

namespace {

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes stand for themselves, the rest are
// moved to 256 + k so that every token text is printable.
struct ByteMap {
  int32_t to_cp[256];
  std::unordered_map<int32_t, uint8_t> to_byte;
  std::string str[256];  // to_cp as UTF-8
  ByteMap();
};
void append_utf8(std::string& out, int32_t cp) {
  uint8_t buf[4];
  const auto n = utf8proc_encode_char(cp, buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}
ByteMap::ByteMap() {
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    to_cp[b] = keep ? b : next++;
    to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    append_utf8(str[b], to_cp[b]);
  }
}
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// One code point of the input with the byte span it came from. Invalid UTF-8 bytes are their own unit
// (cp = -1) and classify as "other", so they still round-trip.
struct Unit {
  int32_t cp;
  size_t begin, end;
};
enum Cls { kLetter, kNumber, kSpace, kOther };

std::vector<Unit> units_of(std::string_view s) {
  std::vector<Unit> u;
  size_t i = 0;
  while (i < s.size()) {
    utf8proc_int32_t cp = -1;
    const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                    static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      u.push_back({-1, i, i + 1});
      ++i;
    } else {
      u.push_back({cp, i, i + static_cast<size_t>(n)});
      i += static_cast<size_t>(n);
    }
  }
  return u;
}

bool is_white_space(int32_t c) {  // Unicode White_Space, which is what \s means in the pre-tokenizer regex
  return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}
Cls classify(int32_t c) {
  if (c < 0) return kOther;
  if (is_white_space(c)) return kSpace;
  switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kNumber;
    default:
      return kOther;
  }
}

// The GPT-2 split 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ over
// units [b, e), appending piece boundaries (unit indices) to `cuts`.
void gpt2_split(const std::vector<Unit>& u, const std::vector<Cls>& cls, size_t b, size_t e,
                std::vector<size_t>& cuts) {
  size_t i = b;
  auto run = [&](size_t j, Cls c) {
    while (j < e && cls[j] == c) ++j;
    return j;
  };
  while (i < e) {
    size_t j = i;
    if (u[i].cp == '\'' && i + 1 < e) {
      const int32_t a = u[i + 1].cp, c2 = i + 2 < e ? u[i + 2].cp : 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        j = i + 2;
      else if ((a == 'r' && c2 == 'e') || (a == 'v' && c2 == 'e') || (a == 'l' && c2 == 'l'))
        j = i + 3;
    }
    if (j == i) {
      const size_t k = (u[i].cp == ' ' && i + 1 < e && cls[i + 1] != kSpace) ? i + 1 : i;
      if (cls[k] != kSpace) {
        j = run(k, cls[k]);  // " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+"
      } else {
        const size_t r = run(i, kSpace);
        // \s+(?!\S): all of the run at the end, else all but the last space; a lone space before
        // non-space falls to \s+.
        j = (r == e) ? r : (r - 1 > i ? r - 1 : r);
      }
    }
    cuts.push_back(j);
    i = j;
  }
}

}  // namespace

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  Tokenizer t;
  t.file_ = f.path();
  const std::string model = f.get_string("tokenizer.ggml.model");
  if (model != "gpt2")
    throw not_supported("tokenizer model '" + model + "' in " + f.path() +
                        " (metapipe reads 'gpt2' byte-level BPE)");
  t.pre_ = f.find_string("tokenizer.ggml.pre").value_or("default");
  if (t.pre_ != "smollm" && t.pre_ != "gpt2" && t.pre_ != "default")
    throw not_supported("pre-tokenizer '" + t.pre_ + "' in " + f.path() +
                        " (metapipe has 'smollm' and 'gpt2')");

  t.tokens_ = f.get_string_array("tokenizer.ggml.tokens");
  const auto n = t.tokens_.size();
  MP_USER_CHECK(n > 0 && n < static_cast<size_t>(std::numeric_limits<int32_t>::max()), f.path(),
                ": tokenizer.ggml.tokens has ", n, " entries (expected 1 to 2^31-1)");
  if (f.has("tokenizer.ggml.token_type")) {
    const auto ty = f.get_int_array("tokenizer.ggml.token_type");
    MP_USER_CHECK(ty.size() == n, f.path(), ": tokenizer.ggml.token_type has ", ty.size(),
                  " entries but there are ", n, " tokens");
    t.types_.assign(ty.begin(), ty.end());
  } else {
    t.types_.assign(n, 1);
  }
  const auto& bm = byte_map();
  t.bytes_.resize(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string& s = t.tokens_[id];
    t.by_text_.emplace(s, static_cast<int32_t>(id));
    if (t.types_[id] == 3 ||
        t.types_[id] == 4) {  // control / user-defined: their text is what they stand for
      t.bytes_[id] = s;
      if (!s.empty()) t.specials_.emplace_back(s, static_cast<int32_t>(id));
      continue;
    }
    // Normal tokens are GPT-2-mapped text; a character outside the map stands for its own UTF-8 bytes.
    std::string out;
    for (const Unit& u : units_of(s)) {
      auto it = u.cp >= 0 ? bm.to_byte.find(u.cp) : bm.to_byte.end();
      if (it != bm.to_byte.end())
        out += static_cast<char>(it->second);
      else
        out.append(s, u.begin, u.end - u.begin);
    }
    t.bytes_[id] = std::move(out);
  }
  for (const auto& sp : t.specials_) t.special_first_[static_cast<unsigned char>(sp.first[0])] = true;
  std::stable_sort(t.specials_.begin(), t.specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  t.byte_token_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    std::string s;
    append_utf8(s, bm.to_cp[b]);
    if (auto it = t.by_text_.find(s); it != t.by_text_.end()) t.byte_token_[b] = it->second;
  }
  const auto merges = f.get_string_array("tokenizer.ggml.merges");
  for (size_t r = 0; r < merges.size(); ++r) {
    MP_USER_CHECK(merges[r].find(' ') != std::string::npos, f.path(), ": tokenizer.ggml.merges[", r, "] '",
                  merges[r].substr(0, 40), "' is not two tokens separated by a space");
    t.merge_rank_.emplace(merges[r], static_cast<int32_t>(r));
  }

  auto id_key = [&](const char* key, int32_t dflt) -> int32_t {
    const auto v = f.find_int(key);
    if (!v) return dflt;
    MP_USER_CHECK(*v >= -1 && *v < static_cast<int64_t>(n), f.path(), ": ", key, " = ", *v,
                  " is not a token id (the vocabulary has ", n, " tokens)");
    return static_cast<int32_t>(*v);
  };
  t.bos_ = id_key("tokenizer.ggml.bos_token_id", -1);
  t.eos_ = id_key("tokenizer.ggml.eos_token_id", -1);
  t.add_bos_ = f.find_int("tokenizer.ggml.add_bos_token").value_or(0) != 0;
  MP_USER_CHECK(!t.add_bos_ || t.bos_ >= 0, f.path(),
                ": tokenizer.ggml.add_bos_token is set but there is no ", "tokenizer.ggml.bos_token_id");
  if (t.eos_ >= 0) t.end_ids_.push_back(t.eos_);
  if (const int32_t eot = id_key("tokenizer.ggml.eot_token_id", -1); eot >= 0) t.end_ids_.push_back(eot);
  for (const char* s : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"})
    if (auto it = t.by_text_.find(s); it != t.by_text_.end() && (t.types_[it->second] == 3))
      t.end_ids_.push_back(it->second);

  // The chat format: the <|im_start|> markers must be in the file's template; a default system message that
  // the template adds before a first non-system message is taken from it literally.
  if (auto tmpl = f.find_string("tokenizer.chat_template")) {
    const std::string sys = "<|im_start|>system\n";
    if (tmpl->find("<|im_start|>") != std::string::npos && tmpl->find("<|im_end|>") != std::string::npos) {
      const size_t p = tmpl->find("'" + sys);
      if (p != std::string::npos && tmpl->find("!= 'system'") != std::string::npos) {
        const size_t q = tmpl->find('\'', p + 1);
        if (q != std::string::npos) {
          std::string lit = tmpl->substr(p + 1, q - p - 1), out;
          for (size_t i = 0; i < lit.size(); ++i) {
            if (lit[i] == '\\' && i + 1 < lit.size() && lit[i + 1] == 'n') {
              out += '\n';
              ++i;
            } else {
              out += lit[i];
            }
          }
          t.chat_system_ = out;
        }
      }
    } else {
      t.chat_renderable_ = false;
    }
  }
  return t;
}

void Tokenizer::check_id(int32_t id) const {
  MP_USER_CHECK(id >= 0 && id < vocab_size(), "token id ", id, " is outside the vocabulary of ", vocab_size(),
                " tokens of ", file_);
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  for (const auto& [b, n] : pre_spans(text)) pieces.emplace_back(text.substr(b, n));
  return pieces;
}

std::vector<std::pair<size_t, size_t>> Tokenizer::pre_spans(std::string_view text) const {
  const auto u = units_of(text);
  std::vector<Cls> cls(u.size());
  for (size_t i = 0; i < u.size(); ++i) cls[i] = classify(u[i].cp);
  std::vector<size_t> cuts;
  if (pre_ == "smollm") {
    // Every number character is a piece of its own; the GPT-2 split runs on what lies between.
    size_t b = 0;
    for (size_t i = 0; i <= u.size(); ++i) {
      if (i == u.size() || cls[i] == kNumber) {
        gpt2_split(u, cls, b, i, cuts);
        if (i < u.size()) cuts.push_back(i + 1);
        b = i + 1;
      }
    }
  } else {
    gpt2_split(u, cls, 0, u.size(), cuts);
  }
  std::vector<std::pair<size_t, size_t>> spans;
  size_t prev = 0;
  for (size_t c : cuts) {
    if (c == prev) continue;
    const size_t bb = u[prev].begin, be = u[c - 1].end;
    spans.emplace_back(bb, be - bb);
    prev = c;
  }
  return spans;
}

std::vector<int32_t> Tokenizer::encode_piece(std::string_view piece, size_t at) const {
  const auto& bm = byte_map();
  // Symbols are byte ranges of the piece in a linked list; a heap of candidate pairs ordered by merge rank,
  // then by position (leftmost first, as BPE is defined), merges the best pair until none is left. Entries
  // whose symbols changed since they were pushed are skipped when popped. O(n log n) in the piece length,
  // so a long run without spaces cannot stall encoding.
  struct Sym {
    int prev, next;
    size_t b, e;
  };
  const int n = static_cast<int>(piece.size());
  std::vector<Sym> sym(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    sym[static_cast<size_t>(i)] = {i - 1, i + 1 < n ? i + 1 : -1, size_t(i), size_t(i) + 1};
  auto text = [&](const Sym& s) {
    std::string out;
    for (size_t k = s.b; k < s.e; ++k) out += bm.str[static_cast<unsigned char>(piece[k])];
    return out;
  };
  struct Cand {
    int32_t rank;
    size_t pos;
    int left, right;
    size_t left_e, right_e;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int l, int r) {
    if (l < 0 || r < 0) return;
    const Sym &L = sym[static_cast<size_t>(l)], &R = sym[static_cast<size_t>(r)];
    auto it = merge_rank_.find(text(L) + " " + text(R));
    if (it != merge_rank_.end()) heap.push({it->second, L.b, l, r, L.e, R.e});
  };
  for (int i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym &L = sym[static_cast<size_t>(c.left)], &R = sym[static_cast<size_t>(c.right)];
    if (L.b == L.e || R.b == R.e || L.next != c.right || L.e != c.left_e || R.e != c.right_e)
      continue;  // stale
    L.e = R.e;
    L.next = R.next;
    if (R.next >= 0) sym[static_cast<size_t>(R.next)].prev = c.left;
    R.b = R.e;  // dead
    push(L.prev, c.left);
    push(c.left, L.next);
  }
  std::vector<int32_t> ids;
  for (int i = n > 0 ? 0 : -1; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Sym& s = sym[static_cast<size_t>(i)];
    if (auto it = by_text_.find(text(s)); it != by_text_.end()) {
      ids.push_back(it->second);
      continue;
    }
    for (size_t k = s.b; k < s.e; ++k) {  // a merge result missing from the vocabulary: its bytes one by one
      const auto byte = static_cast<unsigned char>(piece[k]);
      if (byte_token_[byte] < 0) {
        // Some vocabularies drop byte tokens (SmolLM2 has none for 21 control and never-UTF-8 bytes), so
        // such text has no encoding at all; say where instead of dropping the byte.
        static const char* hex = "0123456789abcdef";
        fail_user("byte 0x", hex[byte >> 4], hex[byte & 15], " at offset ", at + k,
                  " of the text has no token in ", "the vocabulary of ", file_, "; remove or replace it");
      }
      ids.push_back(byte_token_[byte]);
    }
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  if (add_special && add_bos_) ids.push_back(bos_);
  auto plain = [&](std::string_view s, size_t base) {
    for (const auto& [b, n] : pre_spans(s)) {
      const auto e = encode_piece(s.substr(b, n), base + b);
      ids.insert(ids.end(), e.begin(), e.end());
    }
  };
  size_t start = 0, i = 0;
  while (i < text.size()) {
    int32_t hit = -1;
    size_t len = 0;
    if (special_first_[static_cast<unsigned char>(text[i])]) {
      for (const auto& [s, id] : specials_) {
        if (s.size() <= text.size() - i && text.compare(i, s.size(), s) == 0) {
          hit = id;
          len = s.size();
          break;
        }
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    plain(text.substr(start, i - start), start);
    ids.push_back(hit);
    i += len;
    start = i;
  }
  plain(text.substr(start), start);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    check_id(id);
    out += bytes_[static_cast<size_t>(id)];
  }
  return out;
}

std::string Tokenizer::token_bytes(int32_t id) const {
  check_id(id);
  return bytes_[static_cast<size_t>(id)];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  check_id(id);
  return tokens_[static_cast<size_t>(id)];
}

int32_t Tokenizer::bos() const { return bos_; }
int32_t Tokenizer::eos() const { return eos_; }
bool Tokenizer::is_end_of_generation(int32_t id) const {
  return std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
}
int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(tokens_.size()); }

std::string Tokenizer::chat_prompt(std::string_view user_text) const {
  if (!chat_renderable_)
    throw not_supported("the chat template of " + file_ + " (metapipe renders the <|im_start|> format only)");
  MP_USER_CHECK(by_text_.count("<|im_start|>") && by_text_.count("<|im_end|>"), file_,
                " has no <|im_start|> / <|im_end|> tokens, so it has no chat format; use a plain prompt");
  std::string s = chat_system_;
  s += "<|im_start|>user\n";
  s += user_text;
  s += "<|im_end|>\n<|im_start|>assistant\n";
  return s;
}

}  // namespace mp::models
