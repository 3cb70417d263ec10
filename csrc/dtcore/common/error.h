// dtcore errors: the four kinds every user-facing failure belongs to, and the one check macro.
//
// Contract: an error message names what happened, where (rank, host, variable, value) and what
// to do about it. Messages are part of the interface and are tested. The kinds map one-to-one
// onto the Python classes dtcore.ConfigError, RendezvousError, CommError, CheckpointError (all
// subclasses of dtcore.DtcoreError); see csrc/bindings/module.cpp.
//
// Thread safety: the types are plain values; throwing from any thread is fine.
#pragma once

#include <exception>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtcore {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bad launcher environment, DTCORE_* variable or argument. Raised before anything is started.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Rendezvous failed: timeout with missing ranks, port taken, store unreachable, version mismatch.
class RendezvousError : public Error {
 public:
  using Error::Error;
};

// A collective failed or timed out, or a peer rank died.
class CommError : public Error {
 public:
  using Error::Error;
};

// A checkpoint could not be written, read or verified.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// The Python class an error becomes ("ConfigError", ..., "RuntimeError" for any other exception)
// and its message: for errors that are recorded as well as raised.
inline std::pair<std::string, std::string> describe_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const ConfigError& e) {
    return {"ConfigError", e.what()};
  } catch (const RendezvousError& e) {
    return {"RendezvousError", e.what()};
  } catch (const CommError& e) {
    return {"CommError", e.what()};
  } catch (const CheckpointError& e) {
    return {"CheckpointError", e.what()};
  } catch (const Error& e) {
    return {"DtcoreError", e.what()};
  } catch (const std::exception& e) {
    return {"RuntimeError", e.what()};
  } catch (...) {
    return {"RuntimeError", "an exception that is not a std::exception"};
  }
}

namespace detail {
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

}  // namespace dtcore

// DTCORE_CHECK(cond, ErrorType, parts...): throws dtcore::ErrorType with the streamed parts
// when cond is false. Use DTCORE_CHECK(false, ...) for an unconditional failure.
#define DTCORE_CHECK(cond, ErrorType, ...)                           \
  do {                                                               \
    if (!(cond)) {                                                   \
      throw ::dtcore::ErrorType(::dtcore::detail::cat(__VA_ARGS__)); \
    }                                                                \
  } while (false)
