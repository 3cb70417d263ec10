// The job secret: the bytes every rank proves to the rendezvous store (StoreServer) before it
// may read or write a key. Where it comes from, how it is handed to the ranks of one node, and
// what happens without one. See Note [Job secret].
//
// Ownership: JobSecret is a value; a SecretFile owns the file rank 0 wrote and deletes it when
// destroyed. Thread safety: the functions are reentrant; a JobSecret is used by one thread.
#pragma once

#include <string>
#include <utility>

#include "dtcore/bootstrap/world_spec.h"
#include "dtcore/common/env.h"

// Note [Job secret]
// In order of precedence:
//   1. DTCORE_JOB_SECRET: the same value on every node (a launcher, or the user's job script).
//   2. DTCORE_JOB_SECRET_FILE: a file readable by the user only (mode 0600), e.g. on a filesystem
//      every node shares. When it does not exist, rank 0 writes a random secret there once it
//      holds the master port, and deletes it when the rendezvous ends; the other ranks wait for it.
//   3. A job on one node (num_nodes == 1) without either: the same, in a private directory of
//      this host ($XDG_RUNTIME_DIR/dtcore, else /tmp/dtcore-<uid>, mode 0700, owned by the user;
//      any other directory is refused), in a file named by the master port, which only the job
//      holding that port writes. A world of one keeps a random secret in memory.
//   4. A job on several nodes without either: there is no private channel to hand a secret over,
//      and refusing would break every plain multi-node torchrun, so the store runs with a fixed,
//      public secret: it still refuses foreign protocols and bounds what strangers may send, but
//      anyone who can reach the port and runs dtcore can use it. Rank 0 says so at WARNING level,
//      naming the fix (set DTCORE_JOB_SECRET on every node).
// The secret is never logged, never stored in the store, never part of a message: messages name
// its source (the variable or the file) instead. Secret files are refused when readable by others.

namespace dtcore {

struct StoreDial;  // rendezvous_store.h

struct JobSecret {
  std::string value;          // the secret; never logged
  std::string source;         // where it came from, for messages (a variable or a file, never the value)
  std::string path;           // the file it is read from or written to; "" when none
  bool from_file = false;     // read from a file: a failed handshake may mean a stale file, so re-read
  bool publish = false;       // rank 0 must write it to `path` (cases 2 without a file, and 3)
  bool authenticates = true;  // false: the public fallback of case 4
};

// Rank 0's secret (cases 1-4), warning in case 4. Writes no file yet: see publish_secret().
JobSecret server_secret(const WorldSpec& spec, const Env& env);

// The file rank 0 owns until the rendezvous ends: deleted on destruction (if it wrote one).
class SecretFile {
 public:
  SecretFile() = default;
  explicit SecretFile(std::string path) : path_(std::move(path)) {}
  ~SecretFile() { remove(); }
  SecretFile(SecretFile&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  SecretFile& operator=(SecretFile&& other) noexcept {
    if (this != &other) {
      remove();
      path_ = std::exchange(other.path_, "");
    }
    return *this;
  }
  SecretFile(const SecretFile&) = delete;
  SecretFile& operator=(const SecretFile&) = delete;

 private:
  void remove() noexcept;  // unlinks the file, if any
  std::string path_;
};

// Writes rank 0's secret to its file when `secret.publish` (else does nothing); call once rank 0
// holds the master port, which makes the file name its own. Atomic (a private temporary file,
// then rename), mode 0600. Throws RendezvousError naming the path and the fix.
SecretFile publish_secret(const JobSecret& secret);

// The secret of a rank that connects (cases 1-4): waits until the dial's deadline for the file
// rank 0 writes, logging every `log_interval`. Throws RendezvousError naming the file and the fix,
// and the time since the rendezvous started.
JobSecret client_secret(const StoreDial& dial);
// Reads the file again (after a failed handshake: it may have been a previous job's).
void reload_secret(JobSecret& secret);

}  // namespace dtcore
