// ShmExchange and host_reduce(): the shared-memory collectives, with each rank a thread of this
// process over one real segment in /dev/shm (the futex and lock calls work alike between threads and
// between processes). GlooCommunicator's use of it, across real processes, is in the Python tests.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dtcore/comm/host_reduce.h"
#include "dtcore/comm/shm_exchange.h"
#include "dtcore/common/error.h"
#include "expect_error.h"

using namespace dtcore;
using namespace std::chrono_literals;
using dtcore::testing::expect_contains;

namespace {

// `size` ranks' exchanges over one fresh segment.
std::vector<std::unique_ptr<ShmExchange>> exchanges(int size, std::chrono::milliseconds timeout = 30s) {
  static int made = 0;
  const std::string name = "/dtcore-test-" + std::to_string(getpid()) + "-" + std::to_string(++made);
  std::vector<std::unique_ptr<ShmExchange>> out;
  std::string why;
  out.push_back(ShmExchange::create(name, size, timeout, {}, why));
  EXPECT_TRUE(out.back()) << why;
  for (int r = 1; r < size; ++r) {
    out.push_back(ShmExchange::open(name, r, size, timeout, {}, why));
    EXPECT_TRUE(out.back()) << why;
  }
  ShmExchange::unlink(name);
  return out;
}

Collective collective(CollectiveKind kind, uint64_t seq, at::Tensor input, at::Tensor output = {},
                      ReduceOp op = ReduceOp::Sum, int root = 0) {
  Collective c;
  c.kind = kind;
  c.seq = seq;
  c.signature = 1000 + seq;
  c.what = std::string(collective_name(kind)) + " #" + std::to_string(seq);
  c.input = std::move(input);
  c.output = std::move(output);
  c.op = op;
  c.root = root;
  return c;
}

// Runs body(rank) on one thread per rank; the exception each rank threw (null if none).
std::vector<std::exception_ptr> on_ranks(int size, const std::function<void(int)>& body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::string message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

void expect_no_errors(const std::vector<std::exception_ptr>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_FALSE(errors[r]) << "rank " << r << ": " << message(errors[r]);
}

at::Tensor input_of(int rank, int64_t n) {
  return at::randn({n}, at::TensorOptions().dtype(at::kFloat)).mul_(rank + 1);
}

}  // namespace

TEST(HostReduce, HalfPrecisionSumsAccumulateInFloatAndRoundOnce) {
  // 1 + 2^-8 + 2^-8: rounded after each add in bfloat16 it stays 1; summed in float it is 1 + 2^-7.
  at::Tensor own = at::ones({3}, at::kBFloat16), a = at::full({3}, std::ldexp(1.0, -8), at::kBFloat16);
  at::Tensor b = a.clone(), out = at::empty({3}, at::kBFloat16);
  const void* peers[] = {a.data_ptr(), b.data_ptr()};
  host_reduce(out.data_ptr(), own.data_ptr(), peers, 2, 3, at::kBFloat16, ReduceOp::Sum, 3);
  EXPECT_TRUE(at::equal(out, at::full({3}, 1.0 + std::ldexp(1.0, -7), at::kBFloat16)));
  host_reduce(own.data_ptr(), own.data_ptr(), peers, 2, 3, at::kBFloat16, ReduceOp::Avg, 3);  // in place
  EXPECT_NEAR(own[0].item<float>(), (1.0 + std::ldexp(1.0, -7)) / 3, 1e-3);
}

TEST(HostReduce, InPlaceIntoAPeerOverManyBlocks) {
  // dst may be a peer's buffer (a rank other than 0 reducing in rank order into its own tensor).
  const int64_t n = 5000;  // several of host_reduce's blocks
  at::Tensor first = at::randn({n}), mine = at::randn({n}), last = at::randn({n});
  const at::Tensor expected = (first + mine) + last;
  const void* peers[] = {mine.data_ptr(), last.data_ptr()};
  host_reduce(mine.data_ptr(), first.data_ptr(), peers, 2, n, at::kFloat, ReduceOp::Sum, 3);
  EXPECT_TRUE(at::equal(mine, expected));
}

TEST(HostReduce, MaxAndMinPropagateNaNAndIntegersStayExactAndWrap) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  at::Tensor own = at::tensor({1.0f, nan, 3.0f}), peer = at::tensor({nan, 2.0f, 4.0f}), out = at::empty({3});
  const void* peers[] = {peer.data_ptr()};
  host_reduce(out.data_ptr(), own.data_ptr(), peers, 1, 3, at::kFloat, ReduceOp::Max, 2);
  EXPECT_TRUE(std::isnan(out[0].item<float>()) && std::isnan(out[1].item<float>()));
  EXPECT_EQ(out[2].item<float>(), 4.0f);
  host_reduce(out.data_ptr(), own.data_ptr(), peers, 1, 3, at::kFloat, ReduceOp::Min, 2);
  EXPECT_TRUE(std::isnan(out[0].item<float>()) && std::isnan(out[1].item<float>()));
  EXPECT_EQ(out[2].item<float>(), 3.0f);
  const int64_t big = (int64_t{1} << 53) + 1;  // beyond float's and double's integers
  at::Tensor x = at::tensor({big, int64_t{-5}}), y = at::tensor({int64_t{1}, int64_t{7}}),
             z = at::empty({2}, at::kLong);
  const void* ys[] = {y.data_ptr()};
  host_reduce(z.data_ptr(), x.data_ptr(), ys, 1, 2, at::kLong, ReduceOp::Sum, 2);
  EXPECT_EQ(z[0].item<int64_t>(), big + 1);
  EXPECT_EQ(z[1].item<int64_t>(), 2);
  // Integer sums wrap around, as torch's do.
  at::Tensor top = at::tensor({std::numeric_limits<int64_t>::max()}), one = at::tensor({int64_t{1}}),
             wrapped = at::empty({1}, at::kLong);
  const void* ones[] = {one.data_ptr()};
  host_reduce(wrapped.data_ptr(), top.data_ptr(), ones, 1, 1, at::kLong, ReduceOp::Sum, 2);
  EXPECT_EQ(wrapped[0].item<int64_t>(), std::numeric_limits<int64_t>::min());
  at::Tensor small = at::tensor({int8_t{127}}, at::kChar), small_one = at::tensor({int8_t{1}}, at::kChar),
             small_out = at::empty({1}, at::kChar);
  const void* small_ones[] = {small_one.data_ptr()};
  host_reduce(small_out.data_ptr(), small.data_ptr(), small_ones, 1, 1, at::kChar, ReduceOp::Sum, 2);
  EXPECT_EQ(small_out[0].item<int8_t>(), -128);
  EXPECT_FALSE(host_reducible(at::kBool));
  EXPECT_FALSE(host_reducible(at::kComplexFloat));
}

