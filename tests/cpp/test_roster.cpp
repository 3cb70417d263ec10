// Roster entries: encode/decode, for_process, rank ranges, fingerprint comparison, shared devices.
// (test_rendezvous.cpp checks a roster travelling through a real store.)
#include <gtest/gtest.h>

#include <unistd.h>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/common/error.h"
#include "expect_error.h"

using namespace dtcore;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;

namespace {

RosterEntry entry(int rank, const std::string& host, int local_rank, std::map<std::string, std::string> fp) {
  RosterEntry e;
  e.rank = rank;
  e.host = host;
  e.pid = 100 + rank;
  e.local_rank = local_rank;
  e.device = "cpu";
  e.fingerprint = std::move(fp);
  return e;
}

std::map<std::string, std::string> fp(const std::string& torch = "2.13.0", const std::string& abi = "1") {
  return {{"torch", torch}, {"dtcore", "0.1.0"}, {"cxx11_abi", abi}, {"backend", "gloo"}};
}

std::string decode_error(const std::string& text) {
  return error_of<RendezvousError>([&] { RosterEntry::decode(text); });
}

}  // namespace

TEST(Roster, EveryFieldSurvivesEncodeAndDecode) {
  RosterEntry e = entry(3, "node-a.example.com", 1, {{"torch", "2.13.0+cu126"}, {"job", "run=7 a b"}, {"nccl", ""}});
  e.pid = 4242;
  e.device = "cuda:1";
  RosterEntry d = RosterEntry::decode(e.encode());
  EXPECT_EQ(d.rank, 3);
  EXPECT_EQ(d.host, "node-a.example.com");
  EXPECT_EQ(d.pid, 4242);
  EXPECT_EQ(d.local_rank, 1);
  EXPECT_EQ(d.device, "cuda:1");
  EXPECT_EQ(d.fingerprint, e.fingerprint);  // '=' and blanks in a value, an empty value
  EXPECT_EQ(d.encode(), e.encode());
}

TEST(Roster, AnEntryWithoutFingerprintRoundTrips) {
  RosterEntry e = entry(0, "h", 0, {});
  RosterEntry d = RosterEntry::decode(e.encode());
  EXPECT_EQ(d.rank, 0);
  EXPECT_TRUE(d.fingerprint.empty());
}

TEST(Roster, MalformedNumbersAreARendezvousErrorNamingTheKeyAndValue) {
  expect_contains(decode_error("rank=abc\nhost=h\n"), {"malformed roster entry", "rank='abc'", "MASTER_PORT", "Fix:"});
  expect_contains(decode_error("rank=1\npid=x\n"), {"pid='x'"});
  expect_contains(decode_error("rank=3x\nhost=h\n"), {"rank='3x'"});  // a number, all of it
  expect_contains(decode_error("rank=1\nlocal_rank=99999999999999\n"), {"local_rank='99999999999999'"});
}

TEST(Roster, TextThatIsNotAnEntryHasNoRank) {
  for (const char* text : {"", "hello world", "GET / HTTP/1.1\r\n\r\n", "rank=-1\n", "host=x\npid=3\n"}) {
    expect_contains(decode_error(text), {"malformed roster entry", "(no rank)", "another MASTER_PORT"});
  }
}

TEST(Roster, ForProcessTakesRankAndLocalRankFromTheSpecAndThisPid) {
  WorldSpec spec;
  spec.rank = {5, "RANK"};
  spec.local_rank = {1, "LOCAL_RANK"};
  RosterEntry e = RosterEntry::for_process(spec, "node9", "cuda:1", fp());
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.pid, static_cast<long>(getpid()));
  EXPECT_EQ(e.host, "node9");
  EXPECT_EQ(e.device, "cuda:1");
  EXPECT_EQ(e.fingerprint, fp());
}

TEST(FormatRanks, RunsOfConsecutiveRanksBecomeRanges) {
  EXPECT_EQ(format_ranks({3, 2, 1, 0, 8, 5, 7}), "0-3,5,7-8");  // unsorted
  EXPECT_EQ(format_ranks({1, 1, 2, 2, 4, 4}), "1-2,4");         // duplicates
  EXPECT_EQ(format_ranks({7}), "7");
  EXPECT_EQ(format_ranks({7, 7, 7}), "7");
  EXPECT_EQ(format_ranks({0, 2, 4}), "0,2,4");
  EXPECT_EQ(format_ranks({4, 5}), "4-5");
  EXPECT_EQ(format_ranks({10, 9, 11, 100}), "9-11,100");
}

