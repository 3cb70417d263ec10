// The flight recorder and the collective signature: what each rank keeps of its last collectives,
// and what makes two ranks' collectives the same (Note [Collective signature]).
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <ATen/ATen.h>

#include "dtcore/comm/communicator.h"
#include "dtcore/comm/flight_recorder.h"

using namespace dtcore;
using namespace std::chrono_literals;

namespace {

class DoneWork : public Work {
 public:
  DoneWork(std::chrono::milliseconds timeout, std::function<void(bool)> finished, bool ok)
      : Work(timeout, std::move(finished)), ok_(ok) {}
  void wait_for(std::chrono::milliseconds) override { report_finished(ok_); }
  bool is_completed() override { return true; }

 private:
  bool ok_;
};

// Records what it is given; its works finish (ok unless told otherwise) when waited on.
class Engine : public Communicator {
 public:
  explicit Engine(size_t records = 8) : Communicator(0, 2, Options{1000ms, CollectiveCheck::kAuto, records}) {}
  std::string_view backend() const override { return "gloo"; }
  void close() override {}
  bool ok = true;

 protected:
  std::shared_ptr<Work> start(const Collective& c) override {
    return std::make_shared<DoneWork>(timeout(), c.finished, ok);
  }
  bool accepts_device(const at::Tensor& t) const override { return t.device().is_cpu(); }
};

at::Tensor floats(int64_t n) { return at::zeros({n}, at::kFloat); }

}  // namespace

TEST(FlightRecorder, KeepsTheLastCollectivesWithTheirLabelsAndEnds) {
  Engine comm(3);
  comm.all_reduce(floats(4), ReduceOp::Avg, "bucket 1/2")->wait();
  comm.broadcast(floats(2), 1)->wait();
  comm.ok = false;
  comm.all_gather(floats(8), floats(4))->wait();
  auto pending = comm.barrier("end of step");  // not waited on: pending
  auto records = comm.recorder()->snapshot();
  ASSERT_EQ(records.size(), 3u);  // the oldest dropped
  EXPECT_EQ(records[0].seq, 2u);
  EXPECT_EQ(records[0].op, "broadcast");
  EXPECT_EQ(records[0].detail, "torch.float32[2], from rank 1");
  EXPECT_EQ(records[0].state, CollectiveRecord::State::kSucceeded);
  EXPECT_EQ(records[1].state, CollectiveRecord::State::kFailed);
  EXPECT_GT(records[1].finished, records[1].started - 1e-6);
  EXPECT_EQ(records[2].label, "end of step");
  EXPECT_EQ(records[2].state, CollectiveRecord::State::kPending);
  EXPECT_EQ(records[2].finished, 0);
}

TEST(FlightRecorder, DumpsOneJsonObjectPerLineNamingRankAndHost) {
  Engine comm;
  comm.all_reduce(floats(4), ReduceOp::Sum, "bucket \"1\"")->wait();
  auto lines = comm.recorder()->json_lines(3, 8, "node7");
  ASSERT_EQ(lines.size(), 1u);
  const std::string& l = lines[0];
  EXPECT_EQ(l.front(), '{');
  EXPECT_EQ(l.back(), '}');
  for (const char* part : {"\"rank\": 3", "\"world\": 8", "\"host\": \"node7\"", "\"seq\": 1", "\"op\": \"all_reduce\"",
                           "\"detail\": \"torch.float32[4], sum\"", "\"label\": \"bucket \\\"1\\\"\"",
                           "\"state\": \"succeeded\"", "\"signature\": \""}) {
    EXPECT_NE(l.find(part), std::string::npos) << part << " not in " << l;
  }
}

TEST(FlightRecorder, AFailureDumpsTheRecordToItsFile) {
  auto dir = std::filesystem::temp_directory_path() / ("dtcore-flight-test-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  FlightRecorder recorder(8);
  EXPECT_EQ(recorder.dump("no file yet"), "");  // nothing set: nothing written
  const std::string path = (dir / "flight-rank1.jsonl").string();
  recorder.set_dump_file(path, 1, 2, "node7");
  recorder.issued(CollectiveRecord{1, "all_reduce", "torch.float32[4], sum", "", 42});
  recorder.issued(CollectiveRecord{2, "barrier", "", "", 43});
  recorder.finished(1, true);
  EXPECT_FALSE(std::filesystem::exists(path));  // a success dumps nothing
  recorder.finished(2, false);
  ASSERT_TRUE(std::filesystem::exists(path));
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[1].find("\"state\": \"failed\""), std::string::npos) << lines[1];
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));  // written aside, then renamed
  EXPECT_EQ(recorder.dump("again"), path);
  std::filesystem::remove_all(dir);
}

// The signature of the last collective `comm` issued, as its flight recorder has it.
static uint64_t last_signature(const Communicator& comm) { return comm.recorder()->snapshot().back().signature; }

TEST(CollectiveSignature, SameCallsSameSignaturesAndAnyDifferenceChangesItForGood) {
  auto run = [](bool differ_at_second) {
    Engine comm;
    std::vector<uint64_t> sigs;
    comm.all_reduce(floats(4), ReduceOp::Sum);
    sigs.push_back(last_signature(comm));
    if (differ_at_second) {
      comm.all_reduce(at::zeros({4}, at::kInt), ReduceOp::Sum);  // same size, another dtype
    } else {
      comm.all_reduce(floats(4), ReduceOp::Sum);
    }
    sigs.push_back(last_signature(comm));
    comm.barrier();
    sigs.push_back(last_signature(comm));
    return sigs;
  };
  auto a = run(false), b = run(false), c = run(true);
  EXPECT_EQ(a, b);        // the same calls sign alike on every rank
  EXPECT_EQ(a[0], c[0]);  // identical up to the difference...
  EXPECT_NE(a[1], c[1]);  // ...which changes this signature
  EXPECT_NE(a[2], c[2]);  // and every later one (the chain)
}

TEST(CollectiveSignature, OpRootSizeAndKindEachCount) {
  auto first = [](auto call) {
    Engine comm;
    call(comm);
    return last_signature(comm);
  };
  const uint64_t base = first([](Engine& c) { c.all_reduce(floats(4), ReduceOp::Sum); });
  EXPECT_NE(base, first([](Engine& c) { c.all_reduce(floats(4), ReduceOp::Max); }));
  EXPECT_NE(base, first([](Engine& c) { c.all_reduce(floats(5), ReduceOp::Sum); }));
  EXPECT_NE(base, first([](Engine& c) { c.broadcast(floats(4), 0); }));
  EXPECT_NE(first([](Engine& c) { c.broadcast(floats(4), 0); }), first([](Engine& c) { c.broadcast(floats(4), 1); }));
  // A label is the caller's name for a call, not part of it.
  EXPECT_EQ(base, first([](Engine& c) { c.all_reduce(floats(4), ReduceOp::Sum, "bucket 1/1"); }));
}
