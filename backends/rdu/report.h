// Reports of a simulated run: a text summary, JSON (for tools and tests) and an SVG placement picture.
#pragma once
#include <ostream>
#include <string>

#include "backends/rdu/arch.h"
#include "backends/rdu/rdu.h"

namespace mp::rdu {

void print_text(std::ostream& os, const Arch& a, const RunResult& r);
void print_json(std::ostream& os, const Arch& a, const RunResult& r);
// The placement of kernel call `config` with routes, units shaded by utilization.
std::string render_svg(const Arch& a, const RunResult& r, int config = 0);

}  // namespace mp::rdu
