// Store rendezvous on loopback: ranks are threads of this process, each with its own store client.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "dtcore/bootstrap/launcher.h"
#include "dtcore/bootstrap/rendezvous.h"
#include "dtcore/common/error.h"
#include "store_test_util.h"

using namespace dtcore;
using namespace std::chrono_literals;

namespace {

// A port nobody listens on right now (bind to 0, read it back, close).
int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

WorldSpec spec_for(int rank, int world, int port) {
  WorldOverrides o;
  o.rank = rank;
  o.world_size = world;
  o.master_addr = "127.0.0.1";
  o.master_port = port;
  return read_world(Env(), o);
}

RosterEntry entry(int rank, const std::string& torch = "2.13.0") {
  RosterEntry e;
  e.host = "host" + std::to_string(rank / 2);
  e.pid = 1000 + rank;
  e.local_rank = rank % 2;
  e.device = "cpu";
  e.fingerprint = {{"torch", torch}, {"dtcore", "0.1.0"}, {"backend", "gloo"}};
  return e;
}

RendezvousOptions options(std::chrono::milliseconds timeout) {
  RendezvousOptions o;
  o.timeout = timeout;
  o.log_interval = 500ms;
  return o;
}

// Runs join() for the given ranks concurrently; returns each rank's error text ("" on success).
std::vector<std::string> join_all(const std::vector<int>& ranks, int world, int port, std::chrono::milliseconds timeout,
                                  const std::vector<RosterEntry>& entries) {
  std::vector<std::future<std::string>> futures;
  for (size_t i = 0; i < ranks.size(); ++i) {
    int rank = ranks[i];
    RosterEntry e = entries[i];
    futures.push_back(std::async(std::launch::async, [=] {
      try {
        auto r = Rendezvous::join(spec_for(rank, world, port), e, options(timeout), Env::from_process());
        if (static_cast<int>(r->roster().size()) != world) return std::string("incomplete roster");
        // Rank 0 serves the store: it leaves last, once everyone has fetched the roster.
        if (rank != 0) {
          r->store()->add("test/done", 1);
        } else {
          while (r->store()->add("test/done", 0) < static_cast<int64_t>(world - 1)) std::this_thread::sleep_for(5ms);
        }
        return std::string();
      } catch (const std::exception& ex) {
        return std::string(ex.what());
      }
    }));
  }
  std::vector<std::string> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

}  // namespace

TEST(Rendezvous, ThreeRanksJoinAndShareTheRoster) {
  int port = free_port();
  auto errors = join_all({0, 1, 2}, 3, port, 20s, {entry(0), entry(1), entry(2)});
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(Rendezvous, SingleProcessGetsAFreePort) {
  auto r = Rendezvous::join(read_world(Env()), entry(0), options(5s), Env::from_process());
  EXPECT_GT(r->port(), 0);
  EXPECT_EQ(r->roster().size(), 1u);
}

TEST(Rendezvous, MissingRankIsNamedByEveryStartedRankWithinTimeoutPlusTwoSeconds) {
  int port = free_port();
  auto start = std::chrono::steady_clock::now();
  auto errors = join_all({0, 1}, 3, port, 2s, {entry(0), entry(1)});
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 4.0);
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rendezvous timed out"), std::string::npos) << e;
    EXPECT_NE(e.find("missing rank 2"), std::string::npos) << e;
    EXPECT_NE(e.find("2 of 3 ranks joined"), std::string::npos) << e;
  }
}

