// StoreServer: dtcore's rendezvous store server, an authenticated TCP key-value store.
//
// Listens only at the address it is given ("127.0.0.1" = loopback only; the wildcard only when
// the caller passes "0.0.0.0" or "::"), greets every connection with a challenge and serves only
// clients that prove the job's secret (StoreClient, store_client.h). Everything a stranger can
// make it hold is bounded: frame size, stored bytes, the handshake deadline and the number of
// unauthenticated connections (the oldest are dropped first). Malformed input closes that one
// connection, logged at debug level; in the handshake the client is first told why (a Refusal),
// even when the process is out of descriptors. See Note [Store protocol] in store_protocol.h.
//
// Ownership: owns its listening socket, its connections and one thread, which runs a poll()
// loop over non-blocking sockets and owns all stored data (StoreState), so the data path takes
// no locks. stop() (or the destructor) wakes the thread through an eventfd, joins it and closes
// every connection: clients then get an error, never a hang. Thread safety: the constructor
// and destructor are for one thread; port(), host(), stats() and stop() may be called from any.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace dtcore {

struct StoreServerOptions {
  // The largest request or answer. A bigger frame closes its connection; a bigger answer
  // (multiGet, listKeys, a long append) is refused with an error.
  std::size_t max_frame_bytes = 16u << 20;
  // Key and value bytes across the whole store; a write past it gets an error.
  std::size_t max_stored_bytes = 1u << 30;
  // An unauthenticated connection is closed when its handshake is not done by then.
  std::chrono::milliseconds handshake_timeout{5'000};
  // Unauthenticated connections held at once; past it the oldest is dropped, so that a flood of
  // idle sockets cannot keep real clients out. Every rank of a job may connect in the same
  // instant, so it is generous: an idle stranger costs only a descriptor until its deadline.
  std::size_t max_unauthenticated = 1024;
};

// Counters for tests and diagnostics; a snapshot, each value read atomically.
struct StoreServerStats {
  std::uint64_t accepted = 0;         // connections accepted
  std::uint64_t authenticated = 0;    // connections that passed the handshake
  std::uint64_t rejected = 0;         // refused in the handshake (or at EMFILE), or closed for malformed input
  std::uint64_t timed_out = 0;        // closed at the handshake deadline
  std::uint64_t dropped = 0;          // unauthenticated, dropped for newer ones
  std::uint64_t open = 0;             // connections open now
  std::uint64_t unauthenticated = 0;  // of which still in the handshake
};

class StoreServer {
 public:
  // Binds host:port (port 0: any free port, see port()) and starts serving. Throws ConfigError
  // for an empty host or secret or an option out of range, RendezvousError when the address
  // cannot be bound (e.g. the port is already in use), naming host:port and the fix.
  StoreServer(const std::string& host, int port, std::string secret, StoreServerOptions options = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  const std::string& host() const { return host_; }
  int port() const { return port_; }  // the port really bound
  StoreServerStats stats() const;
  // Closes every connection and the listener; idempotent. The destructor calls it.
  void stop();

 private:
  class Loop;  // the poll loop, its connections and the data, in store_server.cpp

  std::string host_;
  int port_ = 0;
  std::unique_ptr<Loop> loop_;
  std::thread thread_;
  std::mutex stop_mutex_;  // stop() from two threads joins once
};

}  // namespace dtcore
