#include "dtcore/common/knobs.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace dtcore {

std::optional<std::string> knob_value(const Env& env, const Knob& knob) {
  if (auto v = env.get(knob.name)) return v;
  if (knob.default_value.empty()) return std::nullopt;
  return std::string(knob.default_value);
}

std::chrono::milliseconds default_duration(const Knob& knob) {
  const std::string text(knob.default_value);
  size_t used = 0;
  double seconds = -1;
  try {
    seconds = std::stod(text, &used);
  } catch (const std::exception&) {
  }
  if (used != text.size() || !(seconds >= 0)) {
    throw std::logic_error("dtcore bug: " + std::string(knob.name) + "'s default '" + text + "' is not seconds");
  }
  return std::chrono::milliseconds(std::llround(seconds * 1000));
}

namespace {

// Levenshtein distance: insertions, deletions and substitutions.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::vector<std::string> unknown_knobs(const Env& env) {
  std::vector<std::string> out;
  for (const std::string& name : env.names_with_prefix(knobs::kPrefix)) {
    const auto known = [&](const Knob* k) { return k->name == name; };
    if (std::any_of(knobs::kAll.begin(), knobs::kAll.end(), known)) continue;
    // Close: at most 3 edits, and fewer than a third of the name (a letter too many, an underscore missing).
    const Knob* closest = nullptr;
    size_t best = std::min<size_t>(4, name.size() / 3 + 1);
    for (const Knob* k : knobs::kAll) {
      const size_t d = edit_distance(name, k->name);
      if (d < best) best = d, closest = k;
    }
    std::string line = name + " is set, but dtcore has no such setting and ignores it.";
    line += closest != nullptr ? " Did you mean " + std::string(closest->name) + "?" : "";
    out.push_back(line + " (Every setting: docs/knobs.md.)");
  }
  return out;
}

}  // namespace dtcore
