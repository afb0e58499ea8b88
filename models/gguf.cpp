// The GGUF reader. Everything the file says is checked against the file's size before it is used, so a
// corrupt or hostile file ends in one user_error naming the file, the field and its byte offset.
#include "models/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <utility>

#include "core/error.h"

namespace mp::models {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // GGML tensors have at most four dimensions
constexpr int kMaxArrayDepth = 8;        // nested arrays deeper than this are refused (no file needs them)
constexpr uint64_t kDefaultAlignment = 32;

// A key or tensor name as it may appear in a one-line message: printable ASCII, the rest escaped, cut.
std::string printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (out.size() > 80) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out += static_cast<char>(c);
    } else {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::U16:
    case GgufType::I16:
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::BOOL:
      return true;
    default:
      return false;
  }
}
bool is_float(GgufType t) { return t == GgufType::F32 || t == GgufType::F64; }

// Bytes of one element of a fixed-size type; 0 for STRING / ARRAY / unknown.
uint64_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::U8:
    case GgufType::I8:
    case GgufType::BOOL:
      return 1;
    case GgufType::U16:
    case GgufType::I16:
      return 2;
    case GgufType::U32:
    case GgufType::I32:
    case GgufType::F32:
      return 4;
    case GgufType::U64:
    case GgufType::I64:
    case GgufType::F64:
      return 8;
    default:
      return 0;
  }
}

// Reads a fixed-size scalar of type t at p (checked to be inside the map by the caller).
void decode_scalar(GgufType t, const uint8_t* p, GgufValue& v) {
  auto load = [&](auto tag) {
    decltype(tag) x;
    std::memcpy(&x, p, sizeof x);
    return x;
  };
  switch (t) {
    case GgufType::U8:
      v.bits = load(uint8_t{});
      break;
    case GgufType::I8:
      v.bits = static_cast<uint64_t>(static_cast<int64_t>(load(int8_t{})));
      break;
    case GgufType::BOOL:
      v.bits = load(uint8_t{});
      break;
    case GgufType::U16:
      v.bits = load(uint16_t{});
      break;
    case GgufType::I16:
      v.bits = static_cast<uint64_t>(static_cast<int64_t>(load(int16_t{})));
      break;
    case GgufType::U32:
      v.bits = load(uint32_t{});
      break;
    case GgufType::I32:
      v.bits = static_cast<uint64_t>(static_cast<int64_t>(load(int32_t{})));
      break;
    case GgufType::U64:
      v.bits = load(uint64_t{});
      break;
    case GgufType::I64:
      v.bits = load(uint64_t{});
      break;
    case GgufType::F32:
      v.f = load(float{});
      break;
    case GgufType::F64:
      v.f = load(double{});
      break;
    default:
      break;
  }
}

}  // namespace

const char* to_string(GgufType t) {
  switch (t) {
    case GgufType::U8:
      return "u8";
    case GgufType::I8:
      return "i8";
    case GgufType::U16:
      return "u16";
    case GgufType::I16:
      return "i16";
    case GgufType::U32:
      return "u32";
    case GgufType::I32:
      return "i32";
    case GgufType::F32:
      return "f32";
    case GgufType::BOOL:
      return "bool";
    case GgufType::STRING:
      return "string";
    case GgufType::ARRAY:
      return "array";
    case GgufType::U64:
      return "u64";
    case GgufType::I64:
      return "i64";
    case GgufType::F64:
      return "f64";
  }
  return "unknown";
}

int64_t GgufTensor::rows() const {
  int64_t r = 1;
  for (size_t i = 1; i < dims.size(); ++i) r *= dims[i];  // bounded on open
  return r;
}

struct GgufFile::Impl {
  std::string path;
  const uint8_t* base = nullptr;
  uint64_t size = 0;
  uint32_t version = 0;
  uint64_t alignment = kDefaultAlignment;
  uint64_t data_start = 0;
  std::vector<std::pair<std::string, GgufValue>> kvs;
  std::unordered_map<std::string, size_t> kv_index;
  std::vector<GgufTensor> tensors;
  std::unordered_map<std::string, size_t> tensor_index;

  bool mapped = false;
  ~Impl() {
    if (base && mapped) munmap(const_cast<uint8_t*>(base), size);
  }

