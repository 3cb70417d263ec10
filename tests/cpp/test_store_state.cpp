// StoreState: the store's data, without sockets: the stored-bytes limit is exact, never silent.
#include <gtest/gtest.h>

#include "dtcore/bootstrap/store_state.h"

using namespace dtcore::store;

namespace {
Bytes bytes(std::size_t n) { return Bytes(n, 'x'); }

Request request(Op op, std::vector<std::string> keys, std::vector<Bytes> values) {
  Request r;
  r.op = op;
  r.keys = std::move(keys);
  r.values = std::move(values);
  return r;
}
}  // namespace

TEST(StoreState, AMultiSetWithinTheLimitWritesEveryKeyEvenWhenOneGrowsFirst) {
  StoreState state(100, 1 << 20);
  ASSERT_EQ(state.apply(1, request(Op::Set, {"a"}, {bytes(9)}))->status, Status::Ok);   // 10 bytes
  ASSERT_EQ(state.apply(1, request(Op::Set, {"b"}, {bytes(79)}))->status, Status::Ok);  // 90 bytes
  // a grows by 40 before b shrinks by 70: over the limit key by key, 60 bytes as a whole.
  auto r = state.apply(1, request(Op::MultiSet, {"a", "b"}, {bytes(49), bytes(9)}));
  ASSERT_EQ(r->status, Status::Ok);
  EXPECT_EQ(state.stored_bytes(), 60u);
  auto got = state.apply(1, request(Op::MultiGet, {"a", "b"}, {}));
  ASSERT_TRUE(got);
  ASSERT_EQ(got->values.size(), 2u);
  EXPECT_EQ(got->values[0].size(), 49u);
  EXPECT_EQ(got->values[1].size(), 9u);
  // Over the limit as a whole: refused, nothing written.
  EXPECT_NE(state.apply(1, request(Op::MultiSet, {"a", "c"}, {bytes(49), bytes(60)}))->status, Status::Ok);
  EXPECT_EQ(state.stored_bytes(), 60u);
}
