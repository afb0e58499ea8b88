// The parts of the run time that need no CUDA: the cache location and the source hash.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cstdlib>

#include "backends/cuda/lower/runtime.h"

namespace mp::cuda {

std::string default_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/metapipe/cuda";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/metapipe/cuda";
  return ".metapipe-cache/cuda";
}

std::string source_hash(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<unsigned char> to_device_bytes(const ir::HostTensor& h) {
  size_t n = h.data.size();
  std::vector<unsigned char> b(n * size_t(device_bytes_of(h.dtype)));
  for (size_t i = 0; i < n; ++i) {
    float x = h.data[i];
    if (h.dtype == ir::DType::bf16) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      uint16_t s = uint16_t(u >> 16);
      std::memcpy(&b[i * 2], &s, 2);
    } else if (h.dtype == ir::DType::i32) {
      int32_t v = std::isfinite(x) ? int32_t(x) : INT32_MIN;  // the poison of an integer tensor
      std::memcpy(&b[i * 4], &v, 4);
    } else {
      std::memcpy(&b[i * 4], &x, 4);
    }
  }
  return b;
}

void from_device_bytes(const std::vector<unsigned char>& b, ir::HostTensor& h) {
  for (size_t i = 0; i < h.data.size(); ++i) {
    float x;
    if (h.dtype == ir::DType::bf16) {
      uint16_t s;
      std::memcpy(&s, &b[i * 2], 2);
      uint32_t u = uint32_t(s) << 16;
      std::memcpy(&x, &u, 4);
    } else if (h.dtype == ir::DType::i32) {
      int32_t v;
      std::memcpy(&v, &b[i * 4], 4);
      x = float(v);
    } else {
      std::memcpy(&x, &b[i * 4], 4);
    }
    h.data[i] = x;
  }
}

}  // namespace mp::cuda
