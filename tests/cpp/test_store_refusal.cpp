// The rendezvous store's refusals (Note [Store protocol]): for each reason the server closes a
// connection in the handshake, the Refusal it sends first and the error the client raises from
// it (the server's reason and the fix); out of descriptors, it still answers, without spinning;
// and a handshake dropped without a Refusal is reported as dropped, never as a wrong secret.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "dtcore/common/error.h"
#include "expect_error.h"
#include "store_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;
using namespace std::chrono_literals;
using store::RefuseReason;

namespace {

// The Refusal the server sends on a raw connection, skipping its greeting.
store::Refusal refusal_on(int fd) {
  for (int frames = 0; frames < 2; ++frames) {
    store::Bytes payload = read_frame(fd);
    if (auto refusal = store::decode_refusal(payload)) return *refusal;
    if (!store::decode_server_hello(payload)) break;
  }
  ADD_FAILURE() << "no Refusal frame came";
  return {};
}

// The client's error against a server that answers every connection with `refusal`, after its
// greeting or, with `instead_of_greeting`, in its place.
StoreRefused client_error(const store::Refusal& refusal, bool instead_of_greeting = false) {
  FakeListener refuser([&](int fd) {
    store::ServerHello hello{store::kProtocolVersion, store::random_nonce()};
    if (!instead_of_greeting) {
      send_raw(fd, frame_of(store::encode_server_hello(hello)));
      read_frame(fd);  // the client's hello
    }
    send_raw(fd, frame_of(store::encode_refusal(refusal)));
  });
  return refusal_of(refuser.port(), kSecret, 2s);
}

// The CPU time of this process's thread named `name`, readable when no descriptor is left: its
// /proc stat file is opened up front.
class ThreadClock {
 public:
  explicit ThreadClock(const std::string& name) {
    DIR* dir = ::opendir("/proc/self/task");
    while (dirent* entry = dir != nullptr ? ::readdir(dir) : nullptr) {
      std::string task = std::string("/proc/self/task/") + entry->d_name;
      std::string comm;
      std::getline(std::ifstream(task + "/comm"), comm);
      if (comm == name) stat_ = Fd(::open((task + "/stat").c_str(), O_RDONLY | O_CLOEXEC));
    }
    if (dir != nullptr) ::closedir(dir);
  }
  bool found() const { return stat_.valid(); }
  // User + system time in clock ticks.
  long ticks() const {
    char buf[1024] = {0};
    ssize_t n = ::pread(stat_.get(), buf, sizeof(buf) - 1, 0);
    std::string stat(buf, n > 0 ? static_cast<size_t>(n) : 0);
    std::istringstream fields(stat.substr(stat.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 13; ++i) fields >> field;  // state .. cmajflt
    long utime = 0, stime = 0;
    fields >> utime >> stime;
    return utime + stime;
  }

 private:
  Fd stat_;
};

// Takes every descriptor this process may still open (under a lowered open-file limit) but
// `spare_left`; gives them back, and the limit, when it goes.
class Exhausted {
 public:
  explicit Exhausted(int spare_left) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit lowered = saved_;
    lowered.rlim_cur = 256;  // a table small enough to fill here
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &lowered), 0);
    take_all();
    for (int i = 0; i < spare_left && !held_.empty(); ++i) {
      ::close(held_.back());
      held_.pop_back();
    }
  }
  ~Exhausted() {
    for (int fd : held_) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &saved_);
  }
  // Takes whatever was given back since.
  void take_all() {
    for (int fd = ::dup(0); fd >= 0; fd = ::dup(0)) held_.push_back(fd);
    EXPECT_EQ(errno, EMFILE);
  }

 private:
  rlimit saved_{};
  std::vector<int> held_;
};

}  // namespace

TEST(StoreRefusal, AnotherProtocolVersionIsRefusedWithTheServersVersion) {
  auto server = start_server();
  Fd raw = raw_connect(server->port());
  auto hello = store::decode_server_hello(read_frame(raw.get()));
  ASSERT_TRUE(hello);
  store::ClientHello mine{static_cast<std::uint16_t>(store::kProtocolVersion + 1), store::random_nonce(), {}};
  mine.mac = store::client_mac(kSecret, hello->nonce, mine.nonce);
  send_raw(raw.get(), frame_of(store::encode_client_hello(mine)));
  store::Refusal refusal = refusal_on(raw.get());
  EXPECT_EQ(refusal.reason, RefuseReason::Version);
  EXPECT_EQ(refusal.number, store::kProtocolVersion);
  expect_contains(refusal.message, {"the client speaks store protocol version 3, this server 2"});
  EXPECT_TRUE(closed_within(raw.get(), 2s));

  StoreRefused e = client_error({RefuseReason::Version, 7, "whatever it says"});
  EXPECT_FALSE(e.transient());
  expect_contains(e.what(), {"speaks store protocol version 7, this client version 2", "same dtcore version"});
}