  [[noreturn]] void bad(const std::string& field, uint64_t at, const std::string& what) const {
    fail_user(path, ": field ", field, " at byte ", at, ": ", what);
  }
  const GgufValue& value(const std::string& key, const char* wanted) const {
    auto it = kv_index.find(key);
    if (it == kv_index.end())
      fail_user(path, ": metadata key '", printable(key), "' is missing (expected ", wanted,
                "); is this the right model file?");
    return kvs[it->second].second;
  }
  [[noreturn]] void wrong_type(const std::string& key, const GgufValue& v, const char* wanted) const {
    std::string got = to_string(v.type);
    if (v.type == GgufType::ARRAY) got = std::string("array of ") + to_string(v.elem);
    bad("'" + printable(key) + "'", v.at, "is " + got + ", expected " + wanted);
  }
  int64_t as_int(const std::string& key, GgufType t, uint64_t bits, uint64_t at) const {
    if (t == GgufType::U64 && bits > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad("'" + printable(key) + "'", at, "u64 value " + std::to_string(bits) + " does not fit in int64");
    return static_cast<int64_t>(bits);
  }
};

namespace {

// A bounds-checked cursor over the map; every read names the field it reads for the message.
struct Cursor {
  const GgufFile::Impl& f;
  uint64_t pos = 0;

  uint64_t left() const { return f.size - pos; }
  void need(uint64_t n, const std::string& field) const {
    if (n > left())
      f.bad(field, pos,
            "file ends after " + std::to_string(left()) + " of " + std::to_string(n) +
                " bytes (truncated file? download it again)");
  }
  template <class T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T x;
    std::memcpy(&x, f.base + pos, sizeof x);
    pos += sizeof x;
    return x;
  }
  std::string_view string(const std::string& field) {
    const uint64_t at = pos;
    const auto n = read<uint64_t>(field + " (string length)");
    if (n > left())
      f.bad(field, at,
            "string length " + std::to_string(n) + " runs past the end of the file (" +
                std::to_string(left()) + " bytes left)");
    std::string_view s(reinterpret_cast<const char*>(f.base + pos), n);
    pos += n;
    return s;
  }
  GgufType type(const std::string& field) {
    const uint64_t at = pos;
    const auto t = read<uint32_t>(field);
    if (t > static_cast<uint32_t>(GgufType::F64))
      f.bad(field, at, "unknown metadata value type " + std::to_string(t) + " (GGUF defines 0..12)");
    return static_cast<GgufType>(t);
  }

  GgufValue value(GgufType t, const std::string& field, int depth) {
    GgufValue v;
    v.type = t;
    v.at = pos;
    if (t == GgufType::STRING) {
      v.s = string(field);
    } else if (t == GgufType::ARRAY) {
      if (depth >= kMaxArrayDepth)
        f.bad(field, pos, "arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
      v.elem = type(field + " (array element type)");
      const uint64_t count_at = pos;
      v.count = read<uint64_t>(field + " (array length)");
      // The smallest an element can be on disk bounds the count before anything is allocated.
      const uint64_t min_elem = v.elem == GgufType::STRING  ? 8
                                : v.elem == GgufType::ARRAY ? 12
                                                            : fixed_size(v.elem);
      if (v.count > left() / min_elem)
        f.bad(field, count_at,
              "array of " + std::to_string(v.count) + " " + to_string(v.elem) +
                  " elements does not fit in the " + std::to_string(left()) + " bytes left");
      if (v.elem == GgufType::STRING) {
        v.strings.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i)
          v.strings.push_back(string(field + "[" + std::to_string(i) + "]"));
      } else if (v.elem == GgufType::ARRAY) {
        v.items.reserve(v.count);
        for (uint64_t i = 0; i < v.count; ++i)
          v.items.push_back(value(GgufType::ARRAY, field + "[" + std::to_string(i) + "]", depth + 1));
      } else {
        v.raw = f.base + pos;
        if (v.elem == GgufType::BOOL)
          for (uint64_t i = 0; i < v.count; ++i)
            if (v.raw[i] > 1)
              f.bad(field + "[" + std::to_string(i) + "]", pos + i,
                    "bool value " + std::to_string(v.raw[i]) + " is neither 0 nor 1");
        pos += v.count * min_elem;
      }
    } else {
      const uint64_t n = fixed_size(t);
      need(n, field);
      decode_scalar(t, f.base + pos, v);
      if (t == GgufType::BOOL && v.bits > 1)
        f.bad(field, pos, "bool value " + std::to_string(v.bits) + " is neither 0 nor 1");
      pos += n;
    }
    return v;
  }
};

std::string field_of(const std::string& key) { return "'" + printable(key) + "'"; }

}  // namespace

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::open(const std::string& path) {
  auto impl = std::make_unique<Impl>();
  Impl& f = *impl;
  f.path = path;
  {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail_user(path, ": cannot open the model file: ", std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      fail_user(path, ": is not a regular file (pass a .gguf model file)");
    }
    if (st.st_size < 4) {
      ::close(fd);
      f.bad("magic", 0, "file is " + std::to_string(st.st_size) + " bytes long, too short for a GGUF header");
    }
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);  // the map keeps the file alive
    if (m == MAP_FAILED) fail_user(path, ": cannot memory-map the file: ", std::strerror(err));
    f.base = static_cast<const uint8_t*>(m);
    f.size = static_cast<uint64_t>(st.st_size);
    f.mapped = true;
  }
  parse(f);
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::from_bytes(const std::string& name, const void* data, size_t size) {
  auto impl = std::make_unique<Impl>();
  impl->path = name;
  impl->base = static_cast<const uint8_t*>(data);
  impl->size = size;
  if (size < 4)
    impl->bad("magic", 0, "file is " + std::to_string(size) + " bytes long, too short for a GGUF header");
  parse(*impl);
  return GgufFile(std::move(impl));
}

