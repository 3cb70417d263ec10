// Helpers for tests that check messages by substring: the message of a thrown error, and parts in a text.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>
#include <typeinfo>

namespace dtcore::testing {

// The message of the E that `fn` throws; fails the test (and returns "") when it throws nothing.
// Another exception type propagates, which fails the test with its message.
template <typename E, typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", but nothing was thrown";
  return "";
}

// Each part somewhere in `text`.
inline void expect_contains(const std::string& text, std::initializer_list<const char*> parts) {
  for (const char* part : parts) EXPECT_NE(text.find(part), std::string::npos) << "'" << part << "' not in: " << text;
}

}  // namespace dtcore::testing