TEST(Rendezvous, RanksThatDisagreeOnTheWorldSizeAreToldSo) {
  int port = free_port();
  // Rank 0 expects 3 ranks, rank 1 expects 2: rank 1 sees all "its" ranks joined, yet no verdict.
  auto rank0 = std::async(std::launch::async, [&] {
    try {
      Rendezvous::join(spec_for(0, 3, port), entry(0), options(2s), Env::from_process());
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  });
  std::string err1;
  try {
    std::this_thread::sleep_for(200ms);  // rank 0 serves the store first
    Rendezvous::join(spec_for(1, 2, port), entry(1), options(1500ms), Env::from_process());
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  std::string err0 = rank0.get();
  EXPECT_NE(err1.find("expects a different world size"), std::string::npos) << err1;
  EXPECT_NE(err1.find("same world size"), std::string::npos) << err1;
  EXPECT_NE(err0.find("rendezvous timed out"), std::string::npos) << err0;
}

TEST(Rendezvous, MissingRankZeroIsNamedByTheOthers) {
  int port = free_port();
  auto errors = join_all({1}, 2, port, 1500ms, {entry(1)});
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].find("Missing ranks: 0"), std::string::npos) << errors[0];
  EXPECT_NE(errors[0].find(std::to_string(port)), std::string::npos) << errors[0];
}

TEST(Rendezvous, TakenPortNamesHostPortAndFix) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  try {
    Rendezvous::join(spec_for(0, 2, port), entry(0), options(2s), Env::from_process());
    ADD_FAILURE() << "served on a taken port";
  } catch (const RendezvousError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("127.0.0.1:" + std::to_string(port) + " is already in use"), std::string::npos) << m;
    EXPECT_NE(m.find("MASTER_PORT"), std::string::npos) << m;
  }
  close(fd);
}

TEST(Rendezvous, VersionMismatchNamesRanksAndValues) {
  int port = free_port();
  auto errors = join_all({0, 1, 2}, 3, port, 20s, {entry(0), entry(1), entry(2, "2.12.0")});
  for (const auto& e : errors) {
    EXPECT_NE(e.find("torch differs"), std::string::npos) << e;
    EXPECT_NE(e.find("'2.12.0' on rank 2 (host host1)"), std::string::npos) << e;
    EXPECT_NE(e.find("'2.13.0' on ranks 0-1 (host host0)"), std::string::npos) << e;
  }
}

TEST(Rendezvous, TwoProcessesClaimingOneRank) {
  int port = free_port();
  auto errors = join_all({0, 1, 1}, 3, port, 5s, {entry(0), entry(1), entry(1)});
  int named = 0;
  for (const auto& e : errors) named += e.find("two processes claim rank 1") != std::string::npos;
  EXPECT_EQ(named, 3) << errors[0] << "\n" << errors[1] << "\n" << errors[2];
}

TEST(Rendezvous, OneGpuHeldByTwoRanksOnOneHost) {
  RosterEntry a = entry(0), b = entry(1);
  b.host = a.host;
  b.local_rank = a.local_rank;
  // On CPU, one host and one local rank share nothing: two launcher "nodes" on one machine.
  EXPECT_EQ(join_all({0, 1}, 2, free_port(), 5s, {a, b}), std::vector<std::string>(2));
  a.device = b.device = "cuda:0";
  a.device_id = b.device_id = "GPU-1234";
  auto errors = join_all({0, 1}, 2, free_port(), 5s, {a, b});
  for (const auto& e : errors) EXPECT_NE(e.find("would share device GPU-1234"), std::string::npos) << e;
}

TEST(Rendezvous, OnAStoreThatHoldsTheMasterPort) {
  // What torch.distributed.init_process_group leaves behind: rank 0 serves a TCPStore at the
  // master port, every rank holds a client under a prefix. The rendezvous runs on those.
  int port = free_port();
  c10d::TCPStoreOptions server_options;
  server_options.port = static_cast<std::uint16_t>(port);
  server_options.isServer = true;
  server_options.numWorkers = 2;
  server_options.waitWorkers = false;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_options);
  std::vector<std::future<std::string>> futures;
  for (int rank : {0, 1}) {
    futures.push_back(std::async(std::launch::async, [=]() -> std::string {
      try {
        c10d::TCPStoreOptions o;
        o.port = static_cast<std::uint16_t>(port);
        auto torch_store =
            c10::make_intrusive<c10d::PrefixStore>("default_pg", c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o));
        auto r = Rendezvous::join(spec_for(rank, 2, port), entry(rank), options(10s), Env::from_process(), torch_store);
        if (r->roster().size() != 2u) return "incomplete roster";
        if (r->port() != port) return "port " + std::to_string(r->port());
        if (r->store_owner().find("torch.distributed's store at 127.0.0.1:") != 0) return r->store_owner();
        if (torch_store->getTimeout() == 10s) return "the caller's store had its timeout changed";
        r->store()->add("test/done", 1);
        return "";
      } catch (const std::exception& ex) {
        return ex.what();
      }
    }));
  }
  for (auto& f : futures) EXPECT_EQ(f.get(), "");
  EXPECT_TRUE(server->check({"default_pg/dtcore/attempt_0/generation_0/roster/all"}));  // on the caller's store
}

