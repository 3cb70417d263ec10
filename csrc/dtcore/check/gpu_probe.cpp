#include "dtcore/check/gpu_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/units.h"

namespace dtcore::check {
namespace {

// The slice of NVML's C API the probe uses, declared here because nvml.h is not on every build
// machine. Layouts follow nvml.h (CUDA 12/13); nvmlProcessInfo_t is the v2 layout that both the
// _v2 and _v3 process queries fill.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlInsufficientSize = 7;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

template <typename Fn>
Fn sym(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

std::string process_name(unsigned pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

// Loads NVML for the duration of one probe; unloads it after, so the checker leaves no trace.
class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* err = dlerror();
      error_ = err ? err : "libnvidia-ml.so.1 not found";
      return;
    }
    auto init = sym<nvmlReturn_t (*)()>(lib_, "nvmlInit_v2");
    error_string_ = sym<const char* (*)(nvmlReturn_t)>(lib_, "nvmlErrorString");
    if (init == nullptr) {
      error_ = "libnvidia-ml.so.1 has no nvmlInit_v2 (driver too old)";
      return;
    }
    nvmlReturn_t rc = init();
    if (rc != kNvmlSuccess) {
      error_ = detail::cat("nvmlInit failed: ", describe(rc));
      return;
    }
    initialized_ = true;
  }
  ~Nvml() {
    if (initialized_) {
      if (auto shutdown = sym<nvmlReturn_t (*)()>(lib_, "nvmlShutdown")) shutdown();
    }
    if (lib_ != nullptr) dlclose(lib_);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return initialized_; }
  const std::string& error() const { return error_; }
  void* lib() const { return lib_; }
  std::string describe(nvmlReturn_t rc) const {
    return error_string_ ? std::string(error_string_(rc)) : detail::cat("NVML error ", rc);
  }

 private:
  void* lib_ = nullptr;
  bool initialized_ = false;
  std::string error_;
  const char* (*error_string_)(nvmlReturn_t) = nullptr;
};

std::vector<GpuProcess> running_processes(void* lib, nvmlDevice_t dev) {
  using Query = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, NvmlProcessInfo*);
  Query query = sym<Query>(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (query == nullptr) query = sym<Query>(lib, "nvmlDeviceGetComputeRunningProcesses_v2");
  std::vector<GpuProcess> out;
  if (query == nullptr) return out;
  std::vector<NvmlProcessInfo> infos(64);
  unsigned int count = static_cast<unsigned int>(infos.size());
  nvmlReturn_t rc = query(dev, &count, infos.data());
  if (rc == kNvmlInsufficientSize) {
    infos.resize(count + 16);
    count = static_cast<unsigned int>(infos.size());
    rc = query(dev, &count, infos.data());
  }
  if (rc != kNvmlSuccess) return out;
  for (unsigned int i = 0; i < count; ++i) {
    out.push_back(GpuProcess{infos[i].pid, infos[i].used_gpu_memory, process_name(infos[i].pid)});
  }
  return out;
}

std::string cuda_version_text(int v) { return detail::cat(v / 1000, ".", (v % 1000) / 10); }

// "13.0" -> 13000; 0 when unparsable.
int parse_cuda_version(const std::string& s) {
  int major = 0, minor = 0;
  if (std::sscanf(s.c_str(), "%d.%d", &major, &minor) < 1) return 0;
  return major * 1000 + minor * 10;
}

}  // namespace

bool driver_too_old(const std::string& torch_cuda, int cuda_driver_version) {
  return cuda_driver_version > 0 && parse_cuda_version(torch_cuda) / 1000 > cuda_driver_version / 1000;
}

int usable_gpus(const GpuFacts& facts, int visible, const std::string& torch_cuda) {
  if (torch_cuda.empty() || !facts.driver_loaded || driver_too_old(torch_cuda, facts.cuda_driver_version)) return 0;
  return visible;
}

namespace {

bool arch_supported(const std::vector<std::string>& arch_list, int major, int minor) {
  const int cap = major * 10 + minor;
  for (const std::string& arch : arch_list) {
    int code = 0;
    char suffix = 0;
    if (std::sscanf(arch.c_str(), "sm_%d%c", &code, &suffix) >= 1) {
      // A cubin runs on its own major version at the same or a later minor ("sm_90a" only on 9.0).
      if (suffix == 'a' || suffix == 'f') {
        if (code == cap) return true;
      } else if (code / 10 == major && code <= cap) {
        return true;
      }
    } else if (std::sscanf(arch.c_str(), "compute_%d", &code) == 1 && code <= cap) {
      return true;  // PTX, compiled by the driver at load
    }
  }
  return false;
}

}  // namespace

