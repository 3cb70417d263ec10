#include "dtcore/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "dtcore/common/error.h"

namespace dtcore::checkpoint {
namespace {

std::atomic<std::uint64_t> temp_counter{0};  // several AtomicFiles in one process never share a temp name

std::string fix_for(int error) {
  switch (error) {
    case ENOSPC:
    case EDQUOT: return "free space on that file system (or save elsewhere), then save again";
    case EACCES:
    case EPERM:
    case EROFS: return "save into a directory this user can write";
    case ENOENT:
    case ENOTDIR: return "check that the checkpoint directory exists and was not removed while saving";
    default: return "check the file system (mounted, writable, not full) and save again";
  }
}

void fsync_directory(const std::string& file) {
  std::string dir = std::filesystem::path(file).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // the rename happened; a directory we cannot open cannot be synced either
  ::fsync(fd);         // some file systems refuse a directory fsync (EINVAL): the rename stands
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  temp_ = detail::cat(path_, ".tmp-", ::getpid(), "-", temp_counter.fetch_add(1));
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temp_.c_str());
  }
}

void AtomicFile::fail(const char* what, int error) const {
  DTCORE_CHECK(false, CheckpointError, "checkpoint file ", path_, ": ", what, " ", temp_, ": ", std::strerror(error),
               ". Fix: ", fix_for(error), ".");
}

void AtomicFile::write(std::span<const std::uint8_t> data) {
  DTCORE_CHECK(fd_ >= 0, CheckpointError, "checkpoint file ", path_, ": written after commit (a dtcore bug).");
  hash_.update(data);
  bytes_ += data.size();
  while (!data.empty()) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int error = errno;
      ::close(fd_);
      fd_ = -1;
      ::unlink(temp_.c_str());
      fail("cannot write", error);
    }
    data = data.subspan(static_cast<std::size_t>(n));
  }
}

void AtomicFile::write(std::string_view data) {
  write(std::span(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
}

FileDigest AtomicFile::commit() {
  DTCORE_CHECK(fd_ >= 0, CheckpointError, "checkpoint file ", path_, ": committed twice (a dtcore bug).");
  int error = ::fsync(fd_) == 0 ? 0 : errno;
  if (::close(fd_) != 0 && error == 0) error = errno;
  fd_ = -1;
  if (error == 0 && ::rename(temp_.c_str(), path_.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp_.c_str());
    fail("cannot complete", error);
  }
  fsync_directory(path_);
  return {bytes_, to_hex(hash_.finish())};
}

FileDigest write_file_atomic(const std::string& path, std::string_view data) {
  AtomicFile file(path);
  file.write(data);
  return file.commit();
}

FileDigest digest_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DTCORE_CHECK(fd >= 0, CheckpointError, "checkpoint file ", path, " cannot be opened: ", std::strerror(errno),
               ". Fix: the checkpoint is incomplete or was moved; load another one.");
  Sha256 hash;
  std::uint64_t bytes = 0;
  std::vector<std::uint8_t> buffer(std::size_t{4} << 20);
  for (;;) {
    ssize_t n = ::read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int error = errno;
      ::close(fd);
      DTCORE_CHECK(false, CheckpointError, "checkpoint file ", path, " cannot be read: ", std::strerror(error),
                   ". Fix: check the file system, or load another checkpoint.");
    }
    if (n == 0) break;
    hash.update(std::span(buffer.data(), static_cast<std::size_t>(n)));
    bytes += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  return {bytes, to_hex(hash.finish())};
}

}  // namespace dtcore::checkpoint
