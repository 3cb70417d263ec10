// Network probe: can the ranks find each other? The master address resolves (and is not loopback
// in a multi-node job), the master port is free where rank 0 will listen (or, under torchrun,
// served by its agent and reachable), NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME name interfaces
// that exist and are up, and which local interface the route to the master takes.
// Thread safety: the probes open short-lived sockets and read /proc; the judge is pure.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/check/item.h"

namespace dtcore::check {

struct Interface {
  std::string name;
  bool up = false;       // IFF_UP: configured up
  bool running = false;  // IFF_RUNNING: link present
  bool loopback = false;
  std::vector<std::string> addresses;  // IPv4 and IPv6, numeric
};

std::vector<Interface> list_interfaces();

// The interfaces a socket-interface variable selects. NCCL_SOCKET_IFNAME (`nccl_syntax`): a
// comma list of name prefixes, "=name" for an exact name, a leading "^" to exclude instead.
// GLOO_SOCKET_IFNAME: a comma list of exact names. Down interfaces are included; the judge says so.
std::vector<std::string> select_interfaces(const std::string& value, const std::vector<Interface>& interfaces,
                                           bool nccl_syntax);

struct PortHolder {
  long pid = 0;
  std::string name;  // the process's executable
};

struct PortProbe {
  bool free = false;
  bool in_use = false;               // EADDRINUSE (rather than, e.g., EACCES below 1024)
  std::string error;                 // why not, e.g. "Address already in use"
  std::optional<PortHolder> holder;  // the listening process, when /proc lets us see it
};

// Binds `port` on all addresses the way the rendezvous store does (SO_REUSEADDR), then closes.
PortProbe probe_port(int port);

// nullopt when a TCP connection to host:port succeeds within `timeout`, else the error.
std::optional<std::string> connect_error(const std::string& host, int port, std::chrono::milliseconds timeout);

struct Route {
  std::string local_address;  // this host's address toward the target
  std::string interface;      // and the interface that holds it
  std::string error;          // when the route could not be found
  bool target_is_loopback = false;
  bool target_is_local = false;  // the target is one of this host's addresses
};

Route route_to(const std::string& host, const std::vector<Interface>& interfaces);

struct NetworkFacts {
  std::vector<Interface> interfaces;
  std::optional<std::string> nccl_socket_ifname;
  std::optional<std::string> gloo_socket_ifname;
  std::string master_addr;
  std::string master_addr_source;
  int master_port = 0;
  std::string master_port_source;
  int num_nodes = 1;
  bool is_rank0 = true;
  bool agent_store = false;                  // torchrun's agent serves the store
  std::optional<std::string> resolve_error;  // the master address does not resolve
  Route route;
  std::optional<PortProbe> port;       // when this process is where rank 0 will listen
  std::optional<std::string> connect;  // set when a reachability test ran: "" ok, else the error
};

struct NetworkOptions {
  bool test_connect = false;  // try a TCP connection to the master (distributed mode)
  // With no port set (one process: any free port), check torchrun's default 29500 instead; a
  // taken 29500 is then a warning for the next launch. Off for init(preflight=True).
  bool probe_default_port = true;
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds resolve_timeout{5000};  // a resolver that does not answer must not hang the check
};

NetworkFacts probe_network(const WorldSpec& spec, const std::optional<std::string>& nccl_ifname,
                           const std::optional<std::string>& gloo_ifname, const NetworkOptions& options);

void judge_network(const NetworkFacts& facts, Items& out);

}  // namespace dtcore::check
