#include "dtcore/bootstrap/validate.h"

#include <netdb.h>
#include <sys/socket.h>

#include "dtcore/common/error.h"

namespace dtcore {
namespace {

// "WORLD_SIZE=12" for a value the user set, "world size 12 (derived: ...)" otherwise.
template <typename T>
std::string shown(const char* field, const Sourced<T>& f) {
  return named(in_words(field), f);
}

}  // namespace

int cuda_device_index(const WorldSpec& spec, int visible_gpus) {
  const std::string& v = spec.cuda_visible_devices;
  bool one_bound = visible_gpus == 1 && !v.empty() && v.find(',') == std::string::npos;
  return one_bound ? 0 : spec.local_rank.value;
}

std::optional<std::string> resolve_error(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (result != nullptr) freeaddrinfo(result);
  if (rc == 0) return std::nullopt;
  return std::string(gai_strerror(rc));
}

std::vector<Problem> check_world(const WorldSpec& s, const WorldCheckOptions& o) {
  std::vector<Problem> out;
  auto add = [&](const char* name, const auto& field, std::string message, std::string fix) {
    out.push_back(Problem{name, field.source, detail::cat(field.value), std::move(message), std::move(fix)});
  };
  const std::string launcher(launcher_name(s.launcher));

  // An index within a count (rank < world size, local rank < local world size, node rank < nodes):
  // the count at least 1, else the index in 0..count-1.
  auto index_within = [&](const char* index_name, const Sourced<int>& index, const char* count_name,
                          const Sourced<int>& count, const char* count_fix, const char* index_fix) {
    if (count.value < 1) {
      add(count_name, count, detail::cat(shown(count_name, count), " must be at least 1."), count_fix);
    } else if (index.value < 0 || index.value >= count.value) {
      add(index_name, index,
          detail::cat(shown(index_name, index), " is outside 0..", count.value - 1, " (", shown(count_name, count),
                      ")."),
          index_fix);
    }
  };
  index_within("rank", s.rank, "world_size", s.world_size,
               "start at least one process; set the world size to the number of processes.",
               "every process needs a distinct rank below the world size; check the launcher's process count or the "
               "variables you set by hand.");
  index_within("local_rank", s.local_rank, "local_world_size", s.local_world_size,
               "set it to the number of processes on this node.",
               "each process on a node needs a distinct local rank below the number of processes on that node.");
  if (s.local_world_size.value > s.world_size.value && s.world_size.value >= 1) {
    add("local_world_size", s.local_world_size,
        detail::cat(shown("local_world_size", s.local_world_size), " exceeds ", shown("world_size", s.world_size), "."),
        "the processes on one node cannot outnumber the whole job; fix one of the two.");
  }
  if (s.tasks_over_nodes) {
    if (s.tasks_over_nodes->value != s.world_size.value) {
      add("world_size", s.world_size,
          detail::cat(shown("world_size", s.world_size), " differs from the ", s.tasks_over_nodes->value,
                      " tasks that ", s.tasks_over_nodes->source, " places on the nodes."),
          "ask SLURM for as many tasks as the job runs (e.g. srun --ntasks=N --ntasks-per-node=G).");
    }
  } else if (s.num_nodes.value >= 1 && s.local_world_size.value >= 1 &&
             s.world_size.value != s.num_nodes.value * s.local_world_size.value) {
    add("world_size", s.world_size,
        detail::cat(shown("world_size", s.world_size), " is not ", shown("num_nodes", s.num_nodes), " x ",
                    shown("local_world_size", s.local_world_size), " = ", s.num_nodes.value * s.local_world_size.value,
                    "."),
        "start the same number of processes on every node and make the world size nodes x processes per node "
        "(torchrun: --nnodes=N --nproc_per_node=G).");
  }
  index_within("node_rank", s.node_rank, "num_nodes", s.num_nodes, "set it to the number of nodes.",
               "give each node a distinct index below the number of nodes (torchrun: --node_rank).");
  // Only where both are known: SLURM's node list bounds the nodes (a step may use fewer than the job has).
  if (s.node_list && s.num_nodes.value > s.node_list_hosts) {
    add("num_nodes", s.num_nodes,
        detail::cat(shown("num_nodes", s.num_nodes), " exceeds the ", s.node_list_hosts, " host(s) that ",
                    as_written(s.node_list->source, s.node_list->value),
                    " names: the job waits for nodes that do not exist."),
        detail::cat("make the node count match the allocation (srun -N ", s.node_list_hosts,
                    "), or correct the variable you set by hand."));
  }
  // No GPU at all is choose_backend()'s to report; this is the case of too few.
  if (o.backend == "nccl" && o.visible_gpus > 0 && cuda_device_index(s, o.visible_gpus) >= o.visible_gpus) {
    std::string visible = s.cuda_visible_devices.empty() ? std::string("CUDA_VISIBLE_DEVICES unset")
                                                         : "CUDA_VISIBLE_DEVICES=" + s.cuda_visible_devices;
    add("gpus_per_node", s.local_rank,
        detail::cat(shown("local_rank", s.local_rank), " needs GPU ", s.local_rank.value, ", but ",
                    o.host.empty() ? std::string("this host") : "host " + o.host, " sees only ", o.visible_gpus,
                    " GPU(s) (", visible,
                    "). This is the 'invalid device ordinal' of a multi-node job configured as "
                    "one node: e.g. 2 nodes x 8 GPUs started as 1 x 16."),
        detail::cat("start at most ", o.visible_gpus,
                    " processes per node and spread the job over nodes "
                    "(torchrun --nnodes=<nodes> --nproc_per_node=",
                    o.visible_gpus, "), or make more GPUs visible to this process."));
  }
  if (s.master_port.value < 0 || s.master_port.value > 65535 || (s.master_port.value == 0 && s.world_size.value > 1)) {
    add("master_port", s.master_port,
        detail::cat(shown("master_port", s.master_port), " is not a usable TCP port (1..65535)."),
        "set MASTER_PORT to a free port such as 29500, the same on every rank.");
  }
  if (s.master_addr.value.empty()) {
    add("master_addr", s.master_addr, detail::cat(s.master_addr.source, " is empty."),
        "set MASTER_ADDR to rank 0's host name.");
  } else if (o.resolve_master && s.world_size.value > 1) {
    if (auto err = resolve_error(s.master_addr.value)) {
      add("master_addr", s.master_addr,
          detail::cat(shown("master_addr", s.master_addr), " does not resolve: ", *err, "."),
          "set MASTER_ADDR to the name or IP address of rank 0's host, as this host can reach it.");
    }
  }
  return out;
}

void validate_world(const WorldSpec& spec, const WorldCheckOptions& options) {
  auto problems = check_world(spec, options);
  if (problems.empty()) return;
  std::string message =
      detail::cat("the launcher environment is not a valid job (launcher: ", launcher_name(spec.launcher), ", host ",
                  options.host.empty() ? std::string("?") : options.host, "):");
  for (const auto& p : problems) message += "\n  - " + p.to_string();
  throw ConfigError(message);
}

}  // namespace dtcore
