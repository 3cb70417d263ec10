// Host probe: the operating-system limits a distributed job runs into. /dev/shm (NCCL's
// intra-node buffers and DataLoader workers live there; containers default to 64 MB), locked
// memory (RDMA registers buffers), open files (every peer is a socket), free disk where
// checkpoints and logs go, and CPUs against OMP_NUM_THREADS x processes on this node.
// Thread safety: probe_host() reads /proc, /sys and statvfs; the judge is pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtcore/check/item.h"

namespace dtcore::check {

struct DiskFacts {
  std::string role;  // "checkpoint directory", "log directory"
  std::string path;
  std::string checked_path;  // the path or, when it does not exist yet, its nearest existing parent
  bool exists = false;
  bool writable = false;
  uint64_t free_bytes = 0;
  std::string error;
};

struct HostFacts {
  std::string shm_path;
  std::optional<uint64_t> shm_total;  // nullopt when the path does not exist
  uint64_t shm_free = 0;
  std::optional<uint64_t> memlock_soft;  // nullopt: unlimited
  std::optional<uint64_t> nofile_soft;
  std::optional<uint64_t> nofile_hard;
  int cpus = 0;             // CPUs this process may run on (affinity and cgroup quota)
  int node_cpus = 0;        // CPUs of the node (online)
  bool infiniband = false;  // /sys/class/infiniband lists a device
  std::vector<DiskFacts> disks;
};

struct HostOptions {
  std::string shm_path = "/dev/shm";
  std::vector<std::pair<std::string, std::string>> dirs;  // (role, path)
};

HostFacts probe_host(const HostOptions& options);

struct HostExpectations {
  int world_size = 1;
  int local_world_size = 1;
  int num_nodes = 1;
  bool gpus = false;                           // NCCL will run here
  bool serves_store = false;                   // rank 0 without torchrun's agent: a connection per rank
  std::optional<std::string> omp_num_threads;  // as set, nullopt when unset
  double min_free_disk_gb = 10.0;              // WARN below this much free disk, in GB (10^9 bytes)
};

void judge_host(const HostFacts& facts, const HostExpectations& expect, Items& out);

}  // namespace dtcore::check
