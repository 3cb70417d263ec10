// HealthMonitor: dead and stalled ranks are named; healthy ones are not.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dtcore/comm/health.h"

using namespace dtcore;
using namespace std::chrono_literals;

namespace {
std::vector<PeerInfo> peers() { return {{"host-a", 11}, {"host-a", 12}, {"host-b", 13}}; }
}  // namespace

// One in-process store stands in for the rendezvous store: what is tested is the protocol.
TEST(Health, AllAliveAndCaughtUpMeansNothingToReport) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0"),
      m2(store, store, 2, peers(), 50ms, "rank 0");
  for (auto* m : {&m0, &m1, &m2}) m->record_progress(7);
  std::this_thread::sleep_for(120ms);  // a beat carries the progress
  EXPECT_EQ(m0.diagnose(7, "allreduce"), "");
}

TEST(Health, ARankWhoseHeartbeatStoppedIsNamedWithHostAndPid) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0");
  {
    HealthMonitor m2(store, store, 2, peers(), 50ms, "rank 0");
  }  // rank 2 beat once, then died
  m0.record_progress(1);
  m1.record_progress(1);
  std::this_thread::sleep_for(120ms);  // rank 1's beat carries its progress
  std::string report = m0.diagnose(1, "allreduce");
  EXPECT_NE(report.find("rank 2 (host host-b, pid 13): no heartbeat"), std::string::npos) << report;
  EXPECT_NE(report.find("dead: rank 2"), std::string::npos) << report;
  EXPECT_EQ(report.find("rank 1 ("), std::string::npos) << report;
}

TEST(Health, ARankThatNeverBeatIsDead) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0");
  std::string report = m1.diagnose(1, "barrier");  // rank 2 never started; must not block on its key
  EXPECT_NE(report.find("dead: rank 2"), std::string::npos) << report;
}

TEST(Health, ClosedMonitorReportsNothing) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0");
  m0.close();
  m0.close();  // idempotent
  EXPECT_EQ(m0.diagnose(1, "allreduce"), "");
}

TEST(Health, ARankThatBeatsButLagsIsStalled) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0"),
      m2(store, store, 2, peers(), 50ms, "rank 0");
  m0.record_progress(5);
  m1.record_progress(5);
  m2.record_progress(4);
  std::string report = m0.diagnose(5, "allreduce");
  EXPECT_NE(report.find("rank 2 (host host-b, pid 13): alive, but has not started allreduce #5 (its last "
                        "collective is #4)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("stalled: rank 2"), std::string::npos) << report;
}
