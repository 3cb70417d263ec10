// SignatureHistory: this rank's signatures by collective number, the lists two ranks exchange,
// and the first collective at which two lists differ.
#include <gtest/gtest.h>

#include "dtcore/comm/signature_history.h"

using namespace dtcore;

TEST(SignatureHistory, KeepsTheLastCollectivesAndEncodesThem) {
  SignatureHistory h(4);
  EXPECT_EQ(h.last(), 0u);
  EXPECT_FALSE(h.signature_at(1));
  for (uint64_t seq = 1; seq <= 6; ++seq) h.add(seq, 0xa0 + seq, "all_reduce (torch.float32[8], sum)");
  EXPECT_EQ(h.last(), 6u);
  EXPECT_FALSE(h.signature_at(2));  // fell out of the ring
  EXPECT_EQ(h.signature_at(3), 0xa3u);
  EXPECT_EQ(h.signature_at(6), 0xa6u);
  EXPECT_FALSE(h.signature_at(7));  // not yet issued here
  EXPECT_EQ(h.call_at(4), "all_reduce (torch.float32[8], sum)");
  EXPECT_EQ(h.encode(5), "3:a3,a4,a5");
  EXPECT_EQ(h.encode(99), "3:a3,a4,a5,a6");
  auto list = SignatureList::decode(h.encode(5));
  ASSERT_TRUE(list);
  EXPECT_EQ(list->first, 3u);
  EXPECT_EQ(list->sigs, (std::vector<uint64_t>{0xa3, 0xa4, 0xa5}));
  for (const char* bad : {"", "3", "0:a1", "x:a1", "3:", "3:a1,", "3:zz", "3:a1;a2"}) {
    EXPECT_FALSE(SignatureList::decode(bad)) << bad;
  }
}

TEST(SignatureHistory, FirstDifferenceIsFoundWithinTheOverlap) {
  SignatureList a{1, {1, 2, 3, 4, 5}}, b{1, {1, 2, 9, 8, 7}};
  auto d = first_difference(a, b);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->seq, 3u);
  EXPECT_TRUE(d->exact);
  // b kept only #4-#5, which already differ: #4 or earlier.
  d = first_difference(a, SignatureList{4, {8, 7}});
  ASSERT_TRUE(d);
  EXPECT_EQ(d->seq, 4u);
  EXPECT_FALSE(d->exact);
  EXPECT_FALSE(first_difference(a, SignatureList{2, {2, 3}}));  // agree where both kept
  EXPECT_FALSE(first_difference(a, SignatureList{9, {1}}));     // nothing in common
}
