// `metapipe list`: the example programs and their parameters with defaults.
#include <iostream>

#include "examples/registry.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

int run_list(Args& a) {
  a.positionals();
  a.finish();
  std::cout << "programs (metapipe run|compile PROGRAM [--set NAME=VALUE ...]):\n";
  for (auto* s : examples::programs()) {
    std::cout << "\n  " << s->name << "  " << s->summary << "\n";
    for (auto& p : s->params) {
      std::string pad(p.name.size() + p.def.size() < 18 ? 18 - p.name.size() - p.def.size() : 1, ' ');
      std::cout << "      " << p.name << "=" << p.def << pad << p.help << "\n";
    }
  }
  std::cout << "\ncompile parameters (every program):\n";
  for (auto& p : examples::compile_params()) {
    std::string pad(p.name.size() + p.def.size() < 18 ? 18 - p.name.size() - p.def.size() : 1, ' ');
    std::cout << "      " << p.name << "=" << p.def << pad << p.help << "\n";
  }
  return 0;
}

MP_REGISTER_COMMAND("list", "list the example programs and their parameters with defaults",
                    "usage: metapipe list\n\n"
                    "Lists every registered example program with a one-line summary and its parameters\n"
                    "(NAME=DEFAULT), then the compile parameters every program accepts. Change them with\n"
                    "--set NAME=VALUE on metapipe run / compile.\n",
                    run_list);

}  // namespace
}  // namespace mp::cli
