// GPU probe: what the NVIDIA driver reports (through NVML, loaded at run time) and its judge.
//
// probe_gpus() dlopens libnvidia-ml.so.1, so the checker runs, and says "no GPU", on a machine
// without the driver; dtcore never links NVML. NVML sees every GPU of the machine whatever
// CUDA_VISIBLE_DEVICES says; visible_devices() applies CUDA's own rules to map that variable
// onto them, so that the judge can compare the two. Nothing here creates a CUDA context.
// Thread safety: probe_gpus() takes NVML's process-wide init/shutdown; call it from one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtcore/check/item.h"

namespace dtcore::check {

struct GpuProcess {
  unsigned pid = 0;
  uint64_t used_bytes = 0;
  std::string name;  // the process's executable, "" when not readable
};

struct GpuDevice {
  int index = 0;  // NVML's (physical) index
  std::string name;
  std::string uuid;  // "GPU-..."
  uint64_t memory_total = 0;
  uint64_t memory_free = 0;
  int cc_major = 0;
  int cc_minor = 0;
  bool mig_enabled = false;
  std::vector<GpuProcess> processes;  // compute processes holding memory on it
};

struct GpuFacts {
  bool hung = false;  // NVML did not answer within the deadline (see checker.cpp)
  bool driver_loaded = false;
  std::string load_error;       // why not, when !driver_loaded
  std::string driver_version;   // e.g. "580.95.05"
  int cuda_driver_version = 0;  // the newest CUDA the driver supports, e.g. 13000 for 13.0
  std::vector<GpuDevice> devices;
};

GpuFacts probe_gpus();

// CUDA_VISIBLE_DEVICES applied to the devices NVML lists, following CUDA's rules: entries are
// indices or (prefixes of) UUIDs, separated by commas; parsing stops silently at an empty,
// negative or unparsable entry, an entry that names no device is reported (CUDA ignores it and
// all after it), and a device named twice makes the whole list invalid. Indices are NVML's (PCI
// order); CUDA_DEVICE_ORDER=FASTEST_FIRST, CUDA's default, may number them differently.
struct VisibleDevices {
  std::vector<int> indices;  // NVML indices (GpuDevice::index) in CUDA's order; -1 for a MIG instance
  std::string problem;       // non-empty when an entry is invalid, duplicated or unknown
};
VisibleDevices visible_devices(const std::optional<std::string>& cuda_visible_devices,
                               const std::vector<GpuDevice>& devices);

// What the judge needs besides the facts: what this torch and this job expect.
struct GpuExpectations {
  std::optional<std::string> cuda_visible_devices;
  std::string torch_cuda;              // torch.version.cuda, "" for a CPU build
  std::vector<std::string> arch_list;  // torch.cuda.get_arch_list(): "sm_90", "compute_90", ...
  bool gpu_required = false;           // the job asked for NCCL (DTCORE_BACKEND=nccl)
  int local_world_size = 1;            // processes this node starts
  std::vector<unsigned> job_pids;      // processes of this job, not counted as "other"
  bool launched = false;               // started by a launcher (idle GPUs are then worth a warning)
  bool pid_namespace = false;          // in a container: NVML's pids are the host's
};

void judge_gpus(const GpuFacts& facts, const GpuExpectations& expect, Items& out);

// True when the driver cannot run torch's CUDA at all (its major version is newer than the
// driver's): CUDA does not initialize, and torch sees no GPU.
bool driver_too_old(const std::string& torch_cuda, int cuda_driver_version);

// The GPUs torch can use here, as torch.cuda.device_count() would count them without
// initializing CUDA: the visible ones, for a CUDA build of torch that this driver can run.
int usable_gpus(const GpuFacts& facts, int visible, const std::string& torch_cuda);

}  // namespace dtcore::check
