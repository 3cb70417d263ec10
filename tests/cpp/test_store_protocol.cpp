// The rendezvous store's wire format: requests, answers and handshake messages round-trip, and
// every malformed payload (truncated, trailing bytes, absurd counts, wrong sizes) is refused.
#include <gtest/gtest.h>

#include "dtcore/bootstrap/store_protocol.h"

using namespace dtcore;
using namespace dtcore::store;

TEST(StoreProtocol, RequestsRoundTrip) {
  Request r{Op::MultiSet, {"a", "", std::string("b\0c", 3)}, {{1, 2, 3}, {}, {0}}, -42};
  Bytes encoded = encode_request(r);
  EXPECT_EQ(encoded.size(), request_bytes(r));
  auto decoded = decode_request(encoded);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->op, r.op);
  EXPECT_EQ(decoded->keys, r.keys);
  EXPECT_EQ(decoded->values, r.values);
  EXPECT_EQ(decoded->number, -42);
  EXPECT_TRUE(shape_ok(*decoded));
}

TEST(StoreProtocol, ResponsesRoundTrip) {
  Response r{Status::Error, {{'o', 'o', 'p', 's'}}, INT64_MIN};
  Bytes encoded = encode_response(r);
  EXPECT_EQ(encoded.size(), response_bytes(r.values));
  auto decoded = decode_response(encoded);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->status, Status::Error);
  EXPECT_EQ(decoded->values, r.values);
  EXPECT_EQ(decoded->number, INT64_MIN);
}

TEST(StoreProtocol, EveryTruncationAndTrailingByteIsRefused) {
  Bytes request = encode_request({Op::CompareSet, {"key"}, {{1, 2}, {3}}, 7});
  for (size_t n = 0; n < request.size(); ++n) {
    EXPECT_FALSE(decode_request({request.data(), n})) << "truncated to " << n;
  }
  request.push_back(0);
  EXPECT_FALSE(decode_request(request));
  Bytes response = encode_response({Status::Ok, {{9, 9}}, 1});
  for (size_t n = 0; n < response.size(); ++n) EXPECT_FALSE(decode_response({response.data(), n}));
}

TEST(StoreProtocol, AbsurdCountsAndUnknownOpsAreRefusedWithoutAllocating) {
  // A key count of 4 billion in a 17-byte payload: refused before any reserve().
  Bytes huge = {static_cast<uint8_t>(Op::Check), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_FALSE(decode_request(huge));
  Bytes unknown = encode_request({Op::NumKeys, {}, {}, 0});
  unknown[0] = 0;
  EXPECT_FALSE(decode_request(unknown));
  unknown[0] = static_cast<uint8_t>(Op::Cancel) + 1;
  EXPECT_FALSE(decode_request(unknown));
  Bytes status = encode_response({Status::Ok, {}, 0});
  status[0] = 200;
  EXPECT_FALSE(decode_response(status));
}

TEST(StoreProtocol, ShapesPerOp) {
  EXPECT_TRUE(shape_ok({Op::Set, {"k"}, {{}}, 0}));
  EXPECT_FALSE(shape_ok({Op::Set, {"k"}, {}, 0}));
  EXPECT_FALSE(shape_ok({Op::Get, {"a", "b"}, {}, 0}));
  EXPECT_TRUE(shape_ok({Op::Wait, {}, {}, 0}));
  EXPECT_TRUE(shape_ok({Op::MultiSet, {"a", "b"}, {{}, {}}, 0}));
  EXPECT_FALSE(shape_ok({Op::MultiSet, {"a", "b"}, {{}}, 0}));
  EXPECT_FALSE(shape_ok({Op::QueuePop, {"q"}, {}, 2}));
  EXPECT_FALSE(shape_ok({Op::Cancel, {"k"}, {}, 0}));
}

TEST(StoreProtocol, HandshakeMessages) {
  ServerHello hello{kProtocolVersion, random_nonce()};
  Bytes h = encode_server_hello(hello);
  ASSERT_EQ(h.size(), kServerHelloBytes);
  auto back = decode_server_hello(h);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->nonce, hello.nonce);
  h[3] ^= 1;  // the magic
  EXPECT_FALSE(decode_server_hello(h));
  h.pop_back();
  EXPECT_FALSE(decode_server_hello(h));

  ClientHello client{kProtocolVersion, random_nonce(), {}};
  client.mac = client_mac("s", hello.nonce, client.nonce);
  auto c = decode_client_hello(encode_client_hello(client));
  ASSERT_TRUE(c);
  EXPECT_EQ(c->mac, client.mac);
  EXPECT_EQ(encode_client_hello(client).size(), kClientHelloBytes);

  ServerProof proof{server_mac("s", hello.nonce, client.nonce), 1234567};
  auto p = decode_server_proof(encode_server_proof(proof));
  ASSERT_TRUE(p);
  EXPECT_EQ(p->max_frame_bytes, 1234567u);
  // The labels keep one side's MAC from passing as the other's.
  EXPECT_NE(client_mac("s", hello.nonce, client.nonce), server_mac("s", hello.nonce, client.nonce));
  EXPECT_NE(random_nonce(), random_nonce());
}

TEST(StoreProtocol, FramesCarryABigEndianLength) {
  Bytes out;
  append_frame(out, Bytes(300, 7));
  ASSERT_EQ(out.size(), 304u);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], 0);
  EXPECT_EQ(out[2], 1);
  EXPECT_EQ(out[3], 44);
  EXPECT_EQ(read_frame_length(out.data()), 300u);
}
