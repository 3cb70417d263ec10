// The host judge on simulated limits: small or missing /dev/shm, locked memory, open files,
// oversubscribed CPUs, disks; and the probe on this machine with a stand-in shm path.
#include <gtest/gtest.h>

#include "check_items.h"
#include "dtcore/check/host_probe.h"

using namespace dtcore::check;
using dtcore::check::testing::expect_item;

namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;

HostFacts healthy() {
  HostFacts f;
  f.shm_path = "/dev/shm";
  f.shm_total = 64 * kGiB;
  f.shm_free = 64 * kGiB;
  f.memlock_soft = std::nullopt;
  f.nofile_soft = 65536;
  f.nofile_hard = 1048576;
  f.cpus = 96;
  f.disks = {{"checkpoint directory", "/ckpt", "/ckpt", true, true, 500 * kGiB, ""}};
  return f;
}

HostExpectations gpu_node() {
  HostExpectations e;
  e.world_size = 16;
  e.local_world_size = 8;
  e.gpus = true;
  e.omp_num_threads = "1";
  return e;
}

}  // namespace

TEST(HostProbe, HealthyNodePasses) {
  Items out;
  judge_host(healthy(), gpu_node(), out);
  for (const Item& i : out.items()) EXPECT_EQ(status_name(i.status), "PASS") << i.id << ": " << i.message;
}

TEST(HostProbe, ContainerDefaultShmFailsForMultiGpuAndWarnsOtherwise) {
  HostFacts f = healthy();
  f.shm_total = 64 * kMiB;
  f.shm_free = 64 * kMiB;
  Items out;
  judge_host(f, gpu_node(), out);
  expect_item(out, "host.shm", Status::Fail, {"64 MiB", "unhandled system error", "--shm-size"});
  HostExpectations cpu = gpu_node();
  cpu.gpus = false;
  Items warn;
  judge_host(f, cpu, warn);
  expect_item(warn, "host.shm", Status::Warn);
  f.shm_total = std::nullopt;
  Items missing;
  judge_host(f, gpu_node(), missing);
  expect_item(missing, "host.shm", Status::Fail, {"does not exist"});
}

TEST(HostProbe, StandInShmPathThatDoesNotExist) {
  HostOptions o;
  o.shm_path = "/nonexistent/dtcore-shm";
  HostFacts f = probe_host(o);
  EXPECT_FALSE(f.shm_total.has_value());
  EXPECT_GE(f.cpus, 1);
}

TEST(HostProbe, LockedMemoryMattersWithGpus) {
  HostFacts f = healthy();
  f.memlock_soft = 64 * 1024;
  Items single;
  judge_host(f, gpu_node(), single);  // one node without InfiniBand: no RDMA
  expect_item(single, "host.memlock", Status::Pass);
  HostExpectations e = gpu_node();
  e.num_nodes = 2;
  Items out;
  judge_host(f, e, out);
  expect_item(out, "host.memlock", Status::Warn, {"64 KiB", "RDMA", "ulimit -l unlimited"});
}

TEST(HostProbe, TooFewOpenFilesForTheWorldFails) {
  HostFacts f = healthy();
  f.nofile_soft = 1024;
  HostExpectations e = gpu_node();
  e.world_size = 1024;
  Items client;
  judge_host(f, e, client);  // an NCCL rank that only connects to the store needs few
  expect_item(client, "host.nofile", Status::Pass);
  e.serves_store = true;
  Items out;
  judge_host(f, e, out);
  expect_item(out, "host.nofile", Status::Fail, {"1024 ranks", "serves the store", "ulimit -n 2304", "1048576"});
  e.serves_store = false;
  e.gpus = false;  // Gloo: a socket mesh to every peer
  Items gloo;
  judge_host(f, e, gloo);
  expect_item(gloo, "host.nofile", Status::Fail, {"Gloo", "ulimit -n 2304"});
}

TEST(HostProbe, OversubscribedCpusWarnAndBadOmpFails) {
  HostFacts f = healthy();
  f.cpus = 16;
  HostExpectations e = gpu_node();
  e.omp_num_threads = std::nullopt;  // every process starts one thread per CPU
  Items out;
  judge_host(f, e, out);
  expect_item(out, "host.cpus", Status::Warn, {"128 threads", "16 CPU(s)", "OMP_NUM_THREADS=2"});
  f.node_cpus = 96;
  f.cpus = 12;  // srun --cpu-bind: 12 CPUs of this task's own
  e.omp_num_threads = "12";
  Items bound;
  judge_host(f, e, bound);
  expect_item(bound, "host.cpus", Status::Pass, {"bound to this process"});
  e.omp_num_threads = "16,2";  // a nested OpenMP list: 16 threads at the first level
  Items over;
  judge_host(f, e, over);
  expect_item(over, "host.cpus", Status::Warn, {"16 threads compete for 12"});
  f.node_cpus = 0;
  f.cpus = 16;
  e.omp_num_threads = "four";
  Items bad;
  judge_host(f, e, bad);
  expect_item(bad, "host.cpus", Status::Fail, {"four", "OMP_NUM_THREADS=2"});
}

TEST(HostProbe, DiskFullOrReadOnly) {
  HostFacts f = healthy();
  f.disks = {{"checkpoint directory", "/ckpt", "/ckpt", true, true, 512 * kMiB, ""},
             {"log directory", "/logs/run1", "/logs", false, false, 100 * kGiB, ""}};
  Items out;
  judge_host(f, gpu_node(), out);
  expect_item(out, "host.disk.checkpoint", Status::Fail, {"under 1 GiB"});
  expect_item(out, "host.disk.log", Status::Fail, {"not writable", "/logs"});
}

TEST(HostProbe, ProbesThisMachine) {
  HostOptions o;
  o.dirs = {{"checkpoint directory", "."}, {"log directory", "./not-yet/created"}};
  HostFacts f = probe_host(o);
  ASSERT_EQ(f.disks.size(), 2u);
  EXPECT_TRUE(f.disks[0].exists);
  EXPECT_FALSE(f.disks[1].exists);
  EXPECT_GT(f.disks[1].free_bytes, 0u);  // judged at the nearest existing parent
}
