// The registry of DTCORE_* environment variables ("knobs").
//
// Every DTCORE_* variable dtcore reads is declared exactly once in knobs.cpp, with its default
// and a one-line doc; docs/knobs.md lists the same table (a test keeps the two in step). Code
// reads a knob only through knob_value(), which refuses undeclared names, so a knob cannot be
// read without being documented. Thread safety: the registry is immutable.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtcore/common/env.h"

namespace dtcore {

struct Knob {
  const char* name;           // e.g. "DTCORE_TIMEOUT"
  const char* default_value;  // as the user would write it; "" when unset means "not given"
  const char* doc;            // one line
};

// All knobs, in the order of docs/knobs.md.
const std::vector<Knob>& knobs();

// The knob's value in `env`, or its default when the variable is unset. Returns nullopt when
// unset and the default is "". Throws std::logic_error for an undeclared name (a dtcore bug).
std::optional<std::string> knob_value(const Env& env, std::string_view name);

// Parses a knob as seconds (e.g. "300", "2.5"); ConfigError names the variable and value.
std::optional<double> knob_seconds(const Env& env, std::string_view name);

}  // namespace dtcore
