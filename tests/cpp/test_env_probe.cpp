// Environment traps: each one set gives its WARN/FAIL with what it does and the fix; unset passes.
#include <gtest/gtest.h>

#include "check_items.h"
#include "dtcore/bootstrap/launcher.h"
#include "dtcore/check/env_probe.h"

using namespace dtcore;
using namespace dtcore::check;
using dtcore::check::testing::expect_item;
using dtcore::check::testing::has;

namespace {

using Vars = std::map<std::string, std::string, std::less<>>;

Items judge(std::map<std::string, std::string, std::less<>> vars, TrapContext c = {}) {
  Items out;
  judge_env_traps(Env(std::move(vars)), c, out);
  return out;
}

}  // namespace

TEST(EnvProbe, CleanEnvironmentPasses) {
  Items out = judge({});
  for (const Item& i : out.items()) EXPECT_EQ(status_name(i.status), "PASS") << i.id;
  EXPECT_TRUE(has(out, "env.use_libuv"));
  EXPECT_TRUE(has(out, "env.nccl_ib_disable"));
}

// The agent store is judged by read_world(), the judgement init() follows; the probe reports it.
Items judge_store(Vars vars) {
  TrapContext c;
  c.agent_store = read_world(Env(vars)).use_agent_store;
  return judge(std::move(vars), c);
}

TEST(EnvProbe, StoreSettings) {
  expect_item(judge({{"USE_LIBUV", "0"}}), "env.use_libuv", Status::Warn, {"legacy TCPStore", "unset USE_LIBUV"});
  // Outside torchrun init() ignores the variable and works: a warning for plain torch.distributed, not a failure.
  expect_item(judge_store({{"TORCHELASTIC_USE_AGENT_STORE", "True"}}), "env.agent_store", Status::Warn,
              {"not started by torchrun", "dtcore ignores it", "unset TORCHELASTIC_USE_AGENT_STORE"});
  Vars torchrun = {{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                   {"TORCHELASTIC_RUN_ID", "x"},
                   {"RANK", "0"},
                   {"WORLD_SIZE", "2"},
                   {"LOCAL_RANK", "0"},
                   {"LOCAL_WORLD_SIZE", "2"},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", "29500"}};
  expect_item(judge_store(torchrun), "env.agent_store", Status::Pass, {"torchrun's agent serves"});
  // An address of one's own is not the agent's: dtcore serves its store, and says the variable is ignored.
  torchrun["DTCORE_MASTER_PORT"] = "29600";
  expect_item(judge_store(torchrun), "env.agent_store", Status::Warn, {"dtcore ignores it"});
  // torchrun itself sets False for rendezvous backends without a shared store (etcd, ...).
  torchrun.erase("DTCORE_MASTER_PORT");
  torchrun["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  expect_item(judge_store(torchrun), "env.agent_store", Status::Pass);
}

TEST(EnvProbe, NcclSwitchesLeftOn) {
  Items out = judge({{"NCCL_P2P_DISABLE", "1"},
                     {"NCCL_IB_DISABLE", "1"},
                     {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "0"},
                     {"CUDA_LAUNCH_BLOCKING", "1"}});
  expect_item(out, "env.nccl_p2p_disable", Status::Warn, {"NVLink", "unset NCCL_P2P_DISABLE"});
  expect_item(out, "env.nccl_ib_disable", Status::Warn, {"InfiniBand", "TCP"});
  expect_item(out, "env.torch_nccl_async_error_handling", Status::Warn, {"hangs"});
  expect_item(out, "env.cuda_launch_blocking", Status::Warn, {"slower"});
  expect_item(judge({{"NCCL_P2P_DISABLE", "0"}}), "env.nccl_p2p_disable", Status::Pass);
}

TEST(EnvProbe, AllocatorWithoutExpandableSegmentsOnGpus) {
  TrapContext gpus{true, false, false};
  expect_item(judge({}, gpus), "env.alloc_conf", Status::Warn, {"expandable_segments:True"});
  expect_item(judge({{"PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512"}}, gpus), "env.alloc_conf", Status::Warn,
              {"max_split_size_mb:512,expandable_segments:True"});
  expect_item(judge({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"}}, gpus), "env.alloc_conf", Status::Pass);
  expect_item(judge({{"PYTORCH_ALLOC_CONF", "expandable_segments:True"}}, gpus), "env.alloc_conf", Status::Pass);
  expect_item(judge({{"PYTORCH_CUDA_ALLOC_CONF", "expandable_segments: True"}}, gpus), "env.alloc_conf", Status::Pass);
  expect_item(judge({}), "env.alloc_conf", Status::Pass, {"GPUs only"});
}

TEST(EnvProbe, WandbSetToLogInWithoutCredentials) {
  TrapContext installed{false, true, false};
  expect_item(judge({{"WANDB_PROJECT", "gpt"}}, installed), "env.wandb", Status::Warn,
              {"WANDB_API_KEY", "wandb login", "WANDB_MODE=offline"});
  expect_item(judge({{"WANDB_PROJECT", "gpt"}, {"WANDB_API_KEY", "k"}}, installed), "env.wandb", Status::Pass);
  expect_item(judge({{"WANDB_PROJECT", "gpt"}, {"WANDB_MODE", "offline"}}, installed), "env.wandb", Status::Pass);
  TrapContext netrc{false, true, true};
  expect_item(judge({{"WANDB_PROJECT", "gpt"}}, netrc), "env.wandb", Status::Pass);
}
