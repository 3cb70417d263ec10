#include "dtcore/check/host_probe.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dtcore/common/error.h"
#include "dtcore/common/units.h"

namespace dtcore::check {
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024ull * kMiB;

std::optional<uint64_t> soft_limit(int resource, std::optional<uint64_t>* hard = nullptr) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0) return std::nullopt;
  if (hard != nullptr) *hard = r.rlim_max == RLIM_INFINITY ? std::nullopt : std::optional<uint64_t>(r.rlim_max);
  if (r.rlim_cur == RLIM_INFINITY) return std::nullopt;
  return static_cast<uint64_t>(r.rlim_cur);
}

// CPUs this process may use: its affinity mask, capped by a cgroup CPU quota (containers).
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpus =
      sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  double quota = -1, period = -1;
  std::ifstream v2("/sys/fs/cgroup/cpu.max");  // cgroup v2: "<quota|max> <period>"
  std::string q;
  if (v2 >> q >> period && q != "max") {
    try {
      quota = std::stod(q);
    } catch (const std::exception&) {
      quota = -1;  // unreadable: fall back to affinity alone
    }
  }
  if (quota < 0) {
    std::ifstream vq("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), vp("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    if (!(vq >> quota && vp >> period)) quota = -1;
  }
  if (quota > 0 && period > 0) cpus = std::min(cpus, std::max(1, static_cast<int>(std::ceil(quota / period))));
  return cpus;
}

DiskFacts probe_disk(const std::string& role, const std::string& path) {
  namespace fs = std::filesystem;
  DiskFacts d;
  d.role = role;
  d.path = path;
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  d.exists = fs::exists(p, ec);
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  d.checked_path = p.string();
  struct statvfs s{};
  if (statvfs(d.checked_path.c_str(), &s) != 0) {
    d.error = std::strerror(errno);
    return d;
  }
  d.free_bytes = static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
  d.writable = access(d.checked_path.c_str(), W_OK) == 0;
  return d;
}

}  // namespace

HostFacts probe_host(const HostOptions& o) {
  HostFacts f;
  f.shm_path = o.shm_path;
  struct statvfs s{};
  if (statvfs(o.shm_path.c_str(), &s) == 0) {
    f.shm_total = static_cast<uint64_t>(s.f_blocks) * s.f_frsize;
    f.shm_free = static_cast<uint64_t>(s.f_bavail) * s.f_frsize;
  }
  f.memlock_soft = soft_limit(RLIMIT_MEMLOCK);
  f.nofile_soft = soft_limit(RLIMIT_NOFILE, &f.nofile_hard);
  f.cpus = usable_cpus();
  f.node_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  std::error_code ec;
  f.infiniband = std::filesystem::is_directory("/sys/class/infiniband", ec) &&
                 !std::filesystem::is_empty("/sys/class/infiniband", ec);
  for (const auto& [role, path] : o.dirs) f.disks.push_back(probe_disk(role, path));
  return f;
}

