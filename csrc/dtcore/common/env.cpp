#include "dtcore/common/env.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>

extern char** environ;  // POSIX

namespace dtcore {

Env Env::from_process() {
  std::map<std::string, std::string, std::less<>> vars;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    auto eq = entry.find('=');
    if (eq == std::string_view::npos) {
      continue;
    }
    vars.emplace(std::string(entry.substr(0, eq)), std::string(entry.substr(eq + 1)));
  }
  return Env(std::move(vars));
}

std::optional<std::string> Env::get(std::string_view name) const {
  auto it = vars_.find(name);
  if (it == vars_.end() || it->second.empty()) {
    return std::nullopt;
  }
  return it->second;
}

std::optional<std::string> Env::raw(std::string_view name) const {
  auto it = vars_.find(name);
  if (it == vars_.end()) return std::nullopt;
  return it->second;
}

bool Env::has_prefix(std::string_view prefix) const {
  auto it = vars_.lower_bound(prefix);
  return it != vars_.end() && std::string_view(it->first).starts_with(prefix);
}

std::vector<std::string> Env::names_with_prefix(std::string_view prefix) const {
  std::vector<std::string> out;
  for (auto it = vars_.lower_bound(prefix); it != vars_.end() && std::string_view(it->first).starts_with(prefix);
       ++it) {
    out.push_back(it->first);
  }
  return out;
}

std::string ascii_lower(std::string_view value) {
  std::string out(value);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

bool truthy(std::string_view value) {
  const std::string v = ascii_lower(value);
  return v == "1" || v == "true" || v == "yes" || v == "on";
}

std::string host_name() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) return "?";
  return host;
}

}  // namespace dtcore
