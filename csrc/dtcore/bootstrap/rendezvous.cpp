#include "dtcore/bootstrap/rendezvous.h"

#include <memory>
#include <utility>

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dtcore/bootstrap/rendezvous_store.h"
#include "dtcore/bootstrap/store_socket.h"
#include "dtcore/common/c10_error.h"
#include "dtcore/common/error.h"
#include "dtcore/common/interrupt.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"
#include "dtcore/common/units.h"

// Note [Rendezvous keys]
// All keys live under "dtcore/attempt_<restart count>/" so that a torchrun agent store that
// outlives a restart never mixes attempts. Below that prefix:
//   roster/started    add() counter of ranks connected to the store (a failing server waits for them)
//   roster/claim/<r>  add() counter: a second claim of rank r means two processes share a rank
//   roster/<r>        rank r's encoded RosterEntry
//   roster/joined     add() counter of registered ranks
//   roster/all        rank 0's verdict on success: all entries, one per rank, separated by \x1e
//   roster/abort      any rank's verdict on failure: the message every rank raises
//   roster/abort_ack  add() counter: ranks that raised the abort (the server lingers for them)
// Waiting is done by polling check()/add(), not store->wait(): c10d logs a warning with a stack
// trace for every wait that times out, and dtcore prints its own progress lines instead.

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr char kRecordSep = '\x1e';

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

struct Context : StoreDial {
  std::string where;  // "host:port" of the store, for messages
};

std::vector<int> missing_ranks(c10d::Store& store, int world) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    if (!store.check({"roster/" + std::to_string(r)})) missing.push_back(r);
  }
  return missing;
}

std::string timeout_message(const Context& c, const std::vector<int>& missing) {
  int world = c.spec.world_size.value;
  if (missing.empty()) {
    // Every rank this process expects has joined, yet rank 0 never declared the roster complete:
    // rank 0 waits for more ranks than this one knows of.
    return detail::cat("rendezvous timed out after ", static_cast<int>(c.elapsed() + 0.5), " s: all ", world,
                       " ranks that this process expects (", c.spec.world_size.source, "=", world, ") joined at ",
                       c.where,
                       ", but the rendezvous never completed: most likely rank 0 expects a different world size "
                       "(it waits for more ranks), or rank 0 is stuck. Fix: start every rank with the same world size "
                       "(one launcher command for the whole job); if they agree, look at rank 0's log.");
  }
  return detail::cat("rendezvous timed out after ", static_cast<int>(c.elapsed() + 0.5),
                     " s: ", world - static_cast<int>(missing.size()), " of ", world, " ranks joined at ", c.where,
                     "; missing rank", missing.size() == 1 ? " " : "s ", format_ranks(missing),
                     ". Fix: check that the missing ranks were started (all nodes of the job, with the same "
                     "WORLD_SIZE) and can reach ",
                     c.where, "; to wait longer, raise init(timeout=) or ", knobs::kTimeout.name, ".");
}

// After a failure, the rank that serves the store waits (at most a second) until every rank that
// started has read the failure, so that they raise it instead of "lost the store".
void linger_for_readers(c10d::Store& store, bool serving) {
  if (!serving) return;
  auto until = Clock::now() + milliseconds(1000);
  Backoff backoff = store_backoff();
  while (Clock::now() < until && store.add("roster/abort_ack", 0) < store.add("roster/started", 0)) backoff.pause();
}

// Publishes a failure that every rank raises, and raises it here.
[[noreturn]] void abort_all(c10d::Store& store, const std::string& message, bool serving) {
  try {
    store.set("roster/abort", bytes(message));
    store.add("roster/abort_ack", 1);
    linger_for_readers(store, serving);
  } catch (const std::exception&) {
    // The store is gone: the others will report its loss. Our own message is what matters here.
  }
  throw RendezvousError(message);
}

// Raises the failure another rank published.
[[noreturn]] void raise_abort(c10d::Store& store, bool serving) {
  std::string message = text(store.get("roster/abort"));
  try {
    store.add("roster/abort_ack", 1);
    linger_for_readers(store, serving);
  } catch (const std::exception&) {
  }
  throw RendezvousError(message);
}

