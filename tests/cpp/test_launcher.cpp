// Launcher detection, reading each launcher's variables, and precedence of the sources.
#include <gtest/gtest.h>

#include "dtcore/bootstrap/launcher.h"
#include "dtcore/common/error.h"
#include "expect_error.h"
#include "launcher_vars.h"

using namespace dtcore;
using dtcore::testing::env_style_vars;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;
using dtcore::testing::slurm_vars;
using dtcore::testing::torchrun_vars;
using dtcore::testing::Vars;

namespace {
Env env(Vars vars) { return Env(std::move(vars)); }

// The ConfigError read_world throws for `vars`; fails the test when there is none.
std::string read_error(const Vars& vars) {
  return error_of<ConfigError>([&] { read_world(env(vars)); });
}
}  // namespace

TEST(Launcher, SingleProcessWithoutAnyLauncher) {
  WorldSpec s = read_world(env({{"HOME", "/root"}}));
  EXPECT_EQ(s.launcher, Launcher::Single);
  EXPECT_EQ(s.rank.value, 0);
  EXPECT_EQ(s.world_size.value, 1);
  EXPECT_EQ(s.local_world_size.value, 1);
  EXPECT_EQ(s.num_nodes.value, 1);
  EXPECT_EQ(s.master_addr.value, "127.0.0.1");
  EXPECT_EQ(s.master_port.value, 0);  // a free port is chosen
}

TEST(Launcher, Torchrun) {
  WorldSpec s = read_world(env(torchrun_vars()));
  EXPECT_EQ(s.launcher, Launcher::Torchrun);
  EXPECT_EQ(s.rank.value, 5);
  EXPECT_EQ(s.rank.source, "RANK");
  EXPECT_EQ(s.world_size.value, 16);
  EXPECT_EQ(s.local_rank.value, 5);
  EXPECT_EQ(s.local_world_size.value, 8);
  EXPECT_EQ(s.node_rank.value, 0);
  EXPECT_EQ(s.num_nodes.value, 2);
  EXPECT_EQ(s.master_addr.value, "node-a");
  EXPECT_EQ(s.master_port.value, 29400);
  EXPECT_TRUE(s.use_agent_store);
  EXPECT_EQ(s.restart_count, 2);
}

TEST(Launcher, TorchrunMissingVariableSaysWhichAndWhy) {
  auto vars = torchrun_vars();
  vars.erase("LOCAL_WORLD_SIZE");
  try {
    read_world(env(vars));
    FAIL() << "accepted a torchrun environment without LOCAL_WORLD_SIZE";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("LOCAL_WORLD_SIZE is not set"), std::string::npos) << m;
    EXPECT_NE(m.find("torchrun"), std::string::npos) << m;
  }
}

TEST(Launcher, Accelerate) {
  WorldSpec s = read_world(env({{"ACCELERATE_MIXED_PRECISION", "bf16"},
                                {"RANK", "1"},
                                {"WORLD_SIZE", "2"},
                                {"LOCAL_RANK", "1"},
                                {"LOCAL_WORLD_SIZE", "2"},
                                {"MASTER_ADDR", "127.0.0.1"},
                                {"MASTER_PORT", "29500"},
                                {"TORCHELASTIC_RUN_ID", "x"}}));
  EXPECT_EQ(s.launcher, Launcher::Accelerate);  // accelerate runs torchrun underneath; it is named as such
  EXPECT_EQ(s.rank.value, 1);
  EXPECT_EQ(s.world_size.value, 2);
  WorldSpec one = read_world(env({{"ACCELERATE_USE_CPU", "true"}}));
  EXPECT_EQ(one.launcher, Launcher::Accelerate);
  EXPECT_EQ(one.world_size.value, 1);
}

