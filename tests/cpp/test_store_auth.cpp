// The rendezvous store's handshake from the client's side: wrong secrets in both directions,
// foreign listeners that never greet, close at once or speak another protocol, and the errors
// (type, host:port, fix) the client raises for each, always within its timeout. The server's
// other refusals are in test_store_refusal.cpp.
#include <gtest/gtest.h>

#include "dtcore/common/error.h"
#include "expect_error.h"
#include "store_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;
using namespace std::chrono_literals;

namespace {

std::string not_a_store_error(int port, std::chrono::milliseconds timeout, double* seconds = nullptr) {
  auto start = Clock::now();
  std::string msg = error_of<RendezvousError>([&] { StoreClient("127.0.0.1", port, kSecret, timeout); });
  if (seconds != nullptr) *seconds = seconds_since(start);
  expect_contains(msg, {"127.0.0.1:", "is not a dtcore rendezvous store", "a port nobody else uses", "ss -ltnp"});
  EXPECT_EQ(msg.find("secret"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(port)), std::string::npos) << msg;
  return msg;
}

// The client's error when the secrets differ, whichever side found it.
std::string wrong_secret_error(int port, const std::string& secret = kSecret) {
  auto start = Clock::now();
  StoreRefused refused = refusal_of(port, secret);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(refused.reason(), store::RefuseReason::WrongSecret);
  EXPECT_FALSE(refused.transient());
  std::string msg = refused.what();
  expect_contains(msg, {"127.0.0.1:", "does not have this job's secret", "Fix: give every rank the same job secret"});
  EXPECT_EQ(msg.find(secret), std::string::npos) << msg;
  return msg;
}

}  // namespace

TEST(StoreAuth, ClientWithTheWrongSecretIsRefused) {
  auto server = start_server();
  // The server says why it closes: the client's error gives its reason, never "not a store".
  std::string msg = wrong_secret_error(server->port(), "another job's secret");
  expect_contains(
      msg, {"refused this connection: the client's proof does not match this store's job secret", "DTCORE_JOB_SECRET"});
  EXPECT_EQ(msg.find("not a dtcore"), std::string::npos) << msg;
  EXPECT_EQ(server->stats().rejected, 1u);
  EXPECT_EQ(server->stats().authenticated, 0u);
  connect_to(*server)->set("still", std::string("serving"));  // the right secret still gets in
}

TEST(StoreAuth, ClientFacingAServerWithAnotherSecretIsRefused) {
  auto server = start_server({}, "the server's secret");
  expect_contains(wrong_secret_error(server->port()), {"refused this connection"});
  EXPECT_EQ(server->stats().rejected, 1u);
}

TEST(StoreAuth, ClientChecksTheServersProof) {
  // An impostor that accepts any client and answers with a proof made from another secret.
  FakeListener impostor([](int fd) {
    store::ServerHello hello{store::kProtocolVersion, store::random_nonce()};
    send_raw(fd, frame_of(store::encode_server_hello(hello)));
    auto client = store::decode_client_hello(read_frame(fd));
    if (!client) return;
    store::ServerProof proof{store::server_mac("guessed secret", hello.nonce, client->nonce), 16u << 20};
    send_raw(fd, frame_of(store::encode_server_proof(proof)));
    closed_within(fd, 2s);
  });
  expect_contains(wrong_secret_error(impostor.port()), {"its proof of the job secret is wrong", "an impostor"});
}

TEST(StoreAuth, ForeignListenerThatNeverWritesFailsWithinTheTimeout) {
  int port = 0;
  Fd listener = raw_listener(port);  // the kernel completes the TCP handshake; nobody ever writes
  double seconds = 0;
  std::string msg = not_a_store_error(port, 300ms, &seconds);
  expect_contains(msg, {"sent no greeting within 300 ms"});
  EXPECT_GE(seconds, 0.29);
  EXPECT_LT(seconds, 2.0);
}

