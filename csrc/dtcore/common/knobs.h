// The registry of DTCORE_* environment variables ("knobs"): the one place their names are written.
//
// Each knob is one constant below, with its default and a one-line doc, in the order of the table
// in docs/knobs.md (a test keeps the two in step, and fails on any DTCORE_ name elsewhere in the
// repository that is not declared here). Code reads a knob only through knob_value(env, knob),
// and names one in a message through knob.name, so a knob cannot be read without being declared
// and documented. Which knob beats which source is decided by read_world() (the job's shape,
// bootstrap/launcher.h) and read_settings() (everything else, common/settings.h).
// Thread safety: constants.
#pragma once

#include <array>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dtcore/common/env.h"

namespace dtcore {

struct Knob {
  std::string_view name;           // e.g. "DTCORE_TIMEOUT"
  std::string_view default_value;  // as the user would write it; "" when unset means "not given"
  std::string_view doc;            // one line
};

namespace knobs {

inline constexpr std::string_view kPrefix = "DTCORE_";  // every knob's name starts with it

// clang-format off
inline constexpr Knob kRank{"DTCORE_RANK", "", "Global rank of this process; beats the launcher's variable."};
inline constexpr Knob kWorldSize{"DTCORE_WORLD_SIZE", "", "Number of processes in the job; beats the launcher's variable."};
inline constexpr Knob kLocalRank{"DTCORE_LOCAL_RANK", "", "Rank of this process on its node (selects the GPU)."};
inline constexpr Knob kLocalWorldSize{"DTCORE_LOCAL_WORLD_SIZE", "", "Number of processes on this node."};
inline constexpr Knob kNodeRank{"DTCORE_NODE_RANK", "", "Index of this node in the job."};
inline constexpr Knob kNumNodes{"DTCORE_NUM_NODES", "", "Number of nodes in the job."};
inline constexpr Knob kMasterAddr{"DTCORE_MASTER_ADDR", "", "Host of rank 0, where the rendezvous store listens."};
inline constexpr Knob kMasterPort{"DTCORE_MASTER_PORT", "", "Port of the rendezvous store on the master host."};
inline constexpr Knob kBackend{"DTCORE_BACKEND", "auto", "Communicator: auto (NCCL when CUDA is usable and built in, else Gloo), nccl or gloo; init(backend=) beats it."};
inline constexpr Knob kTimeout{"DTCORE_TIMEOUT", "300", "Seconds that rendezvous and each collective may take before failing with the missing ranks; init(timeout=) beats it."};
inline constexpr Knob kRdzvLogInterval{"DTCORE_RDZV_LOG_INTERVAL", "5", "Seconds between rendezvous progress lines that name the ranks still missing."};
inline constexpr Knob kHeartbeatInterval{"DTCORE_HEARTBEAT_INTERVAL", "1", "Seconds between health heartbeats; a failed collective names ranks silent for two intervals."};
inline constexpr Knob kCheckCollectives{"DTCORE_CHECK_COLLECTIVES", "auto", "Check that ranks call the same collectives before each call: auto (on Gloo, where a mismatch kills a rank or sums wrongly), 1 (everywhere: refused on NCCL, which has no check before each call) or 0 (never). Whatever it says, the heartbeat compares the ranks' collectives about every second, on every backend, and fails the job at the next collective after a mismatch."};
inline constexpr Knob kFlightRecorder{"DTCORE_FLIGHT_RECORDER", "2000", "Collectives each rank's flight recorder keeps for the post-mortem (written to flight-rank<r>.jsonl beside the log, or under the temporary directory, on a failure or SIGUSR2); 0 keeps none."};
inline constexpr Knob kShm{"DTCORE_SHM", "auto", "Gloo's collectives between ranks on one host through shared memory: auto (when every rank maps rank 0's segment in /dev/shm, else through Gloo, saying why in the log), 1 (required: init fails naming the ranks that could not) or 0 (never). With it, the reducer keeps its gradient buckets (zero=0 and 1) in a buffer every rank maps, where their all-reduce runs in place."};
inline constexpr Knob kJobSecret{"DTCORE_JOB_SECRET", "", "Secret every rank proves to the rendezvous store; the same value on every node (needed for a multi-node job to be authenticated). Never logged."};
inline constexpr Knob kJobSecretFile{"DTCORE_JOB_SECRET_FILE", "", "File (mode 0600) holding the job secret, e.g. on a shared filesystem; rank 0 writes a random one there when it is missing."};
inline constexpr Knob kMemoryDir{"DTCORE_MEMORY_DIR", "/dev/shm", "Where each node keeps the trainer's in-memory checkpoints (checkpoint.memory_every): a tmpfs with room for two copies of its ranks' state; removed when the node's launcher exits."};
inline constexpr Knob kLogLevel{"DTCORE_LOG_LEVEL", "info", "Console level: debug, info, warn or error."};
inline constexpr Knob kLogRanks{"DTCORE_LOG_RANKS", "0", "Ranks whose info lines reach the console: a list such as 0,3 or 'all'; others print warnings and errors only."};
inline constexpr Knob kLogDir{"DTCORE_LOG_DIR", "", "Directory for per-rank log files (dtcore-<time>-rank<r>.log); init(log_dir=) beats it."};
// clang-format on

// Every knob, in the order of docs/knobs.md.
inline constexpr auto kAll = std::to_array<const Knob*>({
    &kRank,
    &kWorldSize,
    &kLocalRank,
    &kLocalWorldSize,
    &kNodeRank,
    &kNumNodes,
    &kMasterAddr,
    &kMasterPort,
    &kBackend,
    &kTimeout,
    &kRdzvLogInterval,
    &kHeartbeatInterval,
    &kCheckCollectives,
    &kFlightRecorder,
    &kShm,
    &kJobSecret,
    &kJobSecretFile,
    &kMemoryDir,
    &kLogLevel,
    &kLogRanks,
    &kLogDir,
});

}  // namespace knobs

// The knob's value in `env`, or its default when the variable is unset (nullopt when the
// default is "" too).
std::optional<std::string> knob_value(const Env& env, const Knob& knob);

// A knob of seconds' default, for the options whose defaults are the knob's (RendezvousOptions,
// CommunicatorOptions): read from its default_value, so that the number is written once.
std::chrono::milliseconds default_duration(const Knob& knob);

// The DTCORE_* variables in `env` that no knob declares, which dtcore would otherwise ignore
// without a word (a misspelt name), each as a line for the log or the resource
// checker that names the closest knob when one is close.
std::vector<std::string> unknown_knobs(const Env& env);

}  // namespace dtcore
