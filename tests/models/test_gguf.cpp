// The GGUF reader on files the test writes itself: every value type round-trips, each kind of corruption
// gives its one-line message, and truncations and random byte flips only ever end in user_errors; on the
// installed model, tensor data is where the PyPI gguf package finds it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/quant.h"
#include "models/gguf.h"
#include "models/model_cache.h"
#include "tests/models/gguf_writer.h"

namespace mp::models {
namespace {

using testing::GgufWriter;
using testing::WTensor;
using testing::WValue;
using T = GgufType;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "mp_gguf_" + std::to_string(getpid()) + "_" + name;
}

std::string write(const std::string& name, const std::string& bytes) {
  const std::string p = temp_path(name);
  GgufWriter::write_file(p, bytes);
  return p;
}

// The user_error message of opening `bytes`, or "" when the file opens.
std::string open_error(const std::string& bytes, const std::string& name = "bad.gguf") {
  const std::string p = write(name, bytes);
  try {
    GgufFile::open(p);
  } catch (const user_error& e) {
    std::remove(p.c_str());
    return e.what();
  }
  std::remove(p.c_str());
  return "";
}

std::string f32_bytes(std::vector<float> v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

// A small valid file with a few of every kind of thing, used as the seed of the corruption tests.
GgufWriter sample(uint32_t version = 3) {
  GgufWriter w;
  w.version = version;
  w.kv("general.architecture", WValue::string("llama"));
  w.kv("llama.block_count", WValue::of(T::U32, uint32_t{2}));
  w.kv("rope", WValue::of(T::F32, 10000.0f));
  w.kv("flag", WValue::of(T::BOOL, uint8_t{1}));
  w.kv("names", WValue::array(T::STRING, {WValue::string("a"), WValue::string("bc")}));
  w.kv("ids", WValue::array(T::I32, {WValue::of(T::I32, int32_t{-1}), WValue::of(T::I32, int32_t{7})}));
  w.kv("nested", WValue::array(T::ARRAY, {WValue::array(T::U8, {WValue::of(T::U8, uint8_t{3})})}));
  std::string q8(quant::info(quant::QType::Q8_0).block_bytes * 2, '\0');
  for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<char>(i * 7);
  q8[0] = 0, q8[1] = 0x3c;  // d = 1.0 in fp16 for the first block
  w.tensor({"a.weight", 0, {4, 2}, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8})});
  w.tensor({"b.weight", 8, {32, 2}, q8});
  w.tensor({"c.bias", 1, {8}, std::string(16, '\x11')});
  return w;
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w;
    w.version = version;
    w.kv("u8", WValue::of(T::U8, uint8_t{250}));
    w.kv("i8", WValue::of(T::I8, int8_t{-128}));
    w.kv("u16", WValue::of(T::U16, uint16_t{65535}));
    w.kv("i16", WValue::of(T::I16, int16_t{-32768}));
    w.kv("u32", WValue::of(T::U32, uint32_t{4000000000u}));
    w.kv("i32", WValue::of(T::I32, int32_t{-2000000000}));
    w.kv("u64", WValue::of(T::U64, uint64_t{1} << 62));
    w.kv("u64_big", WValue::of(T::U64, std::numeric_limits<uint64_t>::max()));
    w.kv("i64", WValue::of(T::I64, std::numeric_limits<int64_t>::min()));
    w.kv("f32", WValue::of(T::F32, 1.5f));
    w.kv("f64", WValue::of(T::F64, -2.25e300));
    w.kv("bool", WValue::of(T::BOOL, uint8_t{1}));
    w.kv("str", WValue::string(std::string("caf\xc3\xa9\0x", 7)));
    w.kv("empty", WValue::string(""));
    w.kv("a_i16", WValue::array(T::I16, {WValue::of(T::I16, int16_t{-5}), WValue::of(T::I16, int16_t{9})}));
    w.kv("a_u64", WValue::array(T::U64, {WValue::of(T::U64, uint64_t{1} << 40)}));
    w.kv("a_f32", WValue::array(T::F32, {WValue::of(T::F32, 0.25f), WValue::of(T::F32, -3.0f)}));
    w.kv("a_f64", WValue::array(T::F64, {WValue::of(T::F64, 1e-300)}));
    w.kv("a_bool",
         WValue::array(T::BOOL, {WValue::of(T::BOOL, uint8_t{0}), WValue::of(T::BOOL, uint8_t{1})}));
    w.kv("a_str", WValue::array(T::STRING, {WValue::string("x"), WValue::string(""), WValue::string("yz")}));
    w.kv("a_empty", WValue::array(T::U32, {}));
    w.kv("a_nested", WValue::array(T::ARRAY, {WValue::array(T::STRING, {WValue::string("p")}),
                                              WValue::array(T::I8, {WValue::of(T::I8, int8_t{-1}),
                                                                    WValue::of(T::I8, int8_t{2})})}));
    const std::string p = write("types.gguf", w.bytes());
    const GgufFile f = GgufFile::open(p);
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.get_int("u8"), 250);
    EXPECT_EQ(f.get_int("i8"), -128);
    EXPECT_EQ(f.get_int("u16"), 65535);
    EXPECT_EQ(f.get_int("i16"), -32768);
    EXPECT_EQ(f.get_int("u32"), 4000000000LL);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_int("u64"), int64_t{1} << 62);
    EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get_int("bool"), 1);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_EQ(f.get_float("f64"), -2.25e300);
    EXPECT_EQ(f.get_float("i8"), -128.0);  // integers are accepted where a number is wanted
    EXPECT_EQ(f.get_string("str"), std::string("caf\xc3\xa9\0x", 7));
    EXPECT_EQ(f.get_string("empty"), "");
    EXPECT_EQ(f.get_int_array("a_i16"), (std::vector<int64_t>{-5, 9}));
    EXPECT_EQ(f.get_int_array("a_u64"), (std::vector<int64_t>{int64_t{1} << 40}));
    EXPECT_EQ(f.get_int_array("a_bool"), (std::vector<int64_t>{0, 1}));
    EXPECT_EQ(f.get_float_array("a_f32"), (std::vector<double>{0.25, -3.0}));
    EXPECT_EQ(f.get_float_array("a_f64"), (std::vector<double>{1e-300}));
    EXPECT_EQ(f.get_float_array("a_i16"), (std::vector<double>{-5, 9}));
    EXPECT_EQ(f.get_string_array("a_str"), (std::vector<std::string>{"x", "", "yz"}));
    EXPECT_TRUE(f.get_int_array("a_empty").empty());
    const GgufValue* n = f.find_value("a_nested");
    ASSERT_NE(n, nullptr);
    ASSERT_EQ(n->elem, T::ARRAY);
    ASSERT_EQ(n->items.size(), 2u);
    EXPECT_EQ(n->items[0].elem, T::STRING);
    ASSERT_EQ(n->items[0].strings.size(), 1u);
    EXPECT_EQ(n->items[0].strings[0], "p");
    EXPECT_EQ(n->items[1].elem, T::I8);
    EXPECT_EQ(n->items[1].count, 2u);
    EXPECT_EQ(static_cast<int8_t>(n->items[1].raw[0]), -1);
    EXPECT_EQ(f.find_int("nope"), std::nullopt);
    EXPECT_EQ(f.find_string("str").value_or("?"), std::string("caf\xc3\xa9\0x", 7));
    EXPECT_EQ(f.keys().size(), 22u);
    EXPECT_EQ(f.keys().front(), "u8");
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_EQ(f.alignment(), 32u);
    // Values outside what the accessor returns are errors, not wrapped numbers.
    try {
      f.get_int("u64_big");
      ADD_FAILURE() << "u64 above INT64_MAX was accepted";
    } catch (const user_error& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit in int64"), std::string::npos) << e.what();
    }
    std::remove(p.c_str());
  }
}

