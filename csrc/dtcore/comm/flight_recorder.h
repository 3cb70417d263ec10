// FlightRecorder: the last collectives of this rank, kept for the post-mortem of a failed job.
//
// Every collective is recorded when it is issued (op, sequence number, dtype, shape, a label
// such as "bucket 3/5", its signature, the wall-clock time) and again when it finishes
// (succeeded or failed, and when). On a collective failure or timeout, and on SIGUSR2, the record
// is written as JSON lines to this rank's dump file (flight-rank<r>.jsonl); with every rank's file
// in one folder, `python -m dtcore.check --analyze DIR` names the first rank and sequence number
// at which the ranks diverged. See Note [Collective signature] for what the signature covers.
//
// Ownership: one per communicator. Thread safety: every member may be called from any thread
// (issue on the caller's, finish on the engine's); one mutex, held for a few assignments.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dtcore {

struct CollectiveRecord {
  enum class State { kPending, kSucceeded, kFailed };

  uint64_t seq = 0;
  std::string op;      // "all_reduce", "broadcast", ...
  std::string detail;  // "torch.float32[4096], avg" or "torch.float32[8], from rank 0"; "" for a barrier
  std::string label;   // what the caller said it is, e.g. "bucket 3/5"; "" if nothing
  uint64_t signature = 0;
  double started = 0;   // seconds since the Unix epoch (comparable across hosts, within their clock
                        // skew); issued() sets it
  double finished = 0;  // 0 while pending
  State state = State::kPending;
};

std::string_view state_name(CollectiveRecord::State state);  // "pending", "succeeded", "failed"

class FlightRecorder : public std::enable_shared_from_this<FlightRecorder> {
 public:
  explicit FlightRecorder(size_t capacity) : capacity_(capacity) {}

  // Records a collective just issued, stamping its start time.
  void issued(CollectiveRecord record);
  // A failure also dumps the record, when a dump file is set.
  void finished(uint64_t seq, bool ok);

  // Where dump() writes (one JSON object per line), and the rank and host each line names; also
  // makes this recorder dump on the dump signal (see install_dump_signal()).
  void set_dump_file(std::string path, int rank, int world, std::string host);
  // Writes the record to the dump file, replacing an earlier dump at once (written aside, then
  // renamed), and logs where, and `why`: at warning level the first time, debug after. Returns
  // the path, or "" when none is set or it could not be written (logged).
  std::string dump(std::string_view why);

  // The records, oldest first.
  std::vector<CollectiveRecord> snapshot() const;
  // One JSON object per line, oldest first; each names the rank and host, so that the lines of
  // several ranks can be read back together (python/dtcore/check/_analyze.py).
  std::vector<std::string> json_lines(int rank, int world, const std::string& host) const;

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::deque<CollectiveRecord> records_;  // at most capacity_, by increasing seq
  std::string path_, host_;               // the dump file; guarded by mu_
  int rank_ = -1, world_ = 0;
  bool dumped_ = false;  // logged at warning level once
  std::mutex dump_mu_;   // one dump at a time
};

// Makes SIGUSR2 dump every flight recorder of this process that has a dump file, from a thread of
// its own (the handler only writes a byte to a pipe). Once per process; not when the program has
// a SIGUSR2 handler of its own, which is left alone (false is returned, and logged at debug).
bool install_dump_signal();

}  // namespace dtcore
