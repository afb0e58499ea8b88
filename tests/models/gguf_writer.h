// A small GGUF writer for tests: builds files byte by byte so that the reader can be checked on every value
// type and on files corrupted in known places.
#pragma once
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "models/gguf.h"

namespace mp::models::testing {

// A metadata value to write: a scalar (bytes already encoded), a string, or an array of values.
struct WValue {
  GgufType type;
  std::string scalar;  // little-endian bytes of a fixed-size scalar
  std::string str;     // STRING
  GgufType elem = GgufType::U8;
  std::vector<WValue> items;  // ARRAY

  template <class T>
  static WValue of(GgufType t, T x) {
    WValue v{t, {}, {}, GgufType::U8, {}};
    v.scalar.assign(reinterpret_cast<const char*>(&x), sizeof x);
    return v;
  }
  static WValue string(std::string s) {
    WValue v{GgufType::STRING, {}, std::move(s), GgufType::U8, {}};
    return v;
  }
  static WValue array(GgufType elem, std::vector<WValue> items) {
    WValue v{GgufType::ARRAY, {}, {}, elem, std::move(items)};
    return v;
  }
};

struct WTensor {
  std::string name;
  uint32_t type;
  std::vector<uint64_t> dims;
  std::string data;
  int64_t offset = -1;  // >= 0: written as is instead of the next aligned offset
};

class GgufWriter {
 public:
  uint32_t version = 3;
  uint64_t alignment = 32;  // used to place the data; write general.alignment yourself to change it

  void kv(const std::string& key, WValue v) { kvs_.emplace_back(key, std::move(v)); }
  void tensor(WTensor t) { tensors_.push_back(std::move(t)); }

  // The whole file. Offsets in the tensor infos are assigned in order, each aligned.
  std::string bytes() const {
    std::string out;
    put<uint32_t>(out, 0x46554747);
    put<uint32_t>(out, version);
    put<uint64_t>(out, tensors_.size());
    put<uint64_t>(out, kvs_.size());
    for (const auto& [k, v] : kvs_) {
      put_str(out, k);
      put<uint32_t>(out, static_cast<uint32_t>(v.type));
      put_value(out, v);
    }
    uint64_t off = 0;
    std::vector<uint64_t> offs;
    for (const auto& t : tensors_) {
      put_str(out, t.name);
      put<uint32_t>(out, static_cast<uint32_t>(t.dims.size()));
      for (auto d : t.dims) put<uint64_t>(out, d);
      put<uint32_t>(out, t.type);
      const uint64_t at = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : off;
      put<uint64_t>(out, at);
      offs.push_back(at);
      off += t.data.size();
      off = (off + alignment - 1) / alignment * alignment;
    }
    if (!tensors_.empty()) {
      while (out.size() % alignment) out += '\0';
      const size_t start = out.size();
      for (size_t i = 0; i < tensors_.size(); ++i) {
        if (offs[i] > (uint64_t{1} << 30)) continue;  // an offset far outside, for error tests: no data
        if (out.size() < start + offs[i] + tensors_[i].data.size())
          out.resize(start + offs[i] + tensors_[i].data.size(), '\0');
        std::memcpy(out.data() + start + offs[i], tensors_[i].data.data(), tensors_[i].data.size());
      }
    }
    return out;
  }

  static void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }

  template <class T>
  static void put(std::string& out, T x) {
    out.append(reinterpret_cast<const char*>(&x), sizeof x);
  }
  static void put_str(std::string& out, const std::string& s) {
    put<uint64_t>(out, s.size());
    out += s;
  }

 private:
  static void put_value(std::string& out, const WValue& v) {
    if (v.type == GgufType::STRING) {
      put_str(out, v.str);
    } else if (v.type == GgufType::ARRAY) {
      put<uint32_t>(out, static_cast<uint32_t>(v.elem));
      put<uint64_t>(out, v.items.size());
      for (const auto& e : v.items) put_value(out, e);
    } else {
      out += v.scalar;
    }
  }
  std::vector<std::pair<std::string, WValue>> kvs_;
  std::vector<WTensor> tensors_;
};

}  // namespace mp::models::testing