TEST(Gguf, TensorsArePlacedAndAligned) {
  GgufWriter w = sample();
  w.alignment = 64;
  w.kv("general.alignment", WValue::of(T::U32, uint32_t{64}));
  const std::string bytes = w.bytes();
  const std::string p = write("tensors.gguf", bytes);
  const GgufFile f = GgufFile::open(p);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.file_bytes(), bytes.size());
  ASSERT_EQ(f.tensors().size(), 3u);
  const GgufTensor& a = f.tensor("a.weight");
  EXPECT_EQ(a.type, quant::QType::F32);
  EXPECT_EQ(a.dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(a.nbytes, 32u);
  EXPECT_EQ(a.offset, 0u);
  float x[8];
  std::memcpy(x, a.data, sizeof x);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[7], 8.0f);
  const GgufTensor& b = f.tensor("b.weight");
  EXPECT_EQ(b.type, quant::QType::Q8_0);
  EXPECT_EQ(b.offset, 64u);
  EXPECT_EQ(b.nbytes, 68u);
  EXPECT_EQ(b.data, a.data + 64);
  float row[32];
  quant::dequantize_row(b.type, b.data, row, 32);
  EXPECT_EQ(row[2], static_cast<float>(static_cast<int8_t>((2 + 2) * 7)));  // q * d with d = 1; qs after d
  EXPECT_EQ(f.tensor("c.bias").type, quant::QType::F16);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
  try {
    f.tensor("output.weight");
    ADD_FAILURE();
  } catch (const user_error& e) {
    EXPECT_EQ(std::string(e.what()),
              p + ": tensor 'output.weight' is missing (is this the right model file?)");
  }
  // Move-only: the map moves with the object.
  GgufFile g = GgufFile::open(p);
  GgufFile h = std::move(g);
  EXPECT_EQ(h.tensor("a.weight").nbytes, 32u);
  std::remove(p.c_str());
}

