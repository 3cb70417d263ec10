#include "dtcore/reducer/bucket_plan.h"

#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "dtcore/common/error.h"

namespace dtcore {

std::vector<size_t> reverse_registration_order(size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = n - 1 - i;
  return order;
}

int64_t mebibytes_to_bytes(double mebibytes, const char* argument) {
  DTCORE_CHECK(std::isfinite(mebibytes) && mebibytes > 0, ConfigError, argument, "=", mebibytes,
               " is not a positive size in MiB (2^20 bytes). Fix: pass e.g. ", argument, "=25.");
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(mebibytes * 1024.0 * 1024.0)));
}

std::vector<Bucket> plan_buckets(const std::vector<GradSpec>& grads, const std::vector<size_t>& order,
                                 const BucketCaps& caps) {
  DTCORE_CHECK(caps.bytes > 0, ConfigError, "bucket_mb gives ", caps.bytes,
               " bytes; it must be positive. Fix: pass bucket_mb > 0, e.g. 25.");
  DTCORE_CHECK(caps.first_bytes > 0, ConfigError, "first_bucket_mb gives ", caps.first_bytes,
               " bytes; it must be positive. Fix: pass first_bucket_mb > 0, e.g. 1.");
  std::vector<bool> seen(grads.size(), false);
  if (order.size() != grads.size()) {
    throw std::invalid_argument("plan_buckets: order lists " + std::to_string(order.size()) + " indices for " +
                                std::to_string(grads.size()) + " gradients");
  }

  // The open bucket of each (device, dtype), as an index into `out`, and whether one was closed.
  using Key = std::tuple<int, int, int>;  // device type, device index, dtype
  struct Open {
    long bucket = -1;
    bool had_one = false;
  };
  std::map<Key, Open> open;
  std::vector<Bucket> out;

  for (size_t index : order) {
    if (index >= grads.size() || seen[index]) {
      throw std::invalid_argument("plan_buckets: order is not a permutation (index " + std::to_string(index) + ")");
    }
    seen[index] = true;
    const GradSpec& g = grads[index];
    Key key{static_cast<int>(g.device.type()), g.device.index(), static_cast<int>(g.dtype)};
    Open& o = open[key];
    if (o.bucket < 0) {
      Bucket b;
      b.device = g.device;
      b.dtype = g.dtype;
      out.push_back(std::move(b));
      o.bucket = static_cast<long>(out.size() - 1);
    }
    Bucket& b = out[static_cast<size_t>(o.bucket)];
    b.params.push_back(index);
    b.offsets.push_back(b.numel);
    b.numels.push_back(g.numel);
    b.numel += g.numel;
    const int64_t cap = o.had_one ? caps.bytes : caps.first_bytes;
    if (b.bytes() >= cap) {  // full: the next gradient of this kind opens a new bucket
      o.bucket = -1;
      o.had_one = true;
    }
  }
  return out;  // created in ready order: bucket i's first gradient is ready before bucket i+1's
}

}  // namespace dtcore
