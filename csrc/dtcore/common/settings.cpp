#include "dtcore/common/settings.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "dtcore/common/knobs.h"
#include "dtcore/common/units.h"

namespace dtcore {
namespace {

// A bad value: the message says what is wrong with `shown` (how the user wrote it), fix what to do.
struct BadValue {
  std::string message;
  std::string fix;
};

double parse_seconds(const std::string& text, const std::string& shown) {
  double seconds = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), seconds);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(seconds) ||
      !(seconds > 0)) {
    throw BadValue{detail::cat(shown, " is not a positive number of seconds."),
                   "use a positive number of seconds such as 300, or leave it unset for the default."};
  }
  if (seconds > kMaxTimeoutSeconds) {
    throw BadValue{
        detail::cat(shown, " is longer than dtcore can wait (at most ", kMaxTimeoutSeconds, " s, about 31 years)."),
        "use a number of seconds up to that."};
  }
  return seconds;
}

int64_t parse_count(const std::string& text, const std::string& shown) {
  int64_t n = -1;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || n < 0 || n > 10'000'000) {
    throw BadValue{detail::cat(shown, " is not a count from 0 to 10000000."), "use a whole number such as 2000."};
  }
  return n;
}

std::string parse_choice(const std::string& text, const std::string& shown, std::initializer_list<const char*> choices,
                         std::string_view what) {
  std::string v = ascii_lower(text);
  for (const char* c : choices) {
    if (v == c) return v;
  }
  std::string list;
  for (const char* c : choices) {
    if (!list.empty()) list += ", ";
    list += c;
  }
  throw BadValue{detail::cat(shown, " is not ", what, "."), detail::cat("use one of ", list, ".")};
}

log::Level parse_log_level(const std::string& text, const std::string& shown) {
  try {
    return log::parse_level(text, shown);
  } catch (const ConfigError&) {
    throw BadValue{detail::cat(shown, " is not a log level."), "use one of debug, info, warn, error."};
  }
}

std::string trimmed(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

LogRanks parse_log_ranks(const std::string& text, const std::string& shown) {
  LogRanks out;
  if (ascii_lower(trimmed(text)) == "all") {
    out.all = true;
    return out;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = std::min(text.find(',', start), text.size());
    std::string part = trimmed(text.substr(start, comma - start));
    if (part.empty()) {  // "0," or "0,,3": nothing between the commas
      start = comma + 1;
      continue;
    }
    int rank = -1;
    auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), rank);
    if (ec != std::errc() || end != part.data() + part.size() || rank < 0) {
      throw BadValue{detail::cat(shown, " is not a list of ranks ('", part, "' is not a rank)."),
                     "use ranks separated by commas, such as 0 or 0,3, or 'all'."};
    }
    out.ranks.push_back(rank);
    start = comma + 1;
  }
  return out;
}

// Reads one setting: init()'s argument when given, else the knob's variable, else its default.
// A bad value is thrown as a ConfigError at finish(), or recorded and replaced by the default.
class Reader {
 public:
  Reader(const Env& env, const Arguments& args, std::vector<Problem>* problems)
      : env_(env), args_(args), problems_(problems) {}

  template <typename T, typename Parse>
  Sourced<T> get(const char* field, const Knob& knob, Parse parse) {
    std::string text, source, shown;
    try {
      if (auto arg = argument(field)) {
        source = detail::cat("init(", field, "=)");
        shown = detail::cat("init(", field, "=", repr(*arg), ")");
        text = repr(*arg);  // what the Problem shows if the type is wrong
        text = argument_text(*arg, knob, shown);
      } else if (auto v = env_.get(knob.name)) {
        text = *v;
        source = std::string(knob.name);
        shown = detail::cat(knob.name, "='", *v, "'");
      } else {
        return Sourced<T>{parse(std::string(knob.default_value), "the default"), "default"};
      }
      return Sourced<T>{parse(text, shown), source};
    } catch (const BadValue& bad) {
      found_.push_back(Problem{field, source, text, bad.message, bad.fix});
      return Sourced<T>{parse(std::string(knob.default_value), "the default"), "default: " + source + " is invalid"};
    }
  }

  void finish() {
    if (problems_ != nullptr) {
      problems_->insert(problems_->end(), found_.begin(), found_.end());
      return;
    }
    if (found_.empty()) return;
    if (found_.size() == 1) throw ConfigError(found_[0].to_string());
    std::string message = "dtcore's settings are not valid:";
    for (const auto& p : found_) message += "\n  - " + p.to_string();
    throw ConfigError(message);
  }

 private:
  std::optional<Argument> argument(const char* field) const {
    auto it = args_.find(field);
    if (it == args_.end() || !it->second) return std::nullopt;
    if (std::string_view(field) == "backend" && std::holds_alternative<std::string>(*it->second) &&
        std::get<std::string>(*it->second) == "auto") {
      return std::nullopt;  // "auto" lets DTCORE_BACKEND decide
    }
    return it->second;
  }