TEST(Gguf, AccessorErrorsNameFileAndKey) {
  const std::string p = write("acc.gguf", sample().bytes());
  const GgufFile f = GgufFile::open(p);
  auto msg = [&](auto fn) -> std::string {
    try {
      fn();
    } catch (const user_error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(msg([&] { f.get_int("llama.context_length"); }),
            p + ": metadata key 'llama.context_length' is missing (expected an integer); is this the right "
                "model file?");
  EXPECT_NE(msg([&] { f.get_string("llama.block_count"); }).find(p + ": field 'llama.block_count' at byte "),
            std::string::npos);
  EXPECT_NE(msg([&] { f.get_string("llama.block_count"); }).find("is u32, expected a string"),
            std::string::npos);
  EXPECT_NE(msg([&] { f.get_int_array("names"); }).find("is array of string, expected an array of integers"),
            std::string::npos);
  EXPECT_NE(msg([&] { f.get_float("general.architecture"); }).find("is string, expected a number"),
            std::string::npos);
  std::remove(p.c_str());
}

// Bytes of a file, patched: `at` bytes replaced by `with`.
std::string patched(std::string b, size_t at, const std::string& with) {
  b.replace(at, with.size(), with);
  return b;
}
template <class X>
std::string le(X x) {
  return std::string(reinterpret_cast<const char*>(&x), sizeof x);
}

struct Bad {
  const char* what;
  std::string bytes;
  std::string expect;  // substring of the message
};

TEST(Gguf, CorruptFilesGiveOneLineErrors) {
  const std::string good = sample().bytes();
  std::vector<Bad> cases;
  cases.push_back({"empty", "", "field magic at byte 0: file is 0 bytes long"});
  cases.push_back({"magic", patched(good, 0, "GGML"), "field magic at byte 0: not a GGUF file"});
  cases.push_back(
      {"version 1", patched(good, 4, le<uint32_t>(1)), "field version at byte 4: GGUF version 1"});
  cases.push_back({"version 9", patched(good, 4, le<uint32_t>(9)), "unsupported GGUF version 9"});
  cases.push_back({"big endian", patched(good, 4, le<uint32_t>(0x03000000)), "big-endian"});
  cases.push_back(
      {"short header", good.substr(0, 6), "field version at byte 4: file ends after 2 of 4 bytes"});
  cases.push_back({"kv count", patched(good, 16, le<uint64_t>(uint64_t{1} << 60)),
                   "field metadata_kv_count at byte 16: count 1152921504606846976 cannot fit"});
  cases.push_back(
      {"tensor count", patched(good, 8, le<uint64_t>(1000000)), "field tensor_count at byte 8: count"});
  cases.push_back({"key length", patched(good, 24, le<uint64_t>(~uint64_t{0})),
                   "field key of metadata pair 0 at byte 24: string length 18446744073709551615 runs past"});
  {
    GgufWriter w;
    w.kv("k", WValue::of(T::U8, uint8_t{0}));
    std::string b = w.bytes();
    cases.push_back({"value type", patched(b, 24 + 8 + 1, le<uint32_t>(13)),
                     "field 'k' (value type) at byte 33: unknown metadata value type 13"});
    cases.push_back(
        {"truncated value", b.substr(0, b.size() - 1), "field 'k' at byte 37: file ends after 0 of 1"});
  }
  {
    GgufWriter w;
    w.kv("arr", WValue::array(T::U32, {WValue::of(T::U32, 1u)}));
    std::string b = w.bytes();
    // key at 24 (8 + 3), type at 35, element type at 39, count at 43
    cases.push_back({"array count", patched(b, 43, le<uint64_t>(uint64_t{1} << 62)),
                     "field 'arr' at byte 43: array of 4611686018427387904 u32 elements does not fit"});
    cases.push_back({"array elem type", patched(b, 39, le<uint32_t>(77)),
                     "field 'arr' (array element type) at byte 39: unknown metadata value type 77"});
  }
  {
    WValue v = WValue::array(T::U8, {});
    for (int i = 0; i < 9; ++i) v = WValue::array(T::ARRAY, {v});
    GgufWriter w;
    w.kv("deep", v);
    cases.push_back({"deep arrays", w.bytes(), "arrays nested deeper than 8 levels"});
  }
  {
    GgufWriter w;
    w.kv("b", WValue::of(T::BOOL, uint8_t{2}));
    cases.push_back({"bool", w.bytes(), "field 'b' at byte 37: bool value 2 is neither 0 nor 1"});
  }
  {
    GgufWriter w;
    w.kv("k", WValue::of(T::U8, uint8_t{0}));
    w.kv("k", WValue::of(T::U8, uint8_t{1}));
    cases.push_back({"duplicate key", w.bytes(), "field 'k' at byte 38: duplicate metadata key"});
  }
  {
    GgufWriter w;
    w.kv("bad\nkey", WValue::of(T::U8, uint8_t{0}));
    w.kv("bad\nkey", WValue::of(T::U8, uint8_t{1}));
    cases.push_back({"escaped key", w.bytes(), "field 'bad\\x0akey' at byte"});
  }
  {
    GgufWriter w = sample();
    w.kv("general.alignment", WValue::of(T::U32, uint32_t{48}));
    cases.push_back({"alignment", w.bytes(), "'general.alignment' at byte"});
    cases.push_back({"alignment", w.bytes(), "alignment 48 is not a power of two"});
  }
  {
    GgufWriter w = sample();
    w.kv("general.alignment", WValue::of(T::U64, uint64_t{32}));
    cases.push_back({"alignment type", w.bytes(), "is u64, expected u32"});
  }
  auto one = [&](WTensor t, WTensor u = {"", 0, {}, {}}) {
    GgufWriter w;
    w.tensor(std::move(t));
    if (!u.name.empty()) w.tensor(std::move(u));
    return w.bytes();
  };
  cases.push_back({"n_dims 0", one({"t", 0, {}, ""}), "field n_dims of tensor 't' at byte 33: 0 dimensions"});
  cases.push_back({"n_dims 5", one({"t", 0, {1, 1, 1, 1, 1}, "abcd"}), "5 dimensions (a tensor has 1 to 4)"});
  cases.push_back(
      {"dim 0", one({"t", 0, {4, 0}, ""}), "field dims[1] of tensor 't' at byte 45: dimension 0 is zero"});
  cases.push_back({"dims overflow", one({"t", 0, {uint64_t{1} << 40, uint64_t{1} << 40}, ""}),
                   "dims[1] of tensor 't' at byte 45: dimension 1099511627776 is zero or makes the element "
                   "count overflow"});
  cases.push_back(
      {"bytes overflow", one({"t", 0, {uint64_t{1} << 61, 2}, ""}), "the tensor's byte size overflows"});
  cases.push_back({"unknown type", one({"t", 99, {4}, ""}),
                   "field type of tensor 't' at byte 45: tensor type 99 is not one metapipe reads"});
  cases.push_back({"block", one({"t", 8, {33}, std::string(34, 'x')}),
                   "row length 33 is not a multiple of the Q8_0 block of 32"});
  {
    WTensor t{"t", 0, {1}, "abcd"};
    t.offset = 4;
    cases.push_back(
        {"unaligned", one(t),
         "field offset of tensor 't' at byte 49: offset 4 is not a multiple of the alignment 32"});
  }
  {
    WTensor t{"t", 0, {1}, "abcd"};
    t.offset = 1LL << 40;
    cases.push_back({"offset outside", one(t).substr(0, 96), "runs past the end of the data section"});
  }
  cases.push_back({"data truncated",
                   one({"t", 0, {4}, "abcd"}, {"u", 0, {8}, std::string(32, 'y')}).substr(0, 140),
                   "field offset of tensor 'u' at byte 82: data [32, +32) runs past the end of the data "
                   "section (44 bytes"});
  cases.push_back({"no data section", one({"t", 0, {4}, std::string(16, 'z')}).substr(0, 61),
                   "field data section at byte 57: file ends before the data section starts"});
  cases.push_back({"duplicate tensor",
                   one({"t", 0, {4}, std::string(16, 'z')}, {"t", 0, {4}, std::string(16, 'z')}),
                   "field name of tensor 't' at byte 57: duplicate tensor name"});

  for (const Bad& c : cases) {
    const std::string m = open_error(c.bytes);
    EXPECT_NE(m.find(c.expect), std::string::npos) << c.what << ": got \"" << m << "\"";
    EXPECT_EQ(m.find('\n'), std::string::npos) << c.what << ": message has several lines: " << m;
    EXPECT_EQ(m.rfind(temp_path("bad.gguf") + ": ", 0), 0u)
        << c.what << ": message does not start with the file: " << m;
  }
}

TEST(Gguf, NotAFile) {
  try {
    GgufFile::open(temp_path("missing.gguf"));
    ADD_FAILURE();
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.gguf: cannot open the model file: No such file"),
              std::string::npos)
        << e.what();
  }
  try {
    GgufFile::open(::testing::TempDir());
    ADD_FAILURE();
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("is not a regular file"), std::string::npos) << e.what();
  }
}

