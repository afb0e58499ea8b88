// A read-only, memory-mapped GGUF file (versions 2 and 3): its metadata key/value pairs and its tensor
// infos, checked on open so that every later access stays inside the map. Tensor data is never copied.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/quant.h"

namespace mp::models {

struct GgufTensor {
  std::string name;
  quant::QType type;
  std::vector<int64_t> dims;      // GGUF order: dims[0] is the fastest-varying (row length)
  uint64_t offset = 0;            // from the start of the data section
  const uint8_t* data = nullptr;  // into the memory map
  uint64_t nbytes = 0;
  int64_t rows() const;  // product of dims[1..]
};

// The metadata value types of the GGUF format (their numeric ids are the format's).
enum class GgufType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
const char* to_string(GgufType t);

// One metadata value, pointing into the map. Arrays of fixed-size elements keep only where their
// elements start (decoded on access, so a large array costs no memory); string arrays keep views; arrays
// of arrays keep their items.
struct GgufValue {
  GgufType type = GgufType::U8;
  uint64_t bits = 0;             // every integer type and BOOL, as read (sign-extended for signed types)
  double f = 0;                  // F32 / F64
  std::string_view s;            // STRING
  GgufType elem = GgufType::U8;  // ARRAY: the element type
  uint64_t count = 0;            // ARRAY: number of elements
  const uint8_t* raw = nullptr;  // ARRAY of numbers: the first element
  std::vector<std::string_view> strings;  // ARRAY of STRING
  std::vector<GgufValue> items;           // ARRAY of ARRAY
  uint64_t at = 0;                        // byte offset of the value in the file (for messages)
};

class GgufFile {  // memory-mapped, read-only; move-only
 public:
  static GgufFile open(const std::string& path);  // user_error "FILE: field F at byte B: what is wrong"
  // The same checks on bytes already in memory (not copied: they must outlive the object); `name` stands
  // for the file in messages. For tests and the fuzz target, where a heap buffer of the exact size lets
  // the address sanitizer see any read past the end.
  static GgufFile from_bytes(const std::string& name, const void* data, size_t size);
  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const;
  uint32_t version() const;
  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;  // any integer type; user_error if missing / wrong type
  std::optional<int64_t> find_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // f32/f64 (ints accepted)
  std::optional<double> find_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<int64_t> get_int_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;
  const std::vector<GgufTensor>& tensors() const;
  const GgufTensor* find_tensor(const std::string& name) const;
  const GgufTensor& tensor(
      const std::string& name) const;  // user_error naming the file and tensor if missing
  uint64_t file_bytes() const;

  // Additions: the raw value (nullptr when absent), the keys in file order, the data alignment.
  const GgufValue* find_value(const std::string& key) const;
  std::vector<std::string> keys() const;
  uint64_t alignment() const;
  uint64_t data_offset() const;  // byte offset of the data section in the file

  struct Impl;

 private:
  explicit GgufFile(std::unique_ptr<Impl> impl);
  static void parse(Impl& f);
  std::unique_ptr<Impl> impl_;
};

}  // namespace mp::models
