// error_text(): an exception's message for a user, without c10's C++ backtrace.
//
// c10::Error::what() appends a stack trace of torch's frames, which tells a user nothing; every
// dtcore message that quotes a torch error quotes this instead. Needs only c10 (not torch), and
// is never included by the logging facade. Thread safety: a pure function.
#pragma once

#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace dtcore {

inline std::string error_text(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

}  // namespace dtcore
