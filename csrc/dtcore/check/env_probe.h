// Environment traps: variables that look harmless, were often set once to debug something, and
// silently make a distributed job slow, fragile or stuck. Each is reported with what it does and
// what to do; unset ones pass. Thread safety: pure.
#pragma once

#include "dtcore/check/item.h"
#include "dtcore/common/env.h"

namespace dtcore::check {

struct TrapContext {
  bool gpus = false;               // GPUs are visible: the CUDA and NCCL settings matter
  bool wandb_installed = false;    // `import wandb` would work
  bool wandb_credentials = false;  // a netrc entry for api.wandb.ai exists
  bool agent_store = false;        // the job uses torchrun's agent store (WorldSpec::use_agent_store)
};

void judge_env_traps(const Env& env, const TrapContext& context, Items& out);

}  // namespace dtcore::check
