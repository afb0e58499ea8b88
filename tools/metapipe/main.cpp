// metapipe: one binary, one subcommand per capability (see `metapipe --help`).
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "tools/metapipe/cli.h"

using namespace mp::cli;

// Messages that already name the command ("metapipe gemm: --cluster is 1 or 2") lose that name, so that
// the error line names it once.
static std::string unprefixed(const std::string& cmd, const std::string& what) {
  const std::string own = "metapipe " + cmd + ": ";
  return what.rfind(own, 0) == 0 ? what.substr(own.size()) : what;
}

static void print_overview() {
  std::cout << "metapipe " MP_VERSION " - a programming system for AI hardware\n\n"
               "usage: metapipe COMMAND [ARGS...]      (metapipe COMMAND --help for details)\n\ncommands:\n";
  for (const auto& c : commands()) {
    std::string pad(c.name.size() < 12 ? 12 - c.name.size() : 1, ' ');
    std::cout << "  " << c.name << pad << c.summary << "\n";
  }
}

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    if (args.size() >= 2 && args[0] == "help") args = {args[1], "--help"};
    else {
      print_overview();
      return args.empty() ? 2 : 0;
    }
  }
  if (args[0] == "--version") {
    std::cout << "metapipe " MP_VERSION "\n";
    return 0;
  }
  const Command* cmd = nullptr;
  for (const auto& c : commands())
    if (c.name == args[0]) cmd = &c;
  if (!cmd) {
    std::cerr << "metapipe: error: unknown command '" << args[0] << "' (run 'metapipe --help' for the list)\n";
    return 2;
  }
  std::vector<std::string> rest(args.begin() + 1, args.end());
  for (const auto& a : rest)
    if (a == "--help" || a == "-h") {
      std::cout << cmd->help;
      if (!cmd->help.empty() && cmd->help.back() != '\n') std::cout << "\n";
      return 0;
    }
  try {
    Args a(cmd->name, std::move(rest));
    return cmd->run(a);
  } catch (const usage_error& e) {
    std::cerr << "metapipe " << cmd->name << ": error: " << unprefixed(cmd->name, e.what()) << "\n";
    return 2;
  } catch (const mp::user_error& e) {
    std::cerr << "metapipe " << cmd->name << ": error: " << unprefixed(cmd->name, e.what()) << "\n";
    return 1;
  } catch (const mp::internal_error& e) {
    std::cerr << "metapipe " << cmd->name << ": internal error (a metapipe bug, please report): " << e.what()
              << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << "metapipe " << cmd->name << ": error: " << e.what() << "\n";
    return 1;
  }
}
