#include "dtcore/common/knobs.h"

namespace dtcore {

std::optional<std::string> knob_value(const Env& env, const Knob& knob) {
  if (auto v = env.get(knob.name)) return v;
  if (knob.default_value.empty()) return std::nullopt;
  return std::string(knob.default_value);
}

}  // namespace dtcore