TEST(Launcher, SlurmWithCompressedNodelist) {
  WorldSpec s = read_world(env({{"SLURM_PROCID", "9"},
                                {"SLURM_NTASKS", "16"},
                                {"SLURM_LOCALID", "1"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_NNODES", "2"},
                                {"SLURM_TASKS_PER_NODE", "8(x2)"},
                                {"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu3"},
                                {"SLURM_JOB_ID", "123456"}}));
  EXPECT_EQ(s.launcher, Launcher::Slurm);
  EXPECT_EQ(s.rank.value, 9);
  EXPECT_EQ(s.world_size.value, 16);
  EXPECT_EQ(s.local_rank.value, 1);
  EXPECT_EQ(s.local_world_size.value, 8);
  EXPECT_EQ(s.node_rank.value, 1);
  EXPECT_EQ(s.num_nodes.value, 2);
  EXPECT_EQ(s.master_addr.value, "gpu01");
  EXPECT_EQ(s.master_addr.source, "first host of SLURM_JOB_NODELIST");
  EXPECT_EQ(s.master_port.value, slurm_default_port(123456));
  EXPECT_NE(s.master_port.source.find("SLURM_JOB_ID"), std::string::npos);
  ASSERT_TRUE(s.tasks_over_nodes.has_value());
  EXPECT_EQ(s.tasks_over_nodes->value, 16);
}

TEST(Launcher, SlurmStepNodelistWinsAndMasterAddrWinsOverBoth) {
  auto vars = Vars{{"SLURM_PROCID", "0"},
                   {"SLURM_NTASKS", "2"},
                   {"SLURM_STEP_NODELIST", "b[2-3]"},
                   {"SLURM_JOB_NODELIST", "a[1-9]"}};
  EXPECT_EQ(read_world(env(vars)).master_addr.value, "b2");
  vars["MASTER_ADDR"] = "explicit-host";
  EXPECT_EQ(read_world(env(vars)).master_addr.value, "explicit-host");
}

TEST(Launcher, SlurmDefaultPortIsStableAndBelowEphemeralRange) {
  EXPECT_EQ(slurm_default_port(42), slurm_default_port(42));
  EXPECT_NE(slurm_default_port(42), slurm_default_port(43));
  for (long id : {0L, 1L, 14999L, 15000L, 987654321L}) {
    EXPECT_GE(slurm_default_port(id), 15000);
    EXPECT_LT(slurm_default_port(id), 30000);
  }
}

TEST(Launcher, OpenMpiDerivesNodesFromLocalSize) {
  WorldSpec s = read_world(env({{"OMPI_COMM_WORLD_RANK", "6"},
                                {"OMPI_COMM_WORLD_SIZE", "8"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                {"MASTER_ADDR", "head"}}));
  EXPECT_EQ(s.launcher, Launcher::OpenMPI);
  EXPECT_EQ(s.rank.value, 6);
  EXPECT_EQ(s.local_rank.value, 2);
  EXPECT_EQ(s.node_rank.value, 1);
  EXPECT_EQ(s.num_nodes.value, 2);
  EXPECT_EQ(s.master_port.value, 29500);
}

TEST(Launcher, OpenMpiOnSeveralNodesNeedsMasterAddr) {
  try {
    read_world(env({{"OMPI_COMM_WORLD_RANK", "0"},
                    {"OMPI_COMM_WORLD_SIZE", "8"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}}));
    FAIL() << "a two-node Open MPI job without MASTER_ADDR was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun -x MASTER_ADDR"), std::string::npos) << e.what();
  }
  // One node: loopback is right.
  WorldSpec s = read_world(env({{"OMPI_COMM_WORLD_RANK", "1"},
                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(s.master_addr.value, "127.0.0.1");
}

TEST(Launcher, MpichAndIntelMpi) {
  WorldSpec s = read_world(env({{"PMI_RANK", "3"},
                                {"PMI_SIZE", "4"},
                                {"MPI_LOCALRANKID", "1"},
                                {"MPI_LOCALNRANKS", "2"},
                                {"MASTER_ADDR", "head"}}));
  EXPECT_EQ(s.launcher, Launcher::Mpich);
  EXPECT_EQ(s.rank.value, 3);
  EXPECT_EQ(s.world_size.value, 4);
  EXPECT_EQ(s.local_rank.value, 1);
  EXPECT_EQ(s.local_world_size.value, 2);
  EXPECT_EQ(s.node_rank.value, 1);
}

TEST(Launcher, TorchrunInsideSlurmAllocationIsTorchrun) {
  auto vars = torchrun_vars();
  vars["SLURM_PROCID"] = "0";
  vars["SLURM_NTASKS"] = "1";
  EXPECT_EQ(read_world(env(vars)).launcher, Launcher::Torchrun);
  auto mpi =
      Vars{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}};
  EXPECT_EQ(read_world(env(mpi)).launcher, Launcher::OpenMPI);
}

TEST(Launcher, PlainRankAndWorldSize) {
  WorldSpec s = read_world(env({{"RANK", "1"}, {"WORLD_SIZE", "3"}}));
  EXPECT_EQ(s.launcher, Launcher::Env);
  EXPECT_EQ(s.local_world_size.value, 3);  // assumed one node
  EXPECT_EQ(s.local_rank.value, 1);
  EXPECT_EQ(s.master_addr.value, "127.0.0.1");
  EXPECT_EQ(s.master_port.value, 29500);
}

TEST(Precedence, DtcoreVariablesBeatLauncherAndArgumentsBeatBoth) {
  auto vars = torchrun_vars();
  vars["DTCORE_RANK"] = "7";
  vars["DTCORE_MASTER_PORT"] = "31000";
  vars["DTCORE_MASTER_ADDR"] = "override-host";
  WorldSpec s = read_world(env(vars));
  EXPECT_EQ(s.rank.value, 7);
  EXPECT_EQ(s.rank.source, "DTCORE_RANK");
  EXPECT_EQ(s.master_port.value, 31000);
  EXPECT_EQ(s.master_addr.value, "override-host");
  EXPECT_EQ(s.world_size.source, "WORLD_SIZE");  // untouched fields keep the launcher's
  EXPECT_FALSE(s.use_agent_store);               // the agent serves at MASTER_ADDR:MASTER_PORT, not at the override
  EXPECT_TRUE(read_world(env(torchrun_vars())).use_agent_store);

  WorldOverrides o;
  o.rank = 3;
  o.master_port = 32000;
  WorldSpec t = read_world(env(vars), o);
  EXPECT_EQ(t.rank.value, 3);
  EXPECT_EQ(t.rank.source, "init(rank=)");
  EXPECT_EQ(t.master_port.value, 32000);
  EXPECT_EQ(t.launcher, Launcher::Torchrun);
}

TEST(Precedence, ArgumentsAloneMakeAWorld) {
  WorldOverrides o;
  o.rank = 1;
  o.world_size = 2;
  WorldSpec s = read_world(env({}), o);
  EXPECT_EQ(s.launcher, Launcher::Env);
  EXPECT_EQ(s.rank.value, 1);
  EXPECT_EQ(s.world_size.value, 2);
}

TEST(Precedence, ArgumentsCompleteAWorldTheLauncherLeftHalfDone) {
  // WORLD_SIZE without RANK: init(rank=) gives the rest, DTCORE_RANK too.
  WorldOverrides o;
  o.rank = 1;
  o.world_size = 2;
  WorldSpec s = read_world(env({{"WORLD_SIZE", "4"}}), o);
  EXPECT_EQ(s.rank.value, 1);
  EXPECT_EQ(s.rank.source, "init(rank=)");
  EXPECT_EQ(s.world_size.value, 2);
  EXPECT_EQ(s.world_size.source, "init(world_size=)");
  WorldOverrides rank_only;
  rank_only.rank = 3;
  s = read_world(env({{"WORLD_SIZE", "4"}}), rank_only);
  EXPECT_EQ(s.rank.value, 3);
  EXPECT_EQ(s.world_size.value, 4);
  EXPECT_EQ(s.world_size.source, "WORLD_SIZE");
  EXPECT_EQ(read_world(env({{"WORLD_SIZE", "4"}, {"DTCORE_RANK", "2"}})).rank.value, 2);
  // torchrun's LOCAL_WORLD_SIZE, srun's SLURM_NTASKS, mpirun's world size: each completed by an argument.
  auto torchrun = torchrun_vars();
  torchrun.erase("LOCAL_WORLD_SIZE");
  WorldOverrides local;
  local.local_world_size = 8;
  EXPECT_EQ(read_world(env(torchrun), local).local_world_size.source, "init(local_world_size=)");
  auto slurm = slurm_vars();
  slurm.erase("SLURM_NTASKS");
  WorldOverrides world;
  world.world_size = 2;
  EXPECT_EQ(read_world(env(slurm), world).world_size.value, 2);
  EXPECT_EQ(read_world(env({{"OMPI_COMM_WORLD_RANK", "1"}}), world).world_size.value, 2);
  // Still an error when nothing gives it, naming the argument too.
  expect_contains(read_error({{"WORLD_SIZE", "4"}}), {"RANK is not set", "init(rank=)", "Fix:"});
  expect_contains(read_error({{"OMPI_COMM_WORLD_RANK", "1"}}),
                  {"OMPI_COMM_WORLD_SIZE is not set", "init(world_size=)"});
}

TEST(Errors, NonIntegerValuesNameVariableValueAndFix) {
  auto vars = torchrun_vars();
  vars["RANK"] = "one";
  try {
    read_world(env(vars));
    FAIL();
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("RANK='one' is not an integer"), std::string::npos) << m;
    EXPECT_NE(m.find("Fix:"), std::string::npos) << m;
  }
  EXPECT_THROW(read_world(env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4x"}})), ConfigError);
  EXPECT_THROW(read_world(env({{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}})), ConfigError);
}

TEST(Errors, RankWithoutWorldSizeAndWorldSizeWithoutRank) {
  EXPECT_THROW(read_world(env({{"DTCORE_RANK", "2"}})), ConfigError);
  try {
    read_world(env({{"WORLD_SIZE", "4"}}));
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK is not set"), std::string::npos) << e.what();
  }
}

// Note [Launcher variables are read by presence]: a launcher variable set to "" is given, and wrong.

TEST(PresentButEmpty, EnvRawSeesEmptyValuesThatGetHides) {
  Env e = env({{"SLURM_PROCID", ""}, {"RANK", "1"}});
  EXPECT_FALSE(e.get("SLURM_PROCID").has_value());  // get(): empty counts as unset, for knobs
  EXPECT_FALSE(e.has("SLURM_PROCID"));
  ASSERT_TRUE(e.raw("SLURM_PROCID").has_value());
  EXPECT_EQ(*e.raw("SLURM_PROCID"), "");
  EXPECT_TRUE(e.present("SLURM_PROCID"));
  EXPECT_EQ(e.raw("RANK"), std::optional<std::string>("1"));
  EXPECT_FALSE(e.raw("WORLD_SIZE").has_value());
  EXPECT_FALSE(e.present("WORLD_SIZE"));
}

TEST(PresentButEmpty, SlurmProcIdIsSlurmAndAnError) {
  auto vars = slurm_vars();
  vars["SLURM_PROCID"] = "";
  EXPECT_EQ(detect_launcher(env(vars)), Launcher::Slurm);  // not a single process of its own
  expect_contains(read_error(vars), {"SLURM_PROCID='' is set but empty (launcher: slurm)", "Fix: set SLURM_PROCID to",
                                     "this task's rank", "srun"});
}

TEST(PresentButEmpty, OpenMpiRankIsOpenMpiAndAnError) {
  Vars vars{{"OMPI_COMM_WORLD_RANK", ""}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  EXPECT_EQ(detect_launcher(env(vars)), Launcher::OpenMPI);
  expect_contains(read_error(vars), {"OMPI_COMM_WORLD_RANK='' is set but empty (launcher: openmpi)", "Fix:", "mpirun"});
}

TEST(PresentButEmpty, PmiRankIsMpichAndAnError) {
  Vars vars{{"PMI_RANK", ""}, {"PMI_SIZE", "2"}};
  EXPECT_EQ(detect_launcher(env(vars)), Launcher::Mpich);
  expect_contains(read_error(vars), {"PMI_RANK='' is set but empty (launcher: mpich)", "Fix:"});
}

TEST(PresentButEmpty, RankIsNotReportedAsUnset) {
  auto vars = env_style_vars();
  vars["RANK"] = "";
  std::string m = read_error(vars);
  expect_contains(m, {"RANK='' is set but empty (launcher: env)", "Fix: set RANK to this process's rank"});
  EXPECT_EQ(m.find("not set"), std::string::npos) << m;
  // Alone, too: an empty RANK is a broken launch, not a single process.
  EXPECT_EQ(detect_launcher(env({{"RANK", ""}})), Launcher::Env);
  expect_contains(read_error({{"RANK", ""}}), {"RANK='' is set but empty"});
}

TEST(PresentButEmpty, WorldSizeIsNotReportedAsUnset) {
  auto vars = env_style_vars();
  vars["WORLD_SIZE"] = "";
  std::string m = read_error(vars);
  expect_contains(m, {"WORLD_SIZE='' is set but empty (launcher: env)", "Fix: set WORLD_SIZE to"});
  EXPECT_EQ(m.find("not set"), std::string::npos) << m;
}

TEST(PresentButEmpty, LocalRank) {
  auto vars = env_style_vars();
  vars["LOCAL_RANK"] = "";  // optional for plain env://, yet present: not derived
  expect_contains(read_error(vars), {"LOCAL_RANK='' is set but empty (launcher: env)", "Fix: set LOCAL_RANK to"});
  auto tr = torchrun_vars();
  tr["LOCAL_RANK"] = "";
  expect_contains(read_error(tr), {"LOCAL_RANK='' is set but empty (launcher: torchrun)"});
}

TEST(PresentButEmpty, LocalWorldSize) {
  auto vars = env_style_vars();
  vars["LOCAL_WORLD_SIZE"] = "";
  expect_contains(read_error(vars), {"LOCAL_WORLD_SIZE='' is set but empty (launcher: env)", "Fix:"});
  auto tr = torchrun_vars();
  tr["LOCAL_WORLD_SIZE"] = "";
  std::string m = read_error(tr);
  expect_contains(m, {"LOCAL_WORLD_SIZE='' is set but empty (launcher: torchrun)"});
  EXPECT_EQ(m.find("not set"), std::string::npos) << m;
}

TEST(PresentButEmpty, MasterAddr) {
  auto vars = env_style_vars();
  vars["MASTER_ADDR"] = "";  // not loopback
  expect_contains(read_error(vars), {"MASTER_ADDR='' is set but empty (launcher: env)", "rank 0's host name"});
  auto slurm = slurm_vars();
  slurm["MASTER_ADDR"] = "";  // not the node list's first host
  expect_contains(read_error(slurm), {"MASTER_ADDR='' is set but empty (launcher: slurm)"});
}

TEST(PresentButEmpty, MasterPort) {
  auto vars = env_style_vars();
  vars["MASTER_PORT"] = "";  // not torch's 29500
  expect_contains(read_error(vars),
                  {"MASTER_PORT='' is set but empty (launcher: env)", "a free TCP port such as 29500"});
  auto slurm = slurm_vars();
  slurm["MASTER_PORT"] = "";  // not the port derived from SLURM_JOB_ID
  expect_contains(read_error(slurm), {"MASTER_PORT='' is set but empty (launcher: slurm)"});
}

TEST(PresentButEmpty, SlurmTasksPerNode) {
  auto vars = slurm_vars();
  vars["SLURM_TASKS_PER_NODE"] = "";
  expect_contains(read_error(vars), {"SLURM_TASKS_PER_NODE='' is set but empty (launcher: slurm)", "e.g. 4(x2),3"});
}

TEST(PresentButEmpty, SlurmJobNodelist) {
  auto vars = slurm_vars();
  vars["SLURM_JOB_NODELIST"] = "";
  expect_contains(read_error(vars),
                  {"SLURM_JOB_NODELIST='' is set but empty (launcher: slurm)", "SLURM hostlist, e.g. gpu[01-04,07]"});
  vars["MASTER_ADDR"] = "head";  // judged even when MASTER_ADDR makes it unneeded
  expect_contains(read_error(vars), {"SLURM_JOB_NODELIST='' is set but empty"});
  vars["SLURM_JOB_NODELIST"] = "gpu[01-";
  expect_contains(read_error(vars), {"SLURM_JOB_NODELIST='gpu[01-'"});
}

TEST(PresentButEmpty, SlurmNtasksIsNamedNotSlurmNprocs) {
  auto vars = slurm_vars();
  vars["SLURM_NTASKS"] = "";
  vars["SLURM_NPROCS"] = "2";  // a present SLURM_NTASKS is not skipped for the older name
  std::string m = read_error(vars);
  expect_contains(m, {"SLURM_NTASKS='' is set but empty (launcher: slurm)", "Fix: set SLURM_NTASKS to"});
  EXPECT_EQ(m.find("SLURM_NPROCS"), std::string::npos) << m;
  vars.erase("SLURM_NPROCS");
  m = read_error(vars);
  EXPECT_EQ(m.find("SLURM_NPROCS"), std::string::npos) << m;
  // Neither set: the current name is the one to set.
  vars.erase("SLURM_NTASKS");
  expect_contains(read_error(vars), {"SLURM_NTASKS is not set"});
  vars["SLURM_NPROCS"] = "2";  // the older name alone still works
  EXPECT_EQ(read_world(env(vars)).world_size.source, "SLURM_NPROCS");
}

TEST(PresentButInvalid, SlurmJobId) {
  auto vars = slurm_vars();
  for (const char* bad : {"-1", "0", "12x", "99999999999"}) {
    vars["SLURM_JOB_ID"] = bad;
    expect_contains(read_error(vars), {"SLURM_JOB_ID='", bad, "' is not a SLURM job id", "Fix:"});
  }
  vars["SLURM_JOB_ID"] = "";
  expect_contains(read_error(vars), {"SLURM_JOB_ID='' is set but empty (launcher: slurm)"});
  vars["SLURM_JOB_ID"] = "4294967295";  // SLURM's ids are 32-bit unsigned
  EXPECT_EQ(read_world(env(vars)).job_id.value, "4294967295");
}

TEST(PresentButEmpty, TorchelasticRunIdIsTorchrunAndAnError) {
  auto vars = torchrun_vars();
  vars["TORCHELASTIC_RUN_ID"] = "";
  EXPECT_EQ(detect_launcher(env(vars)), Launcher::Torchrun);
  expect_contains(read_error(vars), {"TORCHELASTIC_RUN_ID='' is set but empty (launcher: torchrun)"});
}

TEST(PresentButEmpty, TheLaunchersOwnJobIdIsJudgedEvenWhenAnotherIdComesFirst) {
  Vars vars{{"OMPI_COMM_WORLD_RANK", "0"},
            {"OMPI_COMM_WORLD_SIZE", "1"},
            {"SLURM_JOB_ID", "77"},  // mpirun inside a SLURM allocation: SLURM's id is found first
            {"OMPI_MCA_ess_base_jobid", ""}};
  expect_contains(read_error(vars), {"OMPI_MCA_ess_base_jobid='' is set but empty (launcher: openmpi)", "Fix:"});
  vars["OMPI_MCA_ess_base_jobid"] = "12345";
  EXPECT_EQ(read_world(env(vars)).job_id.source, "SLURM_JOB_ID");
}

TEST(PresentButEmpty, AnotherLaunchersEmptyJobIdIsNotThisLaunchersProblem) {
  auto vars = torchrun_vars();
  vars["SLURM_JOB_ID"] = "";  // torchrun inside a SLURM allocation: SLURM's id is not read
  WorldSpec s = read_world(env(vars));
  EXPECT_EQ(s.job_id.value, "job1");
  EXPECT_EQ(s.job_id.source, "TORCHELASTIC_RUN_ID");
}

TEST(PresentButEmpty, DtcoreKnobsStillTreatEmptyAsUnset) {
  auto vars = env_style_vars();
  vars["DTCORE_RANK"] = "";
  vars["DTCORE_MASTER_PORT"] = "";
  vars["DTCORE_MASTER_ADDR"] = "";
  WorldSpec s = read_world(env(vars));
  EXPECT_EQ(s.rank.source, "RANK");
  EXPECT_EQ(s.master_port.source, "MASTER_PORT");
  EXPECT_EQ(s.master_addr.source, "MASTER_ADDR");
}

TEST(PresentButEmpty, SourcesAreKept) {
  WorldSpec s = read_world(env(slurm_vars()));
  EXPECT_EQ(s.rank.source, "SLURM_PROCID");
  EXPECT_EQ(s.world_size.source, "SLURM_NTASKS");
  EXPECT_EQ(s.local_world_size.source, "SLURM_TASKS_PER_NODE");
  EXPECT_EQ(s.num_nodes.source, "SLURM_NNODES");
  EXPECT_EQ(s.master_addr.source, "first host of SLURM_JOB_NODELIST");
  EXPECT_EQ(s.master_port.source, "MASTER_PORT");
  ASSERT_TRUE(s.node_list.has_value());
  EXPECT_EQ(s.node_list->source, "SLURM_JOB_NODELIST");
  EXPECT_EQ(s.node_list->value, "localhost");
  EXPECT_EQ(s.node_list_hosts, 1);
  EXPECT_EQ(s.job_id.source, "SLURM_JOB_ID");
  EXPECT_FALSE(read_world(env(torchrun_vars())).node_list.has_value());  // SLURM's only
}
