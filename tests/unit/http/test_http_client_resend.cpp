// When a kept-alive connection closes with no answer, HttpClient sends the request again only
// if it is idempotent: the server may have processed a POST before the connection went (an
// end_episode whose answer was lost), and a second copy would do it twice.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_client.hpp"
#include "swarm/errors.hpp"
#include "swarm/swarm.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;

// A raw HTTP/1.1 server on loopback that answers `{"success": true}` with keep-alive, except
// that it reads request number `drop` (counting from 0 over all connections) whole and closes
// the connection without answering it (a server that failed after processing, or an answer lost
// on the way). Records every request line it read.
class DroppingServer {
 public:
  explicit DroppingServer(int drop) : drop_(drop) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 8), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { serve(); });
  }
  ~DroppingServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() {
    std::lock_guard lock(mu_);
    return requests_;
  }

 private:
  // One request (headers and a Content-Length body) from `conn`; false when it closed first.
  bool read_request(int conn, std::string& pending) {
    size_t end;
    while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
      char buf[4096];
      const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
      if (n <= 0) return false;
      pending.append(buf, static_cast<size_t>(n));
    }
    size_t body = 0;
    if (auto cl = pending.find("Content-Length: "); cl != std::string::npos && cl < end)
      body = std::stoul(pending.substr(cl + 16));
    while (pending.size() < end + 4 + body) {
      char buf[4096];
      const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
      if (n <= 0) return false;
      pending.append(buf, static_cast<size_t>(n));
    }
    {
      std::lock_guard lock(mu_);
      requests_.push_back(pending.substr(0, pending.find("\r\n")));
    }
    pending.erase(0, end + 4 + body);
    return true;
  }
  void serve() {
    while (!stop_) {
      const int conn = ::accept(fd_, nullptr, nullptr);
      if (conn < 0) return;
      std::string pending;
      while (read_request(conn, pending)) {
        if (seen_++ == drop_) break;  // read whole, never answered
        const std::string ok =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 17\r\nConnection: "
            "keep-alive\r\n\r\n"
            "{\"success\": true}";
        ::send(conn, ok.data(), ok.size(), MSG_NOSIGNAL);
      }
      ::close(conn);
    }
  }

  int drop_;
  int seen_ = 0;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

TEST(HttpClientResend, APostWhoseAnswerWasLostIsNotSentAgain) {
  DroppingServer server(/*drop=*/1);
  HttpClient client(server.url(), 5s);
  EXPECT_EQ(client.request("POST", "/end_episode", "{\"n\": 1}").status, 200);
  EXPECT_THROW(client.request("POST", "/end_episode", "{\"n\": 2}"), TransportError);
  std::this_thread::sleep_for(100ms);  // anything sent again would have arrived by now
  EXPECT_EQ(server.requests(),
            (std::vector<std::string>{"POST /end_episode HTTP/1.1", "POST /end_episode HTTP/1.1"}));
}

TEST(HttpClientResend, AGetWhoseAnswerWasLostIsSentAgainOnce) {
  DroppingServer server(/*drop=*/1);
  HttpClient client(server.url(), 5s);
  EXPECT_EQ(client.request("GET", "/health").status, 200);
  EXPECT_EQ(client.request("GET", "/health").status, 200);  // the copy on a fresh connection
  EXPECT_EQ(server.requests().size(), 3u);
}

// The SDK sends an end_episode again when its answer was lost: the server answers a repeated
// end with the first end's outcome (docs/reliability.md), so the task is not run again.
TEST(HttpClientResend, TheSdkRepeatsAnEndWhoseAnswerWasLost) {
  DroppingServer server(/*drop=*/0);
  SwarmClientOptions o;
  o.request_timeout = 5s;
  o.log_level = ClientLogLevel::OFF;
  SwarmClient client(server.url(), o);
  Task task;
  task.task_id = "t";
  WorkflowOutput out;
  out.reward = 1.0;
  EXPECT_TRUE(client.end_episode(task, "ep-1", out));
  EXPECT_EQ(server.requests(),
            (std::vector<std::string>{"POST /end_episode HTTP/1.1", "POST /end_episode HTTP/1.1"}));
  // A control route is not repeated: its caller decides.
  DroppingServer control(/*drop=*/0);
  SwarmClient admin(control.url(), o);
  EXPECT_THROW(admin.start_engine(), TransportError);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(control.requests().size(), 1u);
}

// The common case stays transparent for every method: a kept-alive connection the server
// closed while idle is noticed before the request goes out, and replaced.
TEST(HttpClientResend, AConnectionClosedWhileIdleIsReplacedBeforeSending) {
  std::atomic<int> served{0};
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  std::thread server([&] {
    for (int c = 0; c < 2; ++c) {  // answers one request per connection, then closes it
      const int conn = ::accept(fd, nullptr, nullptr);
      if (conn < 0) return;
      std::string got;
      char buf[4096];
      while (got.find("\r\n\r\n") == std::string::npos || got.find("{}") == std::string::npos) {
        const ssize_t n = ::recv(conn, buf, sizeof buf, 0);
        if (n <= 0) break;
        got.append(buf, static_cast<size_t>(n));
      }
      const std::string ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok";
      ::send(conn, ok.data(), ok.size(), MSG_NOSIGNAL);
      ++served;
      ::close(conn);  // idle close, after the answer
    }
  });
  HttpClient client("http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)), 5s);
  EXPECT_EQ(client.request("POST", "/claim_episode", "{}").status, 200);
  std::this_thread::sleep_for(100ms);  // the server's close arrives
  EXPECT_EQ(client.request("POST", "/claim_episode", "{}").status, 200);
  EXPECT_EQ(served.load(), 2);
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
  server.join();
}

}  // namespace
}  // namespace swarm
