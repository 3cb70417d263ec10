// SHA-256 and HMAC-SHA256 against the published vectors: NIST (FIPS 180-4 examples) and RFC 4231.
#include <gtest/gtest.h>

#include <string>

#include "dtcore/common/sha256.h"

using namespace dtcore;

namespace {

std::string hex(const Sha256Digest& d) { return to_hex(d); }

}  // namespace

TEST(Sha256, NistVectors) {
  EXPECT_EQ(hex(sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(std::string(1'000'000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalUpdatesMatchOneShot) {
  // Every split of a message that crosses block and padding boundaries gives the same digest.
  std::string message;
  for (int i = 0; i < 200; ++i) message.push_back(static_cast<char>('a' + i % 26));
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 200}) {
    std::string part = message.substr(0, len);
    Sha256Digest whole = sha256(part);
    for (size_t split = 0; split <= len; split += 7) {
      Sha256 h;
      h.update(std::string_view(part).substr(0, split));
      h.update(std::string_view(part).substr(split));
      EXPECT_EQ(h.finish(), whole) << "len " << len << " split " << split;
    }
  }
}

TEST(HmacSha256, Rfc4231Vectors) {
  // Test case 1
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0b'), "Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  // Test case 2: a key shorter than the output
  EXPECT_EQ(hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // Test case 3
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\xaa'), std::string(50, '\xdd'))),
            "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  // Test case 4
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  EXPECT_EQ(hex(hmac_sha256(key4, std::string(50, '\xcd'))),
            "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  // Test case 5: output truncated to 128 bits
  EXPECT_EQ(hex(hmac_sha256(std::string(20, '\x0c'), "Test With Truncation")).substr(0, 32),
            "a3b6167473100ee06e0c796c2955552b");
  // Test case 6: a key longer than the block size is hashed first
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  // Test case 7: key and data longer than the block size
  EXPECT_EQ(hex(hmac_sha256(std::string(131, '\xaa'),
                            "This is a test using a larger than block-size key and a larger than block-size data. "
                            "The key needs to be hashed before being used by the HMAC algorithm.")),
            "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST(ConstantTimeEqual, ComparesContentAndLength) {
  Sha256Digest a = sha256("a");
  Sha256Digest b = a;
  EXPECT_TRUE(constant_time_equal(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(constant_time_equal(a, b));
  b = a;
  b[0] ^= 0x80;
  EXPECT_FALSE(constant_time_equal(a, b));
  EXPECT_FALSE(constant_time_equal(std::span<const uint8_t>(a).first(16), b));
  EXPECT_TRUE(constant_time_equal(std::span<const uint8_t>(), std::span<const uint8_t>()));
}