TEST(StoreRefusal, AMalformedHandshakeIsRefusedAsMalformed) {
  auto server = start_server();
  Fd http = raw_connect(server->port());
  send_raw(http.get(), bytes("GET / HTTP/1.1\r\n\r\n"));
  store::Refusal refusal = refusal_on(http.get());
  EXPECT_EQ(refusal.reason, RefuseReason::Malformed);
  expect_contains(refusal.message, {"its first frame (", "bytes) is not a handshake"});

  StoreRefused e = client_error({RefuseReason::Malformed, 0, "its first frame (9 bytes) is not a handshake"});
  EXPECT_FALSE(e.transient());
  expect_contains(e.what(), {"refused this connection: its first frame (9 bytes) is not a handshake",
                             "did not understand this client's handshake", "same dtcore version"});
  EXPECT_EQ(server->stats().rejected, 1u);
}

TEST(StoreRefusal, TheHandshakeDeadlineIsRefusedAsATimeoutToRetry) {
  StoreServerOptions options;
  options.handshake_timeout = 200ms;
  auto server = start_server(options);
  Fd raw = raw_connect(server->port());
  auto start = Clock::now();
  store::Refusal refusal = refusal_on(raw.get());
  EXPECT_GE(seconds_since(start), 0.15);
  EXPECT_EQ(refusal.reason, RefuseReason::HandshakeTimeout);
  EXPECT_EQ(refusal.number, 200);
  expect_contains(refusal.message, {"no handshake within 200 ms", "handshake_timeout"});

  StoreRefused e = client_error(refusal);
  EXPECT_TRUE(e.transient());
  expect_contains(e.what(), {"refused this connection: no handshake within 200 ms", "within its 200 ms",
                             "retried within the rendezvous timeout"});
  EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
}

TEST(StoreRefusal, TheOldestOfTooManyHandshakesIsRefusedAsCrowdedToRetry) {
  StoreServerOptions options;
  options.max_unauthenticated = 1;
  auto server = start_server(options);
  Fd oldest = raw_connect(server->port());
  ASSERT_TRUE(store::decode_server_hello(read_frame(oldest.get())));
  Fd newer = raw_connect(server->port());
  store::Refusal refusal = refusal_on(oldest.get());
  EXPECT_EQ(refusal.reason, RefuseReason::Crowded);
  EXPECT_EQ(refusal.number, 1);
  expect_contains(refusal.message, {"more than 1 connections at once", "this was the oldest"});

  StoreRefused e = client_error(refusal);
  EXPECT_TRUE(e.transient());
  expect_contains(e.what(), {"more than 1 connections at once were in the handshake", "ss -tnp"});
}

TEST(StoreRefusal, OutOfDescriptorsTheServerStillAnswersWithItsLimitAndDoesNotSpin) {
  auto server = start_server();
  auto client = connect_to(*server);
  int port = server->port();
  Fd early(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));  // made while descriptors are left
  timeval five_seconds{5, 0};
  setsockopt(early.get(), SOL_SOCKET, SO_RCVTIMEO, &five_seconds, sizeof(five_seconds));
  ThreadClock store_thread("dtcore-store");
  ASSERT_TRUE(store_thread.found()) << "no thread named dtcore-store";
  {
    Exhausted table(1);  // one left: for the StoreClient's own socket
    // A real client: the server has no descriptor to accept it with, yet it is told why.
    auto start = Clock::now();
    StoreRefused e = refusal_of(port);
    EXPECT_LT(seconds_since(start), 2.0);
    EXPECT_EQ(e.reason(), RefuseReason::OutOfDescriptors);
    EXPECT_TRUE(e.transient());
    expect_contains(e.what(), {"refused this connection: the serving process is out of file descriptors (its "
                               "open-file limit is 256)",
                               "ulimit -n", "retried within the rendezvous timeout"});
    EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("not a dtcore"), std::string::npos) << e.what();
    // A raw connection while the table stays full: refused in place of the greeting, and the
    // server's thread sleeps meanwhile instead of retrying accept().
    table.take_all();  // the client's socket, closed with it
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ASSERT_EQ(::connect(early.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    store::Refusal refusal = refusal_on(early.get());
    EXPECT_EQ(refusal.reason, RefuseReason::OutOfDescriptors);
    EXPECT_EQ(refusal.number, 256);
    long before = store_thread.ticks();
    std::this_thread::sleep_for(500ms);
    long spent = store_thread.ticks() - before;
    EXPECT_LE(spent, 5) << "the store's thread used " << spent << " ticks in 500 ms with the table full";
  }
  EXPECT_EQ(server->stats().rejected, 2u);
  // Descriptors back: new clients are served again, and the old one never noticed.
  connect_to(*server)->set("after", std::string("yes"));
  EXPECT_EQ(client->get_to_str("after"), "yes");
}

