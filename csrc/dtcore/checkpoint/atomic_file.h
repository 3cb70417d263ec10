// AtomicFile: a file that appears under its name whole or not at all, with its SHA-256.
//
// Writes go to a temporary name beside the target (`<name>.tmp-<pid>-<n>`); commit() fsyncs the
// data, renames it over the target and fsyncs the directory, so that after a crash (a kill, a
// power loss) the target is either the previous file or the complete new one, never a prefix.
// An AtomicFile destroyed without commit() removes its temporary file. Every byte written is
// hashed on the way, so that a checkpoint's manifest can name each file's checksum without
// reading the file again (Note [Checkpoint layout], python/dtcore/checkpoint/manifest.py).
//
// Errors: CheckpointError naming the file, the system's reason and what to do (a full disk, a
// directory that is not writable).
//
// Ownership: owns the temporary file until commit(). Thread safety: one thread at a time per
// object; different objects may be written from different threads concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "dtcore/common/sha256.h"

namespace dtcore::checkpoint {

// What a written (or read) file is: its size and its SHA-256, in lower-case hex.
struct FileDigest {
  std::uint64_t bytes = 0;
  std::string sha256;
};

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::span<const std::uint8_t> data);
  void write(std::string_view data);
  // fsync, rename over the target, fsync the directory. Nothing may be written after it.
  FileDigest commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const char* what, int error) const;

  std::string path_;  // the target
  std::string temp_;  // where the bytes go until commit()
  int fd_ = -1;       // -1 once committed (or closed by a failure)
  Sha256 hash_;
  std::uint64_t bytes_ = 0;
};

// Writes `data` to `path` atomically (as AtomicFile does) and returns its digest.
FileDigest write_file_atomic(const std::string& path, std::string_view data);

// Reads `path` whole and hashes it. CheckpointError naming the file when it cannot be read.
FileDigest digest_file(const std::string& path);

}  // namespace dtcore::checkpoint
