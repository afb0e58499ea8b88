// Runs the metapipe binary as a user would (MP_CLI_PATH is set by the test's CMakeLists) and returns its
// exit status and its stdout + stderr together. Shared by the CLI tests of every layer.
#pragma once
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace mp::test {

struct CliResult {
  int status = -1;  // exit status, -1 when the process did not exit normally or could not start
  std::string out;  // stdout and stderr together
};

inline CliResult run_cli(const std::string& args) {
  std::string cmd = std::string(MP_CLI_PATH) + " " + args + " 2>&1";
  CliResult r;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) r.out.append(buf.data(), n);
  int st = pclose(f);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

}  // namespace mp::test