void wait_as_rank0(const Context& c, c10d::Store& store, bool serving) {
  const int world = c.spec.world_size.value;
  auto next_log = Clock::now() + c.log_interval;
  Backoff backoff = store_backoff();
  for (;;) {
    int64_t joined = store.add("roster/joined", 0);
    if (joined >= world) return;
    if (store.check({"roster/abort"})) raise_abort(store, serving);
    if (Clock::now() >= c.deadline) abort_all(store, timeout_message(c, missing_ranks(store, world)), serving);
    if (Clock::now() >= next_log) {
      auto missing = missing_ranks(store, world);
      // A warning: a wait of seconds is worth seeing on every console, whichever ranks log info.
      log::warn("rendezvous: ", world - static_cast<int>(missing.size()), "/", world, " ranks joined at ", c.where,
                " after ", static_cast<int>(c.elapsed()), " s; waiting for rank", missing.size() == 1 ? " " : "s ",
                format_ranks(missing), ", not started yet or unable to reach this host (", static_cast<int>(c.left()),
                " s left)");
      next_log = Clock::now() + c.log_interval;
    }
    backoff.pause();
  }
}

void wait_for_verdict(const Context& c, c10d::Store& store) {
  auto next_log = Clock::now() + c.log_interval;
  Backoff backoff = store_backoff();
  for (;;) {
    if (store.check({"roster/all"})) return;
    if (store.check({"roster/abort"})) raise_abort(store, false);
    if (Clock::now() >= c.deadline) {
      if (store.check({"roster/all"})) return;  // completed at the last moment
      // Published, so that the others stop too instead of going on without this rank.
      abort_all(store, timeout_message(c, missing_ranks(store, c.spec.world_size.value)), false);
    }
    if (Clock::now() >= next_log) {
      const auto missing = missing_ranks(store, c.spec.world_size.value);
      log::warn("rendezvous: rank ", c.spec.rank.value, " has waited ", static_cast<int>(c.elapsed()), " s for rank",
                missing.size() == 1 ? " " : "s ", format_ranks(missing), " to join at ", c.where,
                ", not started yet or unable to reach it (", static_cast<int>(c.left()), " s left)");
      next_log = Clock::now() + c.log_interval;
    }
    backoff.pause();
  }
}

std::vector<RosterEntry> split_roster(const std::string& all) {
  std::vector<RosterEntry> out;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find(kRecordSep, start);
    if (end == std::string::npos) end = all.size();
    out.push_back(RosterEntry::decode(all.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

// A connection of the rendezvous's own to a store the caller owns, so that setting its timeout
// leaves the caller's alone; the store itself where it cannot be cloned (c10d's HashStore).
c10::intrusive_ptr<c10d::Store> own_connection(const c10::intrusive_ptr<c10d::Store>& store) {
  try {
    return store->clone();
  } catch (const std::exception&) {
    return store;
  }
}

// The port a TCPStore (under any prefixes) listens on, or `otherwise`.
int tcp_port(const c10::intrusive_ptr<c10d::Store>& store, int otherwise) {
  c10::intrusive_ptr<c10d::Store> s = store;
  if (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get())) s = prefixed->getUnderlyingNonPrefixStore();
  auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get());
  return tcp != nullptr ? static_cast<int>(tcp->getPort()) : otherwise;
}

}  // namespace

RendezvousOptions RendezvousOptions::from(const Settings& settings, int generation) {
  RendezvousOptions o;
  o.timeout = seconds_to_timeout(settings.timeout_s.value, settings.timeout_s.source);
  o.log_interval = seconds_to_timeout(settings.rdzv_log_interval_s.value, settings.rdzv_log_interval_s.source);
  o.generation = generation;
  return o;
}

