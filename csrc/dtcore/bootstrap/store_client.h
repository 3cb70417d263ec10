// StoreClient: a c10d::Store on dtcore's authenticated rendezvous store (StoreServer).
//
// torch.distributed and Gloo run on it as on c10d's TCPStore: set/get/add/wait/compareSet/
// deleteKey/check/getNumKeys, the extended API (append, multiGet, multiSet), listKeys and the
// queue ops. Unlike TCPStore's client it never blocks without a deadline: the constructor
// connects and does the handshake by its timeout, in ONE attempt (callers retry), and every
// operation is bounded by the store's timeout (wait(keys, timeout): by the one given; a timeout
// of zero, c10d's kNoTimeout, waits without limit). See Note [Store protocol] in store_protocol.h.
//
// Errors:
//   c10::DistNetworkError  connecting failed (refused, unreachable, no answer), the connection was
//                          dropped in the handshake without the server saying why, or it was lost
//                          (the server stopped); the client is then unusable: make a new one.
//   dtcore::RendezvousError the listener at host:port is not a dtcore store, or speaks another
//                          protocol version (the message gives the fix).
//   dtcore::StoreRefused   (a RendezvousError) the server refused the handshake and said why, or
//                          its proof shows another job secret (reason WrongSecret).
//   c10::DistStoreError    an operation timed out (naming the keys and the time waited, like
//                          TCPStore), or the server refused it (e.g. its stored-bytes limit).
//   c10::DistQueueEmptyError  queuePop(key, block=false) on an empty queue.
//
// Ownership: owns one connection (and the job secret, for clone()). Thread safety: any number of
// threads may share one client; a mutex serializes their requests on the connection, as
// TCPStore's does. clone() gives a thread its own connection. setTimeout() applies to the next
// operation, not to one already waiting.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/bootstrap/store_protocol.h"
#include "dtcore/bootstrap/store_socket.h"
#include "dtcore/common/error.h"

namespace dtcore {

// The store refused this client's handshake: the server's reason (Note [Store protocol]) and the
// fix in the message. transient(): a retry within the rendezvous deadline may succeed.
// In the message of the DistNetworkError for a handshake dropped without a Refusal, so that a
// caller that retries can tell it from "nothing accepts there".
inline constexpr std::string_view kDroppedInHandshake = "was dropped during the handshake";

class StoreRefused : public RendezvousError {
 public:
  StoreRefused(store::RefuseReason reason, const std::string& message) : RendezvousError(message), reason_(reason) {}
  store::RefuseReason reason() const { return reason_; }
  bool transient() const { return store::is_transient(reason_); }

 private:
  store::RefuseReason reason_;
};

class StoreClient : public c10d::Store {
 public:
  // Connects to host:port and authenticates with `secret` by `timeout` (kNoTimeout: by
  // Store::kDefaultTimeout), which also becomes the store's timeout. Throws as listed above.
  StoreClient(std::string host, int port, std::string secret,
              std::chrono::milliseconds timeout = c10d::Store::kDefaultTimeout);
  ~StoreClient() override;

  // A new authenticated connection to the same server, with the same secret and timeout.
  c10::intrusive_ptr<c10d::Store> clone() override;

  using c10d::Store::set;
  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  using c10d::Store::compareSet;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;  // waits for the key
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  void setTimeout(const std::chrono::milliseconds& timeout) override;

  void append(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<std::vector<uint8_t>> multiGet(const std::vector<std::string>& keys) override;  // waits for all
  void multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) override;
  bool hasExtendedApi() const override { return true; }
  std::vector<std::string> listKeys() override;

  void queuePush(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> queuePop(const std::string& key, bool block) override;
  int64_t queueLen(const std::string& key) override;

  const std::string& host() const { return host_; }
  int port() const { return port_; }
  // Keeps `owner` (the StoreServer on the rank that serves it) alive as long as this client or
  // any of its clones lives, as c10d's TCPStore keeps its server: torch.distributed may hold the
  // store after dtcore let go of it.
  void hold(std::shared_ptr<void> owner) { owner_ = std::move(owner); }

 private:
  void handshake(std::chrono::milliseconds timeout);
  [[noreturn]] void refused(const store::Refusal& refusal);  // StoreRefused with the fix for its reason
  // Sends `request` and returns the server's answer (status Ok or QueueEmpty); throws otherwise.
  store::Response call(const store::Request& request, std::chrono::milliseconds timeout);
  // Reads one answer frame. Timeout only when nothing of it had arrived by `deadline`.
  store::IoResult read_answer(store::Clock::time_point deadline, store::Response& answer, std::string& error);
  // After a timeout: cancels the parked request. False when the connection must be given up;
  // `late` gets an answer that crossed the cancel on the wire.
  bool cancel(std::optional<store::Response>& late, std::string& error);
  void drop(const std::string& why);  // gives the connection up; later calls fail naming `why`
  [[noreturn]] void lose(const store::Request& request, const std::string& why);  // drop(), DistNetworkError
  [[noreturn]] void timed_out(const store::Request& request, std::chrono::milliseconds timeout);  // DistStoreError
  std::chrono::milliseconds current_timeout() const { return std::chrono::milliseconds(timeout_ms_.load()); }

  const std::string host_;
  const int port_;
  const std::string secret_;           // kept for clone()
  const std::string where_;            // "host:port", for messages
  std::mutex mutex_;                   // one request at a time on the connection: answers come in order
  store::Fd fd_;                       // guarded by mutex_; invalid once the connection is lost
  std::string lost_;                   // guarded by mutex_; why the connection was lost, for later calls
  std::uint32_t max_frame_bytes_ = 0;  // the server's frame limit, from its handshake proof
  // A copy of Store::timeout_ that operations read: timeout_ itself is a plain member that
  // setTimeout() writes while other threads may be reading it.
  std::atomic<std::int64_t> timeout_ms_;
  std::shared_ptr<void> owner_;  // see hold(); shared with clones
};

namespace store {

enum class Probe {
  Store,    // a dtcore store greeted, or refused the connection (Note [Store protocol])
  Nothing,  // nothing serves there yet (refused, unreachable, or closed at once): retry later
  Silent,   // something accepted the connection and said nothing within the wait
  Foreign,  // something accepted and sent something other than a greeting
};

// One connection to host:port: does a dtcore store greet there? Connecting is bounded by
// `connect_deadline`, the greeting by `greeting_deadline`; consumes no secret (the handshake does not start).
// `detail` says what was seen, for messages.
Probe probe(const std::string& host, int port, Clock::time_point connect_deadline, Clock::time_point greeting_deadline,
            std::string& detail);

}  // namespace store

}  // namespace dtcore
