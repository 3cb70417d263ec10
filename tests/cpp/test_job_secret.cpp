// The job secret (Note [Job secret]): where it comes from, the private directory and file rank 0
// writes, what is refused, and that no message ever shows the secret.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "dtcore/bootstrap/job_secret.h"
#include "dtcore/bootstrap/rendezvous_store.h"
#include "dtcore/common/error.h"
#include "expect_error.h"

using namespace dtcore;
using namespace dtcore::testing;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the build's temporary space, removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dtcore-secret-test-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

Env env_of(std::map<std::string, std::string, std::less<>> vars) { return Env(std::move(vars)); }

WorldSpec world(int size, int nodes, int port = 29555) {
  WorldSpec s;
  s.rank = {1, "RANK"};
  s.world_size = {size, "WORLD_SIZE"};
  s.num_nodes = {nodes, "test"};
  s.master_addr = {"127.0.0.1", "MASTER_ADDR"};
  s.master_port = {port, "MASTER_PORT"};
  return s;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(JobSecret, TheVariableWinsAndIsNeverTheSource) {
  Env env = env_of({{"DTCORE_JOB_SECRET", "hunter2-but-longer"}, {"DTCORE_JOB_SECRET_FILE", "/nonexistent"}});
  JobSecret s = server_secret(world(2, 2), env);
  EXPECT_EQ(s.value, "hunter2-but-longer");
  EXPECT_EQ(s.source, "DTCORE_JOB_SECRET");
  EXPECT_FALSE(s.publish);
  EXPECT_TRUE(s.authenticates);
  EXPECT_EQ(
      client_secret({world(2, 2), env, 1s, std::chrono::steady_clock::now(), std::chrono::steady_clock::now()}).value,
      "hunter2-but-longer");
}

TEST(JobSecret, OneNodeRankZeroWritesAPrivateFileTheOthersReadAndItIsDeleted) {
  TempDir runtime;
  Env env = env_of({{"XDG_RUNTIME_DIR", runtime.path()}});
  JobSecret server = server_secret(world(2, 1), env);
  EXPECT_EQ(server.path, runtime.path() + "/dtcore/store-29555.secret");
  EXPECT_TRUE(server.publish);
  EXPECT_EQ(server.value.size(), 64u);  // 32 random bytes, hex
  EXPECT_EQ(server.source.find(server.value), std::string::npos);
  struct stat st{};
  ASSERT_EQ(::stat((runtime.path() + "/dtcore").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  {
    SecretFile file = publish_secret(server);
    ASSERT_EQ(::stat(server.path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    JobSecret client =
        client_secret({world(2, 1), env, 1s, std::chrono::steady_clock::now(), std::chrono::steady_clock::now() + 5s});
    EXPECT_EQ(client.value, server.value);
    EXPECT_TRUE(client.from_file);
  }
  EXPECT_FALSE(fs::exists(server.path));  // deleted with its SecretFile
}

TEST(JobSecret, AClientThatNeverSeesTheFileTimesOutNamingItAndTheFix) {
  TempDir runtime;
  Env env = env_of({{"XDG_RUNTIME_DIR", runtime.path()}});
  auto start = std::chrono::steady_clock::now();
  std::string msg = error_of<RendezvousError>([&] {
    client_secret({world(2, 1), env, 10s, std::chrono::steady_clock::now(), std::chrono::steady_clock::now() + 300ms});
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  expect_contains(msg, {"rank 1", "store-29555.secret", "never appeared", "127.0.0.1:29555", "DTCORE_JOB_SECRET"});
}

TEST(JobSecret, ADirectoryOthersMayEnterIsRefused) {
  TempDir runtime;
  fs::create_directory(runtime.path() + "/dtcore");
  ::chmod((runtime.path() + "/dtcore").c_str(), 0755);
  Env env = env_of({{"XDG_RUNTIME_DIR", runtime.path()}});
  std::string msg = error_of<RendezvousError>([&] { server_secret(world(2, 1), env); });
  expect_contains(msg, {"refuses that directory", "mode 0755", "rm -r", "DTCORE_JOB_SECRET"});
}

TEST(JobSecret, AFileOthersMayReadIsRefusedWithoutShowingIt) {
  TempDir dir;
  std::string path = dir.path() + "/secret";
  std::ofstream(path) << "do-not-print-me\n";
  ::chmod(path.c_str(), 0640);
  Env env = env_of({{"DTCORE_JOB_SECRET_FILE", path}});
  std::string msg = error_of<RendezvousError>([&] { server_secret(world(4, 2), env); });
  expect_contains(msg, {path.c_str(), "mode 0640", "chmod 600"});
  EXPECT_EQ(msg.find("do-not-print-me"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  JobSecret s = server_secret(world(4, 2), env);
  EXPECT_EQ(s.value, "do-not-print-me");  // the line, without its newline
  EXPECT_FALSE(s.publish);                // the user's file: rank 0 neither rewrites nor deletes it
}

TEST(JobSecret, AMissingSharedFileIsWrittenByRankZero) {
  TempDir dir;
  std::string path = dir.path() + "/job.secret";
  Env env = env_of({{"DTCORE_JOB_SECRET_FILE", path}});
  JobSecret s = server_secret(world(4, 2), env);
  EXPECT_TRUE(s.publish);
  SecretFile file = publish_secret(s);
  EXPECT_EQ(read_all(path), s.value + "\n");
  EXPECT_EQ(
      client_secret({world(4, 2), env, 1s, std::chrono::steady_clock::now(), std::chrono::steady_clock::now() + 1s})
          .value,
      s.value);
}

TEST(JobSecret, ManyNodesWithoutASecretFallBackToThePublicOne) {
  Env env;
  JobSecret server = server_secret(world(4, 2), env);
  JobSecret client =
      client_secret({world(4, 2), env, 1s, std::chrono::steady_clock::now(), std::chrono::steady_clock::now()});
  EXPECT_FALSE(server.authenticates);
  EXPECT_EQ(server.value, client.value);
  expect_contains(server.source, {"none", "2 nodes", "DTCORE_JOB_SECRET"});
}

TEST(JobSecret, AWorldOfOneKeepsItsSecretInMemory) {
  JobSecret s = server_secret(world(1, 1, 0), Env());
  EXPECT_FALSE(s.publish);
  EXPECT_TRUE(s.path.empty());
  EXPECT_EQ(s.value.size(), 64u);
}