namespace {

// Rank 1's error against what serves at `port` in place of rank 0's store, with the job secret in
// the environment.
std::string join_rank1_error(int port, std::chrono::milliseconds timeout, double& seconds) {
  auto start = std::chrono::steady_clock::now();
  std::string error;
  try {
    Rendezvous::join(spec_for(1, 2, port), entry(1), options(timeout),
                     Env(std::map<std::string, std::string, std::less<>>{{"DTCORE_JOB_SECRET", "s"}}));
  } catch (const RendezvousError& e) {
    error = e.what();
  }
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return error;
}

}  // namespace

TEST(Rendezvous, AHandshakeDroppedEveryTimeIsRetriedUntilTheDeadlineAndNamedAsDropped) {
  // A store that greets and then drops each connection (a serving process failing mid-handshake).
  dtcore::testing::FakeListener dropper([](int fd) {
    dtcore::testing::send_raw(fd, dtcore::testing::frame_of(store::encode_server_hello({store::kProtocolVersion, {}})));
    dtcore::testing::read_frame(fd);
  });
  double seconds = 0;
  std::string e = join_rank1_error(dropper.port(), 1500ms, seconds);
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 4.0);
  for (const char* part : {"rendezvous timed out after", "rank 0 serves the store at 127.0.0.1:",
                           "no handshake with it completed", "was dropped during the handshake"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  }
  EXPECT_EQ(e.find("does not have this job's secret"), std::string::npos) << e;
  EXPECT_EQ(e.find("has its job secret from"), std::string::npos) << e;
}

TEST(Rendezvous, AStoreOutOfDescriptorsIsRetriedThenNamedWithItsFix) {
  dtcore::testing::FakeListener refuser([](int fd) {
    store::Refusal refusal{store::RefuseReason::OutOfDescriptors, 64,
                           "the serving process is out of file descriptors (its open-file limit is 64)"};
    dtcore::testing::send_raw(fd, dtcore::testing::frame_of(store::encode_refusal(refusal)));
  });
  double seconds = 0;
  std::string e = join_rank1_error(refuser.port(), 1500ms, seconds);
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 4.0);
  for (const char* part :
       {"no handshake with it completed", "out of file descriptors (its open-file limit is 64)", "ulimit -n"}) {
    EXPECT_NE(e.find(part), std::string::npos) << part << " not in: " << e;
  }
  EXPECT_EQ(e.find("not a dtcore store"), std::string::npos) << e;  // the foreign-listener message of before
  EXPECT_EQ(e.find("secret"), std::string::npos) << e;
}

TEST(Roster, EncodeDecodeAndRankFormatting) {
  RosterEntry e = entry(5);
  e.rank = 5;
  RosterEntry d = RosterEntry::decode(e.encode());
  EXPECT_EQ(d.rank, 5);
  EXPECT_EQ(d.host, e.host);
  EXPECT_EQ(d.fingerprint, e.fingerprint);
  EXPECT_EQ(format_ranks({5, 0, 1, 2, 3, 7, 8}), "0-3,5,7-8");
  EXPECT_EQ(format_ranks({}), "");
  EXPECT_THROW(RosterEntry::decode("host=x\n"), RendezvousError);  // no rank: not ours
}
