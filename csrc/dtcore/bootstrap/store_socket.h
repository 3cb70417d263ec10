// Socket helpers of dtcore's rendezvous store: an owned descriptor, address resolution and
// formatting, the listening socket, and blocking-with-a-deadline I/O over non-blocking sockets
// for the client.
//
// Every wait here is bounded by a deadline (time_point::max() = none), so no call can block
// forever on a peer that accepts and never answers. See Note [Store protocol] in store_protocol.h.
//
// Ownership: Fd owns its descriptor and closes it once. Thread safety: the functions are
// reentrant; one descriptor is used by one thread at a time (the client serializes with a mutex).
#pragma once

#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dtcore::store {

using Clock = std::chrono::steady_clock;

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = 0;
};

// The addresses of host:port, in the resolver's order, of one family: IPv4 when there is one, else
// IPv6. Empty with `error` set on failure.
std::vector<Address> resolve(const std::string& host, int port, std::string& error);

// "host:port", with brackets around an IPv6 literal: "[::1]:29500".
std::string endpoint(const std::string& host, int port);
// The numeric "ip:port" of an address (a peer, for logs).
std::string address_name(const sockaddr_storage& addr, socklen_t length);

void set_nodelay(int fd);  // requests and answers are small: send them now, not after 40 ms

// A non-blocking socket listening at host:port (port 0: any free one, returned in `bound_port`).
// Only at host's address: the wildcard only when host is "0.0.0.0" or "::". Throws
// RendezvousError naming host:port and the fix (e.g. the port is already in use).
Fd listen_at(const std::string& host, int port, int& bound_port);

enum class IoResult { Ok, Timeout, Closed, Failed };

// Connects a new non-blocking socket to `addr` by `deadline`. On failure returns an invalid Fd
// and sets `error` (e.g. "connection refused", "timed out").
Fd connect_by(const Address& addr, Clock::time_point deadline, std::string& error);
// Resolves host:port (resolve()) and connects to the first of its addresses that accepts by
// `deadline`, one attempt at each; the caller retries the whole. On failure returns an invalid Fd
// and sets `error`; `resolved`, when given, tells a name that does not resolve (false) from
// addresses where nothing accepts (true).
Fd connect_any(const std::string& host, int port, Clock::time_point deadline, std::string& error,
               bool* resolved = nullptr);
// Waits until fd has something to read (or the peer closed) by `deadline`; consumes nothing.
IoResult wait_readable(int fd, Clock::time_point deadline, std::string& error);
// Sends all of `data` by `deadline`. `error` is set on Failed.
IoResult send_all(int fd, const std::uint8_t* data, std::size_t size, Clock::time_point deadline, std::string& error);
// Receives exactly `size` bytes by `deadline`. Closed: the peer closed before all arrived.
IoResult recv_exact(int fd, std::uint8_t* data, std::size_t size, Clock::time_point deadline, std::string& error);

}  // namespace dtcore::store
