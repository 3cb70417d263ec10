// Bucket planning: which gradients share a communication buffer, and where each one sits in it.
//
// The reducer (issue: gradient bucketing overlapped with backward) flattens gradients into
// buckets so that one collective moves many of them, and launches a bucket's collective as soon
// as its last gradient is ready. plan_buckets() decides the grouping:
//   - gradients are taken in the order they are expected to become ready: reverse registration
//     order before the first iteration (autograd usually visits the last layers first), the
//     order observed in the first backward afterwards;
//   - a bucket holds one device and one dtype (a collective moves one buffer of one type);
//   - a bucket is closed once it reaches its size cap; the first bucket of each (device, dtype)
//     uses a smaller cap, so that communication starts early in backward;
//   - a gradient larger than the cap closes the bucket it lands in; nothing is ever split.
// Buckets are returned in the order they become ready (the position of their first gradient).
// See Note [Bucket layout].
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

// Note [Bucket layout]
// A bucket is one flat buffer of `numel` elements of `dtype` on `device`. Gradient `params[i]`
// occupies elements [offsets[i], offsets[i] + numels[i]) in that buffer, in the order listed,
// back to back without padding, so that the reducer can make each parameter's .grad a view into
// the buffer and no copy is needed before or after the collective.

namespace dtcore {

// What the planner needs to know of one parameter's gradient; indexed by registration order.
struct GradSpec {
  int64_t numel = 0;
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

struct Bucket {
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  c10::ScalarType dtype = c10::ScalarType::Float;
  std::vector<size_t> params;    // registration indices, in layout order
  std::vector<int64_t> offsets;  // element offset of each, see Note [Bucket layout]
  std::vector<int64_t> numels;
  int64_t numel = 0;

  int64_t bytes() const { return numel * static_cast<int64_t>(c10::elementSize(dtype)); }
};

// The default caps in MiB (2^20 bytes, as torch DDP's bucket_cap_mb): written here once, read
// by Reducer::Options and, through its binding, by dtcore.wrap's signature.
inline constexpr double kDefaultBucketMiB = 25.0;
inline constexpr double kDefaultFirstBucketMiB = 1.0;

struct BucketCaps {
  int64_t bytes = static_cast<int64_t>(kDefaultBucketMiB * (1 << 20));
  int64_t first_bytes = static_cast<int64_t>(kDefaultFirstBucketMiB * (1 << 20));
};

// Indices n-1, ..., 1, 0: the expected ready order before any backward was observed.
std::vector<size_t> reverse_registration_order(size_t n);

// `order` must list every index of `grads` exactly once (std::invalid_argument otherwise: a
// reducer bug, not a user error). Caps must be positive (dtcore::ConfigError naming the value).
std::vector<Bucket> plan_buckets(const std::vector<GradSpec>& grads, const std::vector<size_t>& order,
                                 const BucketCaps& caps);

// One bucket of `members` (registration indices, in layout order; not empty, one device and dtype).
Bucket bucket_of(const std::vector<GradSpec>& grads, const std::vector<size_t>& members);

// Note [Buckets that size themselves]: with bucket_mb="auto" the reducer cuts its buckets where
// they leave the least communication after the backward, from two measurements: when each
// gradient became ready in the first reduced backward (rank 0's clock, the order it observed; on a
// GPU, CUDA events recorded on the backward's stream, since the host runs ahead of it) and
// what one all-reduce costs on this communicator (alpha + beta x bytes, fitted from a few sizes).
// The model: collectives run one at a time in plan order, a bucket's once its last gradient is
// ready and the one before it has finished; and each collective delays the rest of the backward
// by its fixed cost alpha, the time of the process that issues it (its launch and completion; on
// CPU Gloo moves the bytes on the cores the backward computes on), so that a plan of many small
// buckets pays for each. plan_buckets_auto() chooses, for every number of buckets k up to
// kMaxAutoBuckets, the cuts of the observed order that make the last of k collectives finish
// earliest (dynamic programming: for a given k, the finish of a prefix's last collective is all
// that later buckets depend on, and it only delays them), then the k whose last finishes earliest,
// the fewest on a tie. So: few cuts where gradients come in a burst (a compiled graph's piece), a
// small last-ready bucket where the rest can hide behind the backward, one bucket where nothing
// can be hidden. Gradients of several dtypes or devices are cut per kind, each ignoring the
// others' delays. A plan measured from timing may differ from one run to the next, and with it
// the last bits of whatever rounds by the layout: dtcore.wrap's bucket_options (Python) keeps the
// default caps where the process asked torch for deterministic algorithms.
inline constexpr size_t kMaxAutoBuckets = 64;
inline constexpr size_t kMaxAutoCuts = 512;  // places a cut may go; more gradients are grouped in runs

struct CollectiveCost {
  double alpha_ns = 0;          // a collective's fixed cost
  double beta_ns_per_byte = 0;  // and its cost per byte of the buffer
  double ns(int64_t bytes) const { return alpha_ns + beta_ns_per_byte * static_cast<double>(bytes); }
};

// `order` as for plan_buckets; `ready_ns[k]` when gradient order[k] became ready (any origin,
// non-decreasing along the order; std::invalid_argument otherwise). Each (device, dtype) is cut on
// its own. Buckets are returned in the order they complete (their last gradient's position).
std::vector<Bucket> plan_buckets_auto(const std::vector<GradSpec>& grads, const std::vector<size_t>& order,
                                      const std::vector<int64_t>& ready_ns, const CollectiveCost& cost);

// What `plan` leaves exposed under that model: when its last collective finishes (every collective
// before it delaying the backward by alpha), less when its last gradient became ready (ns). `order` and `ready_ns` as
// for plan_buckets_auto.
double exposed_ns(const std::vector<Bucket>& plan, const std::vector<size_t>& order,
                  const std::vector<int64_t>& ready_ns, const std::vector<GradSpec>& grads, const CollectiveCost& cost);

// Converts the user's MiB (bucket_mb, first_bucket_mb) to bytes; ConfigError when not positive,
// naming the argument.
int64_t mebibytes_to_bytes(double mebibytes, const char* argument);

}  // namespace dtcore
