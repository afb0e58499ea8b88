// The CLI's progress line: its text for given fractions and times, that it appears on a terminal only
// after about 2 s and is erased at the end, and that a file (a pipe, a test's capture) never gets it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/support/run_cli.h"
#include "tools/metapipe/progress.h"

namespace {

using mp::cli::Progress;
using mp::cli::progress_duration;
using mp::cli::progress_line;

TEST(ProgressLine, Durations) {
  EXPECT_EQ(progress_duration(0), "0 s");
  EXPECT_EQ(progress_duration(59.4), "59 s");
  EXPECT_EQ(progress_duration(65), "1 min 05 s");
  EXPECT_EQ(progress_duration(3599), "59 min 59 s");
  EXPECT_EQ(progress_duration(7620), "2 h 07 min");
  EXPECT_EQ(progress_duration(-3), "0 s");
  EXPECT_EQ(progress_duration(1.0 / 0.0), "0 s");
  EXPECT_EQ(progress_duration(1e300), "2400 h 00 min");  // capped, no overflow
}

TEST(ProgressLine, PercentElapsedAndTimeLeft) {
  EXPECT_EQ(progress_line("metapipe sim", 0.25, 3), "metapipe sim: 25 %, 3 s elapsed, about 9 s left");
  EXPECT_EQ(progress_line("x", 0.5, 100), "x: 50 %, 1 min 40 s elapsed, about 1 min 40 s left");
  EXPECT_EQ(progress_line("x", 0.999, 10),
            "x: 99 %, 10 s elapsed, about 0 s left");  // never rounds up to 100
  EXPECT_EQ(progress_line("x", 1, 10), "x: 100 %, 10 s elapsed, about 0 s left");
  // Before 1 % the rate says too little to extrapolate; out-of-range fractions are clamped.
  EXPECT_EQ(progress_line("x", 0.001, 5), "x: 0 %, 5 s elapsed, estimating the time left");
  EXPECT_EQ(progress_line("x", -1, 5), "x: 0 %, 5 s elapsed, estimating the time left");
  EXPECT_EQ(progress_line("x", 0.0 / 0.0, 5), "x: 0 %, 5 s elapsed, estimating the time left");
  EXPECT_EQ(progress_line("x", 7, 5), "x: 100 %, 5 s elapsed, about 0 s left");
}

std::string read_all(int fd) {
  std::string s;
  char b[512];
  for (ssize_t n; (n = read(fd, b, sizeof b)) > 0;) s.append(b, size_t(n));
  return s;
}

TEST(Progress, NeverWrittenToAFile) {
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  {
    Progress p("metapipe sim", false, f, fileno(f));
    EXPECT_FALSE(p.on());
    p.update_at(1, 2, 5);
    p.update_at(2, 2, 60);
    EXPECT_FALSE(p.shown());
  }
  std::fflush(f);
  EXPECT_EQ(std::ftell(f), 0) << "the progress line went to a file";
  std::fclose(f);
}

TEST(Progress, OnATerminalAfterTwoSecondsThenErased) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) GTEST_SKIP() << "no pseudo-terminal";
  const char* name = ptsname(master);
  ASSERT_NE(name, nullptr);
  const int slave = open(name, O_RDWR | O_NOCTTY);
  ASSERT_GE(slave, 0);
  std::FILE* out = fdopen(slave, "w");
  ASSERT_NE(out, nullptr);
  {
    Progress quiet("x", true, out, slave);
    EXPECT_FALSE(quiet.on());  // --quiet
    quiet.update_at(1, 2, 10);
    EXPECT_FALSE(quiet.shown());
  }
  {
    Progress p("metapipe generate", false, out, slave);
    EXPECT_TRUE(p.on());
    p.update_at(1, 4, 1.5);  // under 2 s: nothing yet
    EXPECT_FALSE(p.shown());
    p.update_at(1, 4, 2.4);
    EXPECT_TRUE(p.shown());
    p.update_at(2, 4, 2.5);  // within 0.2 s of the last redraw: skipped
    p.update_at(3, 4, 3.0);
    p.update_at(3, 0, 9.0);  // no total: nothing
    p.finish();
    EXPECT_FALSE(p.shown());
    p.update_at(4, 4, 9.0);  // after finish: nothing
  }
  std::fclose(out);
  // The pseudo-terminal's output side turns "\n" into "\r\n" only; "\r" and escapes pass unchanged.
  fcntl(master, F_SETFL, O_NONBLOCK);
  const std::string got = read_all(master);
  close(master);
  EXPECT_EQ(got,
            "\r\033[Kmetapipe generate: 25 %, 2 s elapsed, about 7 s left"
            "\r\033[Kmetapipe generate: 75 %, 3 s elapsed, about 1 s left"
            "\r\033[K");
}

