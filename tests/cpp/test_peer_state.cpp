// Peer state: the heartbeat's encoding, a process's state, and the judgement of a job's ranks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "dtcore/comm/peer_state.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::expect_contains;

TEST(Beat, RoundTripsAndRefusesForeignValues) {
  Beat b{41, 17, 16, Beat::State::kFailed, 17, 0xabc0};
  EXPECT_EQ(b.encode(), "41:17:16:f:17:abc0");
  auto back = Beat::decode(b.encode());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->count, 41u);
  EXPECT_EQ(back->started, 17u);
  EXPECT_EQ(back->finished, 16u);
  EXPECT_EQ(back->state, Beat::State::kFailed);
  EXPECT_EQ(back->failed, 17u);
  EXPECT_EQ(back->signature, 0xabc0u);
  EXPECT_TRUE(back->in_collective());
  for (const char* bad : {"", "3:4", "1:2:3:r", "1:2:3:q:0", "1:2:3:rr:0", "a:2:3:r:0:1", "1:2:3:r:0:9:1",
                          "-1:2:3:r:0:1", "1:2:3:r:0", "1:2:3:r:0:xyz"}) {
    EXPECT_FALSE(Beat::decode(bad)) << bad;
  }
}

TEST(ProcessState, ReadsStatesFromProc) {
  EXPECT_EQ(process_state(getpid()), ProcessState::kRunning);
  EXPECT_EQ(process_state(0), ProcessState::kUnknown);
  auto root = std::filesystem::temp_directory_path() / ("dtcore-proc-" + std::to_string(getpid()));
  for (auto [pid, stat] : {std::pair{101, "101 (python) T 1 2"}, {102, "102 (a) b) (c) t 1"}, {103, "103 (x) Z 1"}}) {
    std::filesystem::create_directories(root / std::to_string(pid));
    std::ofstream(root / std::to_string(pid) / "stat") << stat << "\n";
  }
  EXPECT_EQ(process_state(101, root.string()), ProcessState::kStopped);
  EXPECT_EQ(process_state(102, root.string()), ProcessState::kStopped);  // a name with ") " in it
  EXPECT_EQ(process_state(103, root.string()), ProcessState::kGone);     // a zombie has exited
  EXPECT_EQ(process_state(104, root.string()), ProcessState::kGone);
  std::filesystem::remove_all(root);
}

namespace {
PeerView view(uint64_t started, uint64_t finished, double silent = 0.1, ProcessState p = ProcessState::kUnknown) {
  PeerView v;
  v.host = "h";
  v.pid = 100;
  v.seen = true;
  v.beat = Beat{5, started, finished};
  v.silent_s = silent;
  v.process = p;
  return v;
}
}  // namespace

TEST(Judge, AStoppedRankOnThisHostIsNamedStoppedNotDead) {
  std::vector<PeerView> views{view(92, 91), view(92, 91), view(91, 91, 7.0, ProcessState::kStopped)};
  Diagnosis d = judge(views, 0, 92, "all_reduce", 2.2);
  EXPECT_EQ(d.culprits, std::vector<int>{2});
  EXPECT_EQ(d.culprit_kind, "stopped");
  std::string text = d.text(0);
  expect_contains(text, {"rank 2 (host h, pid 100): no heartbeat for 7 s; the process is stopped (state T",
                         "kill -CONT 100", "rank 1: waiting in all_reduce #92 like this rank"});
  EXPECT_EQ(text.find("exited"), std::string::npos) << text;
}

TEST(Judge, AGoneProcessIsDead) {
  std::vector<PeerView> views{view(3, 2), view(2, 2, 3.0, ProcessState::kGone)};
  Diagnosis d = judge(views, 0, 3, "barrier", 2.2);
  EXPECT_EQ(d.culprit_kind, "dead");
  expect_contains(d.text(0), {"the process has exited (no process 100 on this host)"});
}

