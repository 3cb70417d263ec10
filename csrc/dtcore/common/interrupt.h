// Interrupts: lets a long C++ wait (the rendezvous, a collective's polling) end on Ctrl-C.
//
// dtcore's core knows no Python, yet Python only sets a flag when SIGINT arrives and acts on it
// when control returns to the interpreter, which a blocking C++ wait never does. The binding
// installs a check that tells whether Python has a signal pending (its handler has then raised,
// e.g. KeyboardInterrupt); waits call check_interrupt() between polls (an interruptible Backoff's pause()
// does, once its sleeps reach a millisecond), which throws Interrupted, and the binding hands Python its own
// exception back. Code that turns std::exception into its own errors lets Interrupted through.
// Thread safety: set once at start-up (module import); check_interrupt() from any thread (the
// check acts only on Python's main thread).
#pragma once

#include <exception>

namespace dtcore {

// A wait abandoned for a signal; not a dtcore::Error: nothing went wrong, the user asked.
struct Interrupted : std::exception {
  const char* what() const noexcept override { return "interrupted by a signal (Ctrl-C)"; }
};

// True when a signal asks to abandon the wait.
using InterruptCheck = bool (*)();

// Installs `check` (nullptr: none).
void set_interrupt_check(InterruptCheck check);

// Throws Interrupted when the installed check says so.
void check_interrupt();

}  // namespace dtcore
