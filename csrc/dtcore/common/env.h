// Env: a read-only snapshot of environment variables.
//
// Bootstrap code reads the environment only through an Env, so that tests can hand it any
// launcher's variables without touching the process environment, and so that a whole init()
// sees one consistent snapshot. Thread safety: immutable after construction.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtcore {

class Env {
 public:
  Env() = default;
  explicit Env(std::map<std::string, std::string, std::less<>> vars) : vars_(std::move(vars)) {}

  // The current process environment.
  static Env from_process();

  // The value of `name`; a variable set to the empty string counts as unset. Right for knobs
  // (DTCORE_*, NCCL_*), where an empty value means "use the default".
  std::optional<std::string> get(std::string_view name) const;
  bool has(std::string_view name) const { return get(name).has_value(); }

  // The value of `name` as set, the empty string included; nullopt only when it is not set at all.
  // Right for a launcher's own variables, where SLURM_PROCID='' is a broken launch, not no launcher.
  std::optional<std::string> raw(std::string_view name) const;
  bool present(std::string_view name) const { return raw(name).has_value(); }

  // True when any variable starts with `prefix` (e.g. "ACCELERATE_").
  bool has_prefix(std::string_view prefix) const;
  // The names of the variables that start with `prefix`, sorted.
  std::vector<std::string> names_with_prefix(std::string_view prefix) const;

 private:
  std::map<std::string, std::string, std::less<>> vars_;
};

// A variable's value lower-cased (ASCII), for case-insensitive words such as "True" or "offline".
std::string ascii_lower(std::string_view value);

// A variable read as a switch: 1, true, yes or on (any case) mean on; anything else off.
bool truthy(std::string_view value);

// This machine's host name (gethostname), "?" when it cannot be read.
std::string host_name();

}  // namespace dtcore
