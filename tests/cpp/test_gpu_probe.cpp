// The GPU judge on simulated drivers: no GPU, CUDA_VISIBLE_DEVICES against the GPUs seen,
// driver too old, unsupported architecture, foreign processes, MIG.
#include <gtest/gtest.h>

#include "check_items.h"
#include "dtcore/check/gpu_probe.h"

using namespace dtcore::check;
using dtcore::check::testing::expect_item;
using dtcore::check::testing::has;

namespace {

GpuFacts machine(int gpus, int cuda = 13000) {
  GpuFacts f;
  f.driver_loaded = true;
  f.driver_version = "580.95.05";
  f.cuda_driver_version = cuda;
  for (int i = 0; i < gpus; ++i) {
    GpuDevice d;
    d.index = i;
    d.name = "NVIDIA H100 80GB HBM3";
    d.uuid = "GPU-aaaa000" + std::to_string(i);
    d.memory_total = 80ull << 30;
    d.memory_free = 79ull << 30;
    d.cc_major = 9;
    d.cc_minor = 0;
    f.devices.push_back(d);
  }
  return f;
}

GpuExpectations cuda_torch(int local_world_size = 8) {
  GpuExpectations e;
  e.launched = true;
  e.torch_cuda = "13.0";
  e.arch_list = {"sm_80", "sm_90", "sm_100"};
  e.local_world_size = local_world_size;
  return e;
}

}  // namespace

TEST(GpuProbe, NoDriverPassesForCpuJobsAndFailsWhenNcclIsRequired) {
  GpuFacts none;
  none.load_error = "libnvidia-ml.so.1: cannot open shared object file";
  Items cpu;
  judge_gpus(none, GpuExpectations{}, cpu);
  expect_item(cpu, "gpu.driver", Status::Pass, {"no GPU"});

  GpuExpectations nccl;
  nccl.gpu_required = true;
  Items out;
  judge_gpus(none, nccl, out);
  expect_item(out, "gpu.driver", Status::Fail, {"DTCORE_BACKEND=nccl", "cannot open shared object", "gloo"});
}

TEST(GpuProbe, ProbeWithoutADriverSaysSoInsteadOfFailing) {
  GpuFacts f = probe_gpus();  // this machine: any answer is fine, but it must not throw or crash
  if (!f.driver_loaded) {
    EXPECT_FALSE(f.load_error.empty());
    EXPECT_TRUE(f.devices.empty());
  }
}