GpuFacts probe_gpus() {
  GpuFacts f;
  Nvml nvml;
  if (!nvml.ok()) {
    f.load_error = nvml.error();
    return f;
  }
  f.driver_loaded = true;
  void* lib = nvml.lib();
  char buf[256] = {0};
  if (auto fn = sym<nvmlReturn_t (*)(char*, unsigned int)>(lib, "nvmlSystemGetDriverVersion")) {
    if (fn(buf, sizeof buf) == kNvmlSuccess) f.driver_version = buf;
  }
  if (auto fn = sym<nvmlReturn_t (*)(int*)>(lib, "nvmlSystemGetCudaDriverVersion_v2")) {
    int version = 0;
    if (fn(&version) == kNvmlSuccess) f.cuda_driver_version = version;
  }
  auto get_count = sym<nvmlReturn_t (*)(unsigned int*)>(lib, "nvmlDeviceGetCount_v2");
  auto get_handle = sym<nvmlReturn_t (*)(unsigned int, nvmlDevice_t*)>(lib, "nvmlDeviceGetHandleByIndex_v2");
  auto get_name = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int)>(lib, "nvmlDeviceGetName");
  auto get_uuid = sym<nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int)>(lib, "nvmlDeviceGetUUID");
  auto get_memory = sym<nvmlReturn_t (*)(nvmlDevice_t, NvmlMemory*)>(lib, "nvmlDeviceGetMemoryInfo");
  auto get_cc = sym<nvmlReturn_t (*)(nvmlDevice_t, int*, int*)>(lib, "nvmlDeviceGetCudaComputeCapability");
  auto get_mig = sym<nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, unsigned int*)>(lib, "nvmlDeviceGetMigMode");
  unsigned int count = 0;
  if (get_count == nullptr || get_handle == nullptr || get_count(&count) != kNvmlSuccess) return f;
  for (unsigned int i = 0; i < count; ++i) {
    nvmlDevice_t dev = nullptr;
    if (get_handle(i, &dev) != kNvmlSuccess) continue;
    GpuDevice d;
    d.index = static_cast<int>(i);
    if (get_name && get_name(dev, buf, sizeof buf) == kNvmlSuccess) d.name = buf;
    if (get_uuid && get_uuid(dev, buf, sizeof buf) == kNvmlSuccess) d.uuid = buf;
    NvmlMemory mem{};
    if (get_memory && get_memory(dev, &mem) == kNvmlSuccess) {
      d.memory_total = mem.total;
      d.memory_free = mem.free;
    }
    if (get_cc) get_cc(dev, &d.cc_major, &d.cc_minor);
    unsigned int current = 0, pending = 0;
    if (get_mig && get_mig(dev, &current, &pending) == kNvmlSuccess) d.mig_enabled = current == 1;
    d.processes = running_processes(lib, dev);
    f.devices.push_back(std::move(d));
  }
  return f;
}

VisibleDevices visible_devices(const std::optional<std::string>& cvd, const std::vector<GpuDevice>& devices) {
  VisibleDevices v;
  if (!cvd) {
    for (const auto& d : devices) v.indices.push_back(d.index);
    return v;
  }
  std::set<int> seen;
  std::stringstream in(*cvd);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    entry.erase(0, entry.find_first_not_of(" \t"));
    entry.erase(entry.find_last_not_of(" \t") + 1);
    // CUDA stops, without complaint, at an empty or negative entry ("-1" is the usual way to hide
    // every GPU) or anything that is neither an index nor a UUID.
    if (entry.empty() || entry[0] == '-') break;
    int found = -1;
    if (std::isdigit(static_cast<unsigned char>(entry[0]))) {
      unsigned long idx = std::strtoul(entry.c_str(), nullptr, 10);  // like CUDA: "1gpu" reads as 1
      for (const auto& d : devices) {
        if (static_cast<unsigned long>(d.index) == idx) found = d.index;
      }
    } else if (entry.rfind("MIG-", 0) == 0) {
      v.indices.push_back(-1);  // a MIG instance: NVML lists its parent GPU, not the instance
      continue;
    } else if (entry.rfind("GPU-", 0) == 0) {
      for (const auto& d : devices) {
        if (d.uuid.rfind(entry, 0) == 0) found = d.index;
      }
    } else {
      break;
    }
    if (found < 0) {
      v.problem = detail::cat("entry '", entry, "' names no GPU of this machine (it has ", devices.size(),
                              "); CUDA ignores it and everything after it");
      break;
    }
    if (!seen.insert(found).second) {
      v.problem = detail::cat("GPU ", found, " is listed twice; CUDA then sees no GPU at all");
      v.indices.clear();
      break;
    }
    v.indices.push_back(found);
  }
  return v;
}

