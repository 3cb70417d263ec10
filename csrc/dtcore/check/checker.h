// The resource checker: runs every probe of this process and judges it, in report order
// (version, gpu, launch, network, host, env). Python adds what only it knows (the running torch,
// wandb) and formats the report; `python -m dtcore.check` and dtcore.init(preflight=True) both
// come here. The probes are fast (no CUDA context, no collective): well under a second.
// Thread safety: call from one thread at a time (NVML init/shutdown is process-wide).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/check/gpu_probe.h"
#include "dtcore/check/item.h"
#include "dtcore/check/version_probe.h"
#include "dtcore/common/settings.h"

namespace dtcore::check {

struct CheckInputs {
  std::map<std::string, std::string> env;  // the environment to judge (the process's, or a test's)
  // init()'s arguments, judged as init() would: they beat the environment, as there.
  Arguments world_arguments;           // rank=, world_size=, ... (bootstrap/launcher.h parse_overrides)
  Arguments settings_arguments;        // timeout=, backend=, log_dir= (common/settings.h)
  VersionFacts versions;               // filled by Python; the NCCL library is probed here
  std::vector<std::string> nccl_dirs;  // where torch's NCCL may live
  std::vector<std::string> arch_list;  // torch.cuda.get_arch_list()
  std::string host;
  std::string shm_path = "/dev/shm";
  // Where checkpoints go (free disk is judged there); unset: the working directory, except in
  // preflight, where init() cannot know and only named directories are judged. The log directory
  // is the settings' (init(log_dir=) or DTCORE_LOG_DIR).
  std::optional<std::string> checkpoint_dir;
  double min_free_disk_gb = 10.0;      // GB: 10^9 bytes
  std::string accelerate_config_path;  // "" when there is none
  std::string accelerate_config_text;
  bool wandb_installed = false;
  bool wandb_credentials = false;
  bool distributed = false;        // the whole job runs the check: also test reachability of the master
  bool preflight = false;          // from init(): judge what init() will do (one process takes any port)
  std::vector<unsigned> job_pids;  // this process, its launcher and its sibling ranks
  bool pid_namespace = false;      // in a container: NVML's pids are not ours
  std::optional<GpuFacts> gpus;    // given: use instead of probing the driver (tests)
};

struct CheckResult {
  std::vector<Item> items;
  std::optional<WorldSpec> spec;  // the job as init() would read it, when readable
  Settings settings;              // as init() would read them (invalid values replaced by defaults)
  std::string backend;            // what init() would choose (choose_backend), "gloo" when it cannot
  int visible_gpus = 0;
  GpuFacts gpus;
};

CheckResult run_checks(const CheckInputs& inputs);

}  // namespace dtcore::check
