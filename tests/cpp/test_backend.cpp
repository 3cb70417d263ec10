// choose_backend: gloo always, auto by the facts, nccl only where it can run; errors name the request as written.
// Whether this build has NCCL (built_with_nccl()) differs between machines: each expectation holds either way.
#include <gtest/gtest.h>

#include <map>

#include "dtcore/bootstrap/backend.h"
#include "dtcore/common/error.h"
#include "dtcore/common/settings.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;

namespace {

BackendFacts gpus(int n, std::string visible = "") { return BackendFacts{n, "2.13.0+cpu", std::move(visible)}; }

Sourced<std::string> asked(std::string value, std::string source = "init(backend=)") {
  return Sourced<std::string>{std::move(value), std::move(source)};
}

std::string refusal(const Sourced<std::string>& requested, const BackendFacts& facts) {
  return error_of<ConfigError>([&] { choose_backend(requested, facts); });
}

}  // namespace

TEST(Backend, GlooIsAlwaysGloo) {
  EXPECT_EQ(choose_backend(asked("gloo"), gpus(0)), "gloo");
  EXPECT_EQ(choose_backend(asked("gloo", "DTCORE_BACKEND"), gpus(8)), "gloo");
}

TEST(Backend, AutoIsGlooWithoutACudaDevice) {
  EXPECT_EQ(choose_backend(asked("auto", "default"), gpus(0)), "gloo");
  std::vector<Problem> problems;
  EXPECT_EQ(choose_backend(asked("auto", "default"), gpus(0), &problems), "gloo");
  EXPECT_TRUE(problems.empty());
}

TEST(Backend, AutoWithCudaDevicesIsNcclOnlyWhenBuiltWithIt) {
  EXPECT_EQ(choose_backend(asked("auto", "default"), gpus(2)), built_with_nccl() ? "nccl" : "gloo");
}

TEST(Backend, NcclWithoutADeviceNamesTheArgumentAsWritten) {
  std::string m = refusal(asked("nccl"), gpus(0));
  EXPECT_EQ(m.rfind("init(backend='nccl')", 0), 0u) << m;
  expect_contains(
      m, {"no usable CUDA device", "torch 2.13.0+cpu", "CUDA_VISIBLE_DEVICES=<unset>", "Fix:", "backend='gloo'"});
  EXPECT_EQ(m.find("built without NCCL") != std::string::npos, !built_with_nccl()) << m;
}

TEST(Backend, NcclWithoutADeviceNamesTheVariableAsWritten) {
  std::string m = refusal(asked("nccl", "DTCORE_BACKEND"), gpus(0, "7"));
  EXPECT_EQ(m.rfind("DTCORE_BACKEND='nccl'", 0), 0u) << m;
  expect_contains(m, {"no usable CUDA device", "CUDA_VISIBLE_DEVICES=7"});
}

TEST(Backend, NcclWithDevicesIsNcclOrSaysTheBuildLacksIt) {
  if (built_with_nccl()) {
    EXPECT_EQ(choose_backend(asked("nccl"), gpus(1)), "nccl");
  } else {
    std::string m = refusal(asked("nccl"), gpus(1));
    expect_contains(m, {"init(backend='nccl')", "built without NCCL", "NCCL_HOME", "Fix:"});
    EXPECT_EQ(m.find("no usable CUDA device"), std::string::npos) << m;
  }
}

TEST(Backend, WithAProblemsListTheProblemIsAppendedAndNothingChosen) {
  std::vector<Problem> problems{Problem{"timeout", "DTCORE_TIMEOUT", "x", "earlier", "fix it"}};
  EXPECT_EQ(choose_backend(asked("nccl", "DTCORE_BACKEND"), gpus(0), &problems), std::nullopt);
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].field, "timeout");
  const Problem& p = problems[1];
  EXPECT_EQ(p.field, "backend");
  EXPECT_EQ(p.variable, "DTCORE_BACKEND");
  EXPECT_EQ(p.value, "nccl");
  expect_contains(p.message, {"DTCORE_BACKEND='nccl'", "no usable CUDA device"});
  EXPECT_NE(p.fix.find("backend='gloo'"), std::string::npos) << p.fix;
}

TEST(Backend, AnUnknownRequestIsRefused) {
  // read_settings() refuses it first; choose_backend() does not trust that.
  expect_contains(refusal(asked("mpi"), gpus(4)), {"init(backend='mpi') is not a backend", "auto, nccl, gloo"});
  expect_contains(refusal(asked("mpi", "default"), gpus(0)), {"'mpi' is not a backend"});
}

TEST(Backend, ACaseFoldedVariableIsNamedAsReadSettingsFoldedIt) {
  Settings s = read_settings(Env(std::map<std::string, std::string, std::less<>>{{"DTCORE_BACKEND", "NCCL"}}));
  std::string m = refusal(s.backend, gpus(0));
  EXPECT_EQ(m.rfind("DTCORE_BACKEND='nccl'", 0), 0u) << m;
}