  // The text of an argument, which must have the knob's type: a number of seconds for a knob
  // whose default is a number, else a string.
  static std::string argument_text(const Argument& arg, const Knob& knob, const std::string& shown) {
    const bool numeric = !knob.default_value.empty() && std::isdigit(static_cast<unsigned char>(knob.default_value[0]));
    if (numeric && std::holds_alternative<int64_t>(arg)) return std::to_string(std::get<int64_t>(arg));
    if (numeric && std::holds_alternative<double>(arg)) return repr(arg);
    if (!numeric && std::holds_alternative<std::string>(arg)) return std::get<std::string>(arg);
    throw BadValue{detail::cat(shown, " must be ", numeric ? "a number of seconds." : "a string."),
                   numeric ? "pass a positive number of seconds, e.g. 300." : "pass a string."};
  }

  const Env& env_;
  const Arguments& args_;
  std::vector<Problem>* problems_;
  std::vector<Problem> found_;
};

}  // namespace

bool LogRanks::includes(int rank) const { return all || std::find(ranks.begin(), ranks.end(), rank) != ranks.end(); }

std::string LogRanks::to_string() const {
  if (all) return "all";
  std::string out;
  for (int r : ranks) {
    if (!out.empty()) out += ',';
    out += std::to_string(r);
  }
  return out;
}

log::Level Settings::console_level(int rank) const {
  if (log_ranks.value.includes(rank)) return log_level.value;
  return std::max(log_level.value, log::Level::Warn);
}

std::string repr(const Argument& value) {
  if (std::holds_alternative<bool>(value)) return std::get<bool>(value) ? "True" : "False";
  if (std::holds_alternative<int64_t>(value)) return std::to_string(std::get<int64_t>(value));
  if (std::holds_alternative<double>(value)) {
    // The shortest text that reads back as the same double, as Python's repr: 0.1, not 0.10000000000000001.
    const double d = std::get<double>(value);
    char buf[32];
    int digits = 1;
    for (; digits < 17; ++digits) {
      std::snprintf(buf, sizeof buf, "%.*g", digits, d);
      if (std::strtod(buf, nullptr) == d) break;
    }
    // Python writes an exponent only below 1e-4 or from 1e16 on: 300.0, not 3e+02.
    const int exponent = d == 0 || !std::isfinite(d) ? 0 : static_cast<int>(std::floor(std::log10(std::fabs(d))));
    if (exponent >= -4 && exponent < 16) digits = std::max(digits, exponent + 1);
    std::snprintf(buf, sizeof buf, "%.*g", digits, d);
    std::string s = buf;
    if (s.find_first_of(".eninf") == std::string::npos) s += ".0";
    return s;
  }
  return "'" + std::get<std::string>(value) + "'";
}

Settings read_settings(const Env& env, const Arguments& args, std::vector<Problem>* problems) {
  for (const auto& [name, value] : args) {
    if (name != "timeout" && name != "backend" && name != "log_dir") {
      throw std::logic_error("dtcore bug: read_settings() got the argument '" + name + "'");
    }
  }
  Reader r(env, args, problems);
  Settings s;
  s.timeout_s = r.get<double>("timeout", knobs::kTimeout, parse_seconds);
  s.backend = r.get<std::string>("backend", knobs::kBackend, [](const std::string& t, const std::string& shown) {
    return parse_choice(t, shown, {"auto", "nccl", "gloo"}, "a backend");
  });
  s.log_level = r.get<log::Level>("log_level", knobs::kLogLevel, parse_log_level);
  s.log_ranks = r.get<LogRanks>("log_ranks", knobs::kLogRanks, parse_log_ranks);
  s.log_dir = r.get<std::string>("log_dir", knobs::kLogDir, [](const std::string& t, const std::string&) { return t; });
  s.rdzv_log_interval_s = r.get<double>("rdzv_log_interval", knobs::kRdzvLogInterval, parse_seconds);
  s.heartbeat_interval_s = r.get<double>("heartbeat_interval", knobs::kHeartbeatInterval, parse_seconds);
  s.check_collectives = r.get<std::string>("check_collectives", knobs::kCheckCollectives,
                                           [](const std::string& t, const std::string& shown) {
                                             return parse_choice(t, shown, {"auto", "1", "0"}, "auto, 1 or 0");
                                           });
  s.flight_records = r.get<int64_t>("flight_records", knobs::kFlightRecorder, parse_count);
  s.shared_memory =
      r.get<std::string>("shared_memory", knobs::kShm, [](const std::string& t, const std::string& shown) {
        return parse_choice(t, shown, {"auto", "1", "0"}, "auto, 1 or 0");
      });
  s.memory_dir =
      r.get<std::string>("memory_dir", knobs::kMemoryDir, [](const std::string& t, const std::string&) { return t; });
  r.finish();
  return s;
}

log::Config log_config(const Settings& settings, int rank, int world_size, std::string host) {
  log::Config c;
  c.rank = rank;
  c.world_size = world_size;
  c.host = std::move(host);
  c.console_level = settings.console_level(rank);
  c.log_dir = settings.log_dir.value;
  return c;
}

}  // namespace dtcore
