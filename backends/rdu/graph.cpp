// Construction and checks of the stage graph.
#include "backends/rdu/graph.h"

#include <algorithm>

#include "core/error.h"

namespace mp::rdu {

const char* to_string(StageKind k) {
  switch (k) {
    case StageKind::Load:
      return "load";
    case StageKind::Store:
      return "store";
    case StageKind::Compute:
      return "compute";
  }
  return "?";
}

double Stage::flops() const {
  if (kind != StageKind::Compute) return 0;
  return (is_matmul() ? 2.0 * double(m) * double(k) * double(n) : 0.0) + double(elements) * ops;
}

int Graph::add_tensor(std::string n, int64_t bytes) {
  tensors.push_back({std::move(n), bytes, -1, {}, {}});
  return int(tensors.size()) - 1;
}
int Graph::add_buffer(std::string n, int64_t bytes, int depth) {
  buffers.push_back({std::move(n), bytes, depth, 0, false, 0});
  return int(buffers.size()) - 1;
}
int Graph::add_stage(Stage s) {
  stages.push_back(std::move(s));
  return int(stages.size()) - 1;
}

int Graph::producer_of(int b) const {
  for (size_t s = 0; s < stages.size(); ++s)
    for (int o : stages[s].outputs)
      if (o == b) return int(s);
  return -1;
}

std::vector<int> Graph::consumers_of(int b) const {
  std::vector<int> out;
  for (size_t s = 0; s < stages.size(); ++s)
    for (auto& in : stages[s].inputs)
      if (in.buffer == b) out.push_back(int(s));
  return out;
}

void Graph::validate() const {
  MP_USER_CHECK(!stages.empty(), "graph '", name, "' has no stages");
  for (size_t b = 0; b < buffers.size(); ++b) {
    const Buffer& buf = buffers[b];
    MP_USER_CHECK(buf.depth >= 1, "buffer '", buf.name, "': depth must be >= 1");
    MP_USER_CHECK(buf.bytes > 0, "buffer '", buf.name, "': size must be positive");
    int writers = 0;
    for (auto& s : stages)
      for (int o : s.outputs) writers += o == int(b);
    MP_USER_CHECK(writers <= 1, "buffer '", buf.name, "' has ", writers, " producers; a buffer has one");
    int p = producer_of(int(b));
    MP_USER_CHECK(p >= 0 || buf.initial_tokens > 0, "buffer '", buf.name, "' is read but no stage writes it");
    int64_t made = buf.initial_tokens;
    if (p >= 0) {
      const Stage& ps = stages[p];
      MP_USER_CHECK(ps.accumulate >= 1 && ps.iterations % ps.accumulate == 0, "stage '", ps.name,
                    "': ", ps.iterations, " iterations are not a multiple of accumulate = ", ps.accumulate);
      made += ps.iterations / ps.accumulate;
    }
    for (int c : consumers_of(int(b))) {
      for (auto& in : stages[c].inputs) {
        if (in.buffer != int(b)) continue;
        MP_USER_CHECK(in.reuse >= 1 && stages[c].iterations % in.reuse == 0, "stage '", stages[c].name,
                      "': ", stages[c].iterations, " iterations are not a multiple of the reuse ", in.reuse,
                      " of buffer '", buf.name, "'");
        int64_t need = stages[c].iterations / in.reuse;
        MP_USER_CHECK(need <= made && made - need <= buf.depth, "buffer '", buf.name,
                      "': its producer makes ", made, " tokens but stage '", stages[c].name, "' reads ",
                      need);
      }
    }
  }
  for (auto& s : stages) {
    MP_USER_CHECK(s.iterations >= 1, "stage '", s.name, "' must run at least once");
    MP_USER_CHECK(s.par >= 1, "stage '", s.name, "': par must be >= 1");
    for (auto& in : s.inputs)
      MP_USER_CHECK(in.buffer >= 0 && in.buffer < int(buffers.size()), "stage '", s.name,
                    "' reads an unknown buffer");
    for (int o : s.outputs)
      MP_USER_CHECK(o >= 0 && o < int(buffers.size()), "stage '", s.name, "' writes an unknown buffer");
    if (s.kind != StageKind::Compute) {
      MP_USER_CHECK(s.tensor >= 0 && s.tensor < int(tensors.size()), "stage '", s.name,
                    "' needs an off-chip tensor");
      MP_USER_CHECK(s.access.bytes() > 0, "stage '", s.name, "' moves no bytes");
    }
    if (s.kind == StageKind::Load)
      MP_USER_CHECK(s.outputs.size() == 1, "load '", s.name, "' must write one buffer");
    if (s.kind == StageKind::Store)
      MP_USER_CHECK(s.inputs.size() >= 1, "store '", s.name, "' must read a buffer");
  }
}

void Graph::layout() {
  int64_t next = 0;
  const int64_t align = 1 << 16;
  for (auto& t : tensors) {
    if (t.base < 0) t.base = next;
    next = std::max(next, t.base + (t.bytes + align - 1) / align * align);
  }
}

double Graph::total_flops() const {
  double f = 0;
  for (auto& s : stages) f += s.flops() * double(s.iterations);
  return f;
}

int64_t Graph::offchip_bytes(bool write) const {
  int64_t b = 0;
  for (auto& s : stages)
    if (s.kind == (write ? StageKind::Store : StageKind::Load)) b += s.access.bytes() * s.iterations;
  return b;
}

}  // namespace mp::rdu