void judge_host(const HostFacts& f, const HostExpectations& e, Items& out) {
  // /dev/shm: NCCL's shared-memory transport needs several MiB per pair of local ranks, and a
  // container's default 64 MB fails with "unhandled system error" at a few GPUs.
  const bool shm_needed = e.gpus && e.local_world_size > 1;
  const std::string shm_fix =
      "give the container more shared memory (docker run --shm-size=16g, or "
      "--ipc=host; Kubernetes: an emptyDir with medium: Memory at /dev/shm).";
  if (!f.shm_total) {
    std::string msg = detail::cat(f.shm_path,
                                  " does not exist: NCCL's shared-memory transport and DataLoader "
                                  "workers need it.");
    if (shm_needed)
      out.fail("host.shm", "/dev/shm", "missing", msg, shm_fix);
    else
      out.warn("host.shm", "/dev/shm", "missing", msg, shm_fix);
  } else {
    std::string value = detail::cat(format_bytes(static_cast<int64_t>(*f.shm_total)), " (",
                                    format_bytes(static_cast<int64_t>(f.shm_free)), " free)");
    if (*f.shm_total < 512 * kMiB) {
      std::string msg = detail::cat(f.shm_path, " is ", format_bytes(static_cast<int64_t>(*f.shm_total)),
                                    ": NCCL needs more between local GPUs (the 64 MB container default fails with "
                                    "'unhandled system error'), and DataLoader workers run out of it.");
      if (shm_needed)
        out.fail("host.shm", "/dev/shm", value, msg, shm_fix);
      else
        out.warn("host.shm", "/dev/shm", value, msg, shm_fix);
    } else if (*f.shm_total < kGiB || f.shm_free < 256 * kMiB) {
      out.warn("host.shm", "/dev/shm", value,
               "little shared memory: DataLoader workers with large batches and NCCL's buffers compete for it.",
               shm_fix);
    } else {
      out.pass("host.shm", "/dev/shm", value);
    }
  }

  if (!f.memlock_soft) {
    out.pass("host.memlock", "ulimit -l", "unlimited");
  } else {
    std::string value = format_bytes(static_cast<int64_t>(*f.memlock_soft));
    if (e.gpus && (e.num_nodes > 1 || f.infiniband)) {
      out.warn("host.memlock", "ulimit -l", value,
               "locked memory is limited: RDMA (InfiniBand, RoCE) cannot register NCCL's buffers, and NCCL falls "
               "back to slower transports or fails.",
               "raise it to unlimited (`ulimit -l unlimited`; memlock in /etc/security/limits.conf; docker: "
               "--ulimit memlock=-1).");
    } else {
      out.pass("host.memlock", "ulimit -l", value, "matters for RDMA (InfiniBand, RoCE) between GPU nodes only");
    }
  }

  // Sockets per process: the store server holds two connections per rank (rendezvous and
  // heartbeat), and Gloo's full mesh one or two per peer; NCCL and store clients need few. Plus
  // room for files, the DataLoader and the rest.
  const uint64_t world = static_cast<uint64_t>(std::max(e.world_size, 1));
  const uint64_t need = 256 + (e.serves_store ? 2 * world : 0) + (e.gpus ? 0 : 2 * world);
  if (f.nofile_soft && *f.nofile_soft < need) {
    std::string hard = f.nofile_hard ? std::to_string(*f.nofile_hard) : std::string("unlimited");
    out.fail("host.nofile", "ulimit -n", std::to_string(*f.nofile_soft),
             detail::cat("a job of ", e.world_size, " ranks needs about ", need, " open files in this process (",
                         e.serves_store ? "it serves the store, " : "", e.gpus ? "NCCL" : "Gloo's socket mesh",
                         "); it would fail with 'Too many open files'."),
             detail::cat("raise it before launching: `ulimit -n ", need, "` (the hard limit here is ", hard,
                         "; raise that in /etc/security/limits.conf or the container's --ulimit nofile)."));
  } else {
    out.pass("host.nofile", "ulimit -n", f.nofile_soft ? std::to_string(*f.nofile_soft) : std::string("unlimited"));
  }

  std::optional<int> threads;
  if (e.omp_num_threads) {
    // "4" or a nested list "4,2": the first level is what each process starts.
    const std::string first = e.omp_num_threads->substr(0, e.omp_num_threads->find(','));
    try {
      size_t used = 0;
      int t = std::stoi(first, &used);
      if (used == first.size() && t >= 1) threads = t;
    } catch (const std::exception&) {
    }
    if (!threads) {
      out.fail("host.cpus", "CPUs", "OMP_NUM_THREADS=" + *e.omp_num_threads,
               "OMP_NUM_THREADS is not a positive integer; OpenMP ignores it or aborts.",
               detail::cat("set OMP_NUM_THREADS=", std::max(1, f.cpus / std::max(1, e.local_world_size)),
                           " (CPUs / processes on this node)."));
    }
  }
  if (!e.omp_num_threads || threads) {
    int per_process = threads.value_or(f.cpus);  // unset: every process starts one thread per CPU
    // Bound to fewer CPUs than the node has (srun --cpu-bind, taskset): these CPUs are this
    // process's own, so its threads alone must fit; otherwise all local processes share them.
    const bool bound = f.node_cpus > 0 && f.cpus < f.node_cpus;
    const int sharing = bound ? 1 : std::max(1, e.local_world_size);
    long total = static_cast<long>(per_process) * sharing;
    std::string value =
        detail::cat(f.cpus, " CPU(s)", bound ? " bound to this process" : "", ", ", sharing, " process(es) x ",
                    per_process, " thread(s)", threads ? "" : " (OMP_NUM_THREADS unset)");
    if (total > f.cpus && (bound ? threads.has_value() : e.local_world_size > 1)) {
      out.warn("host.cpus", "CPUs", value,
               detail::cat(total, " threads compete for ", f.cpus,
                           " CPU(s): oversubscription slows every rank, "
                           "and the slowest rank sets the pace of each collective."),
               per_process > 1 ? detail::cat("set OMP_NUM_THREADS=", std::max(1, f.cpus / sharing),
                                             " (CPUs / processes on this node).")
                               : detail::cat("run at most ", f.cpus,
                                             " processes on this node, or give it more CPUs (SLURM: "
                                             "--cpus-per-task; containers: --cpus)."));
    } else {
      out.pass("host.cpus", "CPUs", value);
    }
  }

  for (const DiskFacts& d : f.disks) {
    const std::string id = "host.disk." + d.role.substr(0, d.role.find(' '));
    const std::string title = "disk: " + d.role;
    std::string value = detail::cat(d.path, ", ", format_bytes(static_cast<int64_t>(d.free_bytes)), " free");
    const std::string fix = detail::cat("free space there, or point the ", d.role, " at a larger disk.");
    if (!d.error.empty()) {
      out.fail(id, title, d.path, detail::cat("cannot inspect ", d.checked_path, ": ", d.error, "."),
               "choose a directory this user can reach.");
    } else if (!d.writable) {
      out.fail(id, title, value,
               detail::cat(d.exists ? d.path : d.checked_path + " (parent of " + d.path + ")",
                           " is not writable by this user: the job would fail at its first write."),
               "choose a writable directory, or fix its permissions.");
    } else if (d.free_bytes < kGiB) {
      out.fail(id, title, value, "under 1 GiB free: a checkpoint or log write would fail part-way.", fix);
    } else if (static_cast<double>(d.free_bytes) < e.min_free_disk_gb * 1e9) {
      out.warn(id, title, value,
               detail::cat("under ", e.min_free_disk_gb, " GB (",
                           format_bytes(static_cast<int64_t>(e.min_free_disk_gb * 1e9)),
                           ") free: a few checkpoints of a large model fill it."),
               fix);
    } else {
      out.pass(id, title, value, d.exists ? "" : "will be created");
    }
  }
}

}  // namespace dtcore::check
