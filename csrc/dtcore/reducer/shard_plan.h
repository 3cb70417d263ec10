// Shard planning: which part of each bucket a rank owns under ZeRO (dtcore.wrap(zero=1|2)).
//
// Under ZeRO each rank keeps the optimizer state (zero=1) and the reduced gradient (zero=2) of
// its own shard of every bucket only, and after the optimizer step the shards of the updated
// parameters are all-gathered. shard_bucket() says where rank r's shard lies in a bucket and
// which pieces of which parameters it covers. See Note [Shard layout].
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "dtcore/reducer/bucket_plan.h"

// Note [Shard layout]
// Builds on Note [Bucket layout]. Under ZeRO a bucket's flat buffer is padded with zeros to
// `padded_numel`, the least multiple of the world size N that holds its `numel` elements, so that
// every rank's shard has the same size S = padded_numel / N (reduce-scatter and all-gather move
// equal parts). Rank r owns elements [r * S, (r + 1) * S) of the padded buffer. The padding
// belongs to no parameter and stays zero. A parameter whose range in the bucket crosses a shard
// boundary is split: each rank holds a *piece* of it, the intersection of the parameter's range
// with the rank's shard; a rank may hold no piece of a parameter, or pieces of many.
// The bucket plan changes once, after the first backward (the reducer rebuilds the buckets in
// the order gradients became ready), so shards are planned from the reducer's final plan: code
// that keeps per-shard state (the sharded optimizer) builds it only once the plan is final.

// Note [Flat parameters]
// Under ZeRO the parameters, like the gradients, live in one flat padded buffer per bucket, in
// the bucket's layout (Note [Bucket layout], padded as in [Shard layout]), so that a rank's
// shard of the parameters is one contiguous stretch: the sharded optimizer steps it in place
// (fp32 pieces are views of it; a master copy of a bf16 piece is cast back into it) and the
// all-gather after the step is one collective per bucket whose input is that stretch of its own
// output, with no copy in or out (see Note [In-place all-gather on Gloo]).
//  - Who owns the storage: the sharded optimizer (python/dtcore/zero/optimizer.py, _FlatBucket)
//    allocates the buffers; each parameter's storage is its bucket's buffer, kept alive by the
//    parameters themselves. The padding belongs to no parameter and stays zero.
//  - When it moves: once, at the optimizer's first step after the plan is final (the buckets are
//    rebuilt once, after the first backward). The values are copied; each Parameter object keeps
//    its identity, its requires_grad and its gradient (the reducer's, untouched); only `.data`
//    changes, to a view shaped like the parameter.
//  - A tensor taken from `p.data` (or `p.detach()`) before that step keeps the old storage: it is
//    no longer updated. Take it again after the first step.
//  - state_dict(), save_pretrained() and safetensors see each parameter as a contiguous view of
//    its bucket's buffer; the views of one buffer do not overlap, which safetensors accepts as
//    distinct tensors, and save_pretrained writes them (tests/py/zero/test_flat_parameters.py).

namespace dtcore {

// A parameter's part in a rank's shard: elements [param_offset, param_offset + numel) of the
// flattened parameter sit at [shard_offset, shard_offset + numel) of the shard.
struct ShardPiece {
  size_t param = 0;  // registration index, as in Bucket::params
  int64_t param_offset = 0;
  int64_t shard_offset = 0;
  int64_t numel = 0;
};

struct BucketShard {
  int64_t padded_numel = 0;        // the bucket's buffer size under ZeRO
  int64_t shard_numel = 0;         // S: every rank's share
  int64_t begin = 0;               // this rank's first element in the padded buffer: rank * S
  std::vector<ShardPiece> pieces;  // in layout order
};

// The least multiple of `world` that is >= numel (at least `world`, so that no shard is empty).
int64_t padded_numel(int64_t numel, int world);

// Rank `rank`'s shard of `bucket` in a world of `world` ranks; std::invalid_argument for a rank
// outside [0, world) (a caller's bug, not a user error).
BucketShard shard_bucket(const Bucket& bucket, int world, int rank);

}  // namespace dtcore