void GgufFile::parse(Impl& f) {
  Cursor c{f};
  const auto magic = c.read<uint32_t>("magic");
  if (magic != kMagic) f.bad("magic", 0, "not a GGUF file (the first four bytes are not \"GGUF\")");
  const auto version = c.read<uint32_t>("version");
  if (version == 1)
    f.bad("version", 4, "GGUF version 1 is not read (only versions 2 and 3); convert the file again");
  if (version != 2 && version != 3) {
    if ((version & 0xffff) == 0 && (version >> 24) != 0)
      f.bad("version", 4, "looks like a big-endian GGUF file; metapipe reads little-endian files only");
    f.bad("version", 4, "unsupported GGUF version " + std::to_string(version) + " (metapipe reads 2 and 3)");
  }
  f.version = version;
  const uint64_t tcount_at = c.pos;
  const auto tensor_count = c.read<uint64_t>("tensor_count");
  const uint64_t kvcount_at = c.pos;
  const auto kv_count = c.read<uint64_t>("metadata_kv_count");
  // Minimal on-disk sizes: a key/value pair is at least 8 + 4 + 1 bytes, a tensor info 8 + 4 + 4 + 8.
  if (kv_count > c.left() / 13)
    f.bad("metadata_kv_count", kvcount_at,
          "count " + std::to_string(kv_count) + " cannot fit in the " + std::to_string(c.left()) +
              " bytes left");

  f.kvs.reserve(kv_count);
  for (uint64_t i = 0; i < kv_count; ++i) {
    const uint64_t key_at = c.pos;
    const std::string key(c.string("key of metadata pair " + std::to_string(i)));
    const std::string field = field_of(key);
    if (f.kv_index.count(key)) f.bad(field, key_at, "duplicate metadata key");
    const GgufType t = c.type(field + " (value type)");
    GgufValue v = c.value(t, field, 0);
    f.kv_index.emplace(key, f.kvs.size());
    f.kvs.emplace_back(key, std::move(v));
  }
  if (tensor_count > c.left() / 24)
    f.bad("tensor_count", tcount_at,
          "count " + std::to_string(tensor_count) + " cannot fit in the " + std::to_string(c.left()) +
              " bytes left after the metadata");

  if (auto it = f.kv_index.find("general.alignment"); it != f.kv_index.end()) {
    const GgufValue& a = f.kvs[it->second].second;
    if (a.type != GgufType::U32) f.wrong_type("general.alignment", a, "u32");
    if (a.bits == 0 || (a.bits & (a.bits - 1)) != 0)
      f.bad("'general.alignment'", a.at, "alignment " + std::to_string(a.bits) + " is not a power of two");
    f.alignment = a.bits;
  }

  std::vector<uint64_t> info_at(tensor_count);
  f.tensors.reserve(tensor_count);
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    info_at[i] = c.pos;
    t.name = std::string(c.string("name of tensor " + std::to_string(i)));
    const std::string tf = "of tensor '" + printable(t.name) + "'";
    if (f.tensor_index.count(t.name)) f.bad("name " + tf, info_at[i], "duplicate tensor name");
    const uint64_t nd_at = c.pos;
    const auto nd = c.read<uint32_t>("n_dims " + tf);
    if (nd < 1 || nd > kMaxDims)
      f.bad("n_dims " + tf, nd_at, std::to_string(nd) + " dimensions (a tensor has 1 to 4)");
    uint64_t elems = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t d_at = c.pos;
      const auto n = c.read<uint64_t>("dims[" + std::to_string(d) + "] " + tf);
      if (n == 0 || n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / n)
        f.bad("dims[" + std::to_string(d) + "] " + tf, d_at,
              "dimension " + std::to_string(n) + " is zero or makes the element count overflow");
      elems *= n;
      t.dims.push_back(static_cast<int64_t>(n));
    }
    const uint64_t type_at = c.pos;
    const auto type_id = c.read<uint32_t>("type " + tf);
    const auto qi = quant::qtype_info(type_id);
    if (!qi)
      f.bad("type " + tf, type_at,
            "tensor type " + std::to_string(type_id) +
                " is not one metapipe reads (F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)");
    t.type = qi->type;
    const auto rb = quant::row_bytes(t.type, t.dims[0]);
    if (!rb)
      f.bad("dims[0] " + tf, nd_at + 4,
            "row length " + std::to_string(t.dims[0]) + " is not a multiple of the " + qi->name +
                " block of " + std::to_string(qi->block_elems));
    const uint64_t rows = elems / static_cast<uint64_t>(t.dims[0]);
    if (*rb != 0 && rows > std::numeric_limits<uint64_t>::max() / *rb)
      f.bad("dims " + tf, nd_at + 4, "the tensor's byte size overflows");
    t.nbytes = *rb * rows;
    const uint64_t off_at = c.pos;
    t.offset = c.read<uint64_t>("offset " + tf);
    if (t.offset % f.alignment != 0)
      f.bad("offset " + tf, off_at,
            "offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                std::to_string(f.alignment));
    info_at[i] = off_at;
    f.tensor_index.emplace(t.name, f.tensors.size());
    f.tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t pad = (f.alignment - c.pos % f.alignment) % f.alignment;
  f.data_start = c.pos + pad;
  if (!f.tensors.empty() && f.data_start > f.size)
    f.bad("data section", c.pos,
          "file ends before the data section starts (truncated file? download it again)");
  const uint64_t data_bytes = f.data_start <= f.size ? f.size - f.data_start : 0;
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    GgufTensor& t = f.tensors[i];
    if (t.offset > data_bytes || t.nbytes > data_bytes - t.offset)
      f.bad("offset of tensor '" + printable(t.name) + "'", info_at[i],
            "data [" + std::to_string(t.offset) + ", +" + std::to_string(t.nbytes) +
                ") runs past the end of the data section (" + std::to_string(data_bytes) +
                " bytes; truncated file? download it again)");
    t.data = f.base + f.data_start + t.offset;
  }
}