void judge_gpus(const GpuFacts& f, const GpuExpectations& e, Items& out) {
  if (f.hung) {
    out.fail("gpu.driver", "NVIDIA driver", "not answering",
             "NVML did not answer within the probe's deadline: a GPU has probably fallen off the bus or the driver "
             "is wedged (`nvidia-smi` hangs too).",
             "drain this node and have it checked (`dmesg` shows Xid errors); do not start the job here.");
    return;
  }
  const std::string cvd_text = e.cuda_visible_devices ? "CUDA_VISIBLE_DEVICES=" + *e.cuda_visible_devices
                                                      : std::string("CUDA_VISIBLE_DEVICES unset");
  if (!f.driver_loaded) {
    std::string value = "no NVIDIA driver";
    if (e.gpu_required) {
      out.fail("gpu.driver", "NVIDIA driver", value,
               detail::cat("the job asks for NCCL (", knobs::kBackend.name,
                           "=nccl) but the driver cannot be loaded: ", f.load_error, "."),
               detail::cat("run on a GPU node (check `nvidia-smi`), or set ", knobs::kBackend.name,
                           "=gloo to train on CPU."));
    } else {
      out.pass("gpu.driver", "NVIDIA driver", value, "no GPU: dtcore trains on CPU with Gloo.");
    }
    if (e.cuda_visible_devices && !e.cuda_visible_devices->empty() && *e.cuda_visible_devices != "-1") {
      out.warn("gpu.visible", "CUDA_VISIBLE_DEVICES", *e.cuda_visible_devices,
               "CUDA_VISIBLE_DEVICES is set, but this machine has no NVIDIA driver, so it selects nothing.",
               "unset it here, or run on the GPU node it was meant for.");
    }
    return;
  }

  out.pass("gpu.driver", "NVIDIA driver",
           detail::cat(f.driver_version, " (CUDA ", cuda_version_text(f.cuda_driver_version), ")"));
  if (!e.torch_cuda.empty() && f.cuda_driver_version <= 0) {
    // NVML did not say which CUDA the driver supports: nothing to compare.
  } else if (!e.torch_cuda.empty()) {
    int torch_cuda = parse_cuda_version(e.torch_cuda);
    std::string value =
        detail::cat("torch CUDA ", e.torch_cuda, ", driver supports ", cuda_version_text(f.cuda_driver_version));
    if (driver_too_old(e.torch_cuda, f.cuda_driver_version)) {
      out.fail("gpu.cuda", "CUDA runtime vs driver", value,
               detail::cat("this torch needs a driver for CUDA ", e.torch_cuda, "; driver ", f.driver_version,
                           " stops at ", cuda_version_text(f.cuda_driver_version), ", so CUDA will not initialize."),
               "upgrade the NVIDIA driver, or install a torch built for this driver's CUDA version.");
    } else if (torch_cuda > f.cuda_driver_version) {
      out.warn("gpu.cuda", "CUDA runtime vs driver", value,
               "the driver is older than torch's CUDA minor version: CUDA runs under minor-version compatibility "
               "(torch's own kernels work), but code that the driver must compile from PTX at run time, e.g. "
               "some Triton or custom kernels, can fail.",
               "upgrade the NVIDIA driver to one for CUDA " + e.torch_cuda + " or later.");
    } else {
      out.pass("gpu.cuda", "CUDA runtime vs driver", value);
    }
  } else if (!f.devices.empty()) {
    out.warn("gpu.cuda", "CUDA runtime vs driver", "torch is a CPU build",
             detail::cat("this machine has ", f.devices.size(), " GPU(s), but this torch cannot use them."),
             "install a CUDA build of torch for this driver's CUDA version (pip install torch --index-url "
             "https://download.pytorch.org/whl/cu<version>, see https://pytorch.org/get-started/locally/).");
  }

  if (f.devices.empty()) {
    std::string msg = "the driver is loaded but reports no GPU.";
    if (e.gpu_required) {
      out.fail("gpu.count", "GPUs", "0", msg,
               detail::cat("check `nvidia-smi`, or set ", knobs::kBackend.name, "=gloo."));
    } else {
      out.warn("gpu.count", "GPUs", "0", msg, "check `nvidia-smi`; dtcore falls back to CPU and Gloo.");
    }
    return;
  }
  std::map<std::string, int> models;
  for (const auto& d : f.devices) ++models[d.name];
  std::string summary;
  for (const auto& [name, n] : models) summary += detail::cat(summary.empty() ? "" : ", ", n, " x ", name);
  out.pass("gpu.count", "GPUs", summary);

  VisibleDevices visible = visible_devices(e.cuda_visible_devices, f.devices);
  const int n_visible = static_cast<int>(visible.indices.size());
  if (!visible.problem.empty()) {
    out.fail("gpu.visible", "CUDA_VISIBLE_DEVICES", cvd_text, visible.problem + ".",
             detail::cat("list each GPU once, by index 0..", f.devices.size() - 1,
                         " or UUID (`nvidia-smi -L`), e.g. CUDA_VISIBLE_DEVICES=0,1; or unset it."));
  } else if (n_visible == 0) {
    std::string msg = detail::cat(cvd_text, " hides all ", f.devices.size(), " GPU(s) of this machine.");
    if (e.gpu_required) {
      out.fail("gpu.visible", "CUDA_VISIBLE_DEVICES", cvd_text, msg, "unset CUDA_VISIBLE_DEVICES or list GPUs in it.");
    } else {
      out.warn("gpu.visible", "CUDA_VISIBLE_DEVICES", cvd_text, msg + " The job will run on CPU.",
               "unset CUDA_VISIBLE_DEVICES or list GPUs in it, if the job should use them.");
    }
  } else {
    out.pass("gpu.visible", "CUDA_VISIBLE_DEVICES", cvd_text,
             detail::cat(n_visible, " of ", f.devices.size(), " GPU(s) visible"));
  }
  if (e.launched && n_visible > 0 && e.local_world_size < n_visible && e.local_world_size >= 1) {
    out.warn("gpu.usage", "GPUs used", detail::cat(e.local_world_size, " process(es) for ", n_visible, " GPU(s)"),
             detail::cat(n_visible - e.local_world_size, " visible GPU(s) will stay idle."),
             detail::cat("start one process per GPU (torchrun --nproc_per_node=", n_visible,
                         "), or hide the spare GPUs with CUDA_VISIBLE_DEVICES."));
  }

  const std::set<unsigned> job(e.job_pids.begin(), e.job_pids.end());
  for (int idx : visible.indices) {
    if (idx < 0) continue;  // a MIG instance named by UUID: its parent is judged if listed
    auto it = std::find_if(f.devices.begin(), f.devices.end(), [&](const GpuDevice& g) { return g.index == idx; });
    if (it == f.devices.end()) continue;
    const GpuDevice& d = *it;
    const std::string id = detail::cat("gpu.", d.index);
    const std::string title = detail::cat("GPU ", d.index);
    std::string value =
        detail::cat(d.name, ", sm_", d.cc_major, d.cc_minor, ", ", format_bytes(static_cast<int64_t>(d.memory_free)),
                    " free of ", format_bytes(static_cast<int64_t>(d.memory_total)));
    if (!e.arch_list.empty() && !arch_supported(e.arch_list, d.cc_major, d.cc_minor)) {
      std::string archs;
      for (const auto& a : e.arch_list) archs += (archs.empty() ? "" : " ") + a;
      out.fail(id, title, value,
               detail::cat("this torch has no kernels for compute capability ", d.cc_major, ".", d.cc_minor,
                           " (it has: ", archs, "); CUDA calls fail with 'no kernel image is available'."),
               "install a torch build that supports this GPU (a newer release or another CUDA variant).");
    } else {
      out.pass(id, title, value);
    }
    uint64_t foreign_bytes = 0;
    std::string holders;
    for (const auto& p : d.processes) {
      if (job.count(p.pid)) continue;
      foreign_bytes += p.used_bytes;
      // No /proc entry: a process of another container or of the host (NVML reports host pids).
      holders += detail::cat(holders.empty() ? "" : ", ", "pid ", p.pid,
                             p.name.empty() ? std::string(" (not visible from here)") : " (" + p.name + ")", " ",
                             format_bytes(static_cast<int64_t>(p.used_bytes)));
    }
    if (!holders.empty()) {
      out.warn(id + ".processes", title + " processes", holders,
               detail::cat("other processes hold ", format_bytes(static_cast<int64_t>(foreign_bytes)),
                           " on this GPU; the job has that much less memory and shares compute.",
                           e.pid_namespace ? " (In a container NVML shows the host's pids, which cannot be told "
                                             "apart from this job's.)"
                                           : ""),
               "stop them (`nvidia-smi` lists them; a leftover run is the usual suspect) or choose other GPUs.");
    }
    if (d.mig_enabled) {
      out.warn(id + ".mig", title + " MIG", "MIG enabled",
               "MIG splits this GPU into instances: a process sees one slice, and NCCL cannot use NVLink or "
               "peer-to-peer between instances.",
               "disable MIG for multi-GPU training (`nvidia-smi -i N -mig 0`, by an administrator), or run one "
               "process per instance knowingly.");
    }
  }
}

}  // namespace dtcore::check
