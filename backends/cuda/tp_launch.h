// Tensor parallelism's processes: `metapipe generate --tp N` starts one process per GPU itself (no MPI).
// The starting process supervises: it runs N copies of its own command line, each with its rank in the
// environment, waits for all, and ends the others when one fails. Rank 0 writes NCCL's unique id to a
// file in a fresh directory; the other ranks wait for it (with a time limit). Plain POSIX; tested
// without a GPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mp::cuda::tp {

// The environment a rank runs with.
constexpr const char* kRankEnv = "MP_TP_RANK";
constexpr const char* kSizeEnv = "MP_TP_SIZE";
constexpr const char* kIdFileEnv = "MP_TP_ID_FILE";

struct RankEnv {
  int rank = 0, size = 0;
  std::string id_file;
};
// This process's rank, when it was started as one (all three variables set); user_error when they are
// set but malformed; nullopt when none is set.
std::optional<RankEnv> rank_env();

// Runs `argv` (argv[0] a path) as ranks 0 .. n-1 with the rank variables set and the unique-id file in
// a new directory under $TMPDIR (or /tmp), removed at the end. Ranks other than 0 write their standard
// output to /dev/null. Returns 0 when every rank exits with 0; otherwise stops the others (SIGTERM, then
// SIGKILL after `grace_s`) and returns the first failing rank's exit status (128 + signal when killed),
// after printing to stderr which rank failed and how. The ranks end when the supervisor dies.
int run_ranks(const std::vector<std::string>& argv, int n, double grace_s = 5);

// The unique-id exchange: write (rank 0) is atomic (a temporary file renamed); read polls until the
// file exists or `timeout_s` passes (user_error naming the file and the time waited).
void write_id(const std::string& path, const std::vector<uint8_t>& bytes);
std::vector<uint8_t> read_id(const std::string& path, size_t bytes, double timeout_s);

}  // namespace mp::cuda::tp
