// call_until(): runs a call that may block without bound on a helper thread, and waits for it
// only until a deadline.
//
// For calls into code with no timeout of its own, e.g. c10d's TCPStore client, which waits for a
// reply forever when its server accepts and never answers. At the deadline the caller gets
// nullopt and goes on; the helper thread is detached, stays blocked, and frees what it holds if
// the call ever returns. An exception the call throws comes back as nullopt with `error` set
// (error_text()); a call that timed out leaves `error` empty.
//
// Ownership: the call's result is shared between caller and helper until both let go. Thread
// safety: each call_until() is independent; `fn` runs on the helper thread, so it must own (copy)
// everything it uses.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "dtcore/common/c10_error.h"

namespace dtcore {

template <typename T, typename Fn>
std::optional<T> call_until(std::chrono::steady_clock::time_point deadline, Fn fn, std::string& error) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<T> value;
    std::string error;
  };
  auto shared = std::make_shared<Shared>();
  std::thread([shared, fn = std::move(fn)]() mutable {
    std::optional<T> value;
    std::string failure;
    try {
      value = fn();
    } catch (const std::exception& e) {
      failure = error_text(e);
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->value = std::move(value);
    shared->error = std::move(failure);
    shared->done = true;
    shared->done_cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(shared->mutex);
  if (!shared->done_cv.wait_until(lock, deadline, [&] { return shared->done; })) return std::nullopt;
  error = std::move(shared->error);
  return std::move(shared->value);
}

}  // namespace dtcore
