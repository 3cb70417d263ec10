// Rendezvous: every rank meets every other through the rendezvous store, or says who is missing.
//
// Rank 0 serves dtcore's authenticated store (StoreServer) at master_addr:master_port, at that
// address only, and every rank connects with the job secret (StoreClient; Note [Job secret]).
// Under torchrun's agent store, everyone is a client of the agent's c10d TCPStore instead; when
// the script set up torch.distributed's default group first, everyone uses that group's store
// (`existing`), which its rank 0 already serves at the master port.
// Connecting and every handshake are bounded by the timeout: a listener at the port that is not
// a store ends in a RendezvousError naming host:port. Each rank registers a roster entry; rank 0 waits for all of them,
// logging every `log_interval` who has joined and who is missing, then checks that the
// fingerprints agree and publishes the roster. At `timeout` (counted from join()'s start) every
// started rank throws RendezvousError naming the missing ranks. See Note [Rendezvous keys].
//
// Ownership: a Rendezvous owns its store connections; on rank 0 they hold the server, which
// stops once nothing on rank 0 holds a connection (torch.distributed may hold one after close()). Thread safety: join()
// is a blocking call; the accessors are const and the store may be used from several threads as c10d allows.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/bootstrap/roster.h"
#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/env.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/settings.h"

namespace dtcore {

struct RendezvousOptions {
  std::chrono::milliseconds timeout = default_duration(knobs::kTimeout);
  std::chrono::milliseconds log_interval = default_duration(knobs::kRdzvLogInterval);
  // How many times this process has joined before: every rank of a job counts the same, and the
  // count namespaces the keys, so init() after shutdown() never reads the last round's keys from
  // a store that outlives it (torchrun's agent store).
  int generation = 0;

  // The timeout and progress interval of `settings`.
  static RendezvousOptions from(const Settings& settings, int generation);
};

class Rendezvous {
 public:
  // Blocks until every rank has joined and agreed, or throws RendezvousError. `env`: where the
  // job secret and its directory are looked up (Note [Job secret]). With `existing` (a store every
  // rank of the job reaches: torch.distributed's default one), no store is served or dialled:
  // the rendezvous runs on a connection of its own to that store, which the caller keeps owning.
  static std::unique_ptr<Rendezvous> join(const WorldSpec& spec, RosterEntry self, const RendezvousOptions& options,
                                          const Env& env, c10::intrusive_ptr<c10d::Store> existing = {});

  // The store, namespaced to this job attempt; communicators add their own prefixes.
  c10::intrusive_ptr<c10d::Store> store() const { return store_; }
  // The port the store really listens on (the chosen one when the spec asked for a free port).
  int port() const { return port_; }
  // The world this process joined: the spec it was given, with the port really used.
  const WorldSpec& spec() const { return spec_; }
  int rank() const { return rank_; }
  // Every rank's entry, indexed by rank (fetched from the store once, on first use off rank 0).
  const std::vector<RosterEntry>& roster();
  // A second connection to the same store under the same prefix, for a thread of its own. The
  // first call returns the one opened during join(), while the server was certainly up; later
  // calls open new ones.
  c10::intrusive_ptr<c10d::Store> new_connection();
  // Who serves the store, for messages: "rank 0 (host a)" or "the torchrun agent on host:port".
  const std::string& store_owner() const { return store_owner_; }
  // Drops this object's store connections (on rank 0, the server stops once nobody else holds
  // it). Idempotent; store() is null afterwards.
  void close();

 private:
  Rendezvous() = default;

  // StoreClient (on rank 0 it holds the server), the agent's TCPStore, or a connection to `existing`.
  c10::intrusive_ptr<c10d::Store> raw_store_;
  c10::intrusive_ptr<c10d::Store> store_;  // raw_store_ under this job attempt's prefix
  c10::intrusive_ptr<c10d::Store> spare_;  // a second connection, opened before joining
  WorldSpec spec_;
  std::string prefix_;
  std::string store_owner_;
  int rank_ = -1;
  int port_ = 0;
  std::vector<RosterEntry> roster_;
};

}  // namespace dtcore