TEST(StoreAuth, AListenerThatClosesAtOnceIsADroppedConnectionToRetry) {
  // A dtcore store that is stopping does this as much as another program: retried, not judged.
  FakeListener closer([](int) {});
  auto start = Clock::now();
  std::string msg = error_of<c10::DistNetworkError>([&] { StoreClient("127.0.0.1", closer.port(), kSecret, 5s); });
  EXPECT_LT(seconds_since(start), 2.0);
  expect_contains(msg, {"was dropped during the handshake: the connection was closed before the greeting",
                        "sent no refusal", "retries within its timeout"});
}

TEST(StoreAuth, ForeignListenerThatSpeaksAnotherProtocol) {
  FakeListener http([](int fd) {
    std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    send_raw(fd, bytes(reply));
    closed_within(fd, 2s);
  });
  expect_contains(not_a_store_error(http.port(), 2s), {"greeting is not a dtcore store's"});
}

TEST(StoreAuth, GreetingWithTheWrongMagic) {
  FakeListener other([](int fd) {
    store::Bytes hello = store::encode_server_hello({store::kProtocolVersion, store::random_nonce()});
    hello[0] = 'X';
    send_raw(fd, frame_of(hello));
    closed_within(fd, 2s);
  });
  expect_contains(not_a_store_error(other.port(), 2s), {"wrong magic"});
}

TEST(StoreAuth, AnotherProtocolVersionNamesBothVersions) {
  FakeListener newer([](int fd) {
    send_raw(fd, frame_of(store::encode_server_hello({store::kProtocolVersion + 1, store::random_nonce()})));
    closed_within(fd, 2s);
  });
  std::string msg = error_of<StoreRefused>([&] { StoreClient("127.0.0.1", newer.port(), kSecret, 2s); });
  expect_contains(msg, {"speaks store protocol version 3, this client version 2", "same dtcore version"});
  EXPECT_EQ(msg.find("secret"), std::string::npos) << msg;
}

TEST(StoreAuth, AServerThatStallsAfterTheHandshakeTimesOutEveryOperation) {
  // It knows the secret and passes the handshake, then never answers (a hung process).
  FakeListener stalled([](int fd) {
    store::ServerHello hello{store::kProtocolVersion, store::random_nonce()};
    send_raw(fd, frame_of(store::encode_server_hello(hello)));
    auto client = store::decode_client_hello(read_frame(fd));
    if (!client) return;
    send_raw(fd, frame_of(store::encode_server_proof({store::server_mac(kSecret, hello.nonce, client->nonce), 4096})));
    closed_within(fd, 5s);
  });
  StoreClient client("127.0.0.1", stalled.port(), kSecret, 200ms);
  auto start = Clock::now();
  std::string msg = error_of<c10::DistStoreError>([&] { client.set("k", std::string("v")); });
  EXPECT_LT(seconds_since(start), 3.0);  // the timeout, then at most the cancel's grace
  expect_contains(msg, {"set timeout after 200ms, keys: k", "did not answer in time", "given up"});
  expect_contains(error_of<c10::DistNetworkError>([&] { client.getNumKeys(); }), {"was lost earlier"});
}

TEST(StoreAuth, NothingListeningIsANetworkErrorToRetry) {
  int port = 0;
  {
    Fd gone = raw_listener(port);
  }  // a port that was free a moment ago, closed again
  auto start = Clock::now();
  std::string msg = error_of<c10::DistNetworkError>([&] { StoreClient("127.0.0.1", port, kSecret, 2s); });
  EXPECT_LT(seconds_since(start), 1.0);  // refused at once: one attempt, the caller retries
  expect_contains(msg, {"could not connect to the rendezvous store at 127.0.0.1:", "refused"});
}

TEST(StoreAuth, EmptySecretsAreRefused) {
  expect_contains(error_of<ConfigError>([] { StoreServer("127.0.0.1", 0, ""); }), {"empty job secret"});
  auto server = start_server();
  expect_contains(error_of<ConfigError>([&] { connect_to(*server, 1s, ""); }), {"empty job secret"});
}