// The CLI with stderr on a pseudo-terminal (stdout to /dev/null) and the delay set to 0, so that a short
// run draws the line: what the terminal received, and the exit status.
struct TtyRun {
  int status = -1;
  std::string tty;
};
TtyRun run_on_tty(const std::string& args) {
  TtyRun r;
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) return r;
  const std::string name = ptsname(master);
  const pid_t pid = fork();
  if (pid == 0) {
    const int slave = open(name.c_str(), O_RDWR | O_NOCTTY);
    const int null = open("/dev/null", O_WRONLY);
    if (slave < 0 || null < 0) _exit(126);
    dup2(null, 1);
    dup2(slave, 2);
    setenv("METAPIPE_PROGRESS_AFTER", "0", 1);
    const std::string cmd = std::string(MP_CLI_PATH) + " " + args;
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  // Read until the child is gone: on Linux the master reads EIO once no one holds the terminal.
  char b[4096];
  for (ssize_t n; (n = read(master, b, sizeof b)) > 0;) r.tty.append(b, size_t(n));
  int st = 0;
  waitpid(pid, &st, 0);
  close(master);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Each long-running command draws its line on a terminal, erases it at the end, and --quiet or a pipe
// gets none of it.
void expect_progress(const std::string& args, const std::string& what) {
  SCOPED_TRACE(args);
  const TtyRun t = run_on_tty(args);
  if (t.status == -1 && t.tty.empty()) GTEST_SKIP() << "no pseudo-terminal";
  ASSERT_EQ(t.status, 0) << t.tty;
  EXPECT_NE(t.tty.find("\r\033[K" + what + ": "), std::string::npos) << t.tty;
  EXPECT_NE(t.tty.find(" elapsed, "), std::string::npos) << t.tty;
  EXPECT_TRUE(t.tty.size() >= 4 && t.tty.substr(t.tty.size() - 4) == "\r\033[K")
      << "the line is erased at the end";
  const TtyRun q = run_on_tty(args + " --quiet");
  ASSERT_EQ(q.status, 0) << q.tty;
  EXPECT_EQ(q.tty.find(what + ": "), std::string::npos) << q.tty;
  const mp::test::CliResult p = mp::test::run_cli(args + " 2>&1 >/dev/null | cat");
  EXPECT_EQ(p.out.find(what + ": "), std::string::npos) << p.out;
  EXPECT_EQ(p.out.find('\r'), std::string::npos) << p.out;
}

TEST(ProgressCli, Sim) { expect_progress("sim matmul --arch plasticine", "metapipe sim"); }
TEST(ProgressCli, SystolicCycleLevel) {
  expect_progress(std::string("systolic -c ") + MP_SOURCE_DIR + "/tests/systolic/data/gemm_32x32_ws.cfg -t " +
                      MP_SOURCE_DIR + "/tests/systolic/data/gemm64.csv -i gemm --mode cycle",
                  "metapipe systolic");
}
TEST(ProgressCli, GenerateWithStdoutElsewhere) {
  expect_progress("generate --shapes toy -n 8 --seed 1 --threads 1", "metapipe generate");
}

}  // namespace
