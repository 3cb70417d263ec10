// Every validation error: named variable, value, and a fix.
#include <gtest/gtest.h>

#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/validate.h"
#include "dtcore/common/error.h"
#include "expect_error.h"
#include "launcher_vars.h"

using namespace dtcore;
using dtcore::testing::expect_contains;
using dtcore::testing::slurm_vars;
using dtcore::testing::Vars;

namespace {

WorldSpec torchrun(int rank, int world, int local_rank, int local_world, int nodes) {
  return read_world(Env({{"TORCHELASTIC_RUN_ID", "j"},
                         {"RANK", std::to_string(rank)},
                         {"WORLD_SIZE", std::to_string(world)},
                         {"LOCAL_RANK", std::to_string(local_rank)},
                         {"LOCAL_WORLD_SIZE", std::to_string(local_world)},
                         {"GROUP_WORLD_SIZE", std::to_string(nodes)},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"MASTER_PORT", "29500"}}));
}

WorldCheckOptions gloo() {
  WorldCheckOptions o;
  o.backend = "gloo";
  o.host = "testhost";
  return o;
}

// The single problem check_world reports; fails the test unless there is exactly one.
Problem only_problem(const WorldSpec& s, const WorldCheckOptions& o) {
  auto problems = check_world(s, o);
  EXPECT_EQ(problems.size(), 1u);
  if (problems.size() != 1) {
    for (const auto& p : problems) ADD_FAILURE() << "problem: " << p.to_string();
  }
  return problems.empty() ? Problem{} : problems.front();
}

// Each part in the problem's text, and a fix.
void expect_mentions(const Problem& p, std::initializer_list<const char*> parts) {
  expect_contains(p.to_string(), parts);
  EXPECT_FALSE(p.fix.empty());
}

}  // namespace

TEST(Validate, AGoodWorldHasNoProblem) {
  EXPECT_TRUE(check_world(torchrun(3, 8, 3, 4, 2), gloo()).empty());
  EXPECT_NO_THROW(validate_world(torchrun(0, 1, 0, 1, 1), gloo()));
}

TEST(Validate, RankNotBelowWorldSize) {
  auto problems = check_world(torchrun(4, 4, 0, 4, 1), gloo());
  ASSERT_FALSE(problems.empty());
  expect_mentions(problems.front(), {"RANK=4", "0..3", "WORLD_SIZE=4"});
  EXPECT_EQ(problems.front().variable, "RANK");
  EXPECT_EQ(problems.front().value, "4");
}

TEST(Validate, LocalRankNotBelowLocalWorldSize) {
  auto problems = check_world(torchrun(2, 4, 2, 2, 2), gloo());
  ASSERT_EQ(problems.size(), 1u);
  expect_mentions(problems.front(), {"LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"});
}

TEST(Validate, WorldSizeIsNotNodesTimesLocalWorldSize) {
  auto problems = check_world(torchrun(0, 12, 0, 8, 2), gloo());
  ASSERT_EQ(problems.size(), 1u);
  expect_mentions(problems.front(), {"WORLD_SIZE=12", "GROUP_WORLD_SIZE=2", "LOCAL_WORLD_SIZE=8", "16", "--nnodes"});
}