// Opens `bytes`; a file that opens is read through every accessor and every tensor's bytes, so that the
// sanitizers see any read outside what was checked. Anything but a user_error fails the test.
void open_and_touch(const std::string& path, const std::string& bytes, const std::string& label) {
  // A heap copy of exactly the file's size: a read one byte past the end is an ASan report.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[bytes.size() + (bytes.empty() ? 1 : 0)]);
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  try {
    const GgufFile f = GgufFile::from_bytes(path, copy.get(), bytes.size());
    for (const auto& k : f.keys()) {
      const GgufValue* v = f.find_value(k);
      ASSERT_NE(v, nullptr);
      try {
        f.get_int(k);
      } catch (const user_error&) {
      }
      try {
        f.get_float(k);
      } catch (const user_error&) {
      }
      try {
        f.get_string(k);
      } catch (const user_error&) {
      }
      try {
        f.get_int_array(k);
      } catch (const user_error&) {
      }
      try {
        f.get_float_array(k);
      } catch (const user_error&) {
      }
      try {
        f.get_string_array(k);
      } catch (const user_error&) {
      }
    }
    volatile uint8_t sink = 0;
    for (const GgufTensor& t : f.tensors()) {
      ASSERT_LE(f.data_offset() + t.offset + t.nbytes, f.file_bytes()) << label;
      if (t.nbytes) sink = sink + t.data[0] + t.data[t.nbytes - 1];
      const auto rb = quant::row_bytes(t.type, t.dims[0]);
      ASSERT_TRUE(rb.has_value());
      ASSERT_EQ(*rb * static_cast<uint64_t>(t.rows()), t.nbytes) << label;
    }
  } catch (const user_error& e) {
    const std::string m = e.what();
    ASSERT_EQ(m.find('\n'), std::string::npos) << label << ": " << m;
    ASSERT_EQ(m.rfind(path + ": ", 0), 0u) << label << ": " << m;
  }
}

