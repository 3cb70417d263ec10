// The launcher judge: init()'s own validation item by item, and contradictions with a SLURM
// allocation or an accelerate config, on simulated environments.
#include <gtest/gtest.h>

#include "check_items.h"
#include "dtcore/check/launch_probe.h"

using namespace dtcore;
using namespace dtcore::check;
using dtcore::check::testing::expect_item;
using dtcore::check::testing::has;

namespace {

using Vars = std::map<std::string, std::string, std::less<>>;

Vars torchrun(int world, int local_world, int nodes) {
  return {{"TORCHELASTIC_RUN_ID", "j"},
          {"RANK", "0"},
          {"WORLD_SIZE", std::to_string(world)},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
          {"GROUP_WORLD_SIZE", std::to_string(nodes)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29500"}};
}

LaunchExpectations expect(const std::string& backend = "gloo", int gpus = -1) {
  LaunchExpectations e;
  e.backend = backend;
  e.visible_gpus = gpus;
  e.host = "node1";
  e.resolve_master = false;
  return e;
}

}  // namespace

TEST(LaunchProbe, ValidTorchrunPasses) {
  Items out;
  auto spec = judge_launch(Env(torchrun(8, 8, 1)), expect(), out);
  ASSERT_TRUE(spec.has_value());
  expect_item(out, "launch.launcher", Status::Pass, {"torchrun"});
  expect_item(out, "launch.world", Status::Pass, {"rank 0 of 8", "1 node(s) x 8"});
}

TEST(LaunchProbe, WorldSizeAgainstNodesTimesProcesses) {
  Items out;
  judge_launch(Env(torchrun(12, 8, 2)), expect(), out);
  expect_item(out, "launch.world_size", Status::Fail, {"WORLD_SIZE=12", "2 x", "= 16", "--nnodes"});
  EXPECT_FALSE(has(out, "launch.world"));
}

TEST(LaunchProbe, OneNodeOfSixteenOnEightGpusIsTheInvalidDeviceOrdinal) {
  Vars v = torchrun(16, 16, 1);
  v["LOCAL_RANK"] = "9";
  v["RANK"] = "9";
  Items out;
  judge_launch(Env(v), expect("nccl", 8), out);
  expect_item(out, "launch.gpus_per_node", Status::Fail, {"invalid device ordinal", "--nproc_per_node=8"});
}

TEST(LaunchProbe, UnreadableEnvironmentIsOneFailWithTheFix) {
  Vars v = torchrun(2, 2, 1);
  v["RANK"] = "zero";
  Items out;
  EXPECT_FALSE(judge_launch(Env(v), expect(), out).has_value());
  expect_item(out, "launch.env", Status::Fail, {"RANK", "zero"});
}

TEST(LaunchProbe, TorchrunAskingForMoreNodesThanTheSlurmAllocationFails) {
  Vars v = torchrun(16, 8, 2);
  v["SLURM_JOB_ID"] = "77";
  v["SLURM_JOB_NUM_NODES"] = "1";
  Items out;
  judge_launch(Env(v), expect(), out);
  expect_item(out, "launch.slurm_nodes", Status::Fail, {"expects 2 nodes", "has 1", "sbatch -N 2"});

  v = torchrun(8, 8, 1);
  v["SLURM_JOB_ID"] = "77";
  v["SLURM_JOB_NUM_NODES"] = "4";
  Items idle;
  judge_launch(Env(v), expect(), idle);
  expect_item(idle, "launch.slurm_nodes", Status::Warn, {"idle"});
}

TEST(LaunchProbe, AShellInsideAnAllocationIsNotAJob) {
  Items out;
  judge_launch(Env(Vars{{"SLURM_JOB_ID", "77"}, {"SLURM_JOB_NUM_NODES", "4"}}), expect(), out);
  EXPECT_FALSE(has(out, "launch.slurm_nodes"));
}

TEST(LaunchProbe, MoreProcessesThanSlurmGpusFails) {
  Vars v = torchrun(8, 8, 1);
  v["SLURM_JOB_ID"] = "77";
  v["SLURM_JOB_NUM_NODES"] = "1";
  v["SLURM_GPUS_ON_NODE"] = "4";
  Items out;
  judge_launch(Env(v), expect("nccl", 8), out);
  expect_item(out, "launch.slurm_gpus", Status::Fail, {"SLURM_GPUS_ON_NODE=4", "--gpus-per-node=8"});
}

TEST(LaunchProbe, SrunTasksAgainstSlurmTaskCount) {
  Vars v = {{"SLURM_PROCID", "0"},   {"SLURM_NTASKS", "6"},
            {"SLURM_LOCALID", "0"},  {"SLURM_NODEID", "0"},
            {"SLURM_NNODES", "2"},   {"SLURM_TASKS_PER_NODE", "4(x2)"},
            {"SLURM_JOB_ID", "12"},  {"SLURM_JOB_NODELIST", "n[1-2]"},
            {"MASTER_PORT", "29500"}};
  Items out;
  judge_launch(Env(v), expect(), out);
  expect_item(out, "launch.world_size", Status::Fail, {"SLURM_NTASKS=6", "8 tasks", "--ntasks"});
}

TEST(LaunchProbe, AccelerateConfigAskingForMoreProcessesThanGpusFails) {
  LaunchExpectations e = expect("nccl", 8);
  e.accelerate_config_path = "default_config.yaml";
  e.accelerate_config = parse_accelerate_config("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 1\n");
  Items out;
  judge_launch(Env(Vars{}), e, out);
  expect_item(out, "launch.accelerate", Status::Fail, {"16 processes per machine", "8 GPU(s)", "accelerate config"});

  e.accelerate_config = parse_accelerate_config("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 2\n");
  Items ok;
  judge_launch(Env(Vars{}), e, ok);
  expect_item(ok, "launch.accelerate", Status::Pass);
}

TEST(LaunchProbe, AccelerateConfigOverriddenByTheLaunchCommandWarns) {
  Vars v = torchrun(4, 4, 1);
  v.erase("TORCHELASTIC_RUN_ID");
  v["ACCELERATE_MIXED_PRECISION"] = "no";
  LaunchExpectations e = expect("gloo", -1);
  e.accelerate_config_path = "default_config.yaml";
  e.accelerate_config = parse_accelerate_config("distributed_type: MULTI_CPU\nnum_processes: 2\nnum_machines: 1\n");
  Items out;
  judge_launch(Env(v), e, out);
  expect_item(out, "launch.launcher", Status::Pass, {"accelerate"});
  expect_item(out, "launch.accelerate", Status::Warn, {"num_processes=2", "this job has 4"});
}

TEST(LaunchProbe, AccelerateLaunchThatStartedOneOfSeveralWarns) {
  // `accelerate launch --cpu --num_processes 2`: one process, MASTER_ADDR/MASTER_PORT set.
  Vars v{{"ACCELERATE_USE_CPU", "True"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  Items out;
  judge_launch(Env(v), expect(), out);
  expect_item(out, "launch.accelerate", Status::Warn,
              {"accelerate started this process alone", "MASTER_PORT=29500", "accelerate launch --multi_gpu"});
}
