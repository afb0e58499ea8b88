// A progress line on stderr for long runs: shown only when stderr is a terminal, only once the run has
// taken about 2 s, redrawn at most 5 times a second, and erased when the run ends; --quiet turns it off.
// Output to a pipe or a file (tests, scripts) never gets it. METAPIPE_PROGRESS_AFTER=SECONDS changes the
// 2 s (tests show the line of a short run with 0).
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace mp::cli {

// "12 s", "3 min 05 s", "2 h 07 min": whole units, so the line does not flicker with decimals.
inline std::string progress_duration(double s) {
  if (!std::isfinite(s) || s < 0) s = 0;
  const auto t = static_cast<long long>(std::min(s, 360000.0 * 24) + 0.5);  // capped at 100 days
  char b[48];
  if (t < 60)
    std::snprintf(b, sizeof b, "%lld s", t);
  else if (t < 3600)
    std::snprintf(b, sizeof b, "%lld min %02lld s", t / 60, t % 60);
  else
    std::snprintf(b, sizeof b, "%lld h %02lld min", t / 3600, t / 60 % 60);
  return b;
}

// The text of the line (without the carriage return and erase codes): `fraction` of the work done after
// `elapsed` seconds; the time left is extrapolated at the rate so far, and not guessed before 1 % is done.
inline std::string progress_line(std::string_view what, double fraction, double elapsed) {
  if (!std::isfinite(fraction) || fraction < 0) fraction = 0;
  if (fraction > 1) fraction = 1;
  char pct[16];
  std::snprintf(pct, sizeof pct, "%.0f %%", std::floor(100 * fraction));
  std::string s = std::string(what) + ": " + pct + ", " + progress_duration(elapsed) + " elapsed, ";
  if (fraction < 0.01)
    s += "estimating the time left";
  else
    s += "about " + progress_duration(elapsed * (1 - fraction) / fraction) + " left";
  return s;
}

// The delay before the line appears: METAPIPE_PROGRESS_AFTER when it is a number >= 0, else 2 s.
inline double progress_delay() {
  const char* v = std::getenv("METAPIPE_PROGRESS_AFTER");
  if (!v || !*v) return 2.0;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  return *end == '\0' && std::isfinite(d) && d >= 0 ? d : 2.0;
}

class Progress {
 public:
  // `fd` is the descriptor behind `out` (the terminal test); tests pass a pseudo-terminal or a file.
  Progress(std::string what, bool quiet, std::FILE* out = stderr, int fd = 2)
      : what_(std::move(what)), out_(out), on_(!quiet && isatty(fd) == 1), delay_(progress_delay()) {}
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Erases the line (call before printing results); later updates draw nothing.
  void finish() {
    if (shown_) {
      std::fprintf(out_, "\r\033[K");
      std::fflush(out_);
    }
    shown_ = on_ = false;
  }

  // `done` of `total` work units finished (any unit, e.g. estimated steps).
  void update(double done, double total) { update_at(done, total, seconds()); }
  // The same at a given time since the start (seconds): the clock is a parameter for tests.
  void update_at(double done, double total, double t) {
    if (!on_ || !(total > 0) || t < delay_ || (shown_ && t - last_ < 0.2)) return;
    last_ = t;
    shown_ = true;
    std::fprintf(out_, "\r\033[K%s", progress_line(what_, done / total, t).c_str());
    std::fflush(out_);
  }

  bool on() const { return on_; }        // a terminal, not --quiet, not finished
  bool shown() const { return shown_; }  // the line is on the screen now

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  std::string what_;
  std::FILE* out_;
  bool on_;
  double delay_;
  bool shown_ = false;
  double last_ = 0;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace mp::cli
