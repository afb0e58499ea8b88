// A progress line on stderr for long runs: shown only when stderr is a terminal, only once the run has
// taken about 2 s, redrawn at most 5 times a second, and erased when the run ends; --quiet turns it off.
#pragma once
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace mp::cli {

class Progress {
 public:
  Progress(std::string what, bool quiet) : what_(std::move(what)), on_(!quiet && isatty(2) == 1) {}
  ~Progress() { finish(); }
  // Erases the line (call before printing results); later updates draw nothing.
  void finish() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = on_ = false;
  }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // `done` of `total` work units finished (any unit, e.g. estimated steps).
  void update(double done, double total) {
    if (!on_ || total <= 0) return;
    const double t = seconds();
    if (t < 2.0 || t - last_ < 0.2) return;
    last_ = t;
    shown_ = true;
    const double f = done / total;
    const double left = f > 0 ? t * (1 - f) / f : 0;
    std::fprintf(stderr, "\r\033[K%s: %.0f %%, %.0f s elapsed, about %.0f s left", what_.c_str(), 100 * f, t,
                 left);
    std::fflush(stderr);
  }

 private:
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  std::string what_;
  bool on_;
  bool shown_ = false;
  double last_ = 0;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace mp::cli
