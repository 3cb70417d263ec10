// with_deadline(): runs a call that may block without bound on a thread of its own, and waits for
// it only until a deadline.
//
// For calls into code with no timeout of its own: NVML on a GPU that fell off the bus, a DNS
// resolver that does not answer, c10d's TCPStore client, which waits for a reply forever when its
// server accepts and never answers. At the deadline the caller gets nullopt and goes on, reporting
// the hang instead of becoming one; the thread is detached, stays blocked, and frees what it holds
// (the result is discarded) if the call ever returns. An exception the call throws in time is
// rethrown to the caller.
//
// Ownership: the call's result is shared between caller and helper thread until both let go.
// Thread safety: any thread; each with_deadline() is independent. `fn` runs on the helper thread,
// so it must own (capture by value) everything it touches.
#pragma once

#include <chrono>
#include <exception>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

namespace dtcore {

template <typename T, typename Fn>
std::optional<T> with_deadline(Fn fn, std::chrono::steady_clock::time_point deadline) {
  auto done = std::make_shared<std::promise<T>>();
  std::future<T> result = done->get_future();
  std::thread([done, fn = std::move(fn)]() mutable {
    try {
      done->set_value(fn());
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_until(deadline) != std::future_status::ready) return std::nullopt;
  return result.get();
}

template <typename T, typename Fn>
std::optional<T> with_deadline(Fn fn, std::chrono::milliseconds limit) {
  return with_deadline<T>(std::move(fn), std::chrono::steady_clock::now() + limit);
}

}  // namespace dtcore
