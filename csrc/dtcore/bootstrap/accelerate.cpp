#include "dtcore/bootstrap/accelerate.h"

#include <charconv>
#include <sstream>

#include "dtcore/common/error.h"

namespace dtcore {

std::map<std::string, std::string> parse_accelerate_config(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == ' ' || line[0] == '\t' || line[0] == '#') continue;  // top-level keys only
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon);
    std::string value = line.substr(colon + 1);
    value.erase(0, value.find_first_not_of(" \t"));
    value.erase(value.find_last_not_of(" \t\r") + 1);
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"') && value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    out[key] = value;
  }
  return out;
}

std::string accelerate_started_fewer(const Env& env, const WorldSpec& spec, const std::string& config_path,
                                     const std::map<std::string, std::string>& config) {
  // A world of one that nothing set: a world size from a variable or init() is what was asked.
  if (spec.launcher != Launcher::Accelerate || spec.world_size.value != 1 ||
      !spec.world_size.source.starts_with("default")) {
    return "";
  }
  std::string asked;
  int processes = 0;  // how many the config file asks for, 0 when it does not say
  if (auto it = config.find("num_processes"); it != config.end()) {
    const std::string& v = it->second;
    std::from_chars(v.data(), v.data() + v.size(), processes);
  }
  if (processes > 1) {
    asked = detail::cat("its config file ", config_path, " asks for num_processes: ", processes);
  }
  auto addr = env.get("MASTER_ADDR"), port = env.get("MASTER_PORT");
  if (addr || port) {
    if (!asked.empty()) asked += ", and ";
    asked += detail::cat(addr ? "MASTER_ADDR=" + *addr : std::string(), addr && port ? " and " : "",
                         port ? "MASTER_PORT=" + *port : std::string(),
                         " are set, which `accelerate launch` does only when asked for --num_processes > 1 or "
                         "--num_machines > 1");
  }
  if (asked.empty()) return "";
  const std::string n = processes > 1 ? std::to_string(processes) : std::string("N");
  return detail::cat(
      "accelerate started this process alone (no RANK or WORLD_SIZE: a world of one), but ", asked,
      "; the job trains on one process. accelerate's simple launcher (--cpu, or no --multi_gpu) starts one process "
      "whatever --num_processes says. Fix: start ",
      n, " processes with `accelerate launch --multi_gpu --num_processes=", n,
      "` (it runs torchrun; dtcore uses Gloo where there is no GPU) or `torchrun --nproc_per_node=", n,
      "`; for one process, drop --num_processes", processes > 1 ? " and set num_processes: 1 in " + config_path : "",
      ".");
}

}  // namespace dtcore
