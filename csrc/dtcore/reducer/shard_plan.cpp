#include "dtcore/reducer/shard_plan.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace dtcore {

int64_t padded_numel(int64_t numel, int world) {
  const int64_t n = std::max(world, 1);
  return std::max<int64_t>((numel + n - 1) / n, 1) * n;
}

BucketShard shard_bucket(const Bucket& bucket, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw std::invalid_argument("shard_bucket: rank " + std::to_string(rank) + " outside a world of " +
                                std::to_string(world));
  }
  BucketShard s;
  s.padded_numel = padded_numel(bucket.numel, world);
  s.shard_numel = s.padded_numel / world;
  s.begin = static_cast<int64_t>(rank) * s.shard_numel;
  const int64_t end = s.begin + s.shard_numel;
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const int64_t lo = std::max(bucket.offsets[k], s.begin);
    const int64_t hi = std::min(bucket.offsets[k] + bucket.numels[k], end);
    if (lo >= hi) continue;  // this parameter lies wholly in other ranks' shards
    s.pieces.push_back(ShardPiece{bucket.params[k], lo - bucket.offsets[k], lo - s.begin, hi - lo});
  }
  return s;
}

}  // namespace dtcore
