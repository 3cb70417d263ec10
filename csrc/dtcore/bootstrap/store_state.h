// StoreState: the keys, values, queues and parked requests of dtcore's rendezvous store.
//
// The data half of StoreServer (store_server.h), kept apart from its sockets: apply() takes one
// decoded, authenticated request of a connection and returns its answer, or parks it (a get,
// wait or multiGet of a missing key; a blocking queuePop of an empty queue) until a later write
// releases it. The server collects released answers with take_released() after every apply().
// Values count against a stored-bytes limit; an answer that would not fit in one frame becomes an
// error answer. See Note [Store protocol] in store_protocol.h for the ops and their semantics.
//
// Ownership: owns all stored data. Thread safety: none; it belongs to the server's thread, which
// is why the data path takes no locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dtcore/bootstrap/store_protocol.h"

namespace dtcore::store {

using ConnId = std::uint64_t;

struct Released {
  ConnId conn;
  Response response;
};

class StoreState {
 public:
  StoreState(std::size_t max_stored_bytes, std::size_t max_frame_bytes);

  // Applies a request whose shape_ok() holds and whose op is not Cancel. Returns the answer, or
  // nullopt when the request is parked (at most one per connection).
  std::optional<Response> apply(ConnId conn, const Request& request);
  // The answers to parked requests that earlier apply() calls released, oldest first.
  std::vector<Released> take_released();
  // Forgets the connection's parked request (canceled, or the connection closed). True if one was parked.
  bool drop_parked(ConnId conn);
  bool is_parked(ConnId conn) const { return parked_.count(conn) != 0; }

  std::size_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Parked {
    Request request;
    // The one key (or queue) it is registered under in key_waiters_ (queue_waiters_): the first
    // missing one. A write of that key re-checks the request and moves it to the next missing key,
    // so a request waits in exactly one list and cancel finds it there.
    std::string waiting_on;
    bool on_queue = false;
  };

  // The answer to a get, wait or multiGet if all its keys exist; otherwise the first missing key.
  std::optional<Response> try_answer(const Request& request, std::string& missing) const;
  using Values = std::unordered_map<std::string, Bytes>;

  // Stores key = value if the limit allows; the error answer otherwise.
  Response put(const std::string& key, Bytes value);
  // Stores key = value and wakes its waiters, without the limit check (the caller made it). `it`
  // is values_.find(key), which the caller has already looked up.
  void store(Values::iterator it, const std::string& key, Bytes value);
  Response add(const std::string& key, std::int64_t delta);
  Response multi_set(const Request& request);
  Response queue_push(const std::string& key, Bytes value);
  std::optional<Response> park_or_answer(ConnId conn, const Request& request);
  // Re-checks the requests waiting on `key`, which was just written.
  void key_written(const std::string& key);
  Response over_limit(const std::string& key, std::size_t growth) const;
  Response too_large(std::size_t bytes) const;
  Response checked(Response response) const;  // an error answer instead of a frame over the limit

  const std::size_t max_stored_bytes_;
  const std::size_t max_frame_bytes_;
  Values values_;
  std::unordered_map<std::string, std::deque<Bytes>> queues_;  // a namespace apart from values_, as TCPStore's
  std::size_t stored_bytes_ = 0;                               // key and value bytes of every entry and queue item
  std::unordered_map<ConnId, Parked> parked_;
  std::unordered_map<std::string, std::vector<ConnId>> key_waiters_;   // in arrival order
  std::unordered_map<std::string, std::deque<ConnId>> queue_waiters_;  // served first come, first served
  std::vector<Released> released_;
};

}  // namespace dtcore::store
