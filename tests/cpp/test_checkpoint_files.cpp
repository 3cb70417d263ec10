// Checkpoint files: atomic writes (whole or nothing, no temporary left behind), their digests,
// the safetensors header (layout, alignment, escaping, refusals), and copy plans.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <ATen/ATen.h>

#include "dtcore/checkpoint/atomic_file.h"
#include "dtcore/checkpoint/copy_plan.h"
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

TEST(CopyPlan, CopiesItsSourcesThenTheTailIntoTheDestinations) {
  const at::Tensor file = at::zeros({24}, at::kByte);
  const at::Tensor a = at::arange(4, at::kFloat);  // 16 bytes
  const at::Tensor b = at::full({4}, 7, at::kByte);
  const CopyPlan plan({file.slice(0, 0, 16), file.slice(0, 16, 20), file.slice(0, 20, 24)}, {a.view(at::kByte), b});
  EXPECT_EQ(plan.tail_size(), 1u);
  EXPECT_EQ(plan.bytes(), 24u);
  a.add_(1);  // a copy takes the state as it is when it runs, not as it was laid out
  plan.run({at::full({4}, 9, at::kByte)});
  EXPECT_TRUE(at::equal(file.slice(0, 0, 16).view(at::kFloat), a));
  EXPECT_TRUE(at::equal(file.slice(0, 16, 20), b));
  EXPECT_TRUE(at::equal(file.slice(0, 20, 24), at::full({4}, 9, at::kByte)));
}

TEST(CopyPlan, RefusesWhatDoesNotFitItsPlace) {
  const at::Tensor file = at::zeros({8}, at::kByte);
  expect_contains(error_of<CheckpointError>([&] { CopyPlan({file.slice(0, 0, 4)}, {at::zeros({5}, at::kByte)}); }),
                  {"copy 0 has a source of 5 bytes for a destination of 4"});
  const CopyPlan plan({file.slice(0, 0, 4), file.slice(0, 4, 8)}, {at::zeros({4}, at::kByte)});
  expect_contains(error_of<CheckpointError>([&] { plan.run({}); }), {"0 tensors taken at this save for 1 places"});
  expect_contains(error_of<CheckpointError>([&] { plan.run({at::zeros({2, 4}, at::kByte).t()}); }),
                  {"copy 1 has a source of 8 bytes (not contiguous) for a destination of 4"});
  // A source whose storage was allocated anew since (a tensor resized) is refused, never read where it was.
  at::Tensor growing = at::zeros({4}, at::kByte);
  const CopyPlan held({file.slice(0, 0, 4)}, {growing.view({4})});
  growing.resize_({1 << 20});
  expect_contains(error_of<CheckpointError>([&] { held.run({}); }),
                  {"(4 bytes when laid out) is now of 1048576 bytes at another address"});
}
