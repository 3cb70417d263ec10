#include "dtcore/check/network_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "dtcore/bootstrap/validate.h"
#include "dtcore/common/deadline.h"
#include "dtcore/common/error.h"

namespace dtcore::check {
namespace {

constexpr int kTorchDefaultPort = 29500;
constexpr const char* kTorchDefaultSource = "torchrun's default";

std::string numeric_address(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof buf);
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof buf);
  }
  return buf;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// Closes a descriptor on every path out of a probe.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// The inode of the socket listening on `port`, from /proc/net/tcp{,6}; 0 when none is seen.
unsigned long listening_inode(int port) {
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
      unsigned long inode = 0;
      fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode;
      size_t colon = local.rfind(':');
      if (colon == std::string::npos || state != "0A") continue;  // 0A: LISTEN
      if (std::stoi(local.substr(colon + 1), nullptr, 16) == port) return inode;
    }
  }
  return 0;
}

std::optional<PortHolder> holder_of(unsigned long inode) {
  if (inode == 0) return std::nullopt;
  const std::string target = "socket:[" + std::to_string(inode) + "]";
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return std::nullopt;
  std::optional<PortHolder> found;
  while (dirent* e = readdir(proc)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    const std::string fd_dir = std::string("/proc/") + e->d_name + "/fd";
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;  // another user's process
    while (dirent* f = readdir(fds)) {
      char link[64] = {0};
      ssize_t n = readlink((fd_dir + "/" + f->d_name).c_str(), link, sizeof link - 1);
      if (n > 0 && target == std::string(link, static_cast<size_t>(n))) {
        std::ifstream comm(std::string("/proc/") + e->d_name + "/comm");
        PortHolder h;
        h.pid = std::stol(e->d_name);
        std::getline(comm, h.name);
        found = h;
        break;
      }
    }
    closedir(fds);
    if (found) break;
  }
  closedir(proc);
  return found;
}

// A port the kernel calls free right now, to suggest in a fix.
int some_free_port() {
  Fd s(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (s.fd < 0 || bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(s.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return 0;
  }
  return ntohs(a.sin_port);
}

}  // namespace

std::vector<Interface> list_interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  std::map<std::string, size_t> index;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    auto [it, inserted] = index.emplace(a->ifa_name, out.size());
    if (inserted) {
      Interface i;
      i.name = a->ifa_name;
      i.up = (a->ifa_flags & IFF_UP) != 0;
      i.running = (a->ifa_flags & IFF_RUNNING) != 0;
      i.loopback = (a->ifa_flags & IFF_LOOPBACK) != 0;
      out.push_back(i);
    }
    if (a->ifa_addr != nullptr && (a->ifa_addr->sa_family == AF_INET || a->ifa_addr->sa_family == AF_INET6)) {
      out[it->second].addresses.push_back(numeric_address(a->ifa_addr));
    }
  }
  freeifaddrs(list);
  return out;
}

