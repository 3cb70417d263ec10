// Checkpoint files: atomic writes (whole or nothing, no temporary left behind), their digests,
// and the safetensors header (layout, alignment, escaping, refusals).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "dtcore/checkpoint/atomic_file.h"
#include "dtcore/checkpoint/safetensors.h"
#include "dtcore/common/error.h"
#include "dtcore/common/json.h"
#include "dtcore/common/sha256.h"
#include "expect_error.h"

using namespace dtcore;
using namespace dtcore::checkpoint;
using dtcore::testing::error_of;
using dtcore::testing::expect_contains;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    char name[] = "/tmp/dtcore-ckpt-XXXXXX";
    path_ = ::mkdtemp(name);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (fs::path(path_) / name).string(); }
  std::size_t entries() const { return std::distance(fs::directory_iterator(path_), fs::directory_iterator{}); }

 private:
  std::string path_;
};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST(AtomicFile, CommitRenamesAndDigests) {
  TempDir dir;
  AtomicFile file(dir / "a.bin");
  file.write(std::string_view("hello "));
  file.write(std::string_view("world"));
  EXPECT_FALSE(fs::exists(dir / "a.bin"));  // nothing under the name until commit
  FileDigest d = file.commit();
  EXPECT_EQ(read(dir / "a.bin"), "hello world");
  EXPECT_EQ(d.bytes, 11u);
  EXPECT_EQ(d.sha256, to_hex(sha256("hello world")));
  EXPECT_EQ(dir.entries(), 1u);  // the temporary is gone
  FileDigest again = digest_file(dir / "a.bin");
  EXPECT_EQ(again.sha256, d.sha256);
  EXPECT_EQ(again.bytes, d.bytes);
}

TEST(AtomicFile, AbandonedWriteLeavesThePreviousFile) {
  TempDir dir;
  write_file_atomic(dir / "m.json", "old");
  {
    AtomicFile file(dir / "m.json");
    file.write(std::string_view("new, but never committed"));
  }  // destroyed: as if the process had failed mid-write
  EXPECT_EQ(read(dir / "m.json"), "old");
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(AtomicFile, ErrorsNameTheFileAndTheFix) {
  std::string msg = error_of<CheckpointError>([] { AtomicFile file("/nonexistent-dtcore-dir/x.safetensors"); });
  expect_contains(msg, {"/nonexistent-dtcore-dir/x.safetensors", "No such file", "Fix:"});
  msg = error_of<CheckpointError>([] { digest_file("/nonexistent-dtcore-dir/y"); });
  expect_contains(msg, {"/nonexistent-dtcore-dir/y", "cannot be opened", "Fix:"});
}

TEST(Safetensors, HeaderLayoutAlignmentAndOffsets) {
  float a[3] = {1, 2, 3};
  std::uint8_t b[2] = {7, 9};
  std::vector<TensorEntry> entries = {
      {"w", "F32", {3}, reinterpret_cast<const std::uint8_t*>(a), sizeof a},
      {"b", "U8", {1, 2}, b, sizeof b},
      {"empty", "F32", {0}, nullptr, 0},
  };
  std::string header = safetensors_header(entries, {{"format", "pt"}});
  std::uint64_t n = 0;
  std::memcpy(&n, header.data(), 8);  // little-endian on the machines torch supports
  EXPECT_EQ(n + 8, header.size());
  EXPECT_EQ(header.size() % 8, 0u);
  expect_contains(header,
                  {R"("__metadata__":{"format":"pt"})", R"("w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]})",
                   R"("b":{"dtype":"U8","shape":[1,2],"data_offsets":[12,14]})",
                   R"("empty":{"dtype":"F32","shape":[0],"data_offsets":[14,14]})"});

  TempDir dir;
  FileDigest d = write_safetensors(dir / "t.safetensors", entries, {{"format", "pt"}});
  std::string file = read(dir / "t.safetensors");
  EXPECT_EQ(file.size(), header.size() + 14);
  EXPECT_EQ(d.bytes, file.size());
  EXPECT_EQ(file.substr(header.size(), 12), std::string(reinterpret_cast<const char*>(a), 12));
  EXPECT_EQ(d.sha256, to_hex(sha256(file)));
}

TEST(Safetensors, NamesAreEscapedAndUnique) {
  EXPECT_EQ(json_quote("a\"b\\c\n"), R"("a\"b\\c\u000a")");
  std::uint8_t x = 0;
  std::vector<TensorEntry> twice = {{"k", "U8", {1}, &x, 1}, {"k", "U8", {1}, &x, 1}};
  expect_contains(error_of<CheckpointError>([&] { safetensors_header(twice, {}); }), {"'k'", "twice"});
}

TEST(Safetensors, DtypeCodes) {
  EXPECT_EQ(safetensors_dtype(c10::ScalarType::Float), "F32");
  EXPECT_EQ(safetensors_dtype(c10::ScalarType::BFloat16), "BF16");
  EXPECT_EQ(safetensors_dtype(c10::ScalarType::Long), "I64");
  EXPECT_EQ(safetensors_dtype(c10::ScalarType::Bool), "BOOL");
  expect_contains(error_of<CheckpointError>([] { safetensors_dtype(c10::ScalarType::ComplexFloat); }),
                  {"torch.complex64", "view_as_real"});
}
