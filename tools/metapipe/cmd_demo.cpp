// `metapipe demo`, the main job: every example program on every target present, checked against the CPU
// reference, in one table.
#include <iostream>

#include "core/table.h"
#include "core/text.h"
#include "tools/metapipe/cli.h"

namespace mp::cli {
namespace {

int run_demo(Args& a) {
  DemoContext ctx;
  ctx.quick = a.flag({"--quick"});
  bool json = a.flag({"--json"});
  auto only = a.value({"--target"});
  ctx.target = only;
  a.positionals();
  a.finish();
  ctx.gpu = query_gpu();
  if (ctx.gpu && !gpu_is_hopper(*ctx.gpu)) ctx.gpu.reset();  // our kernels are sm_90a only

  std::vector<DemoRow> rows;
  for (const auto& p : demo_providers()) {
    try {
      for (auto& r : p.fn(ctx))
        if (!only || r.target.rfind(*only, 0) == 0) rows.push_back(std::move(r));
    } catch (const std::exception& e) {
      rows.push_back({p.name, "-", std::string("FAIL: ") + e.what(), "-", false});
    }
  }
  if (only && rows.empty())
    throw usage_error("no demo rows for target '" + *only + "' (targets are prefixes such as cpu, cuda, rdu, systolic)");
  bool all_ok = true;
  for (const auto& r : rows) all_ok = all_ok && r.ok;
  if (json) {
    std::cout << "{\"rows\": [";
    for (size_t i = 0; i < rows.size(); ++i)
      std::cout << (i ? ", " : "") << "{\"program\": \"" << json_escape(rows[i].program) << "\", \"target\": \""
                << json_escape(rows[i].target) << "\", \"check\": \"" << json_escape(rows[i].check)
                << "\", \"measure\": \"" << json_escape(rows[i].measure) << "\", \"ok\": " << (rows[i].ok ? "true" : "false")
                << "}";
    std::cout << "], \"ok\": " << (all_ok ? "true" : "false") << "}\n";
  } else {
    std::cout << "metapipe demo: every example program on every target present ("
              << (ctx.gpu ? "cpu, " + ctx.gpu->name : "cpu; no GPU: " + gpu_absent_reason()) << ")\n\n";
    Table t({"program", "target", "check vs CPU reference", "time / simulated cycles"});
    for (const auto& r : rows) t.add({r.program, r.target, r.check, r.measure});
    t.print(std::cout);
    std::cout << "\n" << (all_ok ? "all checks passed" : "SOME CHECKS FAILED") << " (" << rows.size() << " rows)\n";
  }
  return all_ok ? 0 : 1;
}

MP_REGISTER_COMMAND("demo", "run every example program on every target present and check it (the main job)",
                    "usage: metapipe demo [--quick] [--json] [--target PREFIX]\n\n"
                    "Runs every example program on every target present (cpu always; cuda when a Hopper GPU\n"
                    "is usable; the simulated accelerators always) on fresh random inputs, checks each result\n"
                    "against the CPU reference and prints a table with the time or simulated cycles.\n"
                    "Exits 0 only when every check passes.\n\n"
                    "  --quick          smaller problem sizes\n"
                    "  --json           machine-readable output\n"
                    "  --target PREFIX  only rows whose target starts with PREFIX (cpu, cuda, rdu, systolic)\n",
                    run_demo);

}  // namespace
}  // namespace mp::cli
