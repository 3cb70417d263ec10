// Version probe: the torch that runs, the torch dtcore was built for, and NCCL.
//
// A C++ extension built for one torch fails under another with `undefined symbol` or a silently
// mismatched ABI; the judge turns that into a FAIL with the rebuild command. Facts that only
// Python knows (the running torch) are gathered there; the NCCL library is found here with
// dlopen, without initializing CUDA. Thread safety: pure, except probe_nccl_library's dlopen.
#pragma once

#include <string>
#include <vector>

#include "dtcore/check/item.h"

namespace dtcore::check {

struct NcclLibrary {
  std::string version;  // "2.27.5", "" when not found
  std::string path;     // where it was loaded from, or the error
};

// libnccl.so.2 from the first of `dirs` that has one, else from the loader's search path.
NcclLibrary probe_nccl_library(const std::vector<std::string>& dirs);

struct VersionFacts {
  std::string python;      // "3.11.7"
  std::string torch;       // running torch.__version__
  std::string torch_cuda;  // torch.version.cuda, "" for a CPU build
  bool torch_cxx11_abi = true;
  std::string torch_nccl;   // torch.cuda.nccl.version(), "" when torch has none
  std::string dtcore;       // dtcore's version
  std::string built_torch;  // the torch dtcore was built against
  bool built_cxx11_abi = true;
  std::string built_cuda;  // the CUDA of that torch, "" for CPU
  bool built_with_nccl = false;
  std::string dtcore_nccl;      // the NCCL dtcore's communicator loaded, "" without
  NcclLibrary nccl_library;     // what the loader finds
  bool gpus_present = false;    // the driver lists at least one GPU
  std::string rebuild_command;  // how to rebuild dtcore for the running torch
};

void judge_versions(const VersionFacts& facts, Items& out);

}  // namespace dtcore::check