TEST(CompareFingerprints, AgreeingRanksGiveNothing) {
  EXPECT_EQ(compare_fingerprints({}), "");
  EXPECT_EQ(compare_fingerprints({entry(0, "a", 0, fp())}), "");
  EXPECT_EQ(compare_fingerprints({entry(0, "a", 0, fp()), entry(1, "a", 1, fp()), entry(2, "b", 0, fp())}), "");
}

TEST(CompareFingerprints, ADifferenceNamesFieldValuesRanksAndHosts) {
  std::string m = compare_fingerprints(
      {entry(0, "a", 0, fp()), entry(1, "a", 1, fp()), entry(2, "b", 0, fp("2.12.0")), entry(3, "b", 1, fp())});
  expect_contains(m, {"ranks disagree on what they run", "torch differs", "'2.12.0' on rank 2 (host b)",
                      "'2.13.0' on ranks 0-1,3 (host a, b)", "Fix:"});
  for (const char* same : {"dtcore differs", "backend differs", "cxx11_abi differs"}) {
    EXPECT_EQ(m.find(same), std::string::npos) << m;
  }
}

TEST(CompareFingerprints, EveryDifferingFieldIsNamed) {
  std::string m = compare_fingerprints({entry(0, "a", 0, fp()), entry(1, "b", 0, fp("2.12.0", "0"))});
  expect_contains(m, {"torch differs", "cxx11_abi differs", "'0' on rank 1 (host b)", "'1' on rank 0 (host a)"});
}

TEST(CompareFingerprints, AFieldOneRankLacksIsShownAsNone) {
  auto without_nccl = fp();
  auto with_nccl = fp();
  with_nccl["nccl"] = "2.21.5";
  std::string m = compare_fingerprints({entry(0, "a", 0, with_nccl), entry(1, "b", 0, without_nccl)});
  expect_contains(m, {"nccl differs", "'<none>' on rank 1 (host b)", "'2.21.5' on rank 0 (host a)"});
}

// A GPU rank's entry: device cuda:<index>, identified by the GPU's UUID.
RosterEntry gpu(int rank, const std::string& host, int local_rank, int index, const std::string& uuid) {
  RosterEntry e = entry(rank, host, local_rank, {});
  e.device = "cuda:" + std::to_string(index);
  e.device_id = uuid;
  return e;
}

TEST(SharedDevices, DistinctGpusPerHostAreFine) {
  EXPECT_EQ(find_shared_devices({gpu(0, "a", 0, 0, "GPU-0"), gpu(1, "a", 1, 1, "GPU-1"), gpu(2, "b", 0, 0, "GPU-9")}),
            "");
  EXPECT_EQ(find_shared_devices({}), "");
}

TEST(SharedDevices, CpuRanksWithOneLocalRankOnOneHostShareNothing) {
  // Two launcher "nodes" on one machine: both count local ranks from 0, on CPU that is fine.
  EXPECT_EQ(
      find_shared_devices({entry(0, "a", 0, {}), entry(1, "a", 0, {}), entry(2, "a", 1, {}), entry(3, "a", 1, {})}),
      "");
}

TEST(SharedDevices, OneIndexUnderDifferentVisibleDevicesIsTwoGpus) {
  // CUDA_VISIBLE_DEVICES=0 and =1: each process sees its GPU as cuda:0.
  EXPECT_EQ(find_shared_devices({gpu(0, "a", 0, 0, "GPU-0"), gpu(1, "a", 0, 0, "GPU-1")}), "");
}

TEST(SharedDevices, RanksHoldingOneGpuOnOneHostAreNamed) {
  std::string m =
      find_shared_devices({gpu(0, "a", 0, 0, "GPU-0"), gpu(1, "a", 0, 0, "GPU-0"), gpu(2, "b", 0, 0, "GPU-7"),
                           gpu(3, "b", 1, 1, "GPU-8"), gpu(4, "b", 1, 1, "GPU-8")});
  expect_contains(m, {"would share one device", "ranks 0-1 on host a would share device GPU-0",
                      "rank 0: cuda:0 at local rank 0, rank 1: cuda:0 at local rank 0",
                      "ranks 3-4 on host b would share device GPU-8", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
                      "Fix:", "NCCL_MULTI_RANK_GPU_ENABLE=1"});
  EXPECT_EQ(m.find("ranks 2"), std::string::npos) << m;
}

TEST(SharedDevices, TheDeviceIdSurvivesEncodeAndDecode) {
  RosterEntry d = RosterEntry::decode(gpu(1, "a", 1, 1, "GPU-5e3f").encode());
  EXPECT_EQ(d.device_id, "GPU-5e3f");
  EXPECT_EQ(RosterEntry::decode(entry(0, "a", 0, {}).encode()).device_id, "");
}
