// Helpers for the rendezvous store tests: a server on loopback, clients, and raw sockets that
// play foreign or misbehaving peers.
#pragma once

#include <gtest/gtest.h>

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "dtcore/bootstrap/store_client.h"
#include "dtcore/bootstrap/store_protocol.h"
#include "dtcore/bootstrap/store_server.h"
#include "dtcore/bootstrap/store_socket.h"

namespace dtcore::testing {

using namespace std::chrono_literals;
using store::Clock;
using store::Fd;

inline const std::string kSecret = "this-job's-secret\x01\x02";

inline std::unique_ptr<StoreServer> start_server(StoreServerOptions options = {}, const std::string& secret = kSecret) {
  return std::make_unique<StoreServer>("127.0.0.1", 0, secret, options);
}

inline c10::intrusive_ptr<StoreClient> connect_to(const StoreServer& server, std::chrono::milliseconds timeout = 5s,
                                                  const std::string& secret = kSecret) {
  return c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), secret, timeout);
}

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
inline std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// A plain TCP connection to 127.0.0.1:port (a blocking socket whose reads give up after 5 s).
inline Fd raw_connect(int port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval five_seconds{5, 0};  // a test that waits for a byte that never comes fails instead of hanging
  setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &five_seconds, sizeof(five_seconds));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "raw connect to " << port;
  return fd;
}

// A listening socket on 127.0.0.1 that nobody serves; its port through `port`.
inline Fd raw_listener(int& port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(fd.get(), 16), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

// The StoreRefused a new client of 127.0.0.1:port gets; fails the test when it is not refused.
inline StoreRefused refusal_of(int port, const std::string& secret = kSecret, std::chrono::milliseconds timeout = 5s) {
  try {
    StoreClient("127.0.0.1", port, secret, timeout);
  } catch (const StoreRefused& e) {
    return e;
  }
  ADD_FAILURE() << "the client of port " << port << " was not refused";
  return StoreRefused(store::RefuseReason::Malformed, "");
}

// A listener on loopback whose accepted connections are handed, one at a time, to `act` on a
// thread: a stand-in for a foreign program, or for an impostor or a failing store that speaks
// the protocol.
class FakeListener {
 public:
  explicit FakeListener(std::function<void(int fd)> act) : listener_(raw_listener(port_)) {
    thread_ = std::thread([this, act = std::move(act)] {
      for (;;) {
        Fd conn(::accept(listener_.get(), nullptr, nullptr));
        if (!conn.valid()) return;
        act(conn.get());
      }
    });
  }
  ~FakeListener() {
    ::shutdown(listener_.get(), SHUT_RDWR);  // wakes accept()
    thread_.join();
  }
  int port() const { return port_; }

 private:
  int port_ = 0;
  Fd listener_;
  std::thread thread_;
};

inline void send_raw(int fd, const store::Bytes& data) {
  ASSERT_EQ(::send(fd, data.data(), data.size(), MSG_NOSIGNAL), static_cast<ssize_t>(data.size()));
}

inline store::Bytes frame_of(const store::Bytes& payload) {
  store::Bytes out;
  store::append_frame(out, payload);
  return out;
}

// True when the peer closes `fd` within `wait`; whatever it sends first (a greeting) is skipped.
inline bool closed_within(int fd, std::chrono::milliseconds wait) {
  Clock::time_point deadline = Clock::now() + wait;
  char buf[4096];
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left < 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) return false;
    ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
  }
}

// Reads one frame's payload from a blocking raw socket (empty on EOF).
inline store::Bytes read_frame(int fd) {
  std::string error;
  uint8_t header[4];
  auto deadline = Clock::now() + 5s;
  if (store::recv_exact(fd, header, 4, deadline, error) != store::IoResult::Ok) return {};
  store::Bytes payload(store::read_frame_length(header));
  if (store::recv_exact(fd, payload.data(), payload.size(), deadline, error) != store::IoResult::Ok) return {};
  return payload;
}

// Does the client side of the handshake by hand over a raw socket, so that a test can then
// send what a real client never would.
inline void raw_handshake(int fd, const std::string& secret = kSecret) {
  auto hello = store::decode_server_hello(read_frame(fd));
  ASSERT_TRUE(hello.has_value());
  store::ClientHello mine;
  mine.nonce = store::random_nonce();
  mine.mac = store::client_mac(secret, hello->nonce, mine.nonce);
  send_raw(fd, frame_of(store::encode_client_hello(mine)));
  auto proof = store::decode_server_proof(read_frame(fd));
  ASSERT_TRUE(proof.has_value());
  ASSERT_EQ(proof->mac, store::server_mac(secret, hello->nonce, mine.nonce));
}

}  // namespace dtcore::testing
