#include "dtcore/common/interrupt.h"

#include <atomic>

namespace dtcore {
namespace {
std::atomic<InterruptCheck> g_check{nullptr};
}  // namespace

void set_interrupt_check(InterruptCheck check) { g_check.store(check, std::memory_order_release); }

void check_interrupt() {
  InterruptCheck check = g_check.load(std::memory_order_acquire);
  if (check != nullptr && check()) throw Interrupted();
}

}  // namespace dtcore