TEST(Validate, SlurmTaskCountDisagreesWithTasksPerNode) {
  WorldSpec s = read_world(Env({{"SLURM_PROCID", "0"},
                                {"SLURM_NTASKS", "10"},
                                {"SLURM_NODEID", "0"},
                                {"SLURM_NNODES", "2"},
                                {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                {"MASTER_ADDR", "127.0.0.1"}}));
  auto problems = check_world(s, gloo());
  ASSERT_EQ(problems.size(), 1u);
  expect_mentions(problems.front(), {"SLURM_NTASKS=10", "8 tasks", "SLURM_TASKS_PER_NODE"});
  // Uneven but consistent nodes are fine.
  WorldSpec ok = read_world(Env({{"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "11"},
                                 {"SLURM_NODEID", "2"},
                                 {"SLURM_NNODES", "3"},
                                 {"SLURM_LOCALID", "0"},
                                 {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                                 {"MASTER_ADDR", "127.0.0.1"}}));
  EXPECT_EQ(ok.local_world_size.value, 3);
  EXPECT_TRUE(check_world(ok, gloo()).empty());
}

TEST(Validate, NodeRankOutOfRange) {
  WorldSpec s = torchrun(0, 8, 0, 4, 2);
  s.node_rank = {2, "GROUP_RANK"};
  expect_mentions(only_problem(s, gloo()), {"GROUP_RANK=2", "0..1"});
}

TEST(Validate, LocalRankBeyondVisibleGpusIsTheInvalidDeviceOrdinalCase) {
  // 2 nodes x 8 GPUs started as 1 x 16: local rank 9 on a host with 8 GPUs.
  WorldSpec s = torchrun(9, 16, 9, 16, 1);
  WorldCheckOptions o = gloo();
  o.backend = "nccl";
  o.visible_gpus = 8;
  Problem p = only_problem(s, o);
  expect_mentions(p, {"LOCAL_RANK=9", "sees only 8 GPU", "invalid device ordinal", "2 nodes x 8 GPUs started as 1 x 16",
                      "--nproc_per_node=8", "testhost"});
  o.backend = "gloo";  // CPU jobs do not need a GPU per rank
  EXPECT_TRUE(check_world(s, o).empty());
}

TEST(Validate, OneGpuBoundPerProcessUsesDeviceZero) {
  // srun --gpus-per-task=1: each task sees exactly its own GPU, whatever its local rank.
  WorldSpec s = torchrun(3, 8, 3, 8, 1);
  s.cuda_visible_devices = "5";
  EXPECT_EQ(cuda_device_index(s, 1), 0);
  WorldCheckOptions o = gloo();
  o.backend = "nccl";
  o.visible_gpus = 1;
  EXPECT_TRUE(check_world(s, o).empty());
  s.cuda_visible_devices = "";  // one GPU and no binding: ranks 1..7 have no GPU of their own
  EXPECT_EQ(cuda_device_index(s, 1), 3);
  EXPECT_EQ(check_world(s, o).size(), 1u);
}

TEST(Validate, PortOutOfRange) {
  WorldSpec s = torchrun(0, 2, 0, 2, 1);
  s.master_port = {70000, "MASTER_PORT"};
  expect_mentions(only_problem(s, gloo()), {"MASTER_PORT=70000", "1..65535"});
  s.master_port = {0, "MASTER_PORT"};  // only a single process may ask for "any port"
  expect_mentions(only_problem(s, gloo()), {"MASTER_PORT=0"});
}

TEST(Validate, MasterAddressThatDoesNotResolve) {
  WorldSpec s = torchrun(0, 2, 0, 2, 1);
  s.master_addr = {"no-such-host.invalid", "MASTER_ADDR"};
  expect_mentions(only_problem(s, gloo()), {"MASTER_ADDR=no-such-host.invalid", "does not resolve"});
  WorldCheckOptions o = gloo();
  o.resolve_master = false;
  EXPECT_TRUE(check_world(s, o).empty());
}

TEST(Validate, ValidateWorldListsEveryProblemInOneConfigError) {
  WorldSpec s = torchrun(5, 4, 3, 2, 1);  // rank, local rank and nodes x local all wrong
  try {
    validate_world(s, gloo());
    FAIL();
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("RANK=5"), std::string::npos) << m;
    EXPECT_NE(m.find("LOCAL_RANK=3"), std::string::npos) << m;
    EXPECT_NE(m.find("launcher: torchrun"), std::string::npos) << m;
    EXPECT_NE(m.find("testhost"), std::string::npos) << m;
  }
}

TEST(Validate, NegativeAndZeroSizes) {
  WorldSpec s = torchrun(0, 1, 0, 1, 1);
  s.world_size = {0, "WORLD_SIZE"};
  auto problems = check_world(s, gloo());
  ASSERT_FALSE(problems.empty());
  EXPECT_EQ(problems.front().variable, "WORLD_SIZE");
  s = torchrun(0, 1, 0, 1, 1);
  s.rank = {-1, "RANK"};
  expect_mentions(only_problem(s, gloo()), {"RANK=-1"});
}

TEST(Validate, SlurmNodeCountBeyondTheHostsOfTheNodeList) {
  Vars vars = slurm_vars();    // rank 0 of 2 on "localhost" ...
  vars["SLURM_NNODES"] = "3";  // ... said to span 3 nodes
  Problem p = only_problem(read_world(Env(vars)), gloo());
  expect_mentions(p, {"SLURM_NNODES=3", "exceeds the 1 host(s)", "SLURM_JOB_NODELIST='localhost'", "srun -N 1"});
  EXPECT_EQ(p.field, "num_nodes");
  EXPECT_EQ(p.variable, "SLURM_NNODES");
  EXPECT_EQ(p.value, "3");
  // One ConfigError from validate_world, as for every problem.
  EXPECT_THROW(validate_world(read_world(Env(vars)), gloo()), ConfigError);

  // A step may use fewer nodes than the job's list names.
  vars["SLURM_NNODES"] = "1";
  vars["SLURM_JOB_NODELIST"] = "n[1-2]";
  vars["MASTER_ADDR"] = "127.0.0.1";
  EXPECT_TRUE(check_world(read_world(Env(vars)), gloo()).empty());
  // Only where both are known: without a node list there is nothing to compare with.
  vars["SLURM_NNODES"] = "3";
  vars["SLURM_TASKS_PER_NODE"] = "1(x2)";
  vars.erase("SLURM_JOB_NODELIST");
  WorldSpec no_list = read_world(Env(vars));
  EXPECT_FALSE(no_list.node_list.has_value());
  for (const auto& problem : check_world(no_list, gloo())) EXPECT_NE(problem.field, "num_nodes") << problem.to_string();
  // The step's own list is preferred, and is what the node count is checked against.
  vars["SLURM_STEP_NODELIST"] = "n[1-2]";
  vars["SLURM_JOB_NODELIST"] = "n[1-4]";
  expect_mentions(only_problem(read_world(Env(vars)), gloo()), {"SLURM_NNODES=3", "SLURM_STEP_NODELIST='n[1-2]'"});
}
