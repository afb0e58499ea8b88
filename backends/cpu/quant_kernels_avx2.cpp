// The avx2 kernels (not compiled in yet).
#include "backends/cpu/quant_kernels.h"

namespace mp::cpu::qk {
const Kernels* kernels_avx2() { return nullptr; }
}  // namespace mp::cpu::qk