TEST(ShmExchange, EveryCollectiveOverSeveralChunksMatchesTheReductionOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr int64_t n = 700'001;  // three chunks of a 1 MiB slot, split unevenly three ways
  auto x = exchanges(kRanks);
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < kRanks; ++r) inputs.push_back(input_of(r, n));
  const at::Tensor stacked = at::stack(inputs);
  std::vector<at::Tensor> sums(kRanks), avgs(kRanks), maxes(kRanks), scattered(kRanks), gathered(kRanks),
      broadcast(kRanks);
  const int64_t shard = 200'003;
  auto errors = on_ranks(kRanks, [&](int r) {
    ShmExchange& me = *x[static_cast<size_t>(r)];
    uint64_t seq = 0;
    sums[r] = inputs[r].clone();
    me.run(collective(CollectiveKind::AllReduce, ++seq, sums[r]), {});
    avgs[r] = inputs[r].clone();
    me.run(collective(CollectiveKind::AllReduce, ++seq, avgs[r], {}, ReduceOp::Avg), {});
    maxes[r] = inputs[r].clone();
    me.run(collective(CollectiveKind::AllReduce, ++seq, maxes[r], {}, ReduceOp::Max), {});
    // In place: the output is this rank's own shard of the input.
    at::Tensor in = inputs[r].narrow(0, 0, kRanks * shard).clone();
    scattered[r] = in.narrow(0, r * shard, shard);
    me.run(collective(CollectiveKind::ReduceScatter, ++seq, in, scattered[r]), {});
    gathered[r] = at::zeros({kRanks * shard});
    gathered[r].narrow(0, r * shard, shard).copy_(inputs[r].narrow(0, 0, shard));
    me.run(collective(CollectiveKind::AllGather, ++seq, gathered[r].narrow(0, r * shard, shard), gathered[r]), {});
    broadcast[r] = inputs[r].clone();
    me.run(collective(CollectiveKind::Broadcast, ++seq, broadcast[r], {}, ReduceOp::Sum, 2), {});
    me.run(collective(CollectiveKind::Barrier, ++seq, {}), {});
  });
  expect_no_errors(errors);
  // Every element is summed in rank order, whichever rank reduced its part: the same bits as
  // (x0 + x1) + x2 added elementwise, at every position (Note [Collectives through shared memory]).
  const at::Tensor sum = (inputs[0] + inputs[1]) + inputs[2];
  const at::Tensor rs = sum.narrow(0, 0, kRanks * shard);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(at::equal(sums[r], sum));
    EXPECT_TRUE(at::equal(avgs[r], sum / kRanks));
    EXPECT_TRUE(at::equal(maxes[r], std::get<0>(stacked.max(0))));
    EXPECT_TRUE(at::equal(scattered[r], rs.narrow(0, r * shard, shard)));
    EXPECT_TRUE(at::equal(gathered[r], at::cat({inputs[0].narrow(0, 0, shard), inputs[1].narrow(0, 0, shard),
                                                inputs[2].narrow(0, 0, shard)})));
    EXPECT_TRUE(at::equal(broadcast[r], inputs[2]));
  }
}