TEST(Gguf, EveryTruncationIsAUserError) {
  const std::string good = sample().bytes();
  const std::string p = temp_path("trunc.gguf");
  ASSERT_NO_THROW(GgufFile::open(write("trunc.gguf", good)));
  std::remove(p.c_str());
  for (size_t n = 0; n < good.size(); ++n) {
    open_and_touch(p, good.substr(0, n), "truncated at " + std::to_string(n));
    if (::testing::Test::HasFatalFailure()) break;
  }
}

TEST(Gguf, RandomByteFlipsAreUserErrors) {
  const std::string good = sample(2).bytes();
  const std::string p = temp_path("flip.gguf");
  std::mt19937_64 rng(27);
  int opened = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      const size_t at = rng() % b.size();
      switch (rng() % 3) {
        case 0:
          b[at] = static_cast<char>(b[at] ^ (1 << (rng() % 8)));
          break;
        case 1:
          b[at] = static_cast<char>(rng());
          break;
        default:
          b[at] = static_cast<char>(0xff);
          break;
      }
    }
    open_and_touch(p, b, "mutation " + std::to_string(i));
    if (::testing::Test::HasFatalFailure()) break;
    try {
      GgufFile::from_bytes(p, b.data(), b.size());
      ++opened;
    } catch (const user_error&) {
    }
  }
  // Some mutations hit only data bytes or values, so both outcomes must have happened.
  EXPECT_GT(opened, 0);
  EXPECT_LT(opened, 3000);
  std::remove(p.c_str());
}

