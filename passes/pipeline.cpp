// The compiler pipeline, as a list: each pass is a pure function, followed by verification and an
// optional dump of the IR.
#include "passes/pipeline.h"

#include <chrono>

#include "ir/printer.h"
#include "ir/verify.h"

namespace mp::passes {

std::vector<std::string> pass_names() { return {"tile", "fuse", "parallelize", "metapipeline"}; }

ir::Program compile(const ir::Program& input, const CompileOptions& opt, std::vector<PassRecord>* log) {
  bool all = opt.dump == "after-all";
  if (!all && opt.dump != "none") {
    bool known = false;
    for (auto& n : pass_names()) known = known || opt.dump == "after-" + n;
    MP_USER_CHECK(
        known, "unknown --dump-ir value '", opt.dump,
        "' (expected none, after-all, after-tile, after-fuse, after-parallelize or after-metapipeline)");
  }
  auto t = std::chrono::steady_clock::now();
  auto after = [&](const std::string& name, const ir::Program& p) {
    ir::verify(p);
    auto now = std::chrono::steady_clock::now();
    if (log) log->push_back({name, std::chrono::duration<double, std::milli>(now - t).count()});
    t = now;
    if (opt.dump_to && (all || opt.dump == "after-" + name))
      *opt.dump_to << "// ----- IR after " << name << " -----\n" << ir::print(p) << "\n";
  };

  ir::Program p = input.clone();
  after("input", p);
  p = tile(p, opt.tile);
  after("tile", p);
  p = fuse(p, opt.fuse);
  after("fuse", p);
  p = parallelize(p, opt.parallelize);
  after("parallelize", p);
  p = metapipeline(p, opt.metapipeline);
  after("metapipeline", p);
  return p;
}

}  // namespace mp::passes