TEST(StoreRefusal, AProbeTakesARefusalForAStoreNotAForeignListener) {
  FakeListener refuser([](int fd) {
    send_raw(fd, frame_of(store::encode_refusal({RefuseReason::OutOfDescriptors, 64, "out of file descriptors"})));
  });
  std::string detail;
  auto deadline = Clock::now() + 2s;
  EXPECT_EQ(store::probe("127.0.0.1", refuser.port(), deadline, deadline, detail), store::Probe::Store);
  expect_contains(detail, {"a dtcore store refused the connection: out of file descriptors"});
  StoreRefused e = client_error({RefuseReason::OutOfDescriptors, 64, "out of file descriptors (limit 64)"}, true);
  expect_contains(e.what(), {"out of file descriptors (limit 64)", "ulimit -n"});
}

TEST(StoreRefusal, ARefusalsMessageIsBoundedAndPrintable) {
  store::Refusal refusal{RefuseReason::WrongSecret, -1, std::string(5000, 'x')};
  refusal.message[0] = '\n';
  store::Bytes encoded = store::encode_refusal(refusal);
  EXPECT_LE(encoded.size(), store::kMaxRefusalBytes);
  auto decoded = store::decode_refusal(encoded);
  ASSERT_TRUE(decoded);
  EXPECT_EQ(decoded->reason, RefuseReason::WrongSecret);
  EXPECT_EQ(decoded->number, -1);
  EXPECT_EQ(decoded->message[0], '?');
  for (size_t n = 0; n < encoded.size(); ++n) EXPECT_FALSE(store::decode_refusal({encoded.data(), n}));
  encoded.push_back(0);
  EXPECT_FALSE(store::decode_refusal(encoded));  // trailing bytes, and over the size limit
  EXPECT_FALSE(store::decode_refusal(store::encode_server_hello({})));
  // A code from a newer version: shown with the server's words and the same-version fix.
  StoreRefused e = client_error({static_cast<RefuseReason>(99), 0, "a reason from the future"});
  EXPECT_FALSE(e.transient());
  expect_contains(e.what(), {"a reason from the future", "refusal code 99 is unknown", "same dtcore version"});
}

TEST(StoreRefusal, AHandshakeDroppedWithoutARefusalIsNeverAWrongSecret) {
  // After a real greeting: closed, reset, or cut in the middle of the proof.
  std::vector<std::function<void(int)>> drops = {
      [](int) {},
      [](int fd) {
        linger reset{1, 0};  // close() sends RST
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      },
      [](int fd) { send_raw(fd, {0, 0, 0, store::kServerProofBytes, 1, 2, 3}); },
  };
  for (auto& drop : drops) {
    FakeListener dropper([&](int fd) {
      send_raw(fd, frame_of(store::encode_server_hello({store::kProtocolVersion, store::random_nonce()})));
      read_frame(fd);  // the client's hello
      drop(fd);
    });
    auto start = Clock::now();
    std::string msg = error_of<c10::DistNetworkError>([&] { StoreClient("127.0.0.1", dropper.port(), kSecret, 2s); });
    EXPECT_LT(seconds_since(start), 1.5);
    expect_contains(msg, {"was dropped during the handshake", "proof of the job secret", "sent no refusal",
                          "not a wrong job secret", "retries within its timeout"});
    EXPECT_EQ(msg.find("does not have this job's secret"), std::string::npos) << msg;
  }
}