TEST(GpuProbe, VisibleDevicesFollowCudaRules) {
  auto gpus = machine(4).devices;
  EXPECT_EQ(visible_devices(std::nullopt, gpus).indices, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(visible_devices("2,0", gpus).indices, (std::vector<int>{2, 0}));
  EXPECT_EQ(visible_devices("GPU-aaaa0003", gpus).indices, (std::vector<int>{3}));
  EXPECT_TRUE(visible_devices("", gpus).indices.empty());
  EXPECT_TRUE(visible_devices("-1", gpus).problem.empty());
  EXPECT_EQ(visible_devices("0,1,", gpus).indices, (std::vector<int>{0, 1}));  // CUDA stops, no complaint
  EXPECT_EQ(visible_devices("1,-2,3", gpus).indices, (std::vector<int>{1}));
  EXPECT_EQ(visible_devices("2gpu", gpus).indices, (std::vector<int>{2}));  // read as CUDA reads it
  auto bad = visible_devices("1,7,2", gpus);                                // CUDA stops at the first invalid entry
  EXPECT_EQ(bad.indices, (std::vector<int>{1}));
  EXPECT_NE(bad.problem.find("'7'"), std::string::npos) << bad.problem;
  auto twice = visible_devices("1,1", gpus);
  EXPECT_TRUE(twice.indices.empty());
  EXPECT_NE(twice.problem.find("twice"), std::string::npos);
}

TEST(GpuProbe, BadCudaVisibleDevicesFails) {
  GpuExpectations e = cuda_torch(2);
  e.cuda_visible_devices = "0,8";
  Items out;
  judge_gpus(machine(8), e, out);
  expect_item(out, "gpu.visible", Status::Fail, {"CUDA_VISIBLE_DEVICES=0,8", "'8'", "nvidia-smi -L"});
}

TEST(GpuProbe, HiddenGpusWarnOrFail) {
  GpuExpectations e = cuda_torch(1);
  e.cuda_visible_devices = "";
  Items out;
  judge_gpus(machine(2), e, out);
  expect_item(out, "gpu.visible", Status::Warn, {"hides all 2"});
  e.gpu_required = true;
  Items required;
  judge_gpus(machine(2), e, required);
  expect_item(required, "gpu.visible", Status::Fail);
}

TEST(GpuProbe, IdleGpusWarn) {
  Items out;
  judge_gpus(machine(8), cuda_torch(4), out);
  expect_item(out, "gpu.usage", Status::Warn, {"4 visible GPU(s) will stay idle", "--nproc_per_node=8"});
  Items full;
  judge_gpus(machine(8), cuda_torch(8), full);
  EXPECT_FALSE(has(full, "gpu.usage"));
  GpuExpectations plain = cuda_torch(1);
  plain.launched = false;  // `python -m dtcore.check` on its own: one process, no launcher
  Items alone;
  judge_gpus(machine(8), plain, alone);
  EXPECT_FALSE(has(alone, "gpu.usage"));
}

TEST(GpuProbe, DriverOlderThanTorchsCuda) {
  Items old_major;
  judge_gpus(machine(1, 12080), cuda_torch(1), old_major);
  expect_item(old_major, "gpu.cuda", Status::Fail, {"13.0", "12.8", "upgrade the NVIDIA driver"});
  GpuExpectations e = cuda_torch(1);
  e.torch_cuda = "13.2";
  Items old_minor;
  judge_gpus(machine(1, 13000), e, old_minor);
  expect_item(old_minor, "gpu.cuda", Status::Warn, {"minor-version compatibility"});
  Items ok;
  judge_gpus(machine(1, 13000), cuda_torch(1), ok);
  expect_item(ok, "gpu.cuda", Status::Pass);
}

TEST(GpuProbe, AHungDriverFailsTheNode) {
  GpuFacts f;
  f.hung = true;
  Items out;
  judge_gpus(f, cuda_torch(8), out);
  expect_item(out, "gpu.driver", Status::Fail, {"did not answer", "Xid"});
}

TEST(GpuProbe, UnknownDriverCudaVersionIsNotJudged) {
  Items out;
  judge_gpus(machine(1, 0), cuda_torch(1), out);
  EXPECT_FALSE(has(out, "gpu.cuda"));
}

TEST(GpuProbe, ArchitectureWithoutKernelsFails) {
  GpuFacts f = machine(1);
  f.devices[0].cc_major = 7;
  f.devices[0].cc_minor = 0;
  Items out;
  judge_gpus(f, cuda_torch(1), out);
  expect_item(out, "gpu.0", Status::Fail, {"7.0", "no kernel image"});

  GpuExpectations ptx = cuda_torch(1);
  ptx.arch_list = {"sm_80", "compute_80"};  // PTX for 8.0 is compiled by the driver for 9.0
  Items jit;
  judge_gpus(machine(1), ptx, jit);
  expect_item(jit, "gpu.0", Status::Pass, {"sm_90"});
}

TEST(GpuProbe, ForeignProcessesAndMigWarn) {
  GpuFacts f = machine(2);
  f.devices[1].processes = {{4242, 30ull << 30, "python"}, {777, 1ull << 30, "self"}};
  f.devices[1].mig_enabled = true;
  GpuExpectations e = cuda_torch(2);
  e.job_pids = {777};
  Items out;
  judge_gpus(f, e, out);
  expect_item(out, "gpu.1.processes", Status::Warn, {"pid 4242 (python)", "30 GiB"});
  Item p = dtcore::check::testing::find(out, "gpu.1.processes");
  EXPECT_EQ(p.value.find("777"), std::string::npos) << "this job's own process is not foreign";
  expect_item(out, "gpu.1.mig", Status::Warn, {"MIG"});
  EXPECT_FALSE(has(out, "gpu.0.processes"));
}

// What init() counts with torch.cuda.device_count(), the checker counts without initializing CUDA.
TEST(GpuProbe, UsableGpusAreTheVisibleOnesOfACudaTorchTheDriverCanRun) {
  EXPECT_EQ(usable_gpus(machine(8), 8, "13.0"), 8);
  EXPECT_EQ(usable_gpus(machine(8), 2, "13.0"), 2);         // CUDA_VISIBLE_DEVICES chose two
  EXPECT_EQ(usable_gpus(machine(8), 8, ""), 0);             // a CPU build of torch uses none
  EXPECT_EQ(usable_gpus(machine(8, 12080), 8, "13.0"), 0);  // a driver for CUDA 12: CUDA 13 cannot start
  EXPECT_EQ(usable_gpus(machine(8, 13000), 8, "13.1"), 8);  // a newer minor runs (minor-version compatibility)
  EXPECT_EQ(usable_gpus(GpuFacts{}, 0, "13.0"), 0);         // no driver
  EXPECT_TRUE(driver_too_old("13.0", 12080));
  EXPECT_FALSE(driver_too_old("12.8", 13000));
  EXPECT_FALSE(driver_too_old("13.0", 0));  // the driver did not say: nothing to judge
}
