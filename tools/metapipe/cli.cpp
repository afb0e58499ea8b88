// Argument parsing and the command / demo registries of the metapipe CLI.
#include "tools/metapipe/cli.h"

#include "core/text.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

namespace mp::cli {

Args::Args(std::string command, std::vector<std::string> tokens) : command_(std::move(command)) {
  for (auto& t : tokens) toks_.push_back({std::move(t)});
}

std::vector<std::string> Args::tokens() const {
  std::vector<std::string> v;
  for (auto& t : toks_) v.push_back(t.text);
  return v;
}

static bool is_option(const std::string& s) { return s.size() > 1 && s[0] == '-' && !(s[1] >= '0' && s[1] <= '9'); }

static bool matches(const std::string& tok, const char* name, std::string* inline_value) {
  std::string n = name;
  if (tok == n) return true;
  if (tok.size() > n.size() && tok.compare(0, n.size(), n) == 0 && tok[n.size()] == '=') {
    if (inline_value) *inline_value = tok.substr(n.size() + 1);
    return true;
  }
  return false;
}

bool Args::flag(std::initializer_list<const char*> names) {
  bool found = false;
  for (auto& t : toks_)
    for (const char* n : names)
      if (!t.used && t.text == n) t.used = found = true;
  return found;
}

std::vector<std::string> Args::values(std::initializer_list<const char*> names) {
  std::vector<std::string> out;
  for (size_t i = 0; i < toks_.size(); ++i) {
    if (toks_[i].used) continue;
    for (const char* n : names) {
      std::string v;
      if (!matches(toks_[i].text, n, &v)) continue;
      toks_[i].used = true;
      if (toks_[i].text == n) {
        if (i + 1 >= toks_.size() || toks_[i + 1].used)
          throw usage_error("option " + std::string(n) + " needs a value (" + n + " VALUE or " + n + "=VALUE)");
        v = toks_[i + 1].text;
        toks_[i + 1].used = true;
      }
      out.push_back(v);
      break;
    }
  }
  return out;
}

std::optional<std::string> Args::value(std::initializer_list<const char*> names) {
  auto v = values(names);
  if (v.empty()) return std::nullopt;
  if (v.size() > 1) throw usage_error("option " + std::string(*names.begin()) + " given more than once");
  return v.front();
}

std::optional<long long> Args::integer(std::initializer_list<const char*> names) {
  auto v = value(names);
  if (!v) return std::nullopt;
  long long x = 0;
  auto [p, ec] = std::from_chars(v->data(), v->data() + v->size(), x);
  if (ec != std::errc() || p != v->data() + v->size())
    throw usage_error("option " + std::string(*names.begin()) + " expects an integer, got '" + *v + "'");
  return x;
}

std::vector<std::string> Args::positionals() {
  std::vector<std::string> out;
  for (auto& t : toks_) {
    if (t.used) continue;
    if (is_option(t.text) && t.text != "-") continue;  // left for finish() to report
    t.used = true;
    out.push_back(t.text);
  }
  positionals_taken_ = true;
  return out;
}

void Args::finish() {
  for (auto& t : toks_) {
    if (t.used) continue;
    if (is_option(t.text))
      throw usage_error("unknown option '" + t.text + "' for 'metapipe " + command_ + "' (see metapipe " +
                        command_ + " --help)");
    throw usage_error("unexpected argument '" + t.text + "' for 'metapipe " + command_ + "' (see metapipe " +
                      command_ + " --help)");
  }
}

static std::vector<Command>& command_list() {
  static std::vector<Command> list;
  return list;
}
static std::vector<DemoProvider>& demo_list() {
  static std::vector<DemoProvider> list;
  return list;
}

void register_command(Command c) {
  for (auto& e : command_list())
    if (e.name == c.name) fail_internal("CLI command '", c.name, "' registered twice");
  command_list().push_back(std::move(c));
  std::sort(command_list().begin(), command_list().end(),
            [](const Command& a, const Command& b) { return a.name < b.name; });
}
const std::vector<Command>& commands() { return command_list(); }

void register_demo(std::string name, int order, DemoFn fn) {
  demo_list().push_back({std::move(name), order, std::move(fn)});
}
std::vector<DemoProvider> demo_providers() {
  auto v = demo_list();
  std::sort(v.begin(), v.end(), [](const DemoProvider& a, const DemoProvider& b) {
    return a.order != b.order ? a.order < b.order : a.name < b.name;
  });
  return v;
}

static std::vector<std::pair<std::string, InfoFn>>& info_list() {
  static std::vector<std::pair<std::string, InfoFn>> list;
  return list;
}
void register_info(std::string section, InfoFn fn) { info_list().emplace_back(std::move(section), std::move(fn)); }
std::vector<std::pair<std::string, InfoFn>> info_sections() {
  auto v = info_list();
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return v;
}

std::string format_ms(double ms) {
  char buf[64];
  if (ms < 1.0)
    std::snprintf(buf, sizeof buf, "%.1f us", ms * 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.3f ms", ms);
  return buf;
}

std::string format_count(long long n) { return thousands(n); }

}  // namespace mp::cli
