#include "dtcore/comm/host_reduce.h"

#include <algorithm>
#include <type_traits>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "dtcore/common/error.h"

namespace dtcore {
namespace {

// Elements reduced at a time: the accumulator stays in L1 while every buffer's block streams by.
constexpr int64_t kBlock = 1024;

template <typename T>
using Acc = std::conditional_t<std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>, float, T>;

// Integer sums wrap around, as torch's do; added as unsigned, where C++ defines the wrap.
template <typename A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}

template <typename A>
A max_nan(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b > a ? b : a;
}

template <typename A>
A min_nan(A a, A b) {
  if constexpr (std::is_floating_point_v<A>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return b < a ? b : a;
}

template <typename T>
void reduce_typed(T* dst, const T* own, const T* const* peers, int npeers, int64_t n, ReduceOp op, int ranks) {
  using A = Acc<T>;
  A acc[kBlock];
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t len = std::min(kBlock, n - start);
    const T* o = own + start;
    for (int64_t i = 0; i < len; ++i) acc[i] = static_cast<A>(o[i]);
    for (int p = 0; p < npeers; ++p) {
      const T* src = peers[p] + start;
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg:
          for (int64_t i = 0; i < len; ++i) acc[i] = add(acc[i], static_cast<A>(src[i]));
          break;
        case ReduceOp::Max:
          for (int64_t i = 0; i < len; ++i) acc[i] = max_nan(acc[i], static_cast<A>(src[i]));
          break;
        case ReduceOp::Min:
          for (int64_t i = 0; i < len; ++i) acc[i] = min_nan(acc[i], static_cast<A>(src[i]));
          break;
      }
    }
    if constexpr (std::is_floating_point_v<A>) {
      if (op == ReduceOp::Avg) {
        const A divisor = static_cast<A>(ranks);
        for (int64_t i = 0; i < len; ++i) acc[i] /= divisor;
      }
    }
    T* d = dst + start;
    for (int64_t i = 0; i < len; ++i) d[i] = static_cast<T>(acc[i]);
  }
}

template <typename T>
void reduce_as(void* dst, const void* own, const void* const* peers, int npeers, int64_t n, ReduceOp op, int ranks) {
  reduce_typed(static_cast<T*>(dst), static_cast<const T*>(own), reinterpret_cast<const T* const*>(peers), npeers, n,
               op, ranks);
}

}  // namespace

bool host_reducible(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kChar:
    case at::kByte:
    case at::kShort:
    case at::kInt:
    case at::kLong: return true;
    default: return false;
  }
}

void host_reduce(void* dst, const void* own, const void* const* peers, int npeers, int64_t n, at::ScalarType dtype,
                 ReduceOp op, int ranks) {
  switch (dtype) {
    case at::kFloat: return reduce_as<float>(dst, own, peers, npeers, n, op, ranks);
    case at::kDouble: return reduce_as<double>(dst, own, peers, npeers, n, op, ranks);
    case at::kHalf: return reduce_as<c10::Half>(dst, own, peers, npeers, n, op, ranks);
    case at::kBFloat16: return reduce_as<c10::BFloat16>(dst, own, peers, npeers, n, op, ranks);
    case at::kChar: return reduce_as<int8_t>(dst, own, peers, npeers, n, op, ranks);
    case at::kByte: return reduce_as<uint8_t>(dst, own, peers, npeers, n, op, ranks);
    case at::kShort: return reduce_as<int16_t>(dst, own, peers, npeers, n, op, ranks);
    case at::kInt: return reduce_as<int32_t>(dst, own, peers, npeers, n, op, ranks);
    case at::kLong: return reduce_as<int64_t>(dst, own, peers, npeers, n, op, ranks);
    default: break;
  }
  DTCORE_CHECK(false, Error, "dtcore bug: host_reduce() got ", c10::toString(dtype), ", which it does not reduce");
}

}  // namespace dtcore
