// The metapipe CLI frame: argument parsing, the subcommand registry and the demo-row registry.
// A capability adds a subcommand with one file, tools/metapipe/cmd_<name>.cpp, holding an
// MP_REGISTER_COMMAND(...) and, if it has programs to show, an MP_REGISTER_DEMO(...).
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"

namespace mp::cli {

// Bad command-line usage; main prints it as one line and exits with status 2.
struct usage_error : user_error {
  using user_error::user_error;
};

// Options are read lazily: ask for flags and values first, then positionals(), then finish(), which
// rejects anything left over. Accepted forms: --name, --name=value, --name value, -x value.
class Args {
 public:
  Args(std::string command, std::vector<std::string> tokens);
  const std::string& command() const { return command_; }
  bool flag(std::initializer_list<const char*> names);
  std::optional<std::string> value(std::initializer_list<const char*> names);
  std::vector<std::string> values(std::initializer_list<const char*> names);  // repeatable option
  // value() converted; a malformed number is a usage_error naming the option.
  std::optional<long long> integer(std::initializer_list<const char*> names);
  std::vector<std::string> positionals();
  void finish();  // throws usage_error on an unknown option or an unread positional
  std::vector<std::string> tokens() const;  // the command's arguments as given (to rerun it)

 private:
  struct Tok {
    std::string text;
    bool used = false;
  };
  std::string command_;
  std::vector<Tok> toks_;
  bool positionals_taken_ = false;
};

struct Command {
  std::string name;
  std::string summary;  // one line for `metapipe --help`
  std::string help;     // full text for `metapipe NAME --help`
  std::function<int(Args&)> run;
};

// One row of `metapipe demo`: a program run on a target and checked against the CPU reference.
struct DemoRow {
  std::string program;
  std::string target;   // cpu, cuda, rdu:plasticine, systolic, ...
  std::string check;    // "ok (max rel 1e-6)", "FAIL: ...", or "skipped: reason"
  std::string measure;  // "1.23 ms", "42,255 cycles", ...
  bool ok = true;
};
struct DemoContext {
  std::optional<GpuInfo> gpu;         // present when a CUDA device is usable
  bool quick = false;                 // smaller sizes (used by tests)
  std::optional<std::string> target;  // `demo --target PREFIX`: only rows whose target starts with it
  // Whether rows of a target family (e.g. "rdu", "cpu", "systolic") can pass the --target filter; a
  // provider returns early when not, so a filtered demo does not run work it would throw away.
  bool wants(const std::string& family) const {
    if (!target) return true;
    return target->rfind(family, 0) == 0 || family.rfind(*target, 0) == 0;
  }
};
using DemoFn = std::function<std::vector<DemoRow>(const DemoContext&)>;

void register_command(Command c);
const std::vector<Command>& commands();
void register_demo(std::string name, int order, DemoFn fn);
struct DemoProvider {
  std::string name;
  int order;
  DemoFn fn;
};
std::vector<DemoProvider> demo_providers();  // sorted by order, then name

// `metapipe info` sections contributed by capabilities (e.g. the simulated accelerator presets).
using InfoFn = std::function<std::vector<std::string>()>;
void register_info(std::string section, InfoFn fn);
std::vector<std::pair<std::string, InfoFn>> info_sections();  // in registration-name order

struct Registrar {
  explicit Registrar(Command c) { register_command(std::move(c)); }
  Registrar(std::string name, int order, DemoFn fn) { register_demo(std::move(name), order, std::move(fn)); }
  Registrar(std::string section, InfoFn fn) { register_info(std::move(section), std::move(fn)); }
};

std::string format_ms(double ms);        // "1.234 ms"
std::string format_count(long long n);   // "42,255"

}  // namespace mp::cli

#define MP_CLI_CAT2(a, b) a##b
#define MP_CLI_CAT(a, b) MP_CLI_CAT2(a, b)
#define MP_REGISTER_COMMAND(...) \
  static const ::mp::cli::Registrar MP_CLI_CAT(mp_cmd_registrar_, __LINE__)(::mp::cli::Command{__VA_ARGS__})
#define MP_REGISTER_DEMO(name, order, fn) \
  static const ::mp::cli::Registrar MP_CLI_CAT(mp_demo_registrar_, __LINE__)(name, order, ::mp::cli::DemoFn(fn))
#define MP_REGISTER_INFO(section, fn) \
  static const ::mp::cli::Registrar MP_CLI_CAT(mp_info_registrar_, __LINE__)(section, ::mp::cli::InfoFn(fn))
