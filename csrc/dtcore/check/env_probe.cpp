#include "dtcore/check/env_probe.h"

#include <algorithm>
#include <cctype>

#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"

namespace dtcore::check {
namespace {

bool falsy(const std::string& v) {
  std::string l = ascii_lower(v);
  return l == "0" || l == "false" || l == "no" || l == "off";
}

void judge_store(const Env& env, const TrapContext& c, Items& out) {
  if (auto v = env.get("USE_LIBUV"); v && falsy(*v)) {
    out.warn("env.use_libuv", "USE_LIBUV", *v,
             "selects the legacy TCPStore server for torchrun's agent store (dtcore's own store, which rank 0 "
             "serves outside torchrun, is not affected): one thread per connection, deprecated in torch, and slow to "
             "start or out of threads beyond a few thousand ranks.",
             "unset USE_LIBUV (libuv is torch's default).");
  } else {
    out.pass("env.use_libuv", "USE_LIBUV", env.get("USE_LIBUV").value_or("unset"));
  }
  // Whether the agent's store is used is read_world()'s judgement (WorldSpec::use_agent_store),
  // the one init() follows: the variable alone decides nothing.
  auto agent = env.get("TORCHELASTIC_USE_AGENT_STORE");
  if (!agent || !truthy(*agent)) {
    out.pass("env.agent_store", "TORCHELASTIC_USE_AGENT_STORE", agent.value_or("unset"));
  } else if (c.agent_store) {
    out.pass("env.agent_store", "TORCHELASTIC_USE_AGENT_STORE", *agent, "torchrun's agent serves the rendezvous store");
  } else {
    out.warn("env.agent_store", "TORCHELASTIC_USE_AGENT_STORE", *agent,
             "set, but not for this process: it was not started by torchrun (or the store's address was set apart "
             "from torchrun's), so dtcore ignores it and rank 0 serves the store; a plain "
             "torch.distributed.init_process_group('env://') would instead wait for a store nobody serves.",
             "unset TORCHELASTIC_USE_AGENT_STORE (torchrun sets it for its own workers).");
  }
}

void judge_nccl(const Env& env, Items& out) {
  struct Trap {
    const char* var;
    const char* what;
  };
  static const Trap kTraps[] = {
      {"NCCL_P2P_DISABLE",
       "turns off NVLink and PCIe peer-to-peer: traffic between GPUs of a node goes through "
       "host memory, several times slower."},
      {"NCCL_IB_DISABLE",
       "turns off InfiniBand and RoCE: traffic between nodes goes over TCP sockets, typically "
       "5-20x slower."},
      {"NCCL_SHM_DISABLE", "turns off the shared-memory transport between local GPUs without peer-to-peer."},
  };
  for (const Trap& t : kTraps) {
    const std::string id = "env." + ascii_lower(t.var);
    auto v = env.get(t.var);
    if (v && truthy(*v)) {
      out.warn(id, t.var, *v, t.what,
               detail::cat("unset ", t.var,
                           " unless it works around a known fault on this cluster (and then write "
                           "down which)."));
    } else {
      out.pass(id, t.var, v.value_or("unset"));
    }
  }
  for (const char* var : {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"}) {
    if (auto v = env.get(var); v && falsy(*v)) {
      out.warn("env." + ascii_lower(var), var, *v,
               "a failed or stuck NCCL collective is no longer turned into an error: the job hangs instead of "
               "stopping with the failing rank named.",
               detail::cat("unset ", var, "."));
    }
  }
  if (auto v = env.get("CUDA_LAUNCH_BLOCKING"); v && truthy(*v)) {
    out.warn("env.cuda_launch_blocking", "CUDA_LAUNCH_BLOCKING", *v,
             "every CUDA kernel launch waits for the kernel: a debugging setting that makes training several times "
             "slower and removes communication overlap.",
             "unset CUDA_LAUNCH_BLOCKING outside debugging.");
  }
}

void judge_allocator(const Env& env, const TrapContext& c, Items& out) {
  // torch reads PYTORCH_ALLOC_CONF (newer) or PYTORCH_CUDA_ALLOC_CONF; either enables the option.
  std::string name = "PYTORCH_CUDA_ALLOC_CONF";
  auto v = env.get(name);
  if (!v) {
    if (auto alt = env.get("PYTORCH_ALLOC_CONF")) {
      name = "PYTORCH_ALLOC_CONF";
      v = alt;
    }
  }
  std::string compact = ascii_lower(v.value_or(""));
  compact.erase(std::remove_if(compact.begin(), compact.end(), ::isspace), compact.end());
  const bool expandable = compact.find("expandable_segments:true") != std::string::npos;
  if (!c.gpus) {
    out.pass("env.alloc_conf", name, v.value_or("unset"), "matters on GPUs only");
  } else if (!expandable) {
    out.warn("env.alloc_conf", name, v.value_or("unset"),
             "without expandable_segments the CUDA caching allocator fragments memory as activation sizes vary; "
             "jobs hit OOM with gigabytes reserved but unallocated.",
             v ? detail::cat("add it: ", name, "=", *v, ",expandable_segments:True")
               : std::string("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"));
  } else {
    out.pass("env.alloc_conf", name, *v);
  }
}

void judge_wandb(const Env& env, const TrapContext& c, Items& out) {
  const std::string mode = ascii_lower(env.get("WANDB_MODE").value_or(""));
  const bool off =
      mode == "offline" || mode == "disabled" || mode == "dryrun" || truthy(env.get("WANDB_DISABLED").value_or(""));
  const bool configured = env.has("WANDB_PROJECT") || env.has("WANDB_ENTITY") || mode == "online";
  const bool credentials = env.has("WANDB_API_KEY") || c.wandb_credentials;
  if (!c.wandb_installed || off) {
    out.pass("env.wandb", "wandb", !c.wandb_installed ? "not installed" : "mode " + mode);
  } else if (configured && !credentials) {
    out.warn("env.wandb", "wandb",
             detail::cat("WANDB_PROJECT=", env.get("WANDB_PROJECT").value_or("unset"), ", no credentials"),
             "wandb is set to log in, but finds no WANDB_API_KEY and no login (netrc): under a launcher, "
             "wandb.init() prompts for a login that nobody answers, or fails without a terminal.",
             "run `wandb login` on each node (or set WANDB_API_KEY), or set WANDB_MODE=offline.");
  } else {
    out.pass("env.wandb", "wandb", credentials ? "credentials found" : "installed, not configured");
  }
}

void judge_knobs(const Env& env, Items& out) {
  const std::vector<std::string> unknown = unknown_knobs(env);
  if (unknown.empty()) {
    out.pass("env.dtcore_unknown", "dtcore's variables", "every one set is a setting");
    return;
  }
  std::string names, lines;
  for (const std::string& name : env.names_with_prefix(knobs::kPrefix)) {
    const auto about = [&](const std::string& line) { return line.starts_with(name + " "); };
    if (std::any_of(unknown.begin(), unknown.end(), about)) names += (names.empty() ? "" : ", ") + name;
  }
  for (const std::string& line : unknown) lines += (lines.empty() ? "" : " ") + line;
  out.warn("env.dtcore_unknown", "dtcore's variables", names, lines,
           "rename or unset them; python -m dtcore.check --json lists every setting with its source.");
}

}  // namespace

void judge_env_traps(const Env& env, const TrapContext& c, Items& out) {
  judge_knobs(env, out);
  judge_store(env, c, out);
  judge_nccl(env, out);
  judge_allocator(env, c, out);
  judge_wandb(env, c, out);
}

}  // namespace dtcore::check
