// `metapipe info`: the version and the targets present (CPU always, a GPU when usable, simulated ones).
#include <iostream>
#include <thread>

#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

std::string gib(size_t bytes, const char* unit = "GiB", double div = 1024.0 * 1024 * 1024) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes / div, unit);
  return buf;
}

int run_info(Args& a) {
  a.positionals();
  a.finish();
  std::cout << "metapipe " MP_VERSION "\n\ntargets:\n";
  std::cout << "  cpu     always present (" << std::thread::hardware_concurrency()
            << " hardware threads); the reference every other target is checked against\n";
  if (auto g = query_gpu()) {
    std::cout << "  cuda    " << g->name << " (sm_" << g->cc_major << g->cc_minor << ", " << g->sm_count
              << " SMs, " << g->smem_per_sm / 1024 << " KiB shared memory per SM (" << g->smem_per_block_optin / 1024
              << " KiB per block), L2 " << gib(g->l2_bytes, "MiB", 1024.0 * 1024) << ", memory "
              << gib(g->global_mem_bytes) << ", clock " << g->clock_khz / 1000 << " MHz)";
    if (!gpu_is_hopper(*g)) std::cout << " - not Hopper: the sm_90a kernels cannot run on it";
    std::cout << "\n";
  } else {
    std::cout << "  cuda    absent: " << gpu_absent_reason() << "\n";
  }
  for (const auto& [section, fn] : info_sections()) {
    std::cout << "\n" << section << ":\n";
    for (const auto& line : fn()) std::cout << "  " << line << "\n";
  }
  return 0;
}

MP_REGISTER_COMMAND("info", "version and the targets present (cpu, GPU, simulated accelerators)",
                    "usage: metapipe info\n\n"
                    "Prints the metapipe version and every target this build can use: the CPU (always),\n"
                    "a CUDA GPU (name, SM count, shared memory per SM, L2 and memory size) when one is\n"
                    "usable, and the simulated accelerators and their presets.\n",
                    run_info);

}  // namespace
}  // namespace mp::cli
