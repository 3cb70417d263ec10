// accelerate's config file, and the rule for an `accelerate launch` that started fewer processes
// than it was asked for (the checker's item is in test_launch_probe.cpp).
#include <gtest/gtest.h>

#include "dtcore/bootstrap/accelerate.h"
#include "dtcore/bootstrap/launcher.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::expect_contains;

namespace {

using Vars = std::map<std::string, std::string, std::less<>>;

// What `accelerate launch --cpu [--num_processes 2] script.py` gives its one process.
Vars accelerate_cpu(bool asked_for_two) {
  Vars v{{"ACCELERATE_USE_CPU", "True"}, {"ACCELERATE_MIXED_PRECISION", "no"}};
  if (asked_for_two) {
    v["MASTER_ADDR"] = "127.0.0.1";
    v["MASTER_PORT"] = "29500";
  }
  return v;
}

std::string fewer(const Vars& vars, const std::string& config_text = "", WorldOverrides o = {}) {
  Env env(vars);
  const std::string path = config_text.empty() ? "" : "/home/u/.cache/huggingface/accelerate/default_config.yaml";
  return accelerate_started_fewer(env, read_world(env, o), path, parse_accelerate_config(config_text));
}

}  // namespace

TEST(AccelerateConfig, ParsesTopLevelKeys) {
  auto c = parse_accelerate_config(
      "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 16\n"
      "num_machines: 1\nmain_process_port: '29501'\ndeepspeed_config:\n  zero_stage: 2\n");
  EXPECT_EQ(c["num_processes"], "16");
  EXPECT_EQ(c["main_process_port"], "29501");
  EXPECT_EQ(c.count("zero_stage"), 0u);  // nested keys are not top-level
}

TEST(AccelerateStartedFewer, CpuWithNumProcessesNamesTheVariablesAndTheFix) {
  expect_contains(
      fewer(accelerate_cpu(true)),
      {"accelerate started this process alone", "MASTER_ADDR=127.0.0.1 and MASTER_PORT=29500 are set",
       "--num_processes > 1", "trains on one process",
       "Fix: start N processes with `accelerate launch --multi_gpu --num_processes=N`", "torchrun --nproc_per_node=N"});
}

TEST(AccelerateStartedFewer, AConfigFileAskingForMoreIsNamedWithItsCount) {
  std::string m = fewer(accelerate_cpu(false), "distributed_type: MULTI_CPU\nnum_processes: 4\n");
  expect_contains(m, {"its config file /home/u/.cache/huggingface/accelerate/default_config.yaml asks for "
                      "num_processes: 4",
                      "--num_processes=4", "set num_processes: 1 in /home/u/"});
  EXPECT_EQ(m.find("MASTER_"), std::string::npos) << m;
}

TEST(AccelerateStartedFewer, WhatWasAskedForIsNotWarnedAbout) {
  EXPECT_EQ(fewer(accelerate_cpu(false)), "");                             // one process, as asked
  EXPECT_EQ(fewer(accelerate_cpu(false), "num_processes: 1\n"), "");       // the file agrees
  EXPECT_EQ(fewer({{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}}), "");  // not accelerate
  Vars torchrun = accelerate_cpu(true);                                    // --multi_gpu: torchrun's variables
  torchrun.insert({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_EQ(fewer(torchrun, "num_processes: 2\n"), "");
  WorldOverrides one;
  one.world_size = 1;  // init(world_size=1): one process is what the script asks for
  EXPECT_EQ(fewer(accelerate_cpu(true), "num_processes: 4\n", one), "");
}
