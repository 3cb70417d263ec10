// The network probe and judge: interface selection syntax, a port held by another socket (named
// by pid), a missing interface, a loopback master in a multi-node job, reachability.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_items.h"
#include "dtcore/check/network_probe.h"

using namespace dtcore;
using namespace dtcore::check;
using dtcore::check::testing::expect_item;

namespace {

// A listening socket on a kernel-chosen loopback port, closed at scope exit.
struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof a;
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd, 4), 0);
    getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { close(fd); }
};

std::vector<Interface> fake_interfaces() {
  return {{"lo", true, true, true, {"127.0.0.1"}},
          {"eth0", true, true, false, {"10.0.0.5"}},
          {"eth1", false, false, false, {}},
          {"docker0", true, false, false, {"172.17.0.1"}},
          {"ib0", true, true, false, {"192.168.1.5"}}};
}

NetworkFacts facts_for(const std::string& master, int nodes) {
  NetworkFacts f;
  f.interfaces = list_interfaces();
  f.master_addr = master;
  f.master_addr_source = "MASTER_ADDR";
  f.master_port = 29500;
  f.master_port_source = "MASTER_PORT";
  f.num_nodes = nodes;
  f.is_rank0 = false;
  f.route = route_to(master, f.interfaces);
  return f;
}

}  // namespace

TEST(NetworkProbe, NcclAndGlooInterfaceSyntax) {
  auto ifs = fake_interfaces();
  EXPECT_EQ(select_interfaces("eth", ifs, true), (std::vector<std::string>{"eth0", "eth1"}));
  EXPECT_EQ(select_interfaces("=eth0", ifs, true), (std::vector<std::string>{"eth0"}));
  EXPECT_EQ(select_interfaces("^docker,lo", ifs, true), (std::vector<std::string>{"eth0", "eth1", "ib0"}));
  EXPECT_EQ(select_interfaces("eth0,ib0", ifs, false), (std::vector<std::string>{"eth0", "ib0"}));
  EXPECT_TRUE(select_interfaces("eth", ifs, false).empty());  // Gloo takes exact names
}

TEST(NetworkProbe, MissingOrDownInterfaceFails) {
  NetworkFacts f = facts_for("127.0.0.1", 1);
  f.interfaces = fake_interfaces();
  f.nccl_socket_ifname = "enp";
  f.gloo_socket_ifname = "eth0,eth9";
  Items out;
  judge_network(f, out);
  expect_item(out, "network.nccl_socket_ifname", Status::Fail, {"NCCL_SOCKET_IFNAME=enp", "no interface", "eth0"});
  expect_item(out, "network.gloo_socket_ifname", Status::Fail, {"'eth9'", "Gloo"});

  f.nccl_socket_ifname = "=eth1";
  f.gloo_socket_ifname = "eth0";
  Items down;
  judge_network(f, down);
  expect_item(down, "network.nccl_socket_ifname", Status::Fail, {"eth1", "down"});
  expect_item(down, "network.gloo_socket_ifname", Status::Pass, {"eth0"});
}

TEST(NetworkProbe, PortHeldByAnotherSocketIsNamedWithItsProcess) {
  Listener held;
  PortProbe p = probe_port(held.port);
  EXPECT_FALSE(p.free);
  ASSERT_TRUE(p.holder.has_value()) << "the listener's process should be found through /proc";
  EXPECT_EQ(p.holder->pid, static_cast<long>(getpid()));

  NetworkFacts f = facts_for("127.0.0.1", 1);
  f.is_rank0 = true;
  f.master_port = held.port;
  f.port = p;
  Items out;
  judge_network(f, out);
  expect_item(out, "network.port", Status::Fail,
              {std::to_string(held.port).c_str(), ("pid " + std::to_string(getpid())).c_str(), "MASTER_PORT"});
}

TEST(NetworkProbe, FreePortPasses) {
  int port;
  {
    Listener l;
    port = l.port;
  }
  EXPECT_TRUE(probe_port(port).free);
}

TEST(NetworkProbe, LoopbackMasterInAMultiNodeJobFails) {
  Items out;
  judge_network(facts_for("127.0.0.1", 2), out);
  expect_item(out, "network.master", Status::Fail, {"loopback", "2 nodes"});
  Items single;
  judge_network(facts_for("127.0.0.1", 1), single);
  expect_item(single, "network.master", Status::Pass);
  expect_item(single, "network.route", Status::Pass, {"127.0.0.1"});
}

TEST(NetworkProbe, UnresolvableMasterFails) {
  NetworkFacts f = facts_for("no-such-host.invalid", 2);
  f.resolve_error = "Name or service not known";
  Items out;
  judge_network(f, out);
  expect_item(out, "network.master", Status::Fail, {"no-such-host.invalid", "does not resolve"});
}

TEST(NetworkProbe, ReachabilityOfTheAgentStore) {
  Listener agent;
  EXPECT_FALSE(connect_error("127.0.0.1", agent.port, std::chrono::milliseconds(2000)).has_value());
  int closed;
  {
    Listener l;
    closed = l.port;
  }
  auto err = connect_error("127.0.0.1", closed, std::chrono::milliseconds(2000));
  ASSERT_TRUE(err.has_value());

  NetworkFacts f = facts_for("127.0.0.1", 1);
  f.agent_store = true;
  f.master_port = closed;
  f.connect = *err;
  Items out;
  judge_network(f, out);
  expect_item(out, "network.port", Status::Fail, {"agent store", "cannot be reached"});
}
