// The reducer tests' world of one rank: an in-process communicator that completes every collective at
// once and counts them, a two-layer network, plain autograd's gradients to compare with, and a fixture
// that wraps the network in a Reducer. Shared by test_reducer.cpp and test_reducer_hooks.cpp.
#pragma once

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dtcore/reducer/reducer.h"

namespace dtcore::testing {

using namespace std::chrono_literals;

class DoneWork : public Work {
 public:
  using Work::Work;
  void wait_for(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
};

// One rank: every collective is complete when started, and leaves the data as it is. Counts what it is given.
class OneRankCommunicator : public Communicator {
 public:
  OneRankCommunicator() : Communicator(0, 1, 1000ms) {}
  std::string_view backend() const override { return "gloo"; }
  void close() override {}
  int count(CollectiveKind kind) const {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (CollectiveKind k : started_) n += k == kind;
    return n;
  }
  // What each all_reduce was given, copied when it started.
  std::vector<at::Tensor> reduced() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reduced_;
  }

 protected:
  std::shared_ptr<Work> start(const Collective& c) override {
    std::lock_guard<std::mutex> lock(mu_);  // hooks may run on an autograd thread
    started_.push_back(c.kind);
    if (c.kind == CollectiveKind::AllReduce) reduced_.push_back(c.input.clone());
    if (c.kind == CollectiveKind::ReduceScatter) c.output.copy_(c.input);  // one rank: its shard is all of it
    return std::make_shared<DoneWork>(timeout());
  }
  bool accepts_device(const at::Tensor& t) const override { return t.device().is_cpu(); }

 private:
  mutable std::mutex mu_;
  std::vector<CollectiveKind> started_;
  std::vector<at::Tensor> reduced_;
};

// A two-layer network: fc1 (weight [4, 3], bias [4]), tanh, fc2 (weight [2, 4]).
inline std::vector<at::Tensor> make_params() {
  at::manual_seed(0);
  return {at::randn({4, 3}).requires_grad_(), at::randn({4}).requires_grad_(), at::randn({2, 4}).requires_grad_()};
}
inline const std::vector<std::string> kNames{"fc1.weight", "fc1.bias", "fc2.weight"};

inline at::Tensor loss_of(const std::vector<at::Tensor>& p, const at::Tensor& x) {
  at::Tensor h = at::tanh(at::addmm(p[1], x, p[0].t()));  // (B, 4)
  return h.matmul(p[2].t()).pow(2).sum();                 // (B, 2) -> scalar
}

// The gradients plain autograd gives for `passes` backward passes on copies of `params`.
inline std::vector<at::Tensor> reference_grads(const std::vector<at::Tensor>& params, const at::Tensor& x,
                                               int passes = 1) {
  std::vector<at::Tensor> copies;
  for (const auto& p : params) copies.push_back(p.detach().clone().requires_grad_());
  for (int i = 0; i < passes; ++i) loss_of(copies, x).backward();
  std::vector<at::Tensor> grads;
  for (const auto& c : copies) grads.push_back(c.grad());
  return grads;
}

inline void expect_grads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& expected) {
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << kNames[i];
    EXPECT_TRUE(at::allclose(params[i].grad(), expected[i], 1e-5, 1e-6)) << kNames[i] << ":\n"
                                                                         << params[i].grad() << "\nexpected:\n"
                                                                         << expected[i];
  }
}

struct Fixture {
  std::vector<at::Tensor> params = make_params();
  at::Tensor x = at::randn({5, 3});
  std::shared_ptr<OneRankCommunicator> comm = std::make_shared<OneRankCommunicator>();
  std::unique_ptr<Reducer> reducer;

  explicit Fixture(Reducer::Options options = {}) {
    reducer = std::make_unique<Reducer>(params, kNames, comm, options);
  }
  void step(bool sync = true) {
    reducer->prepare_for_backward(sync);
    loss_of(params, x).backward();
  }
};

// fc2.weight (32 B) alone in the first bucket, then fc1's bias and weight.
inline Reducer::Options two_buckets() {
  Reducer::Options o;
  o.first_bucket_mb = 32.0 / (1 << 20);
  o.bucket_mb = 48.0 / (1 << 20);
  return o;
}

inline Reducer::Options tiny_buckets() {  // first bucket 1 KiB, then 2 KiB
  Reducer::Options o;
  o.first_bucket_mb = 1.0 / 1024;
  o.bucket_mb = 2.0 / 1024;
  return o;
}

}  // namespace dtcore::testing