TEST(ModelCache, MissingModelNamesTheInstallCommand) {
  const std::string dir = temp_path("cache");
  const char* old = std::getenv("METAPIPE_MODEL_DIR");
  const std::string saved = old ? old : "";
  setenv("METAPIPE_MODEL_DIR", dir.c_str(), 1);
  EXPECT_EQ(model_dir(), dir);
  try {
    default_model_path();
    ADD_FAILURE() << "a missing model was found";
  } catch (const user_error& e) {
    EXPECT_NE(std::string(e.what()).find("run scripts/install-deps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(dir + "/" + kDefaultModelFile), std::string::npos) << e.what();
  }
  ASSERT_EQ(system(("mkdir -p '" + dir + "'").c_str()), 0);
  GgufWriter::write_file(dir + "/" + kDefaultModelFile, sample().bytes());
  EXPECT_EQ(default_model_path(), dir + "/" + kDefaultModelFile);
  std::remove((dir + "/" + kDefaultModelFile).c_str());
  rmdir(dir.c_str());
  if (old)
    setenv("METAPIPE_MODEL_DIR", saved.c_str(), 1);
  else
    unsetenv("METAPIPE_MODEL_DIR");
}

// The installed default model, when scripts/install-deps has run: the shapes issue 27 states.
TEST(Gguf, DefaultModelOpens) {
  std::string path;
  try {
    path = default_model_path();
  } catch (const user_error& e) {
    GTEST_SKIP() << e.what();
  }
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_int("llama.block_count"), 30);
  EXPECT_EQ(f.get_int("llama.embedding_length"), 576);
  EXPECT_EQ(f.get_int("llama.attention.head_count_kv"), 3);
  EXPECT_NEAR(f.get_float("llama.rope.freq_base"), 1e5, 1e-6);
  const GgufTensor& e = f.tensor("token_embd.weight");
  EXPECT_EQ(e.type, quant::QType::Q8_0);
  EXPECT_EQ(e.dims, (std::vector<int64_t>{576, 49152}));
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").type, quant::QType::Q4_1);
  EXPECT_EQ(f.tensors().size(), 272u);
  // Dequantized weights are finite and not all zero.
  std::vector<float> row(576);
  quant::dequantize_row(e.type, e.data + 1000 * e.nbytes / 49152, row.data(), 576);
  double s = 0;
  for (float x : row) {
    ASSERT_TRUE(std::isfinite(x));
    s += std::fabs(x);
  }
  EXPECT_GT(s, 0);
}

// Rows of the installed model dequantized from where the reader says each tensor's data is, against the
// PyPI gguf package reading the same file (tests/models/dequant_reference.py): the first and the last tensor
// of the file, their first and last rows, and one of each type.
TEST(Gguf, DefaultModelDataMatchesTheGgufPackage) {
  std::string path;
  try {
    path = default_model_path();
  } catch (const user_error& e) {
    GTEST_SKIP() << e.what();
  }
  struct stat st {};
  if (std::string(MP_PYTHON).empty() || ::stat(MP_PYTHON, &st) != 0)
    GTEST_SKIP() << "the reference venv is not installed (run scripts/install-deps, then configure again)";
  const GgufFile f = GgufFile::open(path);
  const GgufTensor& first = f.tensors().front();
  const GgufTensor& last = f.tensors().back();
  std::vector<std::pair<std::string, int64_t>> rows = {{first.name, 0},
                                                       {first.name, first.rows() - 1},
                                                       {last.name, 0},
                                                       {last.name, last.rows() - 1},
                                                       {"blk.7.attn_k.weight", 100},
                                                       {"output_norm.weight", 0}};
  std::string cmd = std::string("'") + MP_PYTHON + "' '" + MP_TESTS_MODELS_DIR +
                    "/dequant_reference.py' --model '" + path + "'";
  for (const auto& [name, row] : rows) cmd += " '" + name + ":" + std::to_string(row) + "'";
  const std::string out_path = temp_path("dequant.json");
  cmd += " > '" + out_path + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out_path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::remove(out_path.c_str());
  // [[x, ...], ...]: one list of numbers per row asked for.
  std::vector<std::vector<double>> want;
  const std::string js = ss.str();
  const char* p = js.c_str();
  int depth = 0;
  while (*p) {
    if (*p == '[') {
      if (++depth == 2) want.emplace_back();
      ++p;
    } else if (*p == ']') {
      --depth;
      ++p;
    } else if (*p == '-' || (*p >= '0' && *p <= '9')) {
      char* end = nullptr;
      const double x = std::strtod(p, &end);
      ASSERT_GT(end, p);
      want.back().push_back(x);
      p = end;
    } else {
      ++p;
    }
  }
  ASSERT_EQ(want.size(), rows.size()) << js.substr(0, 200);
  for (size_t i = 0; i < rows.size(); ++i) {
    const GgufTensor& t = f.tensor(rows[i].first);
    const int64_t n = t.dims[0];
    ASSERT_EQ(static_cast<int64_t>(want[i].size()), n) << t.name;
    std::vector<float> got(static_cast<size_t>(n));
    quant::dequantize_row(t.type, t.data + static_cast<uint64_t>(rows[i].second) * (t.nbytes / t.rows()),
                          got.data(), n);
    for (int64_t k = 0; k < n; ++k)
      ASSERT_NEAR(got[k], want[i][k], 1e-6 * (1 + std::fabs(want[i][k])))
          << t.name << " (" << quant::to_string(t.type) << ") row " << rows[i].second << " element " << k;
  }
}

}  // namespace
}  // namespace mp::models
