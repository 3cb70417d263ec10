// The rendezvous store's c10d::Store face: every op through StoreClient against an in-process
// StoreServer on loopback, concurrency, clone(), and torch's own PrefixStore on top.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "expect_error.h"
#include "store_test_util.h"

using namespace dtcore;
using namespace dtcore::testing;
using namespace std::chrono_literals;

TEST(Store, SetGetBinaryValuesAndStrings) {
  auto server = start_server();
  auto client = connect_to(*server);
  std::vector<uint8_t> binary = {0, 1, 2, 255, 0, 7};
  client->set("bin", binary);
  EXPECT_EQ(client->get("bin"), binary);
  client->set("text", std::string("hello"));
  EXPECT_EQ(client->get_to_str("text"), "hello");
  client->set("text", std::string(""));  // overwrite with an empty value: the key still exists
  EXPECT_EQ(client->get("text"), std::vector<uint8_t>{});
  EXPECT_TRUE(client->check({"text"}));
  EXPECT_EQ(client->host(), "127.0.0.1");
  EXPECT_EQ(client->port(), server->port());
}

TEST(Store, GetBlocksUntilAnotherClientSets) {
  auto server = start_server();
  auto waiter = connect_to(*server);
  auto setter = connect_to(*server);
  auto start = Clock::now();
  auto got = std::async(std::launch::async, [&] { return text(waiter->get("late")); });
  EXPECT_EQ(got.wait_for(150ms), std::future_status::timeout);  // parked, not answered
  setter->set("late", std::string("value"));
  EXPECT_EQ(got.get(), "value");
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(Store, GetTimesOutWithDistStoreErrorAndTheConnectionStaysUsable) {
  auto server = start_server();
  auto client = connect_to(*server, 200ms);
  auto start = Clock::now();
  std::string msg = error_of<c10::DistStoreError>([&] { client->get("never"); });
  EXPECT_GE(seconds_since(start), 0.19);
  EXPECT_LT(seconds_since(start), 2.0);
  expect_contains(msg, {"get timeout after 200ms", "keys: never", "127.0.0.1:"});
  // The parked get was canceled: the next request gets its own answer, not the stale one.
  client->set("never", std::string("now"));
  EXPECT_EQ(client->get_to_str("never"), "now");
  EXPECT_EQ(client->add("n", 1), 1);
}

TEST(Store, WaitUsesTheGivenTimeoutAndNamesTheKeys) {
  auto server = start_server();
  auto client = connect_to(*server, 30s);  // the store's own timeout must not apply
  client->set("a", std::string("1"));
  auto start = Clock::now();
  std::string msg = error_of<c10::DistStoreError>([&] { client->wait({"a", "b", "c"}, 150ms); });
  EXPECT_LT(seconds_since(start), 2.0);
  expect_contains(msg, {"wait timeout after 150ms", "keys: a, b, c"});
  client->wait({"a"}, 150ms);  // present: returns at once
}

TEST(Store, WaitReturnsOnceEveryKeyIsSet) {
  auto server = start_server();
  auto waiter = connect_to(*server);
  auto setter = connect_to(*server);
  auto done = std::async(std::launch::async, [&] { waiter->wait({"x", "y", "z"}); });
  setter->set("y", std::string("1"));
  setter->set("x", std::string("1"));
  EXPECT_EQ(done.wait_for(100ms), std::future_status::timeout);
  setter->add("z", 1);  // add, append, compareSet and multiSet release waiters too
  done.get();
}

TEST(Store, AddStoresDecimalTextAsTcpStoreDoes) {
  auto server = start_server();
  auto client = connect_to(*server);
  EXPECT_EQ(client->add("counter", 3), 3);
  EXPECT_EQ(client->get_to_str("counter"), "3");
  EXPECT_EQ(client->add("counter", -5), -2);
  EXPECT_EQ(client->get_to_str("counter"), "-2");
  EXPECT_EQ(client->add("counter", 0), -2);
  client->set("words", std::string("not a number"));
  std::string msg = error_of<c10::DistStoreError>([&] { client->add("words", 1); });
  expect_contains(msg, {"refused add", "'words'", "not a decimal integer"});
  client->set("big", std::string("9223372036854775807"));
  expect_contains(error_of<c10::DistStoreError>([&] { client->add("big", 1); }), {"overflows"});
}

TEST(Store, CompareSetFollowsC10dSemantics) {
  auto server = start_server();
  auto client = connect_to(*server);
  // Missing key, non-empty expected: nothing is set, `expected` comes back.
  EXPECT_EQ(client->compareSet("k", "old", "new"), "old");
  EXPECT_FALSE(client->check({"k"}));
  // Missing key, empty expected: desired is set.
  EXPECT_EQ(client->compareSet("k", "", "first"), "first");
  EXPECT_EQ(client->get_to_str("k"), "first");
  // Matching: swapped. Not matching: the current value comes back unchanged.
  EXPECT_EQ(client->compareSet("k", "first", "second"), "second");
  EXPECT_EQ(client->compareSet("k", "first", "third"), "second");
  EXPECT_EQ(client->get_to_str("k"), "second");
}

TEST(Store, DeleteCheckNumKeysAndListKeys) {
  auto server = start_server();
  auto client = connect_to(*server);
  EXPECT_EQ(client->getNumKeys(), 0);
  client->set("a", std::string("1"));
  client->set("b", std::string("2"));
  EXPECT_EQ(client->getNumKeys(), 2);
  EXPECT_TRUE(client->check({"a", "b"}));
  EXPECT_FALSE(client->check({"a", "missing"}));
  auto keys = client->listKeys();
  std::sort(keys.begin(), keys.end());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(client->deleteKey("a"));
  EXPECT_FALSE(client->deleteKey("a"));
  EXPECT_EQ(client->getNumKeys(), 1);
  EXPECT_FALSE(client->check({"a"}));
}

TEST(Store, ExtendedApiAppendMultiGetMultiSet) {
  auto server = start_server();
  auto client = connect_to(*server);
  EXPECT_TRUE(client->hasExtendedApi());
  client->append("log", bytes("ab"));  // creates the key
  client->append("log", bytes("cd"));
  EXPECT_EQ(client->get_to_str("log"), "abcd");
  client->multiSet({"m1", "m2", "m3"}, {bytes("1"), bytes("22"), bytes("")});
  auto values = client->multiGet({"m3", "m1", "log", "m2"});
  ASSERT_EQ(values.size(), 4u);
  EXPECT_EQ(text(values[0]), "");
  EXPECT_EQ(text(values[1]), "1");
  EXPECT_EQ(text(values[2]), "abcd");
  EXPECT_EQ(text(values[3]), "22");
  expect_contains(error_of<c10::DistStoreError>([&] { client->multiSet({"a", "b"}, {bytes("1")}); }),
                  {"2 keys and 1 values"});
  // multiGet waits for missing keys, like TCPStore's.
  auto setter = connect_to(*server);
  auto got = std::async(std::launch::async, [&] { return client->multiGet({"m1", "later"}); });
  EXPECT_EQ(got.wait_for(100ms), std::future_status::timeout);
  setter->set("later", std::string("L"));
  EXPECT_EQ(text(got.get()[1]), "L");
}

TEST(Store, Queues) {
  auto server = start_server();
  auto client = connect_to(*server);
  EXPECT_EQ(client->queueLen("q"), 0);
  client->queuePush("q", bytes("one"));
  client->queuePush("q", bytes("two"));
  EXPECT_EQ(client->queueLen("q"), 2);
  EXPECT_EQ(text(client->queuePop("q", false)), "one");
  EXPECT_EQ(text(client->queuePop("q", true)), "two");
  expect_contains(error_of<c10::DistQueueEmptyError>([&] { client->queuePop("q", false); }), {"queue is empty"});
  // A blocking pop waits for a push from another client.
  auto pusher = connect_to(*server);
  auto popped = std::async(std::launch::async, [&] { return text(client->queuePop("q", true)); });
  EXPECT_EQ(popped.wait_for(100ms), std::future_status::timeout);
  pusher->queuePush("q", bytes("three"));
  EXPECT_EQ(popped.get(), "three");
  EXPECT_EQ(pusher->queueLen("q"), 0);
  EXPECT_FALSE(client->check({"q"}));  // queues live apart from keys, as in TCPStore
}

TEST(Store, ManyClientsFromManyThreadsAddExactly) {
  auto server = start_server();
  auto shared = connect_to(*server);  // half the threads share one client: its mutex serializes them
  constexpr int kThreads = 8;
  constexpr int kAdds = 200;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      c10::intrusive_ptr<c10d::Store> store = t % 2 == 0 ? connect_to(*server) : shared;
      for (int i = 0; i < kAdds; ++i) store->add("counter", 1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(shared->add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(shared->get_to_str("counter"), std::to_string(kThreads * kAdds));
}

TEST(Store, CloneHasItsOwnConnectionSecretAndTimeout) {
  auto server = start_server();
  auto client = connect_to(*server, 4s);
  client->setTimeout(3s);
  auto clone = client->clone();
  EXPECT_EQ(clone->getTimeout(), 3s);
  // The original blocks in get(); the clone, on its own connection, is not held up by it.
  auto got = std::async(std::launch::async, [&] { return client->get_to_str("from_clone"); });
  EXPECT_EQ(got.wait_for(50ms), std::future_status::timeout);
  clone->set("from_clone", std::string("hi"));
  EXPECT_EQ(got.get(), "hi");
  EXPECT_EQ(server->stats().authenticated, 2u);
}

TEST(Store, BarrierFromTheStoreInterface) {
  auto server = start_server();
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.push_back(std::async(std::launch::async, [&] { connect_to(*server)->barrier("sync", 3, 5s); }));
  }
  for (auto& f : ranks) f.get();
}

TEST(Store, TorchPrefixStoreRunsOnIt) {
  auto server = start_server();
  c10::intrusive_ptr<c10d::Store> client = connect_to(*server);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("pg0", client);
  prefixed->set("addr", std::string("10.0.0.1:1234"));
  EXPECT_EQ(prefixed->get_to_str("addr"), "10.0.0.1:1234");
  EXPECT_EQ(prefixed->add("count", 2), 2);
  EXPECT_EQ(prefixed->add("count", 3), 5);
  EXPECT_TRUE(prefixed->check({"addr", "count"}));
  prefixed->wait({"addr"});
  EXPECT_TRUE(prefixed->hasExtendedApi());
  prefixed->multiSet({"m"}, {bytes("v")});
  EXPECT_EQ(text(prefixed->multiGet({"m"})[0]), "v");
  // The keys land under the prefix in the underlying store.
  EXPECT_EQ(client->get_to_str("pg0/addr"), "10.0.0.1:1234");
  EXPECT_EQ(client->get_to_str("pg0/count"), "5");
  // And a clone of the PrefixStore clones our client underneath.
  auto cloned = prefixed->clone();
  EXPECT_EQ(cloned->get_to_str("addr"), "10.0.0.1:1234");
}
