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

// Converts the user's MiB (bucket_mb, first_bucket_mb) to bytes; ConfigError when not positive,
// naming the argument.
int64_t mebibytes_to_bytes(double mebibytes, const char* argument);

}  // namespace dtcore
