// SCALE-Sim v2 compatibility: reports byte-identical to the ones scalesim 2.0.2 wrote for the same files
// (tests/systolic/data/expected, see data/README.md), and readers that reject bad files with a clear message.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>

#include "core/error.h"
#include "systolic/scalesim.h"

namespace mp::systolic {
namespace {

const std::string kData = MP_SYSTOLIC_TEST_DATA;

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Case {
  const char* run;
  const char* topology;
  TopologyKind kind;
};

std::vector<LayerReport> run_case(const Case& c) {
  const SimConfig cfg = read_config(kData + "/" + c.run + ".cfg");
  std::vector<LayerReport> out;
  for (const auto& L : read_topology(kData + "/" + c.topology, c.kind)) out.push_back(simulate_layer(L, cfg));
  return out;
}

class ScaleSimReports : public ::testing::TestWithParam<Case> {};

TEST_P(ScaleSimReports, AreByteIdenticalToScaleSim) {
  const Case c = GetParam();
  const auto layers = run_case(c);
  const std::string dir = kData + "/expected/" + c.run + "/";
  EXPECT_EQ(compute_report_csv(layers), slurp(dir + "COMPUTE_REPORT.csv"));
  EXPECT_EQ(bandwidth_report_csv(layers), slurp(dir + "BANDWIDTH_REPORT.csv"));
  EXPECT_EQ(detailed_access_report_csv(layers), slurp(dir + "DETAILED_ACCESS_REPORT.csv"));
}

INSTANTIATE_TEST_SUITE_P(Runs, ScaleSimReports,
                         ::testing::Values(Case{"gemm_32x32_ws", "gemm64.csv", TopologyKind::Gemm},
                                           Case{"gemm_32x32_os", "gemm64.csv", TopologyKind::Gemm},
                                           Case{"gemm_32x32_is", "gemm64.csv", TopologyKind::Gemm},
                                           Case{"gemm_8x8_ws", "gemm_256x147x64.csv", TopologyKind::Gemm},
                                           Case{"conv_6x4_ws", "conv_small.csv", TopologyKind::Conv},
                                           Case{"conv_6x4_os", "conv_small.csv", TopologyKind::Conv},
                                           Case{"conv_6x4_is", "conv_small.csv", TopologyKind::Conv},
                                           Case{"user_8x4_ws", "conv_small.csv", TopologyKind::Conv},
                                           Case{"user_8x4_os", "conv_small.csv", TopologyKind::Conv},
                                           Case{"user_8x4_is", "conv_small.csv", TopologyKind::Conv}),
                         [](const auto& info) { return std::string(info.param.run); });

// The three cases, spelled out.
TEST(ScaleSimNumbers, Gemm64On32x32) {
  for (auto [run, cycles] :
       {std::pair{"gemm_32x32_ws", 631}, {"gemm_32x32_os", 503}, {"gemm_32x32_is", 631}}) {
    const auto r = run_case({run, "gemm64.csv", TopologyKind::Gemm});
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].total_cycles, cycles) << run;
    EXPECT_EQ(r[0].stall_cycles, 0) << run;
  }
}

TEST(ScaleSimNumbers, Ws8x8Gemm256x147x64) {
  const auto r = run_case({"gemm_8x8_ws", "gemm_256x147x64.csv", TopologyKind::Gemm});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].total_cycles, 42255);
  EXPECT_EQ(std::round(r[0].overall_util * 1000) / 1000, 89.059);
  EXPECT_EQ(std::round(r[0].mapping_eff * 1000) / 1000, 96.711);
}

// USER bandwidth: stalls from the double-buffered SRAMs; total cycles within 5 % of SCALE-Sim's (they are
// in fact equal; the byte-identical test above checks every column).
TEST(ScaleSimNumbers, UserBandwidthStallsWithinFivePercent) {
  for (const char* run : {"user_8x4_ws", "user_8x4_os", "user_8x4_is"}) {
    const auto mine = run_case({run, "conv_small.csv", TopologyKind::Conv});
    std::istringstream ref(slurp(kData + "/expected/" + run + "/COMPUTE_REPORT.csv"));
    std::string line;
    std::getline(ref, line);  // header
    long long run_stalls = 0;
    for (const auto& r : mine) {
      ASSERT_TRUE(std::getline(ref, line)) << run;
      long long id, total, stalls;
      ASSERT_EQ(std::sscanf(line.c_str(), "%lld, %lld, %lld", &id, &total, &stalls), 3) << line;
      run_stalls += stalls;
      EXPECT_LE(std::abs(double(r.total_cycles) - double(total)), 0.05 * double(total))
          << run << " " << r.name;
    }
    EXPECT_GT(run_stalls, 0) << run << ": the case is meant to stall";
  }
}

