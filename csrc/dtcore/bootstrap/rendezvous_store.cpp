#include "dtcore/bootstrap/rendezvous_store.h"

#include <netinet/in.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dtcore/bootstrap/store_client.h"
#include "dtcore/bootstrap/store_server.h"
#include "dtcore/bootstrap/store_socket.h"
#include "dtcore/common/c10_error.h"
#include "dtcore/common/deadline.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// A dtcore store greets as soon as it accepts; a listener silent this long is something else.
constexpr milliseconds kGreetingWait{10'000};

// Note [Store address]: dtcore's store listens only where the job needs it (Note [Job secret]):
// at the master address, or at loopback when the launcher says the job has one node. Every rank
// of a one-node job runs on rank 0's host, so none needs another interface, and no other host
// can even reach the port. "Says": a node count or a local world size from the launcher (or
// DTCORE_*, or init()); a bare RANK/WORLD_SIZE job may span hosts, so it keeps the master
// address. Both ends use store_host(), so they always meet.
std::string store_host(const WorldSpec& spec) {
  const bool one_node = spec.num_nodes.value <= 1 && !spec.local_world_size.source.starts_with("default:");
  return one_node && !spec.use_agent_store ? "127.0.0.1" : spec.master_addr.value;
}

struct Context : StoreDial {
  std::string host;   // where the store listens and every rank dials: store_host()
  std::string where;  // "host:port" of it, for messages
};

bool is_loopback(const store::Address& a) {
  if (a.family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr) >> 24) == 127;
  }
  return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&a.storage)->sin6_addr);
}

// A job of several nodes serves the store at the master address (Note [Store address]); there
// that address must not be a loopback one, or no other node could ever reach it.
void refuse_loopback_for_many_nodes(const Context& c) {
  if (c.spec.num_nodes.value <= 1) return;
  std::string error;
  std::vector<store::Address> addrs = store::resolve(c.spec.master_addr.value, c.spec.master_port.value, error);
  bool all_loopback = !addrs.empty() && std::all_of(addrs.begin(), addrs.end(), is_loopback);
  DTCORE_CHECK(!all_loopback, RendezvousError, "MASTER_ADDR=", c.spec.master_addr.value, " (",
               c.spec.master_addr.source, ") is a loopback address on rank 0's host, where the rendezvous store ",
               "listens, but the job spans ", c.spec.num_nodes.value, " nodes (", c.spec.num_nodes.source,
               "): the other nodes could never reach it. A host name that /etc/hosts maps to 127.0.1.1 is the usual "
               "cause. Fix: set MASTER_ADDR to an address of rank 0's host that the other nodes reach (`hostname -I` "
               "lists them).");
}

[[noreturn]] void nothing_accepts(const Context& c, const std::string& server, const std::string& seen = "") {
  throw RendezvousError(detail::cat(
      "rendezvous timed out after ", static_cast<int>(c.elapsed()), " s on rank ", c.spec.rank.value,
      ": no store serves at ", c.where, seen.empty() ? "" : " (last try: " + seen + ")", ", where ", server,
      " should serve the rendezvous store. Missing ranks: 0 (", server,
      " is not running or not reachable). Fix: check that ", server,
      " was started and that MASTER_ADDR=", c.spec.master_addr.value, " and MASTER_PORT=", c.spec.master_port.value,
      " name its host and port as this host can reach them."));
}

// A StoreClient for `port`, retrying within the timeout what time may cure: a connection refused,
// dropped in the handshake, or refused by the server for a transient reason (its load, its
// descriptors, a flood of strangers' connections; Note [Store protocol]), warning once with the
// server's reason. A refused job secret ends it after a few tries, unless the secret came from a
// file, which may have been a previous job's and is read again. Other refusals end it at once.
c10::intrusive_ptr<StoreClient> connect_client(const Context& c, const std::string& server, int port,
                                               JobSecret& secret) {
  constexpr int kHandshakeTries = 3;
  Backoff backoff = store_backoff();
  std::string last;  // the last failure that was retried, for the message at the deadline
  bool warned = false;
  for (int refused = 0;; backoff.pause()) {
    try {
      return c10::make_intrusive<StoreClient>(c.host, port, secret.value, c.left_ms());
    } catch (const StoreRefused& e) {
      if (e.reason() == store::RefuseReason::WrongSecret) {
        ++refused;
        DTCORE_CHECK((secret.from_file || refused < kHandshakeTries) && Clock::now() < c.deadline, RendezvousError,
                     e.what(), " (rank ", c.spec.rank.value, " has its job secret from ", secret.source,
                     "; every rank needs the same.)");
        reload_secret(secret);
        continue;
      }
      if (!e.transient()) throw;
      last = e.what();
      if (!warned) {
        log::warn("rendezvous: rank ", c.spec.rank.value, ": ", last, " (", static_cast<int>(c.left()), " s left)");
        warned = true;
      }
    } catch (const c10::DistNetworkError& e) {
      last = e.what_without_backtrace();  // nothing accepts (rank 0 gone), or the handshake was dropped
    }
    if (Clock::now() >= c.deadline) {
      if (warned || last.find(kDroppedInHandshake) != std::string::npos) {
        throw RendezvousError(detail::cat("rendezvous timed out after ", static_cast<int>(c.elapsed()), " s on rank ",
                                          c.spec.rank.value, ": ", server, " serves the store at ", c.where,
                                          ", but no handshake with it completed; the last try: ", last));
      }
      nothing_accepts(c, server, last);
    }
  }
}

