#include "dtcore/check/version_probe.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>

#include "dtcore/common/error.h"

namespace dtcore::check {
namespace {

std::string nccl_code_text(int code) {
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch; older ones major*1000 + minor*100 + patch.
  if (code >= 10000) return detail::cat(code / 10000, ".", (code % 10000) / 100, ".", code % 100);
  return detail::cat(code / 1000, ".", (code % 1000) / 100, ".", code % 100);
}

// "2.21.5" < "2.27.3", numerically by component.
bool older(const std::string& a, const std::string& b) {
  int x[3] = {0, 0, 0}, y[3] = {0, 0, 0};
  std::sscanf(a.c_str(), "%d.%d.%d", &x[0], &x[1], &x[2]);
  std::sscanf(b.c_str(), "%d.%d.%d", &y[0], &y[1], &y[2]);
  return std::lexicographical_compare(x, x + 3, y, y + 3);
}

}  // namespace

NcclLibrary probe_nccl_library(const std::vector<std::string>& dirs) {
  std::vector<std::string> candidates;
  for (const auto& d : dirs) candidates.push_back(d + "/libnccl.so.2");
  candidates.push_back("libnccl.so.2");
  NcclLibrary out;
  for (const auto& name : candidates) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* err = dlerror();
      out.path = err ? err : name + ": not found";
      continue;
    }
    using GetVersion = int (*)(int*);
    auto get_version = reinterpret_cast<GetVersion>(dlsym(lib, "ncclGetVersion"));
    int code = 0;
    if (get_version != nullptr && get_version(&code) == 0 && code > 0) {
      out.version = nccl_code_text(code);
      out.path = name;
      dlclose(lib);
      return out;
    }
    dlclose(lib);
  }
  return out;
}

void judge_versions(const VersionFacts& f, Items& out) {
  out.pass("version.python", "Python", f.python);
  out.pass("version.torch", "torch",
           detail::cat(f.torch, " (CUDA ", f.torch_cuda.empty() ? "none" : f.torch_cuda, ", C++11 ABI ",
                       int(f.torch_cxx11_abi), ")"));

  std::string built =
      detail::cat(f.dtcore, ", built for torch ", f.built_torch, " (C++11 ABI ", int(f.built_cxx11_abi), ", CUDA ",
                  f.built_cuda.empty() ? "none" : f.built_cuda, ", NCCL ", f.built_with_nccl ? "on" : "off", ")");
  if (f.built_torch != f.torch || f.built_cxx11_abi != f.torch_cxx11_abi) {
    out.fail("version.dtcore", "dtcore build", built,
             detail::cat("dtcore was built against torch ", f.built_torch, " (C++11 ABI ", int(f.built_cxx11_abi),
                         ") but this Python runs torch ", f.torch, " (C++11 ABI ", int(f.torch_cxx11_abi),
                         "); a C++ extension must be rebuilt for the torch it runs with."),
             detail::cat("in dtcore's source directory run `", f.rebuild_command,
                         "`, or install the torch it was "
                         "built for (",
                         f.built_torch, ", from the index of its CUDA variant)."));
  } else if (f.gpus_present && !f.torch_cuda.empty() && !f.built_with_nccl) {
    out.warn(
        "version.dtcore", "dtcore build", built,
        "this machine has GPUs, but dtcore was built without NCCL: GPU jobs would fall back to Gloo, "
        "which is many times slower.",
        detail::cat("rebuild where CUDA and NCCL are found (set NCCL_HOME if needed): `", f.rebuild_command, "`."));
  } else {
    out.pass("version.dtcore", "dtcore build", built);
  }

  std::string nccl =
      f.nccl_library.version.empty() ? "not found" : f.nccl_library.version + " (" + f.nccl_library.path + ")";
  if (!f.torch_nccl.empty()) nccl += ", torch's " + f.torch_nccl;
  if (!f.dtcore_nccl.empty()) nccl += ", dtcore's " + f.dtcore_nccl;
  const bool any_nccl = !f.nccl_library.version.empty() || !f.torch_nccl.empty() || !f.dtcore_nccl.empty();
  // What runs: dtcore's linked NCCL when built with it, else what the loader finds.
  const std::string loaded = !f.dtcore_nccl.empty() ? f.dtcore_nccl : f.nccl_library.version;
  if (!any_nccl) {
    if (f.gpus_present && !f.torch_cuda.empty()) {
      out.fail("version.nccl", "NCCL", nccl,
               detail::cat("no NCCL library could be loaded (", f.nccl_library.path, "); GPU collectives need it."),
               "install it (pip install nvidia-nccl-cu" + f.torch_cuda.substr(0, f.torch_cuda.find('.')) +
                   ") or add its lib directory to LD_LIBRARY_PATH.");
    } else {
      out.pass("version.nccl", "NCCL", nccl, "not needed without GPUs: Gloo carries the collectives.");
    }
  } else if (!f.torch_nccl.empty() && !loaded.empty() && older(loaded, f.torch_nccl)) {
    out.warn("version.nccl", "NCCL", nccl,
             detail::cat("torch was compiled against NCCL ", f.torch_nccl, " but NCCL ", loaded,
                         " is what loads: features torch expects may be missing or behave differently."),
             "install the nvidia-nccl package version that this torch requires (pip show torch lists it), and "
             "remove older libnccl.so.2 from LD_LIBRARY_PATH.");
  } else {
    out.pass("version.nccl", "NCCL", nccl);
  }
}

}  // namespace dtcore::check
