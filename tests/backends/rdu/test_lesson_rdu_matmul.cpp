// docs/lesson_rdu_matmul.md runs: every transcript in it (a code block starting with `$ metapipe ...`) is
// run and its lines must appear in the output in the order shown ("..." stands for any text), and every
// row of its "change one thing" table is run and must give the cycles shown, the rows keeping the relations
// the lesson explains (single buffers slower, wider PCUs faster until bandwidth-bound). The doc is the
// expected output; the test keeps it true.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_cli.h"

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) {
    while (!l.empty() && (l.back() == ' ' || l.back() == '\r')) l.pop_back();
    out.push_back(l);
  }
  return out;
}

std::vector<std::string> lesson() {
  std::ifstream f(MP_LESSON_PATH);
  EXPECT_TRUE(f.good()) << "cannot read " << MP_LESSON_PATH;
  std::stringstream ss;
  ss << f.rdbuf();
  return lines_of(ss.str());
}

// `line` matches `pattern` where each "..." of the pattern stands for any text.
bool matches(const std::string& line, const std::string& pattern) {
  std::vector<std::string> parts;
  for (size_t at = 0;;) {
    size_t dots = pattern.find("...", at);
    parts.push_back(pattern.substr(at, dots == std::string::npos ? std::string::npos : dots - at));
    if (dots == std::string::npos) break;
    at = dots + 3;
  }
  if (parts.size() == 1) return line == pattern;
  if (line.compare(0, parts.front().size(), parts.front()) != 0) return false;
  size_t pos = parts.front().size();
  for (size_t k = 1; k + 1 < parts.size(); ++k) {
    pos = line.find(parts[k], pos);
    if (pos == std::string::npos) return false;
    pos += parts[k].size();
  }
  const std::string& last = parts.back();
  return line.size() >= pos + last.size() && line.compare(line.size() - last.size(), last.size(), last) == 0;
}

struct Transcript {
  std::string args;                // after "$ metapipe "
  std::vector<std::string> shown;  // the output lines the doc shows
};

std::vector<Transcript> transcripts(const std::vector<std::string>& doc) {
  std::vector<Transcript> out;
  for (size_t i = 0; i + 1 < doc.size(); ++i) {
    if (doc[i] != "```" || doc[i + 1].rfind("$ metapipe ", 0) != 0) continue;
    Transcript t;
    t.args = doc[i + 1].substr(11);
    for (i += 2; i < doc.size() && doc[i] != "```"; ++i)
      if (doc[i] != "...") t.shown.push_back(doc[i]);
    out.push_back(t);
  }
  return out;
}

// The doc's `--svg FILE` goes to the test's temporary folder.
std::string with_svg_in_temp(std::string args) {
  size_t at = args.find("--svg ");
  if (at == std::string::npos) return args;
  size_t end = args.find(' ', at + 6);
  return args.substr(0, at) + "--svg " + testing::TempDir() + "/lesson.svg" +
         (end == std::string::npos ? "" : args.substr(end));
}

std::string without_svg(std::string args) {
  size_t at = args.find(" --svg ");
  if (at == std::string::npos) return args;
  size_t end = args.find(' ', at + 7);
  return args.substr(0, at) + (end == std::string::npos ? "" : args.substr(end));
}

// "2,840,634" -> 2840634
long long number_of(const std::string& s) {
  std::string digits;
  for (char c : s)
    if (c >= '0' && c <= '9')
      digits += c;
    else if (c != ',')
      break;
  return digits.empty() ? -1 : std::stoll(digits);
}

// "matmul on plasticine: 2,840,634 cycles = ..." -> 2840634
long long simulated_cycles(const std::string& out) {
  for (auto& l : lines_of(out)) {
    size_t on = l.find(" on "), colon = l.find(": ");
    if (on != std::string::npos && colon != std::string::npos && colon > on &&
        l.find(" cycles = ") != std::string::npos)
      return number_of(l.substr(colon + 2));
  }
  return -1;
}

}  // namespace

TEST(RduLesson, TranscriptsShowWhatTheCommandsPrint) {
  const auto doc = lesson();
  const auto ts = transcripts(doc);
  ASSERT_GE(ts.size(), 2u) << "the lesson's transcripts (code blocks starting with `$ metapipe`)";
  for (auto& t : ts) {
    auto r = mp::test::run_cli(with_svg_in_temp(t.args));
    ASSERT_EQ(r.status, 0) << t.args << "\n" << r.out;
    const auto out = lines_of(r.out);
    size_t at = 0;
    for (auto& want : t.shown) {
      while (at < out.size() && !matches(out[at], want)) ++at;
      ASSERT_LT(at, out.size()) << "metapipe " << t.args << ": the lesson shows\n  " << want
                                << "\nwhich is not in the output (in this order):\n"
                                << r.out;
      ++at;
    }
  }
}

TEST(RduLesson, EveryRowOfTheChangeOneThingTableGivesTheCyclesShown) {
  const auto doc = lesson();
  const auto ts = transcripts(doc);
  ASSERT_FALSE(ts.empty());
  const std::string base = without_svg(ts[0].args);  // section 1's command
  std::map<std::string, long long> cycles;           // options added -> simulated cycles
  bool in_table = false;
  for (auto& l : doc) {
    if (l.rfind("| options added |", 0) == 0) {
      in_table = true;
      continue;
    }
    if (!in_table || l.rfind("|---", 0) == 0) continue;
    if (l.rfind("| ", 0) != 0) break;
    // | `--set depth=1` | 3,450,432 | why |   or   | (none) | 2,840,634 | ... |
    size_t c1 = l.find(" | ", 2), c2 = l.find(" | ", c1 + 3);
    ASSERT_NE(c2, std::string::npos) << l;
    std::string opts = l.substr(2, c1 - 2);
    if (opts == "(none)")
      opts.clear();
    else {
      ASSERT_TRUE(opts.size() > 2 && opts.front() == '`' && opts.back() == '`') << l;
      opts = opts.substr(1, opts.size() - 2);
    }
    const long long shown = number_of(l.substr(c1 + 3, c2 - c1 - 3));
    auto r = mp::test::run_cli(base + (opts.empty() ? "" : " " + opts));
    ASSERT_EQ(r.status, 0) << base << " " << opts << "\n" << r.out;
    cycles[opts] = simulated_cycles(r.out);
    EXPECT_EQ(cycles[opts], shown) << "the lesson's row `" << opts << "`";
  }
  // What the rows say, as relations that hold whatever the exact cycles: a single buffer makes producer
  // and consumer take turns; wider PCUs speed up the compute-bound matmul until the loads of B limit it.
  for (const char* row : {"", "--set depth=1", "--set pcu.lanes=32", "--set pcu.lanes=64"})
    ASSERT_TRUE(cycles.count(row)) << "the table should keep its row `" << row << "`";
  EXPECT_GT(cycles["--set depth=1"], cycles[""]);
  EXPECT_NEAR(double(cycles["--set pcu.lanes=32"]) / cycles[""], 0.5, 0.03);  // half the interval
  EXPECT_LT(cycles["--set pcu.lanes=64"], cycles["--set pcu.lanes=32"]);
  EXPECT_GT(double(cycles["--set pcu.lanes=64"]) / cycles["--set pcu.lanes=32"], 0.5);  // no longer halves
}
