#include "dtcore/bootstrap/store_state.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "dtcore/common/error.h"

// See Note [Store protocol] in store_protocol.h.

namespace dtcore::store {
namespace {

Bytes to_bytes(std::string_view s) { return Bytes(s.begin(), s.end()); }

Response ok(std::vector<Bytes> values = {}, std::int64_t number = 0) {
  return Response{Status::Ok, std::move(values), number};
}

Response error(const std::string& message) { return Response{Status::Error, {to_bytes(message)}, 0}; }

std::string size_text(std::size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return detail::cat(bytes >> 20, " MiB");
  return detail::cat(bytes, " bytes");
}

// A key for a message: keys are the client's bytes and may be long.
std::string quoted(std::string_view key) {
  return detail::cat("'", key.substr(0, 200), key.size() > 200 ? "...'" : "'");
}

}  // namespace

StoreState::StoreState(std::size_t max_stored_bytes, std::size_t max_frame_bytes)
    : max_stored_bytes_(max_stored_bytes), max_frame_bytes_(max_frame_bytes) {}

std::optional<Response> StoreState::apply(ConnId conn, const Request& request) {
  const std::string empty;
  const std::string& key = request.keys.empty() ? empty : request.keys[0];
  switch (request.op) {
    case Op::Set: return put(key, request.values[0]);
    case Op::CompareSet: {
      // c10d's semantics (TCPStore): a missing key is set only when `expected` is empty; the
      // answer is the value stored afterwards, or `expected` when the key is missing.
      const Bytes& expected = request.values[0];
      const Bytes& desired = request.values[1];
      auto it = values_.find(key);
      if (it == values_.end()) {
        if (!expected.empty()) return ok({expected});
        if (Response r = put(key, desired); r.status != Status::Ok) return r;
        return ok({desired});
      }
      if (it->second == expected) {
        if (Response r = put(key, desired); r.status != Status::Ok) return r;
      }
      return checked(ok({it->second}));  // `it` stays valid: a key that exists is overwritten in place
    }
    case Op::Get:
    case Op::Wait:
    case Op::MultiGet: return park_or_answer(conn, request);
    case Op::Add: return add(key, request.number);
    case Op::DeleteKey: {
      auto it = values_.find(key);
      if (it == values_.end()) return ok({}, 0);
      stored_bytes_ -= it->first.size() + it->second.size();
      values_.erase(it);
      return ok({}, 1);
    }
    case Op::Check: {
      bool all = std::all_of(request.keys.begin(), request.keys.end(),
                             [&](const std::string& k) { return values_.count(k) != 0; });
      return ok({}, all ? 1 : 0);
    }
    case Op::NumKeys: return ok({}, static_cast<std::int64_t>(values_.size()));
    case Op::Append: {
      auto it = values_.find(key);
      Bytes joined = it == values_.end() ? Bytes() : it->second;
      joined.insert(joined.end(), request.values[0].begin(), request.values[0].end());
      return put(key, std::move(joined));
    }
    case Op::MultiSet: return multi_set(request);
    case Op::ListKeys: {
      std::vector<Bytes> keys;
      keys.reserve(values_.size());
      for (const auto& [k, v] : values_) keys.push_back(to_bytes(k));
      return checked(ok(std::move(keys), static_cast<std::int64_t>(values_.size())));
    }
    case Op::QueuePush: return queue_push(key, request.values[0]);
    case Op::QueuePop: return park_or_answer(conn, request);
    case Op::QueueLen: {
      auto it = queues_.find(key);
      return ok({}, it == queues_.end() ? 0 : static_cast<std::int64_t>(it->second.size()));
    }
    case Op::Cancel: break;  // handled by the server, which owns the connection
  }
  return error(detail::cat("op ", op_name(request.op), " cannot be applied to the store's data"));
}

std::vector<Released> StoreState::take_released() { return std::exchange(released_, {}); }

bool StoreState::drop_parked(ConnId conn) {
  auto it = parked_.find(conn);
  if (it == parked_.end()) return false;
  const Parked& p = it->second;
  if (p.on_queue) {
    auto w = queue_waiters_.find(p.waiting_on);
    if (w != queue_waiters_.end()) {
      std::erase(w->second, conn);
      if (w->second.empty()) queue_waiters_.erase(w);
    }
  } else {
    auto w = key_waiters_.find(p.waiting_on);
    if (w != key_waiters_.end()) {
      std::erase(w->second, conn);
      if (w->second.empty()) key_waiters_.erase(w);
    }
  }
  parked_.erase(it);
  return true;
}

std::optional<Response> StoreState::try_answer(const Request& request, std::string& missing) const {
  const bool wants_values = request.op != Op::Wait;
  std::vector<const Bytes*> found;  // copied into the answer only once every key is there
  if (wants_values) found.reserve(request.keys.size());
  for (const std::string& k : request.keys) {
    auto it = values_.find(k);
    if (it == values_.end()) {
      missing = k;
      return std::nullopt;
    }
    if (wants_values) found.push_back(&it->second);
  }
  if (!wants_values) return ok();
  std::vector<Bytes> values;
  values.reserve(found.size());
  for (const Bytes* v : found) values.push_back(*v);
  return checked(ok(std::move(values)));
}

std::optional<Response> StoreState::park_or_answer(ConnId conn, const Request& request) {
  if (request.op == Op::QueuePop) {
    const std::string& key = request.keys[0];
    auto it = queues_.find(key);
    if (it != queues_.end() && !it->second.empty()) {
      Bytes value = std::move(it->second.front());
      it->second.pop_front();
      stored_bytes_ -= key.size() + value.size();
      if (it->second.empty()) queues_.erase(it);
      return ok({std::move(value)});
    }
    if (request.number == 0) return Response{Status::QueueEmpty, {}, 0};
    parked_[conn] = Parked{request, key, true};
    queue_waiters_[key].push_back(conn);
    return std::nullopt;
  }
  std::string missing;
  if (auto answer = try_answer(request, missing)) return answer;
  parked_[conn] = Parked{request, missing, false};
  key_waiters_[missing].push_back(conn);
  return std::nullopt;
}

void StoreState::key_written(const std::string& key) {
  auto w = key_waiters_.find(key);
  if (w == key_waiters_.end()) return;
  std::vector<ConnId> waiting = std::move(w->second);
  key_waiters_.erase(w);
  for (ConnId conn : waiting) {
    auto p = parked_.find(conn);
    if (p == parked_.end()) continue;
    std::string missing;
    if (auto answer = try_answer(p->second.request, missing)) {
      released_.push_back(Released{conn, std::move(*answer)});
      parked_.erase(p);
    } else {
      p->second.waiting_on = missing;
      key_waiters_[missing].push_back(conn);
    }
  }
}

Response StoreState::put(const std::string& key, Bytes value) {
  auto it = values_.find(key);
  std::size_t old_size = it == values_.end() ? 0 : key.size() + it->second.size();
  std::size_t new_size = key.size() + value.size();
  if (new_size > old_size && stored_bytes_ - old_size + new_size > max_stored_bytes_) {
    return over_limit(key, new_size - old_size);
  }
  store(it, key, std::move(value));
  return ok();
}

void StoreState::store(Values::iterator it, const std::string& key, Bytes value) {
  std::size_t old_size = it == values_.end() ? 0 : key.size() + it->second.size();
  stored_bytes_ = stored_bytes_ - old_size + key.size() + value.size();
  if (it == values_.end()) {
    values_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  key_written(key);
}

Response StoreState::add(const std::string& key, std::int64_t delta) {
  std::int64_t current = 0;
  auto it = values_.find(key);
  if (it != values_.end()) {
    const char* begin = reinterpret_cast<const char*>(it->second.data());
    const char* end = begin + it->second.size();
    auto [ptr, ec] = std::from_chars(begin, end, current);
    if (ec != std::errc() || ptr != end || it->second.empty()) {
      return error(detail::cat("add() on key ", quoted(key), ", whose value (", it->second.size(),
                               " bytes) is not a decimal integer. Fix: use add() only on keys that are "
                               "written by add() alone."));
    }
  }
  std::int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    return error(detail::cat("add(", delta, ") on key ", quoted(key), " overflows its value ", current, "."));
  }
  if (Response r = put(key, to_bytes(std::to_string(result))); r.status != Status::Ok) return r;
  return ok({}, result);
}

Response StoreState::multi_set(const Request& request) {
  // All or nothing: the growth of the whole batch (the last value of a repeated key wins) is
  // checked against the limit before anything is written.
  std::unordered_map<std::string_view, std::size_t> last;
  for (std::size_t i = 0; i < request.keys.size(); ++i) last[request.keys[i]] = request.values[i].size();
  std::size_t grown = stored_bytes_;
  for (const auto& [k, size] : last) {
    auto it = values_.find(std::string(k));
    grown = grown + k.size() + size - (it == values_.end() ? 0 : k.size() + it->second.size());
  }
  if (grown > stored_bytes_ && grown > max_stored_bytes_) {
    return over_limit(request.keys.empty() ? "" : request.keys[0], grown - stored_bytes_);
  }
  // Checked as a whole above: written without a check per key, which could refuse one key that
  // grows before another shrinks, and answer Ok with that key unwritten.
  for (std::size_t i = 0; i < request.keys.size(); ++i) {
    store(values_.find(request.keys[i]), request.keys[i], request.values[i]);
  }
  return ok();
}

Response StoreState::queue_push(const std::string& key, Bytes value) {
  std::size_t size = key.size() + value.size();
  if (stored_bytes_ + size > max_stored_bytes_) return over_limit(key, size);
  stored_bytes_ += size;
  auto& queue = queues_[key];
  queue.push_back(std::move(value));
  auto w = queue_waiters_.find(key);
  while (w != queue_waiters_.end() && !w->second.empty() && !queue.empty()) {
    ConnId conn = w->second.front();
    w->second.pop_front();
    if (parked_.erase(conn) == 0) continue;
    Bytes front = std::move(queue.front());
    queue.pop_front();
    stored_bytes_ -= key.size() + front.size();
    released_.push_back(Released{conn, ok({std::move(front)})});
  }
  if (w != queue_waiters_.end() && w->second.empty()) queue_waiters_.erase(w);
  if (queue.empty()) queues_.erase(key);
  return ok();
}

Response StoreState::over_limit(const std::string& key, std::size_t growth) const {
  return error(detail::cat("key ", quoted(key), " would add ", growth, " bytes to the ", stored_bytes_,
                           " bytes the store holds, over its limit of ", size_text(max_stored_bytes_),
                           ". The store is for rendezvous metadata, not data. Fix: store less, or raise "
                           "StoreServerOptions::max_stored_bytes where the server is created."));
}

Response StoreState::too_large(std::size_t bytes) const {
  return error(detail::cat("the answer would be ", bytes, " bytes, over the store's frame limit of ",
                           size_text(max_frame_bytes_),
                           ". Fix: read fewer or smaller values at a time, or raise "
                           "StoreServerOptions::max_frame_bytes where the server is created."));
}

Response StoreState::checked(Response response) const {
  std::size_t bytes = response_bytes(response.values);
  if (bytes > max_frame_bytes_) return too_large(bytes);
  return response;
}

}  // namespace dtcore::store
