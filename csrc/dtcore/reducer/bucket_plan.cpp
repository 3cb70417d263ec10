#include "dtcore/reducer/bucket_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "dtcore/common/error.h"

namespace dtcore {

namespace {

using Key = std::tuple<int, int, int>;  // device type, device index, dtype
Key key_of(const GradSpec& g) {
  return {static_cast<int>(g.device.type()), g.device.index(), static_cast<int>(g.dtype)};
}

// Each gradient's position in `order`, checking that it is a permutation with non-decreasing times.
std::vector<size_t> positions(size_t n, const std::vector<size_t>& order, const std::vector<int64_t>& ready_ns) {
  if (order.size() != n || ready_ns.size() != n) {
    throw std::invalid_argument("plan_buckets_auto: " + std::to_string(order.size()) + " indices and " +
                                std::to_string(ready_ns.size()) + " times for " + std::to_string(n) + " gradients");
  }
  std::vector<size_t> pos(n, n);
  for (size_t k = 0; k < n; ++k) {
    if (order[k] >= n || pos[order[k]] != n) {
      throw std::invalid_argument("plan_buckets_auto: order is not a permutation (index " + std::to_string(order[k]) +
                                  ")");
    }
    if (k > 0 && ready_ns[k] < ready_ns[k - 1]) {
      throw std::invalid_argument("plan_buckets_auto: ready times decrease at position " + std::to_string(k));
    }
    pos[order[k]] = k;
  }
  return pos;
}

}  // namespace

Bucket bucket_of(const std::vector<GradSpec>& grads, const std::vector<size_t>& members) {
  Bucket b;
  b.device = grads[members.front()].device;
  b.dtype = grads[members.front()].dtype;
  for (size_t index : members) {
    b.params.push_back(index);
    b.offsets.push_back(b.numel);
    b.numels.push_back(grads[index].numel);
    b.numel += grads[index].numel;
  }
  return b;
}

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
    Open& o = open[key_of(g)];
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

std::vector<Bucket> plan_buckets_auto(const std::vector<GradSpec>& grads, const std::vector<size_t>& order,
                                      const std::vector<int64_t>& ready_ns, const CollectiveCost& cost) {
  const std::vector<size_t> pos = positions(grads.size(), order, ready_ns);
  std::map<Key, std::vector<size_t>> groups;  // each (device, dtype)'s gradients in ready order
  for (size_t index : order) groups[key_of(grads[index])].push_back(index);

  std::vector<Bucket> out;
  for (const auto& [key, members] : groups) {
    // The places a cut may go: after every gradient, or, for more than kMaxAutoCuts gradients (a model
    // of thousands of tensors), after runs of about 1/kMaxAutoCuts of the bytes, so that the search
    // stays within kMaxAutoBuckets x kMaxAutoCuts^2 / 2 steps.
    const size_t n = members.size();
    std::vector<double> member_bytes(n);
    double group_bytes = 0;
    for (size_t i = 0; i < n; ++i) {
      const GradSpec& g = grads[members[i]];
      member_bytes[i] = static_cast<double>(g.numel) * static_cast<double>(c10::elementSize(g.dtype));
      group_bytes += member_bytes[i];
    }
    std::vector<size_t> ends;  // ends[u]: one past the last member of unit u
    double run = 0;
    for (size_t i = 0; i < n; ++i) {
      run += member_bytes[i];
      if (n <= kMaxAutoCuts || (run > 0 && run * static_cast<double>(kMaxAutoCuts) >= group_bytes) || i + 1 == n) {
        ends.push_back(i + 1);
        run = 0;
      }
    }
    const size_t m = ends.size();
    std::vector<double> bytes(m + 1, 0.0);  // bytes[u]: units [0, u)'s
    for (size_t u = 0, i = 0; u < m; ++u) {
      bytes[u + 1] = bytes[u];
      for (; i < ends[u]; ++i) bytes[u + 1] += member_bytes[i];
    }
    // finish[k][u]: the earliest the last of k collectives of units [0, u) can finish, each earlier one
    // having delayed the backward by alpha; cut[k][u]: where that plan's last bucket starts.
    const size_t most = std::min(m, kMaxAutoBuckets);
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> finish(most + 1, std::vector<double>(m + 1, inf));
    std::vector<std::vector<size_t>> cut(most + 1, std::vector<size_t>(m + 1, 0));
    finish[0][0] = -inf;
    for (size_t k = 1; k <= most; ++k) {
      const double delay = cost.alpha_ns * static_cast<double>(k - 1);  // from the k-1 collectives before
      for (size_t u = k; u <= m; ++u) {
        const double ready = static_cast<double>(ready_ns[pos[members[ends[u - 1] - 1]]]) + delay;
        for (size_t j = k - 1; j < u; ++j) {  // the last bucket is units [j, u)
          if (finish[k - 1][j] == inf) continue;
          const double f =
              std::max(ready, finish[k - 1][j]) + cost.alpha_ns + cost.beta_ns_per_byte * (bytes[u] - bytes[j]);
          if (f < finish[k][u]) {
            finish[k][u] = f;
            cut[k][u] = j;
          }
        }
      }
    }
    size_t k = 1;  // the fewest buckets among the best: ties keep fewer
    for (size_t c = 2; c <= most; ++c) {
      if (finish[c][m] < finish[k][m]) k = c;
    }
    std::vector<std::vector<size_t>> pieces;
    for (size_t u = m; u > 0; u = cut[k][u], --k) {
      const size_t begin = cut[k][u] ? ends[cut[k][u] - 1] : 0;
      pieces.emplace_back(members.begin() + begin, members.begin() + ends[u - 1]);
    }
    std::reverse(pieces.begin(), pieces.end());
    for (const auto& piece : pieces) out.push_back(bucket_of(grads, piece));
  }
  // Launched in plan order, each once complete: order them by their last gradient.
  std::stable_sort(out.begin(), out.end(),
                   [&](const Bucket& a, const Bucket& b) { return pos[a.params.back()] < pos[b.params.back()]; });
  return out;
}

double exposed_ns(const std::vector<Bucket>& plan, const std::vector<size_t>& order,
                  const std::vector<int64_t>& ready_ns, const std::vector<GradSpec>& grads,
                  const CollectiveCost& cost) {
  const std::vector<size_t> pos = positions(grads.size(), order, ready_ns);
  double finish = -std::numeric_limits<double>::infinity();
  const int64_t last_ready = ready_ns.empty() ? 0 : ready_ns.back();
  double delay = 0;  // each collective delays the rest of the backward by alpha
  for (const Bucket& b : plan) {
    size_t last = 0;
    for (size_t index : b.params) last = std::max(last, pos[index]);
    finish = std::max(finish, static_cast<double>(ready_ns[last]) + delay) + cost.ns(b.bytes());
    delay += cost.alpha_ns;
  }
  return plan.empty() ? 0.0 : finish - static_cast<double>(last_ready);
}

}  // namespace dtcore