const std::string& GgufFile::path() const { return impl_->path; }
uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::file_bytes() const { return impl_->size; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
uint64_t GgufFile::data_offset() const { return impl_->data_start; }
bool GgufFile::has(const std::string& key) const { return impl_->kv_index.count(key) != 0; }

const GgufValue* GgufFile::find_value(const std::string& key) const {
  auto it = impl_->kv_index.find(key);
  return it == impl_->kv_index.end() ? nullptr : &impl_->kvs[it->second].second;
}
std::vector<std::string> GgufFile::keys() const {
  std::vector<std::string> k;
  for (const auto& [key, v] : impl_->kvs) k.push_back(key);
  return k;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "an integer");
  if (!is_integer(v.type)) impl_->wrong_type(key, v, "an integer");
  return impl_->as_int(key, v.type, v.bits, v.at);
}
std::optional<int64_t> GgufFile::find_int(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_int(key);
}
double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "a number");
  if (is_float(v.type)) return v.f;
  if (is_integer(v.type)) return static_cast<double>(impl_->as_int(key, v.type, v.bits, v.at));
  impl_->wrong_type(key, v, "a number");
}
std::optional<double> GgufFile::find_float(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}
std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "a string");
  if (v.type != GgufType::STRING) impl_->wrong_type(key, v, "a string");
  return std::string(v.s);
}
std::optional<std::string> GgufFile::find_string(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}
std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "an array of strings");
  if (v.type != GgufType::ARRAY || v.elem != GgufType::STRING)
    impl_->wrong_type(key, v, "an array of strings");
  return {v.strings.begin(), v.strings.end()};
}
std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "an array of integers");
  if (v.type != GgufType::ARRAY || !is_integer(v.elem)) impl_->wrong_type(key, v, "an array of integers");
  std::vector<int64_t> out(v.count);
  const uint64_t n = fixed_size(v.elem);
  for (uint64_t i = 0; i < v.count; ++i) {
    GgufValue e;
    decode_scalar(v.elem, v.raw + i * n, e);
    out[i] = impl_->as_int(key, v.elem, e.bits, v.at);
  }
  return out;
}
std::vector<double> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = impl_->value(key, "an array of numbers");
  if (v.type != GgufType::ARRAY || !(is_integer(v.elem) || is_float(v.elem)))
    impl_->wrong_type(key, v, "an array of numbers");
  std::vector<double> out(v.count);
  const uint64_t n = fixed_size(v.elem);
  for (uint64_t i = 0; i < v.count; ++i) {
    GgufValue e;
    decode_scalar(v.elem, v.raw + i * n, e);
    out[i] = is_float(v.elem) ? e.f : static_cast<double>(impl_->as_int(key, v.elem, e.bits, v.at));
  }
  return out;
}

const std::vector<GgufTensor>& GgufFile::tensors() const { return impl_->tensors; }
const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}
const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (!t)
    fail_user(impl_->path, ": tensor '", printable(name), "' is missing (is this the right model file?)");
  return *t;
}

}  // namespace mp::models
