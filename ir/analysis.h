// Static analysis a backend needs from the IR: per-node work (flops, element ops, off-chip bytes and
// access patterns), on-chip footprint, and where each value is defined.
#pragma once
#include <map>

#include "ir/ir.h"

namespace mp::ir {

// Work of one execution of a node; a MetaPipe counts all its iterations (trip x body).
Work work_of(const Node& n);
// Work of a list of nodes (a stage or a program body).
Work work_of(const std::vector<NodeRef>& nodes);

// The off-chip access of a LoadTile / StoreTile / Gather / Scatter (nullopt for other nodes).
std::optional<OffChipAccess> access_of(const Node& n);

// Bytes of on-chip memory a MetaPipe's buffers take, nested loops included (each nested loop's buffers
// counted once: one instance is live at a time per enclosing stage).
int64_t buffer_bytes(const MetaPipe& m);
// Every buffer of the program with the path of its loop ("L3/L9"), for reports.
struct BufferRef {
  std::string loop;  // e.g. "L3" (MetaPipe #3), nested: "L3/L9"
  const MetaPipe* pipe;
  const BufferInfo* buffer;
};
std::vector<BufferRef> all_buffers(const Program& p);

// Every stage of the program, outer loops first, with how often it fires in one run of the program
// (its loop's trip times the trips of all enclosing loops): what a simulator schedules.
struct StageRef {
  std::string path;            // "L4.s1/L8.s0": loop ids and stage names from the outside in
  const MetaPipe* pipe = nullptr;
  int index = 0;               // into pipe->stages
  int64_t iterations = 0;      // total firings
  int depth = 0;               // 0: a top-level loop's stage
  bool holds_loop = false;     // the stage runs a nested METAPIPE
};
std::vector<StageRef> all_stages(const Program& p);

// Values a node reads: its operands, and for a MetaPipe also every value its body (nested loops
// included) reads from outside the loop. This is what crosses into a stage that holds the node.
std::vector<Value> reads_of(const Node& n);

// Total program work (all top-level statements).
Work program_work(const Program& p);

}  // namespace mp::ir