TEST(ShmExchange, RanksThatCallDifferentCollectivesAreToldBeforeAnyDataIsRead) {
  auto x = exchanges(2);
  std::vector<at::Tensor> t{at::ones({8}), at::ones({8})};
  auto errors = on_ranks(2, [&](int r) {
    Collective c = collective(CollectiveKind::AllReduce, 1, t[static_cast<size_t>(r)]);
    if (r == 1) c.signature += 1;  // e.g. another size or op
    x[static_cast<size_t>(r)]->run(c, {});
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]);
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<size_t>(r)]), ShmMismatch);
  }
  EXPECT_TRUE(at::equal(t[0], at::ones({8})) && at::equal(t[1], at::ones({8}))) << "nothing was reduced";
}

TEST(ShmExchange, ACollectiveThroughGlooIsCheckedAgainstOneThroughTheSegment) {
  // Rank 0 reduces float32 here; rank 1 reduces bool, which goes through Gloo after check(): both are
  // told at once, rather than each waiting for the other in another engine until the timeout.
  auto x = exchanges(2);
  at::Tensor t = at::ones({8});
  auto errors = on_ranks(2, [&](int r) {
    if (r == 0) {
      x[0]->run(collective(CollectiveKind::AllReduce, 1, t), {});
    } else {
      Collective c = collective(CollectiveKind::AllReduce, 1, at::ones({8}, at::kBool));
      c.signature += 1;
      x[1]->check(c, {});
    }
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]);
    EXPECT_THROW(std::rethrow_exception(errors[static_cast<size_t>(r)]), ShmMismatch);
  }
}

TEST(ShmExchange, ATimeoutNamesTheRanksThatDidNotArriveAndTheirLastCollective) {
  auto x = exchanges(3, 300ms);
  at::Tensor t0 = at::ones({4}), t1 = at::ones({4});
  auto errors = on_ranks(2, [&](int r) {  // rank 2 never comes
    x[static_cast<size_t>(r)]->run(collective(CollectiveKind::AllReduce, 1, r == 0 ? t0 : t1), {});
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[static_cast<size_t>(r)]);
    expect_contains(message(errors[static_cast<size_t>(r)]),
                    {"timed out waiting in shared memory for rank 2 (last began #0)"});
  }
}

TEST(ShmExchange, ARankWhoseProcessLetGoOfTheSegmentIsNamedAtOnce) {
  auto x = exchanges(2, 60s);
  const auto start = std::chrono::steady_clock::now();
  std::thread leaver([&] {
    std::this_thread::sleep_for(200ms);
    x[1].reset();  // as a process exit does: unmapped, its lock released
  });
  std::string m =
      dtcore::testing::error_of<std::runtime_error>([&] { x[0]->run(collective(CollectiveKind::Barrier, 7, {}), {}); });
  leaver.join();
  expect_contains(m, {"rank 1 exited while barrier #7 waited for it in shared memory"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << "not the 60 s timeout";
}

TEST(ShmExchange, AnInterruptEndsTheWaitWithItsMessage) {
  auto x = exchanges(2, 60s);
  const auto start = std::chrono::steady_clock::now();
  auto interrupt = [&]() -> std::string {
    return std::chrono::steady_clock::now() - start > 300ms ? "closed while it ran" : "";
  };
  std::string m =
      dtcore::testing::error_of<CommError>([&] { x[0]->run(collective(CollectiveKind::Barrier, 1, {}), interrupt); });
  EXPECT_EQ(m, "closed while it ran");
}

TEST(ShmExchange, ANameAlreadyTakenIsRefusedWithTheReason) {
  const std::string name = "/dtcore-test-taken-" + std::to_string(getpid());
  std::string why;
  auto first = ShmExchange::create(name, 2, 1s, {}, why);
  ASSERT_TRUE(first) << why;
  EXPECT_FALSE(ShmExchange::create(name, 2, 1s, {}, why));
  expect_contains(why, {"shm_open(", "File exists"});
  EXPECT_FALSE(ShmExchange::open(name, 1, 3, 1s, {}, why)) << "another world size";
  expect_contains(why, {"is not the size this rank expects"});
  ShmExchange::unlink(name);
  EXPECT_FALSE(ShmExchange::open(name, 1, 2, 1s, {}, why));
  expect_contains(why, {"not the same host"});
}
