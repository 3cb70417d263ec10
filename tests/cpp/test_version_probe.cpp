// The version judge: a dtcore built for another torch fails with the rebuild command; NCCL found
// or missing; GPUs with a dtcore built without NCCL.
#include <gtest/gtest.h>

#include "check_items.h"
#include "dtcore/check/version_probe.h"

using namespace dtcore::check;
using dtcore::check::testing::expect_item;

namespace {

VersionFacts matching() {
  VersionFacts f;
  f.python = "3.11.7";
  f.torch = f.built_torch = "2.13.0+cu130";
  f.torch_cuda = f.built_cuda = "13.0";
  f.torch_nccl = f.dtcore_nccl = "2.28.3";
  f.dtcore = "0.1.0";
  f.built_with_nccl = true;
  f.gpus_present = true;
  f.rebuild_command = "pip install --no-build-isolation --force-reinstall --no-deps .";
  return f;
}

}  // namespace

TEST(VersionProbe, MatchingBuildPasses) {
  Items out;
  judge_versions(matching(), out);
  expect_item(out, "version.dtcore", Status::Pass, {"built for torch 2.13.0+cu130"});
  expect_item(out, "version.nccl", Status::Pass, {"2.28.3"});
}

TEST(VersionProbe, BuildForAnotherTorchFailsWithTheRebuildCommand) {
  VersionFacts f = matching();
  f.torch = "2.14.0+cu130";
  Items out;
  judge_versions(f, out);
  expect_item(out, "version.dtcore", Status::Fail,
              {"2.13.0+cu130", "2.14.0+cu130", "pip install --no-build-isolation --force-reinstall"});
  f = matching();
  f.torch_cxx11_abi = false;
  Items abi;
  judge_versions(f, abi);
  expect_item(abi, "version.dtcore", Status::Fail, {"C++11 ABI 0"});
}

TEST(VersionProbe, GpusWithoutNcclInTheBuildWarn) {
  VersionFacts f = matching();
  f.built_with_nccl = false;
  f.dtcore_nccl = "";
  Items out;
  judge_versions(f, out);
  expect_item(out, "version.dtcore", Status::Warn, {"without NCCL", "NCCL_HOME"});
}

TEST(VersionProbe, MissingNcclFailsOnlyWhereGpusNeedIt) {
  VersionFacts f = matching();
  f.torch_nccl = f.dtcore_nccl = "";
  f.nccl_library = NcclLibrary{"", "libnccl.so.2: cannot open shared object file"};
  Items out;
  judge_versions(f, out);
  expect_item(out, "version.nccl", Status::Fail, {"cannot open", "nvidia-nccl-cu13"});
  f.gpus_present = false;
  f.torch_cuda = "";
  Items cpu;
  judge_versions(f, cpu);
  expect_item(cpu, "version.nccl", Status::Pass, {"not found"});
}

TEST(VersionProbe, NcclOlderThanTorchWasCompiledAgainstWarns) {
  VersionFacts f = matching();
  f.dtcore_nccl = "2.21.5";
  Items out;
  judge_versions(f, out);
  expect_item(out, "version.nccl", Status::Warn, {"compiled against NCCL 2.28.3", "2.21.5 is what loads"});
  f.dtcore_nccl = "2.29.1";  // a newer NCCL than torch was compiled against is fine
  Items newer;
  judge_versions(f, newer);
  expect_item(newer, "version.nccl", Status::Pass);
}

TEST(VersionProbe, NcclLibraryProbeNeverThrows) {
  NcclLibrary lib = probe_nccl_library({"/nonexistent"});
  EXPECT_TRUE(!lib.version.empty() || !lib.path.empty());  // a version, or why there is none
}
