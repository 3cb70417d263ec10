// with_deadline(): runs a probe that may block without bound (NVML on a GPU that fell off the bus,
// a DNS resolver that does not answer) on a thread of its own and stops waiting after `limit`.
// A probe that misses its deadline is left to finish on its detached thread; the result is then
// discarded, and the checker reports the hang instead of becoming one. The callable must own
// everything it touches (capture by value). Thread safety: any thread.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>

namespace dtcore::check {

template <typename T, typename Fn>
std::optional<T> with_deadline(Fn fn, std::chrono::milliseconds limit) {
  auto done = std::make_shared<std::promise<T>>();
  std::future<T> result = done->get_future();
  std::thread([done, fn = std::move(fn)]() mutable {
    try {
      done->set_value(fn());
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(limit) != std::future_status::ready) return std::nullopt;
  return result.get();
}

}  // namespace dtcore::check