TEST(Judge, DeadRanksComeBeforeStalledOnesAsTheRootCause) {
  std::vector<PeerView> views{view(9, 8), view(8, 8), view(8, 8, 5.0, ProcessState::kGone), view(9, 8)};
  Diagnosis d = judge(views, 0, 9, "all_reduce", 2.2);
  EXPECT_EQ(d.culprits, std::vector<int>{2});
  expect_contains(d.text(0), {"rank 1 (host h, pid 100): alive, but has not started all_reduce #9",
                              "rank 3: waiting in all_reduce #9"});
}

TEST(Judge, ARankInAnEarlierCollectiveIsBehindNotStalled) {
  std::vector<PeerView> views{view(9, 8), view(8, 7)};
  Diagnosis d = judge(views, 0, 9, "all_reduce", 2.2);
  EXPECT_EQ(d.culprit_kind, "behind");
  expect_contains(d.text(0), {"still waiting in its own collective #8"});
}

TEST(Judge, FailedRanksAreNamedButNeverTheRootCause) {
  std::vector<PeerView> views{view(4, 3), view(4, 4)};
  views[1].beat.state = Beat::State::kFailed;
  views[1].beat.failed = 4;
  Diagnosis d = judge(views, 0, 4, "all_reduce", 2.2);
  EXPECT_TRUE(d.culprits.empty());
  expect_contains(d.text(0), {"alive; its collective #4 failed there"});
  EXPECT_EQ(d.text(0).find("root cause"), std::string::npos);
}

TEST(Judge, AGoneOrStoppedProcessOnThisHostIsConfirmedBeforeDeadAfter) {
  // Silent for 1.6 s of a 2.2 s dead_after: too short to call silence alone, long enough with its
  // process seen gone; a process that is there (another PID namespace, say) is not accused.
  for (auto [process, culprit] : {std::pair{ProcessState::kGone, true},
                                  {ProcessState::kStopped, true},
                                  {ProcessState::kRunning, false},
                                  {ProcessState::kUnknown, false}}) {
    std::vector<PeerView> views{view(3, 2), view(2, 2, 1.6, process)};
    EXPECT_EQ(confirmed_silent(views[1], 2.2), culprit);
    Diagnosis d = judge(views, 0, 3, "all_reduce", 2.2);
    EXPECT_EQ(!d.culprits.empty() && d.culprit_kind != "stalled", culprit) << d.text(0);
  }
  EXPECT_FALSE(confirmed_silent(view(2, 2, 0.5, ProcessState::kGone), 2.2));  // silent too briefly
}

TEST(Judge, ARankThatFailedAndThenExitedIsAVictimNotDead) {
  std::vector<PeerView> views{view(3, 2), view(3, 3, 5.0, ProcessState::kGone), view(2, 2, 5.0, ProcessState::kGone)};
  views[1].beat.state = Beat::State::kFailed;  // rank 1 failed at #3, raised and exited
  views[1].beat.failed = 3;
  Diagnosis d = judge(views, 0, 3, "all_reduce", 2.2);
  EXPECT_EQ(d.culprits, std::vector<int>{2}) << d.text(0);
  expect_contains(d.text(0), {"rank 1 (host h, pid 100): exited or stopped after its collective #3 failed there"});
}

TEST(Judge, ASubgroupsRanksAreNamedByTheirJobRanks) {
  // A subgroup monitor's views are the group's members {1, 3, 5}, by rank in the group.
  std::vector<PeerView> views{view(6, 5), view(6, 5), view(5, 5, 5.0, ProcessState::kGone)};
  for (size_t i = 0; i < views.size(); ++i) views[i].rank = static_cast<int>(2 * i + 1);
  Diagnosis d = judge(views, 0, 6, "all_reduce", 2.2);
  EXPECT_EQ(d.culprits, std::vector<int>{5});
  std::string text = d.text(1);
  expect_contains(text, {"health check on rank 1:", "rank 5 (host h, pid 100): no heartbeat",
                         "rank 3: waiting in all_reduce #6 like this rank", "root cause: rank 5 (dead)"});
  EXPECT_EQ(text.find("rank 2"), std::string::npos) << text;
}