// Rank 0: serves dtcore's store at the master address only, then connects to it like any rank.
c10::intrusive_ptr<StoreClient> serve(const Context& c, SecretFile& secret_file) {
  refuse_loopback_for_many_nodes(c);
  JobSecret secret = server_secret(c.spec, c.env);
  auto server = std::make_shared<StoreServer>(c.host, c.spec.master_port.value, secret.value);
  secret_file = publish_secret(secret);  // once the port is ours: the file is named by it
  secret.from_file = false;              // rank 0 has it from memory
  auto client = connect_client(c, "rank 0", server->port(), secret);
  client->hold(server);
  return client;
}

// Waits (with progress lines) until something accepts at the master address. With `greeting`,
// that something must greet as a dtcore store: a listener that is silent or says something else
// ends the rendezvous at once, naming host:port (see Note [Store protocol]).
void wait_for_listener(const Context& c, const std::string& server, bool greeting) {
  auto next_log = Clock::now() + c.log_interval;
  Backoff backoff = store_backoff();
  const std::string& host = c.host;
  const int port = c.spec.master_port.value;
  for (;;) {
    Clock::time_point now = Clock::now();
    Clock::time_point connect_by = std::min(c.deadline, now + milliseconds(500));
    std::string detail;
    store::Probe p = store::Probe::Nothing;
    if (greeting) {
      p = store::probe(host, port, connect_by, std::min(c.deadline, now + kGreetingWait), detail);
    } else if (store::connect_any(host, port, connect_by, detail).valid()) {
      p = store::Probe::Store;
    }
    if (p == store::Probe::Store) return;
    DTCORE_CHECK(p == store::Probe::Nothing, RendezvousError, "rank ", c.spec.rank.value, " reached ", c.where,
                 ", where ", server, " should serve the rendezvous store, but the listener there is not a dtcore ",
                 "store: ", detail, " (after ", static_cast<int>(c.elapsed() * 1000), " ms). Another program holds ",
                 "that port",
                 p == store::Probe::Silent
                     ? std::string(", or the serving process cannot accept connections (out of file descriptors and "
                                   "no spare left to refuse with: its console says so; raise `ulimit -n` there)")
                     : std::string(),
                 ". Fix: give the job another port (MASTER_PORT=<port>, torchrun --master_port=<port>, or ",
                 "init(master_port=)), or stop the other program (`ss -ltnp 'sport = :", port, "'` names it).");
    if (Clock::now() >= c.deadline) nothing_accepts(c, server, detail);
    if (Clock::now() >= next_log) {
      log::warn("rendezvous: rank ", c.spec.rank.value, " has waited ", static_cast<int>(c.elapsed()), " s for ",
                server, " to serve the store at ", c.where, ": not started yet, or its host is unreachable (",
                static_cast<int>(c.left()), " s left)");
      next_log = Clock::now() + c.log_interval;
    }
    backoff.pause();
  }
}

// Every rank but 0: connects to dtcore's store with the job secret, within the timeout.
c10::intrusive_ptr<StoreClient> join_store(const Context& c, const std::string& server) {
  wait_for_listener(c, server, true);
  JobSecret secret = client_secret(c);
  return connect_client(c, server, c.spec.master_port.value, secret);
}

// Under torchrun's agent store: c10d's TCPStore client, whose handshake has no timeout of its own
// (a listener that accepts and never answers holds it forever), so it is made on a helper
// thread and abandoned at the deadline.
c10::intrusive_ptr<c10d::Store> join_agent_store(const Context& c, const std::string& server) {
  wait_for_listener(c, server, false);
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(c.spec.master_port.value);
  opts.isServer = false;
  opts.waitWorkers = false;
  opts.timeout = c.left_ms();
  std::string error;
  std::optional<c10::intrusive_ptr<c10d::Store>> store;
  try {
    store = with_deadline<c10::intrusive_ptr<c10d::Store>>(
        [host = c.spec.master_addr.value, opts]() -> c10::intrusive_ptr<c10d::Store> {
          return c10::make_intrusive<c10d::TCPStore>(host, opts);
        },
        c.deadline);
  } catch (const std::exception& e) {
    error = error_text(e);
  }
  bool done = store.has_value() || !error.empty();
  DTCORE_CHECK(done, RendezvousError, "rank ", c.spec.rank.value, " reached ", c.where, ", where ", server,
               " serves the rendezvous store, but the listener there did not complete c10d's TCPStore handshake in ",
               static_cast<int>(c.elapsed()), " s: it is not a torch store (another program holds the port) or the ",
               "agent is stuck. Fix: give the job another port (torchrun --master_port=<port>), or stop the other ",
               "program (`ss -ltnp 'sport = :", c.spec.master_port.value, "'` names it).");
  DTCORE_CHECK(error.empty(), RendezvousError, "rank ", c.spec.rank.value, " reached ", c.where,
               " but could not talk to a rendezvous store there: ", error,
               " Fix: check that MASTER_PORT is this job's and not another program's.");
  return *store;
}

}  // namespace

Backoff store_backoff() { return Backoff(milliseconds(5), milliseconds(200), Backoff::Interrupt::kCheck); }

StoreConnection connect_store(const StoreDial& dial) {
  const std::string host = store_host(dial.spec);
  Context c{dial, host, store::endpoint(host, dial.spec.master_port.value)};
  const std::string server = dial.spec.use_agent_store ? "the torchrun agent" : "rank 0";
  StoreConnection out;
  if (dial.spec.use_agent_store) {
    out.store = join_agent_store(c, server);
    out.port = c10::static_intrusive_pointer_cast<c10d::TCPStore>(out.store)->getPort();
  } else {
    auto client = dial.spec.rank.value == 0 ? serve(c, out.secret_file) : join_store(c, server);
    out.port = client->port();
    out.store = client;
  }
  return out;
}

}  // namespace dtcore
