// The supervisor of a tensor-parallel run's rank processes and the unique-id file (see tp_launch.h).
#include "backends/cuda/tp_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "core/error.h"

extern char** environ;

namespace mp::cuda::tp {

namespace {

std::optional<int> small_int(const char* v) {
  if (!v || !*v) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || errno || x < 0 || x > 1024) return std::nullopt;
  return int(x);
}

std::string describe(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + strsignal(WTERMSIG(status));
  return "stopped";
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

std::optional<RankEnv> rank_env() {
  const char* r = std::getenv(kRankEnv);
  const char* s = std::getenv(kSizeEnv);
  const char* f = std::getenv(kIdFileEnv);
  if (!r && !s && !f) return std::nullopt;
  auto rank = small_int(r), size = small_int(s);
  MP_USER_CHECK(rank && size && f && *f && *size >= 1 && *rank < *size,
                "tensor-parallel rank environment: ", kRankEnv, "='", r ? r : "", "', ", kSizeEnv, "='",
                s ? s : "", "', ", kIdFileEnv, "='", f ? f : "",
                "' must give a rank below the size and a file (unset all three to run alone)");
  return RankEnv{*rank, *size, f};
}

int run_ranks(const std::vector<std::string>& argv, int n, double grace_s) {
  MP_USER_CHECK(!argv.empty() && n >= 1 && n <= 64, "--tp ", n, " must be in [1, 64]");
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/metapipe-tp-XXXXXX";
  MP_USER_CHECK(mkdtemp(dir.data()) != nullptr, "--tp: cannot make a directory for the unique id (", dir,
                "): ", std::strerror(errno), "; set TMPDIR to a writable directory");
  const std::string id_file = dir + "/nccl-id";
  const pid_t parent = getpid();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string v = *e;
      if (v.rfind(std::string(kRankEnv) + "=", 0) && v.rfind(std::string(kSizeEnv) + "=", 0) &&
          v.rfind(std::string(kIdFileEnv) + "=", 0))
        env.push_back(v);
    }
    env.push_back(std::string(kRankEnv) + "=" + std::to_string(r));
    env.push_back(std::string(kSizeEnv) + "=" + std::to_string(n));
    env.push_back(std::string(kIdFileEnv) + "=" + id_file);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);
    std::cout.flush(), std::cerr.flush();
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t p : pids) kill(p, SIGKILL);
      for (pid_t p : pids) waitpid(p, nullptr, 0);
      fail_user("--tp: cannot start rank ", r, ": ", std::strerror(errno));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // the ranks end with the supervisor
      if (getppid() != parent) _exit(127);
      if (r > 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null >= 0) dup2(null, 1), close(null);
      }
      execve(cargv[0], cargv.data(), cenv.data());
      std::fprintf(stderr, "metapipe: --tp: cannot run %s: %s\n", cargv[0], std::strerror(errno));
      _exit(127);
    }
    pids.push_back(pid);
  }
  // Wait for every rank; the first failure stops the others.
  int result = 0;
  size_t left = pids.size();
  bool stopping = false;
  auto stop_deadline = std::chrono::steady_clock::now();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    int status = 0;
    const pid_t p = waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;
    if (p == 0) {  // stopping, none ended yet
      if (std::chrono::steady_clock::now() > stop_deadline)
        for (size_t i = 0; i < pids.size(); ++i)
          if (!done[i]) kill(pids[i], SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    size_t r = 0;
    while (r < pids.size() && pids[r] != p) ++r;
    if (r == pids.size()) continue;
    done[r] = true, --left;
    if (status != 0 && result == 0) {
      result = exit_code(status);
      if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0)
        std::cerr << "metapipe: --tp: rank " << r << " of " << n << " " << describe(status)
                  << (left ? "; stopping the other ranks" : "") << "\n";
      if (!stopping && left) {
        stopping = true;
        stop_deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(int64_t(std::max(0.0, grace_s) * 1000));
        for (size_t i = 0; i < pids.size(); ++i)
          if (!done[i]) kill(pids[i], SIGTERM);
      }
    }
  }
  std::remove(id_file.c_str());
  rmdir(dir.c_str());
  return result;
}

void write_id(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string part = path + ".part";
  {
    std::ofstream f(part, std::ios::binary);
    MP_USER_CHECK(bool(f), "--tp: cannot write the unique-id file '", part, "'");
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    MP_USER_CHECK(bool(f.flush()), "--tp: writing the unique-id file '", part, "' failed");
  }
  MP_USER_CHECK(std::rename(part.c_str(), path.c_str()) == 0, "--tp: cannot rename '", part, "' to '", path,
                "': ", std::strerror(errno));
}

std::vector<uint8_t> read_id(const std::string& path, size_t bytes, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f) {
      std::vector<uint8_t> b(bytes);
      f.read(reinterpret_cast<char*>(b.data()), std::streamsize(bytes));
      const auto got = f.gcount();
      MP_USER_CHECK(size_t(got) == bytes && f.peek() == std::char_traits<char>::eof(),
                    "--tp: the unique-id file '", path, "' holds ",
                    got == std::streamsize(bytes) ? "more than " : "",
                    got == std::streamsize(bytes) ? bytes : size_t(got), " bytes; ", bytes, " expected");
      return b;
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    MP_USER_CHECK(waited < timeout_s, "--tp: rank 0 wrote no unique id to '", path, "' within ", timeout_s,
                  " s (did rank 0 fail? its error comes first)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace mp::cuda::tp
