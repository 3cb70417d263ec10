#include "dtcore/bootstrap/store_socket.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "dtcore/common/error.h"

// See Note [Store protocol] in store_protocol.h.

namespace dtcore::store {
namespace {

// Milliseconds to pass to poll() for `deadline`, rounded up so that a wait never ends early; -1 = none.
int poll_timeout(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1'000'000));
}

// Waits for `events` on fd until `deadline`. Ok when ready (or the peer hung up: the read or
// write that follows reports it), Timeout, or Failed.
IoResult wait_for(int fd, short events, Clock::time_point deadline, std::string& error) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    int n = poll(&pfd, 1, poll_timeout(deadline));
    if (n > 0) return IoResult::Ok;
    if (n == 0) {
      if (Clock::now() >= deadline) return IoResult::Timeout;
      continue;
    }
    if (errno == EINTR) continue;
    error = std::strerror(errno);
    return IoResult::Failed;
  }
}

}  // namespace

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::vector<Address> resolve(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;  // no AI_PASSIVE: an empty host never means "every interface"
  addrinfo* list = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  std::vector<Address> out;
  if (rc != 0) {
    error = gai_strerror(rc);
    return out;
  }
  for (addrinfo* ai = list; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family != AF_INET && ai->ai_family != AF_INET6) continue;
    Address a;
    std::memcpy(&a.storage, ai->ai_addr, ai->ai_addrlen);
    a.length = ai->ai_addrlen;
    a.family = ai->ai_family;
    out.push_back(a);
  }
  freeaddrinfo(list);
  if (out.empty()) error = "no IPv4 or IPv6 address";
  // One family, the same on the server and every client: IPv4 when the name has an IPv4 address.
  // A client that also tried the other family's addresses could reach a stranger listening at the
  // same port there (e.g. at [::1] when rank 0 listens at 127.0.0.1 for "localhost"), which then
  // relays the handshake to the real store and sits in the middle of an authenticated session.
  if (std::any_of(out.begin(), out.end(), [](const Address& a) { return a.family == AF_INET; })) {
    std::erase_if(out, [](const Address& a) { return a.family != AF_INET; });
  }
  return out;
}

std::string endpoint(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string address_name(const sockaddr_storage& addr, socklen_t length) {
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), length, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  return endpoint(host, std::atoi(serv));
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Fd connect_by(const Address& addr, Clock::time_point deadline, std::string& error) {
  Fd fd(::socket(addr.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    error = std::string("socket() failed: ") + std::strerror(errno);
    return Fd();
  }
  int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length);
  if (rc != 0 && errno != EINPROGRESS) {
    error = std::strerror(errno);
    return Fd();
  }
  if (rc != 0) {
    IoResult r = wait_for(fd.get(), POLLOUT, deadline, error);
    if (r == IoResult::Timeout) {
      error = "the TCP connection was not established in time (no answer to the connection request)";
      return Fd();
    }
    if (r != IoResult::Ok) return Fd();
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      error = std::strerror(err);
      return Fd();
    }
  }
  set_nodelay(fd.get());
  return fd;
}

Fd connect_any(const std::string& host, int port, Clock::time_point deadline, std::string& error, bool* resolved) {
  std::vector<Address> addrs = resolve(host, port, error);
  if (resolved != nullptr) *resolved = !addrs.empty();
  for (const Address& addr : addrs) {
    if (Fd fd = connect_by(addr, deadline, error); fd.valid()) return fd;
  }
  return Fd();
}

IoResult wait_readable(int fd, Clock::time_point deadline, std::string& error) {
  return wait_for(fd, POLLIN, deadline, error);
}

IoResult send_all(int fd, const std::uint8_t* data, std::size_t size, Clock::time_point deadline, std::string& error) {
  std::size_t sent = 0;
  while (sent < size) {
    ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      IoResult r = wait_for(fd, POLLOUT, deadline, error);
      if (r != IoResult::Ok) return r;
      continue;
    }
    if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return IoResult::Closed;
    error = std::strerror(errno);
    return IoResult::Failed;
  }
  return IoResult::Ok;
}

IoResult recv_exact(int fd, std::uint8_t* data, std::size_t size, Clock::time_point deadline, std::string& error) {
  std::size_t got = 0;
  while (got < size) {
    ssize_t n = ::recv(fd, data + got, size - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
      continue;
    }
    if (n == 0) return IoResult::Closed;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      IoResult r = wait_for(fd, POLLIN, deadline, error);
      if (r != IoResult::Ok) return r;
      continue;
    }
    if (errno == ECONNRESET) return IoResult::Closed;
    error = std::strerror(errno);
    return IoResult::Failed;
  }
  return IoResult::Ok;
}

Fd listen_at(const std::string& host, int port, int& bound_port) {
  std::string where = endpoint(host, port);
  std::string error;
  std::vector<Address> addrs = resolve(host, port, error);
  DTCORE_CHECK(!addrs.empty(), RendezvousError, "the rendezvous store cannot listen at ", where, ": ", host,
               " does not resolve (", error, "). Fix: pass an IP address of this host, or 127.0.0.1 for a job on ",
               "one machine.");
  for (const Address& addr : addrs) {
    Fd fd(::socket(addr.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      error = std::strerror(errno);
      continue;
    }
    int one = 1;  // rebind a port whose last connections are in TIME_WAIT; two listeners still cannot share it
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0) {
      DTCORE_CHECK(errno != EADDRINUSE, RendezvousError, where,
                   " is already in use on this host, so the rendezvous store cannot listen there: another job or a "
                   "leftover process holds the port. Fix: ",
                   "choose a port nobody else uses for the whole job (MASTER_PORT=<port>, torchrun ",
                   "--master_port=<port>, or init(master_port=)), or find the holder with `ss -ltnp 'sport = :", port,
                   "'`.");
      error = std::strerror(errno);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len);
    bound_port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    return fd;
  }
  DTCORE_CHECK(false, RendezvousError, "the rendezvous store cannot listen at ", where, ": ", error,
               ". Fix: pass an address of this host (`ip -brief addr` lists them), or 127.0.0.1 for a job on one "
               "machine.");
  return Fd();
}

}  // namespace dtcore::store
