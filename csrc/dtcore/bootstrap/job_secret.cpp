#include "dtcore/bootstrap/job_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "dtcore/bootstrap/rendezvous_store.h"
#include "dtcore/bootstrap/store_protocol.h"
#include "dtcore/bootstrap/store_socket.h"
#include "dtcore/common/error.h"
#include "dtcore/common/knobs.h"
#include "dtcore/common/log.h"
#include "dtcore/common/sha256.h"

// See Note [Job secret] in job_secret.h.

namespace dtcore {
namespace {

using Clock = std::chrono::steady_clock;

// Case 4: known to everyone, so it authenticates nobody; it only keeps foreign protocols out.
constexpr char kPublicSecret[] = "dtcore-store-without-a-job-secret";
constexpr std::size_t kMaxSecretBytes = 4096;

std::string fix_with_variable() {
  return detail::cat("set ", knobs::kJobSecret.name, " to the same random value for every rank (e.g. `export ",
                     knobs::kJobSecret.name, "=$(openssl rand -hex 32)` in the job script, before the launcher)");
}

std::string random_secret() {
  store::Nonce n = store::random_nonce();
  return to_hex(n);
}

std::string mode_text(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// The secret in `path`, or nullopt when there is no such file. Refuses a file that is not the
// user's own, or that others may read: such a secret is not secret any more.
std::optional<std::string> read_secret_file(const std::string& path) {
  // O_NONBLOCK: a FIFO planted at the path must not block open(); it is refused below (not regular).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && errno == ENOENT) return std::nullopt;
  DTCORE_CHECK(fd >= 0, RendezvousError, "cannot open the job secret file ", path, ": ", std::strerror(errno),
               ". Fix: make it a regular file of yours with mode 0600 (chmod 600 ", path, "), or ", fix_with_variable(),
               ".");
  struct stat st{};
  ::fstat(fd, &st);
  std::string problem;
  if (!S_ISREG(st.st_mode)) problem = "is not a regular file";
  if (problem.empty() && st.st_uid != ::geteuid()) {
    problem = detail::cat("belongs to uid ", st.st_uid, ", not to this process's uid ", ::geteuid());
  }
  if (problem.empty() && (st.st_mode & 077) != 0) {
    problem = detail::cat("has mode ", mode_text(st.st_mode), ": other users may read it");
  }
  std::string value;
  if (problem.empty()) {
    value.resize(kMaxSecretBytes + 1);
    ssize_t n = ::read(fd, value.data(), value.size());
    value.resize(static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    while (!value.empty() && (value.back() == '\n' || value.back() == '\r' || value.back() == ' ')) value.pop_back();
    if (n < 0) problem = detail::cat("cannot be read (", std::strerror(errno), ")");
    if (problem.empty() && value.empty()) problem = "is empty";
    if (problem.empty() && value.size() > kMaxSecretBytes) problem = "is longer than 4096 bytes";
  }
  ::close(fd);
  DTCORE_CHECK(problem.empty(), RendezvousError, "the job secret file ", path, " ", problem,
               ", so dtcore does not use it. Fix: a file of yours, readable by you only, with the secret on one line "
               "(chmod 600 ",
               path, "), or ", fix_with_variable(), ".");
  return value;
}

// The private directory of case 3, created (0700) if missing; RendezvousError if it is not the
// user's own or others may enter it.
std::string private_secret_dir(const Env& env) {
  std::string dir = detail::cat("/tmp/dtcore-", ::geteuid());
  if (auto runtime = env.get("XDG_RUNTIME_DIR")) {
    struct stat st{};
    if (::stat(runtime->c_str(), &st) == 0 && S_ISDIR(st.st_mode)) dir = *runtime + "/dtcore";
  }
  if (::mkdir(dir.c_str(), 0700) != 0) {
    DTCORE_CHECK(errno == EEXIST, RendezvousError, "cannot create the directory ", dir,
                 " for the job secret file: ", std::strerror(errno), ". Fix: ", fix_with_variable(), ".");
  }
  struct stat st{};
  std::string problem;
  if (::lstat(dir.c_str(), &st) != 0) problem = std::strerror(errno);
  if (problem.empty() && !S_ISDIR(st.st_mode)) problem = "it is not a directory (a symbolic link or a file)";
  if (problem.empty() && st.st_uid != ::geteuid()) {
    problem = detail::cat("it belongs to uid ", st.st_uid, ", not to this process's uid ", ::geteuid());
  }
  if (problem.empty() && (st.st_mode & 077) != 0) {
    problem = detail::cat("it has mode ", mode_text(st.st_mode), ": other users may enter it");
  }
  DTCORE_CHECK(problem.empty(), RendezvousError, "dtcore keeps the job secret of a one-node job in ", dir,
               ", and refuses that directory: ", problem, ". Fix: remove it (rm -r ", dir,
               ") so that dtcore creates it privately, or ", fix_with_variable(), ".");
  return dir;
}

// Where rank 0 writes, and the others read, the secret of a job on one node (case 3).
std::string node_secret_path(const WorldSpec& spec, const Env& env) {
  return detail::cat(private_secret_dir(env), "/store-", spec.master_port.value, ".secret");
}

// Cases 1 and 2 (a variable); nullopt when neither is set.
std::optional<JobSecret> secret_from_variables(const Env& env) {
  if (auto value = knob_value(env, knobs::kJobSecret)) {
    JobSecret s;
    s.value = *value;
    s.source = std::string(knobs::kJobSecret.name);
    return s;
  }
  if (auto path = knob_value(env, knobs::kJobSecretFile)) {
    JobSecret s;
    s.path = *path;
    s.source = detail::cat(knobs::kJobSecretFile.name, "=", *path);
    s.from_file = true;
    return s;
  }
  return std::nullopt;
}

JobSecret public_secret(const WorldSpec& spec) {
  JobSecret s;
  s.value = kPublicSecret;
  s.source = detail::cat("none: the job spans ", spec.num_nodes.value, " nodes and neither ", knobs::kJobSecret.name,
                         " nor ", knobs::kJobSecretFile.name, " is set");
  s.authenticates = false;
  return s;
}

}  // namespace

JobSecret server_secret(const WorldSpec& spec, const Env& env) {
  if (auto s = secret_from_variables(env)) {
    if (s->from_file) {
      std::optional<std::string> existing = read_secret_file(s->path);
      s->publish = !existing.has_value();
      s->value = existing ? *existing : random_secret();
    }
    return *s;
  }
  JobSecret s;
  if (spec.world_size.value <= 1) {
    s.value = random_secret();
    s.source = "generated in memory (a world of one)";
    return s;
  }
  if (spec.num_nodes.value <= 1) {
    s.path = node_secret_path(spec, env);
    s.value = random_secret();
    s.source = detail::cat("the file ", s.path, ", which rank 0 writes on a one-node job");
    s.from_file = true;
    s.publish = true;
    return s;
  }
  log::warn("rendezvous: the store at ", store::endpoint(spec.master_addr.value, spec.master_port.value),
            " authenticates nobody: the job spans ", spec.num_nodes.value, " nodes (", spec.num_nodes.source,
            ") and has no job secret (neither ", knobs::kJobSecret.name, " nor ", knobs::kJobSecretFile.name,
            " is set). Any process that can reach that port and speaks dtcore's store protocol can read and change "
            "the rendezvous. Fix: ",
            fix_with_variable(), ", or set ", knobs::kJobSecretFile.name,
            " to a path every node sees (a shared filesystem): rank 0 writes a private secret there.");
  return public_secret(spec);
}

SecretFile publish_secret(const JobSecret& secret) {
  if (!secret.publish) return SecretFile();
  std::string tmp = detail::cat(secret.path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  std::string error = fd < 0 ? std::strerror(errno) : "";
  if (fd >= 0) {
    std::string line = secret.value + "\n";
    if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) error = std::strerror(errno);
    ::close(fd);
    if (error.empty() && ::rename(tmp.c_str(), secret.path.c_str()) != 0) error = std::strerror(errno);
    if (!error.empty()) ::unlink(tmp.c_str());
  }
  DTCORE_CHECK(error.empty(), RendezvousError, "rank 0 cannot write the job secret file ", secret.path, ": ", error,
               ". Fix: let rank 0 write there (its directory must exist and be writable), or ", fix_with_variable(),
               ".");
  return SecretFile(secret.path);
}

void SecretFile::remove() noexcept {
  if (!path_.empty()) ::unlink(path_.c_str());
  path_.clear();
}

JobSecret client_secret(const StoreDial& dial) {
  const WorldSpec& spec = dial.spec;
  std::optional<JobSecret> s = secret_from_variables(dial.env);
  if (!s && spec.num_nodes.value > 1) return public_secret(spec);
  if (!s) {
    s = JobSecret{};
    s->path = node_secret_path(spec, dial.env);
    s->source = detail::cat("the file ", s->path, ", which rank 0 writes on a one-node job");
    s->from_file = true;
  }
  if (!s->from_file) return *s;
  Backoff backoff = store_backoff();
  Clock::time_point next_log = Clock::now() + dial.log_interval;
  for (;;) {
    if (std::optional<std::string> value = read_secret_file(s->path)) {
      s->value = *value;
      return *s;
    }
    DTCORE_CHECK(Clock::now() < dial.deadline, RendezvousError, "rendezvous timed out after ",
                 static_cast<int>(dial.elapsed()), " s on rank ", spec.rank.value, ": the job secret file ", s->path,
                 " never appeared. Rank 0 writes it once it serves the store at ",
                 store::endpoint(spec.master_addr.value, spec.master_port.value),
                 "; it did not get that far, or it runs on another host (this job counts ", spec.num_nodes.value,
                 " node(s): ", spec.num_nodes.source,
                 "). Fix: look at rank 0's log; for a job "
                 "on several nodes, ",
                 fix_with_variable(), ".");
    if (Clock::now() >= next_log) {
      log::warn("rendezvous: rank ", spec.rank.value, " waits for the job secret file ", s->path,
                " that rank 0 writes");
      next_log = Clock::now() + dial.log_interval;
    }
    backoff.pause();
  }
}

void reload_secret(JobSecret& secret) {
  if (!secret.from_file) return;
  if (std::optional<std::string> value = read_secret_file(secret.path)) secret.value = *value;
}

}  // namespace dtcore