std::vector<std::string> select_interfaces(const std::string& value, const std::vector<Interface>& interfaces,
                                           bool nccl_syntax) {
  std::vector<std::string> out;
  std::string spec = value;
  bool exclude = false;
  bool exact = !nccl_syntax;
  if (nccl_syntax && !spec.empty() && spec[0] == '^') {
    exclude = true;
    spec.erase(0, 1);
  }
  if (nccl_syntax && !spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  const auto names = split_commas(spec);
  for (const Interface& i : interfaces) {
    bool match = std::any_of(names.begin(), names.end(),
                             [&](const std::string& n) { return exact ? i.name == n : i.name.rfind(n, 0) == 0; });
    if (match != exclude) out.push_back(i.name);
  }
  return out;
}

PortProbe probe_port(int port) {
  PortProbe p;
  // IPv6 first with dual stack (what the store's listener does), then plain IPv4.
  for (int family : {AF_INET6, AF_INET}) {
    Fd s(socket(family, SOCK_STREAM, 0));
    if (s.fd < 0) continue;  // no IPv6 on this host
    int one = 1;
    setsockopt(s.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (family == AF_INET6) {
      int zero = 0;
      setsockopt(s.fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      rc = bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = bind(s.fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    if (rc != 0) {
      p.in_use = errno == EADDRINUSE;
      p.error = std::strerror(errno);
      if (p.in_use) p.holder = holder_of(listening_inode(port));
      return p;
    }
  }
  p.free = true;
  return p;
}

std::optional<std::string> connect_error(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  if (rc != 0) return std::string(gai_strerror(rc));
  std::string error = "no address";
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    Fd s(socket(a->ai_family, SOCK_STREAM, 0));
    if (s.fd < 0) continue;
    fcntl(s.fd, F_SETFL, O_NONBLOCK);
    if (connect(s.fd, a->ai_addr, a->ai_addrlen) == 0) {
      freeaddrinfo(result);
      return std::nullopt;
    }
    if (errno != EINPROGRESS) {
      error = std::strerror(errno);
      continue;
    }
    pollfd pfd{s.fd, POLLOUT, 0};
    int ready = poll(&pfd, 1, static_cast<int>(timeout.count()));
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (ready == 1 && getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &so_error, &len) == 0 && so_error == 0) {
      freeaddrinfo(result);
      return std::nullopt;
    }
    if (ready == 0) {
      error = detail::cat("no answer within ", timeout.count(), " ms");
    } else {
      error = std::strerror(ready < 0 ? errno : so_error);
    }
  }
  freeaddrinfo(result);
  return error;
}

Route route_to(const std::string& host, const std::vector<Interface>& interfaces) {
  Route r;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), "9", &hints, &result);
  if (rc != 0) {
    r.error = gai_strerror(rc);
    return r;
  }
  std::string target = numeric_address(result->ai_addr);
  // A UDP "connect" sends nothing; it asks the kernel which local address the route would use.
  Fd s(socket(result->ai_family, SOCK_DGRAM, 0));
  sockaddr_storage local{};
  socklen_t len = sizeof local;
  if (s.fd < 0 || connect(s.fd, result->ai_addr, result->ai_addrlen) != 0 ||
      getsockname(s.fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) {
    r.error = std::strerror(errno);
    freeaddrinfo(result);
    return r;
  }
  freeaddrinfo(result);
  r.local_address = numeric_address(reinterpret_cast<sockaddr*>(&local));
  // 127.0.1.1 (Debian's entry for the host name) is loopback without belonging to an interface.
  r.target_is_loopback = target.rfind("127.", 0) == 0 || target == "::1";
  r.target_is_local = r.target_is_loopback;
  for (const Interface& i : interfaces) {
    for (const std::string& a : i.addresses) {
      if (a == r.local_address) r.interface = i.name;
      if (a == target) {
        r.target_is_local = true;
        r.target_is_loopback = r.target_is_loopback || i.loopback;
      }
    }
  }
  return r;
}

NetworkFacts probe_network(const WorldSpec& spec, const std::optional<std::string>& nccl_ifname,
                           const std::optional<std::string>& gloo_ifname, const NetworkOptions& options) {
  NetworkFacts f;
  f.interfaces = list_interfaces();
  f.nccl_socket_ifname = nccl_ifname;
  f.gloo_socket_ifname = gloo_ifname;
  f.master_addr = spec.master_addr.value;
  f.master_addr_source = spec.master_addr.source;
  f.master_port = spec.master_port.value;
  f.master_port_source = spec.master_port.source;
  if (f.master_port == 0 && options.probe_default_port) {
    // One process picks any free port; the port a later torchrun would use is the one worth checking.
    f.master_port = kTorchDefaultPort;
    f.master_port_source = kTorchDefaultSource;
  }
  f.num_nodes = spec.num_nodes.value;
  f.is_rank0 = spec.rank.value == 0;
  f.agent_store = spec.use_agent_store;
  // One bounded lookup; route_to and connect_error below then hit the resolver's cache.
  std::string host = f.master_addr;
  auto looked_up =
      with_deadline<std::optional<std::string>>([host] { return resolve_error(host); }, options.resolve_timeout);
  f.resolve_error = looked_up ? *looked_up
                              : detail::cat("no answer from the resolver within ",
                                            options.resolve_timeout.count() / 1000, " s (/etc/resolv.conf)");
  if (!f.resolve_error) f.route = route_to(f.master_addr, f.interfaces);
  if (!f.agent_store && f.is_rank0 && f.master_port > 0) f.port = probe_port(f.master_port);
  if (options.test_connect && f.agent_store && !f.resolve_error) {
    f.connect = connect_error(f.master_addr, f.master_port, options.connect_timeout).value_or("");
  }
  return f;
}

namespace {

bool literal_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

void judge_ifname(const char* var, const std::optional<std::string>& value, bool nccl_syntax,
                  const std::vector<Interface>& interfaces, Items& out) {
  const std::string id = std::string("network.") + (nccl_syntax ? "nccl_socket_ifname" : "gloo_socket_ifname");
  if (!value) {
    out.pass(id, var, "unset",
             nccl_syntax ? "NCCL picks an interface itself (InfiniBand first, then not docker/lo)"
                         : "Gloo uses the address this host's name resolves to");
    return;
  }
  std::string have;
  for (const auto& i : interfaces) have += (have.empty() ? "" : ", ") + i.name + (i.up ? "" : " (down)");
  auto selected = select_interfaces(*value, interfaces, nccl_syntax);
  std::vector<std::string> down, missing;
  for (const auto& name : selected) {
    auto it = std::find_if(interfaces.begin(), interfaces.end(), [&](const Interface& i) { return i.name == name; });
    if (!it->up || !it->running) down.push_back(name);
  }
  if (!nccl_syntax) {  // Gloo fails on any name that does not exist
    for (const auto& name : split_commas(*value)) {
      if (std::find(selected.begin(), selected.end(), name) == selected.end()) missing.push_back(name);
    }
  }
  std::string fix = detail::cat(
      "set ", var, " to interfaces that exist and are up on every node (this host has: ", have, "), or unset it.");
  if (selected.empty() || !missing.empty()) {
    std::string which = missing.empty() ? std::string("no interface") : "'" + missing.front() + "'";
    out.fail(id, var, *value,
             detail::cat(var, "=", *value, " selects ", which, " on this host: ",
                         nccl_syntax ? "NCCL fails at communicator creation." : "Gloo fails to connect."),
             fix);
  } else if (down.size() == selected.size() || (!nccl_syntax && !down.empty())) {
    out.fail(id, var, *value, detail::cat(var, " selects ", down.front(), ", which is down (no link)."), fix);
  } else {
    std::string used;
    for (const auto& n : selected) used += (used.empty() ? "" : ", ") + n;
    out.pass(id, var, *value, "selects " + used);
  }
}

}  // namespace

void judge_network(const NetworkFacts& f, Items& out) {
  const std::string master = detail::cat(f.master_addr, ":", f.master_port);
  if (f.resolve_error) {
    out.fail("network.master", "master address", f.master_addr,
             detail::cat(f.master_addr_source, "=", f.master_addr, " does not resolve: ", *f.resolve_error, "."),
             "set MASTER_ADDR to the name or IP address of rank 0's host, as every node can reach it.");
  } else if (f.num_nodes > 1 && f.route.target_is_loopback && literal_loopback(f.master_addr)) {
    out.fail("network.master", "master address", f.master_addr,
             detail::cat(f.master_addr_source, "=", f.master_addr, " is a loopback address, but the job spans ",
                         f.num_nodes, " nodes: the other nodes cannot reach it."),
             "set MASTER_ADDR to rank 0's host name or its address on the cluster network.");
  } else if (f.num_nodes > 1 && f.route.target_is_loopback) {
    // Debian's "127.0.1.1 <hostname>": other nodes resolve the name through DNS and reach the
    // store, but Gloo on this host would advertise the loopback address to its peers.
    out.warn(
        "network.master", "master address", f.master_addr,
        detail::cat(f.master_addr,
                    " resolves to a loopback address on this host (/etc/hosts). Other nodes "
                    "resolve it through DNS and reach the store, but Gloo here would announce 127.x to its peers."),
        "map the host name to its cluster address in /etc/hosts, or set GLOO_SOCKET_IFNAME to the cluster "
        "interface.");
  } else if (f.is_rank0 && !f.agent_store && f.num_nodes >= 1 && !f.route.target_is_local &&
             !f.route.target_is_loopback && f.route.error.empty() && f.master_addr_source.rfind("default", 0) != 0) {
    out.fail("network.master", "master address", f.master_addr,
             detail::cat("this is rank 0, which serves the store, but ", f.master_addr_source, "=", f.master_addr,
                         " is not one of this host's addresses: the other ranks would wait at another host."),
             "set MASTER_ADDR to the host of rank 0 (this host), the same on every rank.");
  } else {
    out.pass("network.master", "master address", f.master_addr, "resolves");
  }

  const std::string port_title = "master port";
  if (f.agent_store) {
    if (f.connect && !f.connect->empty()) {
      out.fail("network.port", port_title, master,
               detail::cat("torchrun's agent store at ", master, " cannot be reached: ", *f.connect, "."),
               "check that the node of the rendezvous endpoint is up and that a firewall allows the port.");
    } else {
      out.pass("network.port", port_title, master,
               f.connect ? "served by torchrun's agent store; reachable" : "served by torchrun's agent store");
    }
  } else if (!f.port && f.master_port == 0) {
    out.pass("network.port", port_title, "any free port", "one process: the store takes any free port");
  } else if (f.port) {
    const bool planned = f.master_port_source == kTorchDefaultSource;
    if (f.port->free) {
      out.pass("network.port", port_title, detail::cat(f.master_port, " (", f.master_port_source, ")"), "free");
    } else {
      std::string who = f.port->holder ? detail::cat("pid ", f.port->holder->pid, " (", f.port->holder->name, ")")
                                       : std::string("another process");
      int suggestion = some_free_port();
      std::string value = detail::cat(f.master_port, " (", f.master_port_source, ")");
      std::string message = f.port->in_use
                                ? detail::cat("port ", f.master_port, " is taken on this host by ", who,
                                              ". Rank 0 could not serve the rendezvous store there.")
                                : detail::cat("port ", f.master_port, " cannot be bound here: ", f.port->error, ".");
      std::string fix = detail::cat("set MASTER_PORT to a free port",
                                    suggestion > 0 ? detail::cat(" (", suggestion, " is free now)") : std::string(),
                                    ", the same on every rank (torchrun: --master_port)",
                                    f.port->in_use ? "; or stop " + who + " if it is a leftover run." : ".");
      if (planned) {  // nobody asked for this port yet: a warning for the next launch
        out.warn("network.port", port_title, value, message, fix);
      } else {
        out.fail("network.port", port_title, value, message, fix);
      }
    }
  } else {
    out.pass("network.port", port_title, master, "rank 0 serves it; not tested from this rank");
  }

  if (!f.route.error.empty() && !f.resolve_error) {
    out.warn("network.route", "route to master", f.master_addr,
             detail::cat("no route to ", f.master_addr, ": ", f.route.error, "."),
             "check this host's network configuration (`ip route get <master address>`).");
  } else if (!f.resolve_error) {
    out.pass("network.route", "route to master",
             detail::cat(f.route.interface.empty() ? "?" : f.route.interface, " (", f.route.local_address, ")"),
             "the interface this host uses to reach the master");
  }
  judge_ifname("NCCL_SOCKET_IFNAME", f.nccl_socket_ifname, true, f.interfaces, out);
  judge_ifname("GLOO_SOCKET_IFNAME", f.gloo_socket_ifname, false, f.interfaces, out);
}

}  // namespace dtcore::check