TEST(PyFloat, MatchesPythonRepr) {
  EXPECT_EQ(py_float(100.0), "100.0");
  EXPECT_EQ(py_float(33.0), "33.0");
  EXPECT_EQ(py_float(-459.0), "-459.0");
  EXPECT_EQ(py_float(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(py_float(1e-05), "1e-05");
  EXPECT_EQ(py_float(0.0001), "0.0001");
  EXPECT_EQ(py_float(1e16), "1e+16");
  EXPECT_EQ(py_float(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(py_float(1.5e-7), "1.5e-07");
  EXPECT_EQ(py_float(2.0 / 3.0), "0.6666666666666666");
  EXPECT_EQ(py_float(0.0), "0.0");
}

// Bad input: the message names the file, the line or key, and what is expected.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const user_error& e) {
    return e.what();
  }
  return "(no error)";
}

const char* kGoodCfg =
    "[general]\nrun_name = r\n\n[architecture_presets]\nArrayHeight: 8\nArrayWidth: 8\nIfmapSramSzkB: 64\n"
    "FilterSramSzkB: 64\nOfmapSramSzkB: 64\nIfmapOffset: 0\nFilterOffset: 10000000\nOfmapOffset: 20000000\n"
    "Dataflow : ws\nBandwidth : 10\n\n[run_presets]\nInterfaceBandwidth: CALC\n";

std::string edited(const std::string& from, const std::string& to) {
  std::string s = kGoodCfg;
  const auto p = s.find(from);
  EXPECT_NE(p, std::string::npos) << from;
  return s.replace(p, from.size(), to);
}

TEST(ConfigErrors, NameFileLineKeyAndExpectation) {
  EXPECT_NO_THROW(parse_config(kGoodCfg, "a.cfg"));
  auto msg = [](const std::string& text) { return error_of([&] { parse_config(text, "a.cfg"); }); };
  EXPECT_EQ(msg(edited("ArrayHeight: 8\n", "")), "a.cfg: missing key ArrayHeight in [architecture_presets]");
  EXPECT_EQ(msg(edited("ArrayWidth: 8", "ArrayWidth: eight")),
            "a.cfg:6: ArrayWidth must be an integer, got 'eight'");
  EXPECT_EQ(msg(edited("ArrayHeight: 8", "ArrayHeight: 0")),
            "a.cfg:5: ArrayHeight must be in [1, 65536], got 0");
  EXPECT_EQ(msg(edited("IfmapSramSzkB: 64", "IfmapSramSzkB: -4")),
            "a.cfg:7: IfmapSramSzkB must be in [1, 1073741824], got -4");
  EXPECT_EQ(msg(edited("Dataflow : ws", "Dataflow : rs")),
            "a.cfg:13: Dataflow must be ws, os or is, got 'rs'");
  EXPECT_EQ(msg(edited("InterfaceBandwidth: CALC", "InterfaceBandwidth: FAST")),
            "a.cfg:17: InterfaceBandwidth must be CALC or USER, got 'FAST'");
  const std::string user = edited("InterfaceBandwidth: CALC", "InterfaceBandwidth: USER");
  EXPECT_EQ(msg(user), "(no error)");
  EXPECT_EQ(msg(edited("Bandwidth : 10", "Bandwidth : 0")), "(no error)");  // CALC does not read it
  EXPECT_EQ(msg(std::string(user).replace(user.find("Bandwidth : 10"), 14, "Bandwidth : x")),
            "a.cfg:14: Bandwidth must be a comma-separated list of integers in [1, 1048576] (words per "
            "cycle), got 'x'");
  EXPECT_EQ(msg("[general]\nrun_name = r\nArrayHeight 8\n"),
            "a.cfg:3: expected 'key : value' or 'key = value', got 'ArrayHeight 8'");
  EXPECT_EQ(msg(edited("[run_presets]\nInterfaceBandwidth: CALC\n", "")),
            "a.cfg: missing section [run_presets] (needed for key InterfaceBandwidth)");
  EXPECT_NE(
      error_of([] { read_config(kData + "/no_such.cfg"); }).find("no_such.cfg: cannot open the config file"),
      std::string::npos);
}

TEST(Config, ReadsEveryFieldAndTheTopologyLocation) {
  const SimConfig c =
      parse_config(std::string(kGoodCfg) + "\n[network_presets]\nTopologyCsvLoc: \"t/alex.csv\"\n", "a.cfg");
  EXPECT_EQ(c.run_name, "r");
  EXPECT_EQ(c.array.rows, 8);
  EXPECT_EQ(c.array.dataflow, Dataflow::WS);
  EXPECT_EQ(c.filter_offset, 10000000);
  EXPECT_FALSE(c.user_bandwidth);
  EXPECT_EQ(c.topology_path, "t/alex.csv");
  std::string user = edited("Bandwidth : 10", "Bandwidth : 16, 8");
  user.replace(user.find("CALC"), 4, "USER");
  const SimConfig u = parse_config(user, "u.cfg");
  EXPECT_TRUE(u.user_bandwidth);
  EXPECT_EQ(u.bandwidth, (std::vector<std::int64_t>{16, 8}));
}

TEST(TopologyErrors, NameFileLineColumnAndExpectation) {
  const std::string head =
      "Layer name, IFMAP Height, IFMAP Width, Filter Height, Filter Width, Channels, Num Filter, Strides,\n";
  auto conv = [&](const std::string& row) {
    return error_of(
        [&] { parse_topology(head + "ok, 8, 8, 3, 3, 2, 4, 1,\n" + row, "t.csv", TopologyKind::Conv); });
  };
  EXPECT_EQ(conv(""), "(no error)");
  EXPECT_EQ(conv("c2, 8, x8, 3, 3, 2, 4, 1,\n"),
            "t.csv:3: column 3 (IFMAP width) must be an integer, got 'x8'");
  EXPECT_EQ(conv("c2, 8, 8, 3, 0, 2, 4, 1,\n"),
            "t.csv:3: column 5 (filter width) must be a positive integer, got 0");
  EXPECT_EQ(conv("c2, 8, 8, 3, 3, 2, -4, 1,\n"),
            "t.csv:3: column 7 (number of filters) must be a positive integer, got -4");
  EXPECT_EQ(conv("c2, 8, 8, 3, 3, 2,\n"), "t.csv:3: missing column 7 (number of filters)");
  EXPECT_EQ(conv("c2, 4, 8, 5, 3, 2, 4, 1,\n"), "t.csv:3: filter height 5 is larger than the IFMAP height 4");
  auto gemm = [&](const std::string& row) {
    return error_of([&] { parse_topology("Layer, M, N, K,\n" + row, "g.csv", TopologyKind::Gemm); });
  };
  EXPECT_EQ(gemm("g, 4, 5,\n"), "g.csv:2: missing column 4 (K)");
  EXPECT_EQ(gemm("g, 4, 5, 0\n"), "g.csv:2: column 4 (K) must be a positive integer, got 0");
  EXPECT_EQ(gemm(""), "g.csv: no layers (expected a header line and then one layer per line)");
}

TEST(Topology, GemmRowsMapLikeScaleSim) {
  // SCALE-Sim's GEMM row is name, M, N, K; it becomes an M x K image, a 1 x K filter and N filters.
  const auto L = parse_topology("Layer, M, N, K,\ng, 256, 64, 147,\n", "g.csv", TopologyKind::Gemm);
  ASSERT_EQ(L.size(), 1u);
  EXPECT_EQ(L[0].gemm().M, 256);
  EXPECT_EQ(L[0].gemm().K, 147);
  EXPECT_EQ(L[0].gemm().N, 64);
  // Rows with or without SCALE-Sim's trailing comma; one stride for both directions or two.
  const auto C = parse_topology("h\nc, 10, 12, 3, 3, 4, 6, 2\nd, 10, 12, 3, 3, 4, 6, 1, 3,\n", "c.csv",
                                TopologyKind::Conv);
  ASSERT_EQ(C.size(), 2u);
  EXPECT_EQ(C[0].gemm().M, 5 * 6);  // ceil((10-3+2)/2) x ceil((12-3+2)/2), as SCALE-Sim
  EXPECT_EQ(C[0].gemm().K, 36);
  EXPECT_EQ(C[1].gemm().M, 8 * 4);
  // A layer whose name contains DP is depthwise: SCALE-Sim runs it as one single-channel layer per channel.
  const auto D = parse_topology("h\nDP1, 8, 8, 3, 3, 3, 1, 1,\n", "d.csv", TopologyKind::Conv);
  ASSERT_EQ(D.size(), 3u);
  EXPECT_EQ(D[2].name, "DP1Channel_2");
  EXPECT_EQ(D[2].channels, 1);
  EXPECT_EQ(D[2].gemm().K, 9);
}

}  // namespace
}  // namespace mp::systolic