std::unique_ptr<Rendezvous> Rendezvous::join(const WorldSpec& spec, RosterEntry self, const RendezvousOptions& options,
                                             const Env& env, c10::intrusive_ptr<c10d::Store> existing) {
  const Clock::time_point start = Clock::now();
  Context c{{spec, env, options.log_interval, start, start + options.timeout},
            store::endpoint(spec.master_addr.value, spec.master_port.value)};
  const int rank = spec.rank.value;
  const int world = spec.world_size.value;
  const std::string server = spec.use_agent_store ? std::string("the torchrun agent")
                             : existing           ? std::string("torch.distributed's rank 0")
                                                  : std::string("rank 0");
  std::unique_ptr<Rendezvous> rdzv(new Rendezvous());

  // Rank 0 serves the store, its own or torch.distributed's, unless the torchrun agent does.
  const bool serving = rank == 0 && !spec.use_agent_store;
  // Rank 0's secret file lives until the rendezvous ends: by then every rank has read it.
  StoreConnection connection;
  if (existing) {
    connection.store = own_connection(existing);
    connection.port = tcp_port(existing, spec.master_port.value);
  } else {
    connection = connect_store(c);
  }
  c10::intrusive_ptr<c10d::Store> raw = connection.store;
  rdzv->port_ = connection.port;
  rdzv->spec_ = spec;
  if (spec.master_port.value != rdzv->port_) {
    rdzv->spec_.master_port = existing
                                  ? Sourced<int>{rdzv->port_, "torch.distributed's store"}
                                  : Sourced<int>{rdzv->port_, "chosen: a free port (" + spec.master_port.source + ")"};
  }
  c.where = store::endpoint(spec.master_addr.value, rdzv->port_);
  rdzv->raw_store_ = raw;
  rdzv->rank_ = rank;
  rdzv->prefix_ = detail::cat("dtcore/attempt_", spec.restart_count, "/generation_", options.generation);
  rdzv->store_ = c10::make_intrusive<c10d::PrefixStore>(rdzv->prefix_, raw);
  rdzv->store_owner_ = spec.use_agent_store ? "the torchrun agent at " + c.where
                       : existing           ? "torch.distributed's store at " + c.where
                                            : detail::cat("rank 0 (host ", spec.master_addr.value, ")");
  c10d::Store& store = *rdzv->store_;
  log::debug("rendezvous: ", serving ? "serving" : "connected to", " the store at ", c.where);

  try {
    store.add("roster/started", 1);
    self.rank = rank;
    if (store.add("roster/claim/" + std::to_string(rank), 1) > 1) {
      std::string other = "another process";
      if (store.check({"roster/" + std::to_string(rank)})) {
        auto e = RosterEntry::decode(text(store.get("roster/" + std::to_string(rank))));
        other = detail::cat("host ", e.host, ", pid ", e.pid);
      }
      abort_all(store,
                detail::cat("two processes claim rank ", rank, ": ", other, " and host ", self.host, ", pid ", self.pid,
                            ". Fix: give every process a distinct rank (", spec.rank.source,
                            "); the launcher does this when it starts them."),
                serving);
    }
    store.set("roster/" + std::to_string(rank), bytes(self.encode()));
    // Opened before this rank counts as joined: rank 0 (serving) waits for every join, so the
    // server is up now, which it need not be once rank 0 has returned from init().
    auto spare = own_connection(raw);
    spare->setTimeout(options.timeout);  // a clone inherits what is left of the rendezvous timeout
    rdzv->spare_ = c10::make_intrusive<c10d::PrefixStore>(rdzv->prefix_, spare);
    store.add("roster/joined", 1);

    if (rank == 0) {
      wait_as_rank0(c, store, serving);
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back("roster/" + std::to_string(r));
      std::string all;
      for (const auto& value : store.multiGet(keys)) {
        rdzv->roster_.push_back(RosterEntry::decode(text(value)));
        all += text(value) + kRecordSep;
      }
      std::string problem = compare_fingerprints(rdzv->roster_);
      if (problem.empty()) problem = find_shared_devices(rdzv->roster_);
      if (!problem.empty()) abort_all(store, problem, serving);
      store.set("roster/all", bytes(all));
      log::info("rendezvous: all ", world, " ranks joined at ", c.where, " in ", static_cast<int>(c.elapsed() * 1000),
                " ms");
    } else {
      wait_for_verdict(c, store);
    }
  } catch (const RendezvousError&) {
    throw;
  } catch (const Interrupted&) {
    throw;
  } catch (const std::exception& e) {
    DTCORE_CHECK(false, RendezvousError, "rank ", rank, " lost the rendezvous store at ", c.where, " (served by ",
                 server, ") after ", static_cast<int>(c.elapsed()), " s: ", error_text(e), " ", server,
                 " has probably exited; its own log says why. Fix: look at ", server,
                 "'s error first; this rank only lost its connection.");
  }
  // Operations after rendezvous (communicator set-up) get the full timeout of their own.
  rdzv->raw_store_->setTimeout(options.timeout);
  return rdzv;
}

void Rendezvous::close() {
  spare_.reset();
  store_.reset();
  raw_store_.reset();
}

c10::intrusive_ptr<c10d::Store> Rendezvous::new_connection() {
  if (spare_) return std::exchange(spare_, {});
  DTCORE_CHECK(raw_store_, CommError,
               "the rendezvous store is closed (dtcore.shutdown() was called). Fix: call dtcore.init() again.");
  auto connection = own_connection(raw_store_);
  connection->setTimeout(raw_store_->getTimeout());
  return c10::make_intrusive<c10d::PrefixStore>(prefix_, connection);
}

const std::vector<RosterEntry>& Rendezvous::roster() {
  if (roster_.empty()) {
    DTCORE_CHECK(store_, CommError,
                 "the rendezvous store is closed (dtcore.shutdown() was called). Fix: call dtcore.init() again.");
    roster_ = split_roster(text(store_->get("roster/all")));
  }
  return roster_;
}

}  // namespace dtcore
