// Backoff: the sleep between polls of something that is not ready yet.
//
// Starts short, so that a wait that ends soon ends soon, and doubles up to a cap, so that a long
// wait costs neither CPU nor requests to a shared server. Each waiter picks its own bounds (a
// CUDA event: microseconds; the rendezvous store, polled by every rank: milliseconds). A wait the
// user sits in (the rendezvous) is made interruptible: once its sleeps reach a millisecond, each
// pause first checks for Ctrl-C (interrupt.h); shorter sleeps skip the check, which costs a lock.
// Teardown loops stay uninterruptible, so that Ctrl-C never leaves a half-closed engine.
// Thread safety: one Backoff per waiting loop.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

#include "dtcore/common/interrupt.h"

namespace dtcore {

class Backoff {
 public:
  enum class Interrupt { kIgnore, kCheck };

  Backoff(std::chrono::microseconds first, std::chrono::microseconds cap, Interrupt interrupt = Interrupt::kIgnore)
      : delay_(first), cap_(cap), interruptible_(interrupt == Interrupt::kCheck) {}

  // Throws Interrupted (interrupt.h) when interruptible and Ctrl-C is pending.
  void pause() {
    if (interruptible_ && delay_ >= std::chrono::milliseconds(1)) check_interrupt();
    std::this_thread::sleep_for(delay_);
    delay_ = std::min(delay_ * 2, cap_);
  }

 private:
  std::chrono::microseconds delay_;
  const std::chrono::microseconds cap_;
  const bool interruptible_;
};

}  // namespace dtcore
