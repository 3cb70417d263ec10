// The rendezvous store server against hostile or broken peers: malformed input closes that one
// connection, idle floods cannot keep real clients out, memory is bounded, it listens only where
// asked, and stopping it gives waiting clients an error instead of a hang.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>

#include <future>
#include <random>
#include <vector>

#include "dtcore/common/error.h"
#include "expect_error.h"
#include "store_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;
using namespace std::chrono_literals;

namespace {

// After each misbehaving peer: the server closed it, counted it, and still serves a real client.
void expect_closed_and_still_serving(int fd, c10d::Store& client) {
  EXPECT_TRUE(closed_within(fd, 2s));
  client.set("alive", std::string("yes"));
  EXPECT_EQ(client.get_to_str("alive"), "yes");
}

}  // namespace

TEST(StoreServer, GarbageBeforeTheHandshakeClosesThatConnectionOnly) {
  auto server = start_server();
  auto client = connect_to(*server);
  Fd raw = raw_connect(server->port());
  send_raw(raw.get(), bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
  expect_closed_and_still_serving(raw.get(), *client);
  EXPECT_EQ(server->stats().rejected, 1u);
}

TEST(StoreServer, AWrongMacOrDataBeforeTheProofIsClosed) {
  auto server = start_server();
  auto client = connect_to(*server);
  {
    Fd raw = raw_connect(server->port());
    auto hello = store::decode_server_hello(read_frame(raw.get()));
    ASSERT_TRUE(hello);
    store::ClientHello mine{store::kProtocolVersion, store::random_nonce(), {}};  // all-zero MAC
    send_raw(raw.get(), frame_of(store::encode_client_hello(mine)));
    expect_closed_and_still_serving(raw.get(), *client);
  }
  {
    // A valid hello with a request glued to it: data before the handshake is done.
    Fd raw = raw_connect(server->port());
    auto hello = store::decode_server_hello(read_frame(raw.get()));
    ASSERT_TRUE(hello);
    store::ClientHello mine{store::kProtocolVersion, store::random_nonce(), {}};
    mine.mac = store::client_mac(kSecret, hello->nonce, mine.nonce);
    store::Bytes data = frame_of(store::encode_client_hello(mine));
    store::Bytes request = frame_of(store::encode_request({store::Op::NumKeys, {}, {}, 0}));
    data.insert(data.end(), request.begin(), request.end());
    send_raw(raw.get(), data);
    expect_closed_and_still_serving(raw.get(), *client);
  }
  EXPECT_EQ(server->stats().rejected, 2u);
}

TEST(StoreServer, OversizedFramesUnknownOpsAndMalformedRequestsAreClosed) {
  StoreServerOptions options;
  options.max_frame_bytes = 4096;
  auto server = start_server(options);
  auto client = connect_to(*server);
  std::vector<store::Bytes> bad;
  bad.push_back({0x00, 0x00, 0x10, 0x01});                                         // a frame header of 4097 bytes
  bad.push_back({0x7f, 0xff, 0xff, 0xff});                                         // 2 GiB
  bad.push_back({0x00, 0x00, 0x00, 0x00});                                         // an empty frame
  bad.push_back(frame_of({99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}));   // unknown op 99
  bad.push_back(frame_of({static_cast<uint8_t>(store::Op::Get), 0, 0, 0, 1}));     // truncated
  bad.push_back(frame_of(store::encode_request({store::Op::Set, {"k"}, {}, 0})));  // set without a value
  store::Bytes trailing = store::encode_request({store::Op::NumKeys, {}, {}, 0});
  trailing.push_back(0);
  bad.push_back(frame_of(trailing));
  for (const store::Bytes& frame : bad) {
    Fd raw = raw_connect(server->port());
    raw_handshake(raw.get());
    send_raw(raw.get(), frame);
    expect_closed_and_still_serving(raw.get(), *client);
  }
  EXPECT_EQ(server->stats().rejected, bad.size());
}

TEST(StoreServer, ASecondRequestWhileOneIsParkedIsClosed) {
  auto server = start_server();
  auto client = connect_to(*server);
  Fd raw = raw_connect(server->port());
  raw_handshake(raw.get());
  send_raw(raw.get(), frame_of(store::encode_request({store::Op::Get, {"missing"}, {}, 0})));
  send_raw(raw.get(), frame_of(store::encode_request({store::Op::NumKeys, {}, {}, 0})));
  expect_closed_and_still_serving(raw.get(), *client);
  client->set("missing", std::string("set after the waiter left"));  // releases nobody, crashes nothing
}

TEST(StoreServer, RandomBytesNeverCrashOrStallTheServer) {
  auto server = start_server();
  auto client = connect_to(*server);
  std::mt19937 rng(1234);
  for (int i = 0; i < 200; ++i) {
    Fd raw = raw_connect(server->port());
    if (i % 2 == 1) raw_handshake(raw.get());  // half before the handshake, half after it
    store::Bytes payload(1 + rng() % 64);
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    payload[0] = static_cast<uint8_t>(rng() % 20);  // mostly real ops, with nonsense behind them
    send_raw(raw.get(), i % 4 == 3 ? payload : frame_of(payload));
  }
  client->set("alive", std::string("yes"));
  EXPECT_EQ(client->get_to_str("alive"), "yes");
  EXPECT_EQ(server->stats().accepted, 201u);
}

TEST(StoreServer, AFloodOfIdleConnectionsDoesNotKeepClientsOut) {
  StoreServerOptions options;
  options.handshake_timeout = 500ms;
  options.max_unauthenticated = 64;
  auto server = start_server(options);
  std::vector<Fd> idle;
  for (int i = 0; i < 500; ++i) idle.push_back(raw_connect(server->port()));
  auto start = Clock::now();
  auto client = connect_to(*server);
  client->set("k", std::string("v"));
  EXPECT_EQ(client->get_to_str("k"), "v");
  EXPECT_LT(seconds_since(start), 0.5);
  // All of them are closed by the handshake deadline (most at once: only 64 are held).
  for (Fd& fd : idle) ASSERT_TRUE(closed_within(fd.get(), 3s));
  StoreServerStats stats = server->stats();
  EXPECT_EQ(stats.unauthenticated, 0u);
  EXPECT_EQ(stats.open, 1u);
  EXPECT_EQ(stats.dropped + stats.timed_out, 500u);
  EXPECT_LE(stats.timed_out, options.max_unauthenticated);
  EXPECT_EQ(client->get_to_str("k"), "v");
}

TEST(StoreServer, StoredBytesAreLimited) {
  StoreServerOptions options;
  options.max_stored_bytes = 1000;
  auto server = start_server(options);
  auto client = connect_to(*server);
  client->set("a", std::vector<uint8_t>(600, 'x'));
  std::string msg = error_of<c10::DistStoreError>([&] { client->set("b", std::vector<uint8_t>(600, 'y')); });
  expect_contains(msg, {"refused set", "key 'b'", "over its limit", "max_stored_bytes", "127.0.0.1:"});
  EXPECT_FALSE(client->check({"b"}));
  expect_contains(error_of<c10::DistStoreError>([&] { client->append("a", std::vector<uint8_t>(500, 'z')); }),
                  {"over its limit"});
  expect_contains(error_of<c10::DistStoreError>([&] { client->queuePush("q", std::vector<uint8_t>(500, 'z')); }),
                  {"over its limit"});
  client->set("a", std::vector<uint8_t>(100, 'x'));  // shrinking is always allowed
  client->set("b", std::vector<uint8_t>(600, 'y'));
  EXPECT_TRUE(client->deleteKey("a"));
  client->set("c", std::vector<uint8_t>(300, 'z'));  // deleting freed the room
}

TEST(StoreServer, FrameLimitIsTheClientsErrorNotAClosedConnection) {
  StoreServerOptions options;
  options.max_frame_bytes = 4096;
  auto server = start_server(options);
  auto client = connect_to(*server);
  std::string msg = error_of<c10::DistStoreError>([&] { client->set("big", std::vector<uint8_t>(8192, 'x')); });
  expect_contains(msg, {"over the frame limit of 4096 bytes", "max_frame_bytes"});
  // Values grown past the limit by append are refused when read back, not sent.
  for (int i = 0; i < 3; ++i) client->append("grown", std::vector<uint8_t>(2000, 'x'));
  expect_contains(error_of<c10::DistStoreError>([&] { client->get("grown"); }), {"over the store's frame limit"});
  EXPECT_EQ(client->add("still_connected", 1), 1);
}

TEST(StoreServer, StoppingTheServerReleasesAWaitingClientWithAnError) {
  auto server = start_server();
  auto client = connect_to(*server, 10s);
  auto start = Clock::now();
  auto waiting =
      std::async(std::launch::async, [&] { return error_of<c10::DistNetworkError>([&] { client->get("never"); }); });
  std::this_thread::sleep_for(100ms);
  server.reset();
  std::string msg = waiting.get();
  EXPECT_LT(seconds_since(start), 2.0);
  expect_contains(msg, {"lost the connection to the rendezvous store at 127.0.0.1:", "during get"});
  expect_contains(error_of<c10::DistNetworkError>([&] { client->set("k", std::string("v")); }),
                  {"was lost earlier", "has probably exited; its log has the first error"});
}

TEST(StoreServer, PortZeroGivesARealPortAndStopIsIdempotent) {
  auto server = start_server();
  EXPECT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");
  connect_to(*server)->set("k", std::string("v"));
  server->stop();
  server->stop();
  EXPECT_THROW(connect_to(*server, 1s), c10::DistNetworkError);  // the listener is gone
}

TEST(StoreServer, ATakenPortIsAlreadyInUse) {
  auto first = start_server();
  std::string msg = error_of<RendezvousError>([&] { StoreServer("127.0.0.1", first->port(), kSecret); });
  expect_contains(msg, {"127.0.0.1:", "already in use", "choose a port nobody else uses", "ss -ltnp"});
}

TEST(StoreServer, EmptyHostOrBadOptionsAreConfigErrors) {
  expect_contains(error_of<ConfigError>([] { StoreServer("", 0, kSecret); }), {"empty host", "0.0.0.0"});
  expect_contains(error_of<ConfigError>([] { StoreServer("127.0.0.1", 70000, kSecret); }), {"out of range"});
  StoreServerOptions options;
  options.max_unauthenticated = 0;
  expect_contains(error_of<ConfigError>([&] { StoreServer("127.0.0.1", 0, kSecret, options); }), {"positive"});
}

TEST(StoreServer, LoopbackMeansLoopbackOnly) {
  // Find an address of this host that is not loopback; the server on 127.0.0.1 must not answer there.
  std::string other;
  ifaddrs* list = nullptr;
  ASSERT_EQ(getifaddrs(&list), 0);
  for (ifaddrs* a = list; a != nullptr && other.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    auto* in = reinterpret_cast<sockaddr_in*>(a->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    other = buf;
  }
  freeifaddrs(list);
  auto server = start_server();
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  std::string error;
  auto addrs = store::resolve(other, server->port(), error);
  ASSERT_FALSE(addrs.empty()) << error;
  Fd fd = store::connect_by(addrs[0], Clock::now() + 1s, error);
  EXPECT_FALSE(fd.valid()) << "the server on 127.0.0.1 answered at " << other;
  expect_contains(error, {"refused"});
}

TEST(StoreServer, ListensOnIpv6LoopbackWhenAsked) {
  std::unique_ptr<StoreServer> server;
  try {
    server = std::make_unique<StoreServer>("::1", 0, kSecret);
  } catch (const RendezvousError& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  StoreClient client("::1", server->port(), kSecret, 2s);
  client.set("v6", std::string("ok"));
  EXPECT_EQ(client.get_to_str("v6"), "ok");
  EXPECT_THROW(StoreClient("127.0.0.1", server->port(), kSecret, 1s), c10::DistNetworkError);
}
