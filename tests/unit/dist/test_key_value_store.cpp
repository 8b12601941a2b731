// The authenticated rendezvous store (dist/key_value_store.hpp): c10d's store semantics on the
// data, served over loopback to ranks that prove the secret, refusing everyone else.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "common/error.hpp"
#include "dist/key_value_store.hpp"
#include "dist/rank_channel.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;

TEST(KeyValueStore, StoreSemantics) {
  KeyValueStore s;
  EXPECT_EQ(s.get("a", 10ms), std::nullopt);
  s.set("a", std::string("\x00\xff", 2));
  EXPECT_EQ(s.get("a", 0ms), std::string("\x00\xff", 2));
  EXPECT_EQ(s.add("n", 3), 3);
  EXPECT_EQ(s.add("n", -5), -2);
  EXPECT_EQ(s.get("n", 0ms), "-2");
  EXPECT_THROW(s.add("a", 1), SwarmError);  // not a number
  // compare_set: missing + empty expectation sets; a mismatch returns what is there.
  EXPECT_EQ(s.compare_set("c", "", "one"), "one");
  EXPECT_EQ(s.compare_set("c", "two", "three"), "one");
  EXPECT_EQ(s.compare_set("c", "one", "four"), "four");
  EXPECT_EQ(s.compare_set("missing", "x", "y"), "x");
  EXPECT_FALSE(s.check({"missing"}));
  EXPECT_TRUE(s.check({"a", "n", "c"}));
  EXPECT_EQ(s.size(), 3);
  EXPECT_TRUE(s.erase("c"));
  EXPECT_FALSE(s.erase("c"));
  EXPECT_EQ(s.size(), 2);
}

TEST(KeyValueStore, ReadingWaitsForTheKeyAndClosingWakesEveryone) {
  KeyValueStore s;
  std::thread writer([&] {
    std::this_thread::sleep_for(50ms);
    s.set("late", "here");
    s.set("later", "too");
  });
  EXPECT_EQ(s.get("late", 5s), "here");
  EXPECT_TRUE(s.wait({"late", "later"}, 5s));
  writer.join();
  EXPECT_FALSE(s.wait({"never"}, 20ms));
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    s.close();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(s.wait({"never"}, 30s));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  closer.join();
}

struct Served {
  std::shared_ptr<KeyValueStore> store = std::make_shared<KeyValueStore>();
  int port = pick_free_port();
  std::unique_ptr<KeyValueServer> server;
  explicit Served(int world = 3) {
    server = std::make_unique<KeyValueServer>(store, "127.0.0.1", port, world, "store secret");
  }
};

TEST(KeyValueStore, RanksShareItOverTheNetwork) {
  Served s;
  KeyValueClient one("127.0.0.1", s.port, 1, 5s, "store secret");
  KeyValueClient two("127.0.0.1", s.port, 2, 5s, "store secret");
  KeyValueClient two_again("127.0.0.1", s.port, 2, 5s, "store secret");  // a clone: the same rank again
  std::thread waiter([&] { EXPECT_EQ(two.get("addr/1", 5s), std::string("10.0.0.1\0:1", 11)); });
  std::this_thread::sleep_for(20ms);
  one.set("addr/1", std::string("10.0.0.1\0:1", 11));
  waiter.join();
  EXPECT_EQ(s.store->get("addr/1", 0ms), std::string("10.0.0.1\0:1", 11));  // rank 0 reads it directly
  EXPECT_EQ(one.add("barrier", 1), 1);
  EXPECT_EQ(two_again.add("barrier", 1), 2);
  EXPECT_EQ(two.compare_set("cs", "", "v1"), "v1");
  EXPECT_EQ(one.compare_set("cs", "v0", "v2"), "v1");
  EXPECT_TRUE(one.wait({"addr/1", "barrier"}, 1s));
  EXPECT_FALSE(one.wait({"nobody"}, 20ms));
  EXPECT_EQ(one.get("nobody", 20ms), std::nullopt);
  EXPECT_TRUE(two.check({"cs"}));
  EXPECT_EQ(two.size(), 3);
  EXPECT_TRUE(two.erase("cs"));
  EXPECT_FALSE(one.check({"cs"}));
}

TEST(KeyValueStore, StrangersAndOtherJobsGetNothing) {
  Served s;
  s.store->set("gloo/rank0/address", "10.0.0.1:4567");
  // Another job's rank (another secret) is refused at the handshake, and says so.
  try {
    KeyValueClient impostor("127.0.0.1", s.port, 1, 2s, "another secret");
    FAIL() << "joined without the secret";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
    EXPECT_NE(std::string(e.what()).find("rendezvous secret"), std::string::npos) << e.what();
  }
  // A raw connection that skips the handshake and asks for the key gets the door closed.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  write_rank_frame(fd, RankMessage{{{"op", "get"}, {"keys", {"gloo/rank0/address"}}, {"n", 0}}, {}});
  bool answered = false;
  try {
    std::optional<RankMessage> m = read_rank_frame(fd);
    answered = m.has_value() && m->payload.find("10.0.0.1") != std::string::npos;
  } catch (const SwarmError&) {  // reset by the server: nothing read
  }
  EXPECT_FALSE(answered);
  ::close(fd);
  // The job's own ranks are still served.
  KeyValueClient rank1("127.0.0.1", s.port, 1, 2s, "store secret");
  EXPECT_EQ(rank1.get("gloo/rank0/address", 1s), "10.0.0.1:4567");
}

TEST(KeyValueStore, StoppingTheServerEndsWaitingRanks) {
  auto s = std::make_unique<Served>(2);
  const int port = s->port;
  KeyValueClient rank1("127.0.0.1", port, 1, 2s, "store secret");
  std::thread stopper([&] {
    std::this_thread::sleep_for(50ms);
    s.reset();
  });
  const auto t0 = std::chrono::steady_clock::now();
  try {
    EXPECT_FALSE(rank1.wait({"never"}, 30s));
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::UNAVAILABLE);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  stopper.join();
}

}  // namespace
}  // namespace swarm
