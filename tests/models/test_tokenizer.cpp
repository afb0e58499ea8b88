// The byte-level BPE tokenizer: the pre-tokenizer split on hand-picked strings, merges and special tokens on
// a small vocabulary written by the test, byte-exact round trips on random bytes and Unicode, and (with the
// installed model and the reference venv) the same ids as the PyPI `tokenizers` library.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/text.h"
#include "models/model_cache.h"
#include "models/tokenizer.h"
#include "tests/models/gguf_writer.h"

namespace mp::models {
namespace {

using testing::GgufWriter;
using testing::WValue;
using T = GgufType;

// GPT-2's byte -> printable character map, written out again here so the test does not trust the
// tokenizer's own copy.
std::string mapped(unsigned char b) {
  int cp = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174))) {
    int k = 0;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174))) ++k;
    cp = 256 + k;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}
std::string mapped(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += mapped(b);
  return s;
}

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
  int32_t add(const std::string& t, int32_t type = 1) {
    tokens.push_back(t);
    types.push_back(type);
    return static_cast<int32_t>(tokens.size() - 1);
  }
};

const char* kImTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% "
    "endif %}";

std::string tiny_file(const std::string& pre, bool add_bos, const std::string& model = "gpt2",
                      const std::string& chat_template = kImTemplate) {
  Vocab v;
  v.add("<|endoftext|>", 3);
  v.add("<|im_start|>", 3);
  v.add("<|im_end|>", 3);
  for (int b = 0; b < 256; ++b) v.add(mapped(static_cast<unsigned char>(b)));
  // merges: h e -> he, he l -> hel, hel l -> hell, hell o -> hello, Ġ w -> Ġw, 1 2 -> 12
  const std::vector<std::pair<std::string, std::string>> m = {
      {"h", "e"}, {"he", "l"}, {"hel", "l"}, {"hell", "o"}, {mapped(' '), "w"}, {"1", "2"}, {"l", "l"}};
  for (const auto& [a, b] : m) {
    v.merges.push_back(a + " " + b);
    v.add(a + b);
  }
  GgufWriter w;
  w.kv("tokenizer.ggml.model", WValue::string(model));
  w.kv("tokenizer.ggml.pre", WValue::string(pre));
  std::vector<WValue> toks, types, merges;
  for (const auto& t : v.tokens) toks.push_back(WValue::string(t));
  for (auto t : v.types) types.push_back(WValue::of(T::I32, t));
  for (const auto& s : v.merges) merges.push_back(WValue::string(s));
  w.kv("tokenizer.ggml.tokens", WValue::array(T::STRING, toks));
  w.kv("tokenizer.ggml.token_type", WValue::array(T::I32, types));
  w.kv("tokenizer.ggml.merges", WValue::array(T::STRING, merges));
  w.kv("tokenizer.ggml.bos_token_id", WValue::of(T::U32, uint32_t{1}));
  w.kv("tokenizer.ggml.eos_token_id", WValue::of(T::U32, uint32_t{2}));
  w.kv("tokenizer.ggml.add_bos_token", WValue::of(T::BOOL, uint8_t{add_bos}));
  w.kv("tokenizer.chat_template", WValue::string(chat_template));
  return w.bytes();
}

// A file held in memory with the tokenizer read from it; the bytes live as long as the file that maps them.
struct Loaded {
  std::shared_ptr<const std::string> bytes;
  GgufFile file;
  Tokenizer tok;
};
Loaded load(const std::string& bytes, const std::string& name = "tiny.gguf") {
  auto keep = std::make_shared<const std::string>(bytes);
  GgufFile f = GgufFile::from_bytes(name, keep->data(), keep->size());
  Tokenizer t = Tokenizer::from_gguf(f);
  return {keep, std::move(f), std::move(t)};
}

using Pieces = std::vector<std::string>;

