// host_reduce(): the elementwise reduction of a few host buffers, for collectives that move
// bytes themselves (ShmExchange).
//
// It runs in the thread that calls it, never in ATen's thread pool: a communicator's thread must
// not start a second pool of compute threads beside the training loop's. Half-precision sums
// (float16, bfloat16) accumulate in float32 across all the buffers and round once, as NCCL does.
// Max and Min propagate NaN, as torch.maximum does. Thread safety: a pure function.
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include "dtcore/comm/communicator.h"

namespace dtcore {

// Whether host_reduce() reduces `dtype`: the floating types (float32, float64, float16,
// bfloat16) and the integer ones (int8..int64, uint8). Not bool or complex.
bool host_reducible(at::ScalarType dtype);

// dst[i] = op(own[i], peers[0][i], ..., peers[npeers - 1][i]) for i < n, reducing in that
// order; Avg divides the sum by `ranks`. `dst` may be any input (in place: each block
// of every input is read before that block of `dst` is written). The dtype
// must be host_reducible(); Avg is for floating types only (the communicator checks both).
void host_reduce(void* dst, const void* own, const void* const* peers, int npeers, int64_t n, at::ScalarType dtype,
                 ReduceOp op, int ranks);

}  // namespace dtcore
