// HealthMonitor: dead, stopped and stalled ranks are named with the root cause; ranks waiting in
// the same collective, or that left in order, are not accused.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "dtcore/comm/health.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::expect_contains;
using namespace std::chrono_literals;

namespace {
std::vector<PeerInfo> peers() { return {{"host-a", 11}, {"host-a", 12}, {"host-b", 13}}; }

// A rank that beat once with `beat`, then went silent (its process killed: no last beat).
void silent_rank(c10d::Store& store, int rank, Beat beat) {
  std::string v = beat.encode();
  store.set("health/" + std::to_string(rank), std::vector<uint8_t>(v.begin(), v.end()));
}
}  // namespace

// One in-process store stands in for the rendezvous store: what is tested is the protocol.
TEST(Health, AllWaitingInTheSameCollectiveMeansNothingToReport) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0"),
      m2(store, store, 2, peers(), 50ms, "rank 0");
  for (auto* m : {&m0, &m1, &m2}) m->record_started(7, "all_reduce #7");
  std::this_thread::sleep_for(120ms);  // a beat carries the progress
  EXPECT_EQ(m0.diagnose(7, "all_reduce"), "");
}

TEST(Health, ARankWhoseHeartbeatStoppedIsTheRootCause) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  silent_rank(*store, 2, Beat{3, 0, 0});
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0");
  m0.record_started(1, "all_reduce #1");
  m1.record_started(1, "all_reduce #1");
  const auto start = std::chrono::steady_clock::now();
  std::string report = m0.diagnose(1, "all_reduce");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);  // about dead_after(): 110 ms
  // host-b is not this host: the process cannot be looked at.
  expect_contains(
      report, {"rank 2 (host host-b, pid 13): no heartbeat for", "or its host is unreachable",
               "rank 1: waiting in all_reduce #1 like this rank", "root cause: rank 2 (dead, stopped or unreachable)"});
}

TEST(Health, ARankThatNeverBeatIsNamed) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0");
  std::string report = m1.diagnose(1, "barrier");  // rank 2 never started; must not block on its key
  expect_contains(report, {"rank 2 (host host-b, pid 13): never sent a heartbeat", "root cause: rank 2"});
}

TEST(Health, ARankThatLeftInOrderIsNotDead) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0");
  {
    HealthMonitor m2(store, store, 2, peers(), 50ms, "rank 0");
    m2.record_started(4, "all_reduce #4");
    m2.record_finished(4, true);
  }  // closed: its last beat says it left
  m0.record_started(5, "all_reduce #5");
  m1.record_started(5, "all_reduce #5");
  std::string report = m0.diagnose(5, "all_reduce");
  expect_contains(report, {"rank 2 (host host-b, pid 13): left the job (dtcore.shutdown() or a normal exit) after "
                           "collective #4, without starting all_reduce #5",
                           "root cause: rank 2 (left early)"});
  EXPECT_EQ(report.find("no heartbeat"), std::string::npos) << report;
}

TEST(Health, ARankThatFailedAndLeftIsNotTheRootCause) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  silent_rank(*store, 2, Beat{3, 2, 1});  // died inside #2
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0");
  {
    HealthMonitor m1(store, store, 1, peers(), 50ms, "rank 0");
    m1.record_started(2, "all_reduce #2");
    m1.record_finished(2, false);
  }  // rank 1 saw the failure first, raised and exited
  m0.record_started(2, "all_reduce #2");
  std::string report = m0.diagnose(2, "all_reduce");
  expect_contains(report, {"rank 1 (host host-a, pid 12): left the job after its collective #2 failed there",
                           "root cause: rank 2 ("});
}

TEST(Health, ClosedMonitorReportsNothing) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0");
  m0.close();
  m0.close();  // idempotent
  EXPECT_EQ(m0.diagnose(1, "all_reduce"), "");
}

TEST(Health, ARankThatBeatsButHasNotStartedItIsStalled) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 50ms, "rank 0"), m1(store, store, 1, peers(), 50ms, "rank 0"),
      m2(store, store, 2, peers(), 50ms, "rank 0");
  for (auto* m : {&m0, &m1, &m2}) {
    m->record_started(4, "all_reduce #4");
    m->record_finished(4, true);
  }
  m0.record_started(5, "all_reduce #5");
  m1.record_started(5, "all_reduce #5");
  std::string report = m0.diagnose(5, "all_reduce");
  expect_contains(report, {"rank 2 (host host-b, pid 13): alive, but has not started all_reduce #5 (its last "
                           "collective is #4)",
                           "root cause: rank 2 (stalled)"});
  EXPECT_EQ(report.find("rank 1 ("), std::string::npos) << report;  // waiting too: never accused
}

TEST(Health, SuccessiveDiagnosesShareTheWatch) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  silent_rank(*store, 2, Beat{3, 0, 0});
  HealthMonitor m0(store, store, 0, peers(), 100ms, "rank 0");
  m0.record_started(1, "all_reduce #1");
  std::string first = m0.diagnose(1, "all_reduce");
  const auto start = std::chrono::steady_clock::now();
  for (int bucket = 0; bucket < 8; ++bucket) EXPECT_NE(m0.diagnose(1, "all_reduce"), "");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);              // not 8 x dead_after()
  expect_contains(first, {"root cause: ranks 1-2 (dead or stopped)"});  // rank 1: none here
}

// See Note [Collective signature]: ranks whose signatures part are found through the heartbeat,
// and every rank then names the first collective that differs and each rank's call there.
TEST(Health, RanksThatCalledDifferentCollectivesAreFoundThroughTheHeartbeat) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<PeerInfo> two{{"host-a", 11}, {"host-a", 12}};
  HealthMonitor m0(store, store, 0, two, 50ms, "rank 0"), m1(store, store, 1, two, 50ms, "rank 0");
  m0.record_started(1, "barrier #1", 0x11);
  m1.record_started(1, "barrier #1", 0x11);
  m0.record_started(2, "all_reduce #2 (torch.float32[1000], sum)", 0x22);
  m1.record_started(2, "all_reduce #2 (torch.float32[1000], max)", 0x23);
  m0.record_started(3, "barrier #3", 0x33);
  m1.record_started(3, "barrier #3", 0x34);  // the chain differs from #2 on
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!(m0.diverged() && m1.diverged()) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  for (auto* m : {&m0, &m1}) {
    ASSERT_TRUE(m->diverged());
    expect_contains(m->divergence(),
                    {"the ranks called different collectives at #2:", "rank 0: all_reduce (torch.float32[1000], sum)",
                     "rank 1: all_reduce (torch.float32[1000], max)", "Fix:"});
    expect_contains(m->diagnose(3, "barrier"), {"the ranks called different collectives at #2:"});
  }
}

TEST(Health, RanksThatAgreeAreNeverFoundToDiffer) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  HealthMonitor m0(store, store, 0, peers(), 20ms, "rank 0"), m1(store, store, 1, peers(), 20ms, "rank 0"),
      m2(store, store, 2, peers(), 20ms, "rank 0");
  for (uint64_t seq = 1; seq <= 50; ++seq) {
    for (auto* m : {&m0, &m1, &m2}) m->record_started(seq, "all_reduce #" + std::to_string(seq), 0x100 + seq);
    std::this_thread::sleep_for(2ms);  // the ranks' beats catch them at different numbers
  }
  std::this_thread::sleep_for(150ms);
  for (auto* m : {&m0, &m1, &m2}) EXPECT_FALSE(m->diverged()) << m->divergence();
}
