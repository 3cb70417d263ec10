// connect_store(): how a rank gets its connection to the rendezvous store, every step bounded by
// the rendezvous deadline.
//
// Rank 0 serves dtcore's StoreServer at the master address only (Note [Job secret] for the secret
// and the one-node file) and connects to it like the others. Every other rank waits until the
// master port accepts, checks that a dtcore store greets there (a listener that is silent or
// speaks something else is a RendezvousError naming host:port and the fix), reads the job secret
// and connects. Under torchrun's agent store, every rank is a client of the agent's c10d
// TCPStore, made on a helper thread and given up at the deadline (its handshake has no timeout).
//
// Ownership: the StoreConnection owns the connection (on rank 0 it holds the server) and rank 0's
// secret file. Thread safety: one call per rank; the store may be used as c10d allows.
#pragma once

#include <algorithm>
#include <chrono>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "dtcore/bootstrap/job_secret.h"
#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/backoff.h"
#include "dtcore/common/env.h"

namespace dtcore {

// One rendezvous attempt: who dials, and its clock. Every wait of the rendezvous (the store's
// port, the job secret file, the roster) ends at `deadline` and reports the time since `start`.
struct StoreDial {
  using Clock = std::chrono::steady_clock;

  const WorldSpec& spec;
  const Env& env;
  std::chrono::milliseconds log_interval;  // between "waiting for ..." lines
  Clock::time_point start;                 // of the rendezvous (join()), not of this step
  Clock::time_point deadline;

  // Seconds since `start`, and seconds left until `deadline` (never negative), for messages.
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  double left() const { return std::max(0.0, std::chrono::duration<double>(deadline - Clock::now()).count()); }
  // What is left, as a timeout for a call: at least 1 ms, since StoreClient takes 0 for "no timeout".
  std::chrono::milliseconds left_ms() const {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  }
};

// Polls of the store and its port: fast when ranks arrive together, light on rank 0's server when
// they do not. Interruptible: the user sits in these waits (backoff.h).
Backoff store_backoff();

struct StoreConnection {
  c10::intrusive_ptr<c10d::Store> store;  // a StoreClient (on rank 0 holding the server) or the agent's TCPStore
  int port = 0;                           // the port really used (rank 0 may have been asked for any free one)
  SecretFile secret_file;                 // rank 0's, deleted with this object: keep it until every rank joined
};

StoreConnection connect_store(const StoreDial& dial);

}  // namespace dtcore