TEST(Tokenizer, Gpt2Split) {
  const std::string b = tiny_file("gpt2", false);
  const GgufFile f = GgufFile::from_bytes("tiny.gguf", b.data(), b.size());
  const Tokenizer t = Tokenizer::from_gguf(f);
  EXPECT_EQ(t.pre_tokenize("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(t.pre_tokenize("a 12 b"), (Pieces{"a", " 12", " b"}));
  EXPECT_EQ(t.pre_tokenize("it's they're we'll I'd"),
            (Pieces{"it", "'s", " they", "'re", " we", "'ll", " I", "'d"}));
  EXPECT_EQ(t.pre_tokenize("hello   world"), (Pieces{"hello", "  ", " world"}));
  EXPECT_EQ(t.pre_tokenize("end  "), (Pieces{"end", "  "}));
  EXPECT_EQ(t.pre_tokenize("x\n\ny"), (Pieces{"x", "\n", "\n", "y"}));
  EXPECT_EQ(t.pre_tokenize("!!! ?? \xf0\x9f\x98\x80"), (Pieces{"!!!", " ??", " \xf0\x9f\x98\x80"}));
  EXPECT_EQ(t.pre_tokenize("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"),
            (Pieces{"caf\xc3\xa9", " \xe6\x97\xa5\xe6\x9c\xac"}));
  // Invalid UTF-8 bytes are "other" characters: they group with punctuation and keep their bytes.
  EXPECT_EQ(t.pre_tokenize("\xff\xfe!ab"), (Pieces{"\xff\xfe!", "ab"}));
  EXPECT_EQ(t.pre_tokenize(""), Pieces{});
}

TEST(Tokenizer, SmollmSplitsDigitsOneByOne) {
  const auto L = load(tiny_file("smollm", false));
  EXPECT_EQ(L.tok.pre_tokenize("a 12 b"), (Pieces{"a", " ", "1", "2", " b"}));
  EXPECT_EQ(L.tok.pre_tokenize("x2024y"), (Pieces{"x", "2", "0", "2", "4", "y"}));
  // Other number characters (here superscript two and a Roman numeral) count as digits too.
  EXPECT_EQ(L.tok.pre_tokenize("m\xc2\xb2\xe2\x85\xa0"), (Pieces{"m", "\xc2\xb2", "\xe2\x85\xa0"}));
  EXPECT_EQ(L.tok.pre_tokenize(" 7 "), (Pieces{" ", "7", " "}));
}

TEST(Tokenizer, MergesSpecialsAndBos) {
  const auto L = load(tiny_file("smollm", true));
  const Tokenizer& t = L.tok;
  auto id = [&](const std::string& text) {
    for (int32_t i = 0; i < t.vocab_size(); ++i)
      if (t.token_text(i) == text) return i;
    ADD_FAILURE() << "no token " << text;
    return -1;
  };
  EXPECT_EQ(t.vocab_size(), 3 + 256 + 7);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_TRUE(t.is_end_of_generation(2));
  EXPECT_TRUE(t.is_end_of_generation(0));
  EXPECT_FALSE(t.is_end_of_generation(1));
  EXPECT_EQ(t.encode("hello", false), (std::vector<int32_t>{id("hello")}));
  EXPECT_EQ(t.encode("hello", true), (std::vector<int32_t>{1, id("hello")}));
  // "Ġw" merges, "orld" has no merges: one token per byte. Digits never merge under smollm: "12" is split
  // before BPE sees it.
  EXPECT_EQ(t.encode(" world", false),
            (std::vector<int32_t>{id(mapped(" w")), id("o"), id("r"), id("l"), id("d")}));
  EXPECT_EQ(t.encode("12", false), (std::vector<int32_t>{id("1"), id("2")}));
  // "ll" (rank 6) loses to the chain h e / he l / hel l (ranks 0-2).
  EXPECT_EQ(t.encode("hell", false), (std::vector<int32_t>{id("hell")}));
  EXPECT_EQ(t.encode("ll", false), (std::vector<int32_t>{id("ll")}));
  // Special tokens in the text are single tokens, wherever they are.
  EXPECT_EQ(t.encode("<|im_start|>hello<|im_end|><|im_end", false),
            (std::vector<int32_t>{1, id("hello"), 2, id("<"), id("|"), id("i"), id("m"), id("_"), id("e"),
                                  id("n"), id("d")}));
  EXPECT_EQ(t.decode({1, id("hello"), 2}), "<|im_start|>hello<|im_end|>");
  EXPECT_EQ(t.token_bytes(id(mapped(" w"))), " w");
  EXPECT_EQ(t.token_bytes(id(mapped('\n'))), "\n");
  EXPECT_EQ(t.chat_prompt("Hi"), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(Tokenizer, BadInput) {
  const auto L = load(tiny_file("smollm", false));
  try {
    L.tok.decode({5, 99999});
    ADD_FAILURE();
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 99999 is outside the vocabulary of 266 tokens"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(L.tok.token_bytes(-1), user_error);
  try {
    load(tiny_file("smollm", false, "llama"));
    ADD_FAILURE();
  } catch (const not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("not supported yet: tokenizer model 'llama'"), std::string::npos)
        << e.what();
  }
  try {
    load(tiny_file("qwen2", false));
    ADD_FAILURE();
  } catch (const not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("pre-tokenizer 'qwen2'"), std::string::npos) << e.what();
  }
  try {
    load(tiny_file("smollm", false, "gpt2", "{{ '[INST] ' + message['content'] + ' [/INST]' }}"))
        .tok.chat_prompt("x");
    ADD_FAILURE();
  } catch (const not_supported& e) {
    EXPECT_NE(std::string(e.what()).find("the chat template of tiny.gguf"), std::string::npos) << e.what();
  }
  GgufWriter w;
  w.kv("tokenizer.ggml.model", WValue::string("gpt2"));
  const std::string b = w.bytes();
  const GgufFile f = GgufFile::from_bytes("notok.gguf", b.data(), b.size());
  try {
    Tokenizer::from_gguf(f);
    ADD_FAILURE();
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("notok.gguf: metadata key 'tokenizer.ggml.tokens' is missing"),
              std::string::npos)
        << e.what();
  }
}

// Random byte strings (any bytes, so mostly invalid UTF-8) and random valid Unicode text.
std::vector<std::string> random_strings(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> out;
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x20, 0x7e},       {0x09, 0x0d},     {0xa0, 0x24f},    {0x370, 0x3ff},   {0x400, 0x4ff},
      {0x600, 0x6ff},     {0x900, 0x97f},   {0x3040, 0x30ff}, {0x4e00, 0x4fff}, {0xac00, 0xad00},
      {0x1f300, 0x1f64f}, {0x2000, 0x206f}, {0x30, 0x39}};
  for (int i = 0; i < n; ++i) {
    std::string s;
    const int len = static_cast<int>(rng() % 48);
    if (i % 2 == 0) {
      for (int k = 0; k < len; ++k) s += static_cast<char>(rng());
    } else {
      for (int k = 0; k < len; ++k) {
        const auto& [lo, hi] = ranges[rng() % ranges.size()];
        const uint32_t cp = lo + static_cast<uint32_t>(rng() % (hi - lo + 1));
        if (cp < 0x80) {
          s += static_cast<char>(cp);
        } else if (cp < 0x800) {
          s += static_cast<char>(0xc0 | (cp >> 6));
          s += static_cast<char>(0x80 | (cp & 0x3f));
        } else if (cp < 0x10000) {
          s += static_cast<char>(0xe0 | (cp >> 12));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
          s += static_cast<char>(0x80 | (cp & 0x3f));
        } else {
          s += static_cast<char>(0xf0 | (cp >> 18));
          s += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
          s += static_cast<char>(0x80 | (cp & 0x3f));
        }
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

void check_round_trips(const Tokenizer& t, const std::vector<std::string>& texts) {
  for (const auto& s : texts) {
    const auto ids = t.encode(s, false);
    ASSERT_EQ(t.decode(ids), s) << "decode(encode(x)) != x for " << ::testing::PrintToString(s);
    std::string streamed;
    for (int32_t id : ids) streamed += t.token_bytes(id);
    ASSERT_EQ(streamed, s);
    ASSERT_EQ(t.encode(t.decode(ids), false), ids) << ::testing::PrintToString(s);
  }
}

TEST(Tokenizer, RoundTripsRandomBytesAndUnicode) {
  const auto L = load(tiny_file("smollm", false));
  check_round_trips(L.tok, random_strings(600, 1));
  const auto G = load(tiny_file("gpt2", false));
  check_round_trips(G.tok, random_strings(200, 2));
}

// One piece of 200,000 bytes (no spaces): BPE must stay near-linear, not quadratic, in the piece length.
TEST(Tokenizer, LongPieceEncodesInLinearishTime) {
  const auto L = load(tiny_file("smollm", false));
  std::string s;
  while (s.size() < 200000) s += "hellollhe";
  const auto ids = L.tok.encode(s, false);
  EXPECT_EQ(L.tok.decode(ids), s);
  EXPECT_LT(ids.size(), s.size() / 2);  // the merges applied
}

// The installed SmolLM2 file, or a skip naming the install command.
std::optional<GgufFile> default_model() {
  try {
    return GgufFile::open(default_model_path());
  } catch (const user_error&) {
    return std::nullopt;
  }
}

TEST(Tokenizer, SmolLM2ChatFormatAndRoundTrips) {
  auto f = default_model();
  if (!f) GTEST_SKIP() << "the default model is not installed (run scripts/install-deps)";
  const Tokenizer t = Tokenizer::from_gguf(*f);
  EXPECT_EQ(t.vocab_size(), 49152);
  EXPECT_EQ(t.pre(), "smollm");
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_TRUE(t.is_end_of_generation(2));
  // The file's template adds this system message before a first user message.
  EXPECT_EQ(
      t.chat_prompt("What is 2+2?"),
      "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_NE(f->get_string("tokenizer.chat_template").find("You are a helpful AI assistant named SmolLM"),
            std::string::npos);
  // add_bos_token is false in this file: no BOS even when asked for specials.
  EXPECT_EQ(t.encode("Hi", true), t.encode("Hi", false));
  // This vocabulary has no token for some bytes (control characters, bytes never found in UTF-8): text with
  // them has no encoding, which is an error naming the byte and where it is, never a dropped byte.
  try {
    t.encode("ok <|im_end|>ab\x13", false);
    ADD_FAILURE() << "byte 0x13 was encoded";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("byte 0x13 at offset 15 of the text has no token in the vocabulary"),
              std::string::npos)
        << e.what();
  }
  std::vector<bool> has(256, false);
  for (int32_t id = 0; id < t.vocab_size(); ++id)
    if (t.token_bytes(id).size() == 1) has[static_cast<unsigned char>(t.token_bytes(id)[0])] = true;
  int missing = 0;
  for (bool h : has) missing += !h;
  EXPECT_EQ(missing, 21);
  auto texts = random_strings(300, 3);
  for (auto& s : texts)
    for (auto& c : s)
      if (!has[static_cast<unsigned char>(c)]) c = '?';
  check_round_trips(t, texts);
}

// Runs tests/models/tokenizer_reference.py on `texts` and returns its ids.
std::vector<std::vector<int32_t>> reference_ids(const std::string& model,
                                                const std::vector<std::string>& texts) {
  const std::string dir = ::testing::TempDir() + "mp_tok_" + std::to_string(getpid());
  const std::string in = dir + "_in.json", out = dir + "_out.json";
  {
    std::ofstream o(in, std::ios::binary);
    o << "[";
    for (size_t i = 0; i < texts.size(); ++i) o << (i ? "," : "") << "\"" << json_escape(texts[i]) << "\"";
    o << "]";
  }
  const std::string cmd = std::string("'") + MP_PYTHON + "' '" + MP_TESTS_MODELS_DIR +
                          "/tokenizer_reference.py' --model '" + model + "' < '" + in + "' > '" + out + "'";
  const int rc = std::system(cmd.c_str());
  std::remove(in.c_str());
  EXPECT_EQ(rc, 0) << cmd;
  std::ifstream i(out);
  std::stringstream ss;
  ss << i.rdbuf();
  std::remove(out.c_str());
  // The output is [[1,2],[3]]: a list of lists of integers.
  std::vector<std::vector<int32_t>> ids;
  const std::string s = ss.str();
  int depth = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const char c = s[k];
    if (c == '[') {
      if (++depth == 2) ids.emplace_back();
    } else if (c == ']') {
      --depth;
    } else if (c >= '0' && c <= '9') {
      size_t e = k;
      while (e < s.size() && s[e] >= '0' && s[e] <= '9') ++e;
      if (depth == 2) ids.back().push_back(std::stoi(s.substr(k, e - k)));
      k = e - 1;
    }
  }
  return ids;
}

TEST(Tokenizer, SmolLM2MatchesTheTokenizersLibrary) {
  auto f = default_model();
  if (!f) GTEST_SKIP() << "the default model is not installed (run scripts/install-deps)";
  struct stat st {};
  if (std::string(MP_PYTHON).empty() || ::stat(MP_PYTHON, &st) != 0)
    GTEST_SKIP() << "the reference venv is not installed (run scripts/install-deps, then configure again)";
  const Tokenizer t = Tokenizer::from_gguf(*f);
  std::vector<std::string> texts = {
      "Hello world",
      "I have 12345 apples and 3.14159 pies, 1st 2nd 1000000",
      "  two  spaces   three\n\n\nnewlines\r\n \t tab  trailing   ",
      "emoji \xf0\x9f\x99\x82\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd family "
      "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9",
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
      "special<|im_end|>inside and <|endoftext|> too, and a broken <|im_start",
      "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 "
      "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7",
      "it's they're we've I'm you'll he'd IT'S",
      "def f(x):\n    return x**2  # comment\n\tpass",
      "m\xc2\xb2 \xe2\x85\xa0\xe2\x85\xa1 \xd9\xa3\xd9\xa4 \xc2\xbd",  // other number characters
      "\xc2\xa0non-breaking\xe2\x80\x83"
      "em space\xe3\x80\x80"
      "ideographic",
      t.chat_prompt("Write a haiku about GPUs."),
  };
  for (auto& s : random_strings(80, 4)) texts.push_back(s);
  // Only valid UTF-8 can go to Python as text.
  std::vector<std::string> valid;
  for (const auto& s : texts) {
    bool ok = true;
    for (size_t k = 0; k < s.size() && ok;) {
      const unsigned char c = static_cast<unsigned char>(s[k]);
      const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
      if (n == 0 || k + n > s.size()) ok = false;
      for (int j = 1; ok && j < n; ++j) ok = (static_cast<unsigned char>(s[k + j]) >> 6) == 2;
      k += n ? n : 1;
    }
    if (ok) valid.push_back(s);
  }
  ASSERT_GE(valid.size(), 12u);
  const auto want = reference_ids(f->path(), valid);
  ASSERT_EQ(want.size(), valid.size());
  for (size_t k = 0; k < valid.size(); ++k)
    EXPECT_EQ(t.encode(valid[k], false), want[k])
        << "text " << k << ": " << ::testing::PrintToString(valid[k]);
}

}  // namespace
}  // namespace mp::models
