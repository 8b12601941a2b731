// HttpServer + HttpClient over real loopback sockets. Raw POSIX sockets cover what a
// well-behaved client never sends (garbage, pipelining, HTTP/1.0, slow requests).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <future>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http/http_client.hpp"
#include "http/http_transport.hpp"
#include "swarm/errors.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ------------------------------------------------------------------ helpers

/// A blocking loopback TCP connection for hand-written HTTP.
class RawConn {
 public:
  explicit RawConn(uint16_t port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RawConn() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }

  void send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  /// Reads into the buffer; false on EOF/error/timeout.
  bool read_more(std::chrono::milliseconds timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
    char buf[8192];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(buf, static_cast<size_t>(n));
    return true;
  }

  struct Response {
    std::string status_line;
    std::string head;  // all header lines, lower-cased
    std::string body;
  };

  /// Reads one Content-Length delimited response (or returns nullopt on timeout/EOF).
  std::optional<Response> read_response(std::chrono::milliseconds timeout = 3000ms) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      auto end = buf_.find("\r\n\r\n");
      if (end != std::string::npos) {
        Response r;
        std::string head = buf_.substr(0, end);
        r.status_line = head.substr(0, head.find("\r\n"));
        for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        r.head = head;
        size_t len = 0;
        auto cl = head.find("content-length: ");
        if (cl != std::string::npos) len = std::stoul(head.substr(cl + 16));
        if (buf_.size() >= end + 4 + len) {
          r.body = buf_.substr(end + 4, len);
          buf_.erase(0, end + 4 + len);
          return r;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms || !read_more(left)) return std::nullopt;
    }
  }

  /// True if the peer closes the connection within `timeout` (data before that is kept).
  bool wait_closed(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    while (!eof_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left <= 0ms) return false;
      if (!read_more(left) && !eof_) return false;
    }
    return true;
  }

 private:
  int fd_ = -1;
  std::string buf_;
  bool eof_ = false;
};

/// Number of IPv4 TCP connection ends (any state but LISTEN, incl. TIME_WAIT) with `port`
/// at one end.
int tcp_sockets_on_port(uint16_t port) {
  std::ifstream f("/proc/net/tcp");
  std::string line;
  std::getline(f, line);  // header
  int n = 0;
  char want[8];
  std::snprintf(want, sizeof want, ":%04X", port);
  while (std::getline(f, line)) {
    std::istringstream is(line);
    std::string slot, local, remote, state;
    is >> slot >> local >> remote >> state;
    if (state != "0A" && (local.ends_with(want) || remote.ends_with(want))) ++n;
  }
  return n;
}

template <class Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = 2000ms) {
  auto deadline = Clock::now() + timeout;
  while (!pred()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

std::string get_header(const HttpClientResponse& r, const std::string& name) {
  for (const auto& [k, v] : r.headers)
    if (k == name) return v;
  return {};
}

/// Background threads answering sinks later; joined by the fixture.
class Workers {
 public:
  template <class F>
  void spawn(F&& f) {
    std::lock_guard lk(mu_);
    threads_.emplace_back(std::forward<F>(f));
  }
  void join() {
    std::vector<std::thread> ts;
    {
      std::lock_guard lk(mu_);
      ts.swap(threads_);
    }
    for (auto& t : ts) t.join();
  }
  ~Workers() { join(); }

 private:
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

class HttpTransportTest : public ::testing::Test {
 protected:
  void start(HttpHandler handler, HttpServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o, std::move(handler));
    server_->start();
    ASSERT_NE(server_->port(), 0);
  }
  void TearDown() override {
    if (server_) server_->stop(500);
    workers_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  uint16_t port() const { return server_->port(); }

  static HttpHandler echo_handler() {
    return [](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
      HttpResponse r;
      r.content_type = "text/plain";
      bool lower = true;
      for (const auto& [k, v] : req.headers)
        for (char c : k)
          if (c >= 'A' && c <= 'Z') lower = false;
      r.body = req.method + "|" + req.path + "|" + req.target + "|" + req.header("x-test") + "|" +
               (lower ? "lower" : "UPPER") + "|" + req.remote_address + "|" + req.body;
      r.headers.emplace_back("X-Reply", "yes");
      sink->respond(std::move(r));
    };
  }

  std::unique_ptr<HttpServer> server_;
  Workers workers_;
};

// ------------------------------------------------------------------ basics

TEST_F(HttpTransportTest, GetEchoSplitsQueryAndLowercasesHeaders) {
  start(echo_handler());
  HttpClient client(url());
  auto r = client.request("GET", "/v1/echo?a=1&b=2", "", {{"X-Test", "Hello"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "GET|/v1/echo|/v1/echo?a=1&b=2|Hello|lower|127.0.0.1|");
  EXPECT_EQ(get_header(r, "server"), "swarm");
  EXPECT_EQ(get_header(r, "content-type"), "text/plain");
  EXPECT_EQ(get_header(r, "content-length"), std::to_string(r.body.size()));
  EXPECT_EQ(get_header(r, "x-reply"), "yes");
}

// A port another process holds: the server does not start, and the error says what to do
// (an agent pointed at that port would otherwise talk to the other process).
TEST_F(HttpTransportTest, APortInUseFailsTheStartSayingSo) {
  start(echo_handler());
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.port = port();
  HttpServer second(o, echo_handler());
  try {
    second.start();
    FAIL() << "a second server bound a port in use";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("port " + std::to_string(port()) + " on 127.0.0.1 is already in use"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("--port 0"), std::string::npos) << what;
  }
  HttpClient client(url());  // the first one serves on
  EXPECT_EQ(client.request("GET", "/x").status, 200);
}

TEST_F(HttpTransportTest, PostEchoAndPathPrefix) {
  start(echo_handler());
  HttpClient client(url() + "/api/");
  std::string body = R"({"x":[1,2,3]})";
  auto r = client.request("POST", "/submit", body, {{"X-Test", "p"}});
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "POST|/api/submit|/api/submit|p|lower|127.0.0.1|" + body);
}

TEST_F(HttpTransportTest, KeepAliveReusesOneConnection) {
  std::atomic<int> served{0};
  start([&](HttpRequest&&, std::shared_ptr<ResponseSink> sink) {
    ++served;
    sink->respond({200, "application/json", {}, R"({"ok":true})"});
  });
  // An earlier connection may have left a TIME_WAIT on the same port number: count new ones.
  const int before = tcp_sockets_on_port(port());
  HttpClient client(url());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(client.request("GET", "/x").status, 200);
  EXPECT_EQ(served.load(), 100);
  // One connection = its two ends; a reconnect per request would leave ~100 TIME_WAITs.
  // /proc/net/tcp is machine-wide, and tests running in parallel can hold sockets whose
  // ephemeral port number equals ours (seen once in CI: 4 instead of 2), so allow a few.
  EXPECT_LE(tcp_sockets_on_port(port()) - before, 10);
}

TEST_F(HttpTransportTest, Http10WithoutKeepAliveCloses) {
  start(echo_handler());
  RawConn c(port());
  ASSERT_TRUE(c.ok());
  c.send("GET /old HTTP/1.0\r\n\r\n");
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status_line, "HTTP/1.0 200 OK");
  EXPECT_TRUE(c.wait_closed(2000ms));

  RawConn k(port());  // HTTP/1.0 with keep-alive stays open
  k.send("GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  auto r1 = k.read_response();
  ASSERT_TRUE(r1);
  EXPECT_NE(r1->head.find("connection: keep-alive"), std::string::npos);
  k.send("GET /b HTTP/1.0\r\n\r\n");
  auto r2 = k.read_response();
  ASSERT_TRUE(r2);
  EXPECT_NE(r2->body.find("/b"), std::string::npos);
}

// ------------------------------------------------------------------ bad input

TEST_F(HttpTransportTest, OversizedBodyGets413AndServerKeepsServing) {
  HttpServerOptions o;
  o.max_body_bytes = 1024;
  start(echo_handler(), o);
  HttpClient client(url());
  auto r = client.request("POST", "/big", std::string(4096, 'x'));
  EXPECT_EQ(r.status, 413);
  EXPECT_EQ(r.body, R"({"detail":"request body exceeds 1024 bytes",)"
                    R"("error":{"code":"payload_too_large","message":"request body exceeds 1024 bytes",)"
                    R"("type":"invalid_request_error"},"success":false,"type":"error"})");
  EXPECT_EQ(get_header(r, "connection"), "close");
  EXPECT_EQ(client.request("POST", "/small", std::string(1000, 'y')).status, 200);

  // Chunked bodies are limited too.
  RawConn c(port());
  c.send("POST /chunked HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" +
         std::string(0x800, 'z') + "\r\n0\r\n\r\n");
  auto rc = c.read_response();
  ASSERT_TRUE(rc);
  EXPECT_EQ(rc->status_line, "HTTP/1.1 413 Payload Too Large");
  EXPECT_TRUE(c.wait_closed(3000ms));
  EXPECT_EQ(client.request("GET", "/after").status, 200);
}

TEST_F(HttpTransportTest, GarbageGets400AndCloses) {
  start(echo_handler());
  static const char kTlsHello[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 junk\r\n\r\n";
  for (const std::string& junk :
       {std::string(kTlsHello, sizeof kTlsHello - 1), std::string("GET / HTTP/9.9\r\n\r\n"),
        std::string("GET / HTTP/1.1\r\nBad Header\r\n\r\n")}) {
    RawConn c(port());
    c.send(junk);
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status_line.substr(0, 12), "HTTP/1.1 400");
    EXPECT_NE(r->body.find("\"bad_request\""), std::string::npos);
    EXPECT_TRUE(c.wait_closed(3000ms));
  }
  // Random bytes and mangled requests: never a crash, at most an error answer.
  std::mt19937 rng(42);
  const std::vector<std::string> pieces = {"GET ",
                                           "POST ",
                                           "/x",
                                           " HTTP/1.1",
                                           "\r\n",
                                           ": ",
                                           "Content-Length",
                                           "Transfer-Encoding: chunked",
                                           "ffffffffffff",
                                           "\r\n\r\n",
                                           "0",
                                           "-1",
                                           "\x00"};
  for (int i = 0; i < 40; ++i) {
    RawConn f(port());
    std::string junk;
    int parts = static_cast<int>(rng() % 20);
    for (int p = 0; p < parts; ++p) {
      if (rng() % 3 == 0)
        junk += static_cast<char>(rng() % 256);
      else
        junk += pieces[rng() % pieces.size()];
    }
    f.send(junk);
  }
  RawConn eof(port());  // half a request, then gone
  eof.send("POST / HTTP/1.1\r\nContent-Length: 100\r\n\r\nabc");
  HttpClient client(url());
  EXPECT_EQ(client.request("GET", "/healthy").status, 200);
}

TEST_F(HttpTransportTest, ReadTimeoutClosesIdleAndSlowConnections) {
  HttpServerOptions o;
  o.read_timeout_seconds = 1;
  start(echo_handler(), o);
  auto t0 = Clock::now();
  RawConn idle(port());
  RawConn slow(port());
  slow.send("GET /slow HTTP/1.1\r\nHost: x\r\n");  // never finishes its headers
  RawConn after(port());
  after.send("GET /a HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(after.read_response());
  HttpClient client(url());
  ASSERT_EQ(client.request("GET", "/first").status, 200);

  EXPECT_TRUE(idle.wait_closed(3000ms));
  EXPECT_TRUE(slow.wait_closed(3000ms));
  EXPECT_TRUE(after.wait_closed(3000ms));
  EXPECT_GE(Clock::now() - t0, 900ms);
  // The client's kept-alive connection was closed by the server too: retried transparently.
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(client.request("GET", "/second").status, 200);
}

// ------------------------------------------------------------------ sinks

TEST_F(HttpTransportTest, HeaderTimeoutCutsTricklingClientsWhileOthersAreServed) {
  HttpServerOptions o;
  o.read_timeout_seconds = 30;
  o.header_timeout_seconds = 1;
  start(echo_handler(), o);
  const auto t0 = Clock::now();
  RawConn silent(port());  // connects, never sends a byte
  RawConn trickle(port());
  RawConn kept(port());  // a complete request, then an idle keep-alive connection
  kept.send("GET /k HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(kept.read_response());
  std::atomic<bool> stop{false};
  std::thread slowloris([&] {  // one header byte every 100 ms: never done within 1 s
    const std::string head =
        "GET /slow HTTP/1.1\r\nHost: x\r\nX-Padding: " + std::string(200, 'a') + "\r\n\r\n";
    for (size_t i = 0; i < head.size() && !stop; ++i) {
      trickle.send(head.substr(i, 1));
      std::this_thread::sleep_for(100ms);
    }
  });
  // Fresh requests are served at once meanwhile.
  HttpClient client(url());
  EXPECT_EQ(client.request("GET", "/fresh").status, 200);
  EXPECT_TRUE(trickle.wait_closed(4000ms));
  EXPECT_TRUE(silent.wait_closed(4000ms));
  const auto cut_after = Clock::now() - t0;
  stop = true;
  slowloris.join();
  EXPECT_LT(cut_after, 5s);  // the header timeout, not the 30 s read timeout
  // The idle keep-alive connection has the read timeout: still open and serving.
  kept.send("GET /k2 HTTP/1.1\r\nHost: x\r\n\r\n");
  auto again = kept.read_response();
  ASSERT_TRUE(again);
  EXPECT_NE(again->status_line.find("200"), std::string::npos);
  EXPECT_EQ(client.request("GET", "/after").status, 200);
}

TEST_F(HttpTransportTest, ConnectionsOverTheLimitGet503AndTheServerStaysHealthy) {
  HttpServerOptions o;
  o.max_connections = 4;
  start(echo_handler(), o);
  std::vector<std::unique_ptr<RawConn>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawConn>(port()));
    held.back()->send("GET /h HTTP/1.1\r\nHost: x\r\n\r\n");
    ASSERT_TRUE(held.back()->read_response());  // each is open and counted
  }
  RawConn extra(port());
  extra.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n");
  auto r = extra.read_response();
  ASSERT_TRUE(r);
  EXPECT_NE(r->status_line.find("503"), std::string::npos) << r->status_line;
  EXPECT_NE(r->body.find("too many open connections"), std::string::npos) << r->body;
  EXPECT_NE(r->head.find("retry-after: 1"), std::string::npos);
  EXPECT_TRUE(extra.wait_closed(2000ms));
  // The held connections still work; one closed frees a place for a newcomer.
  held[0]->send("GET /still HTTP/1.1\r\nHost: x\r\n\r\n");
  ASSERT_TRUE(held[0]->read_response());
  held.pop_back();
  ASSERT_TRUE(wait_until([&] {
    RawConn next(port());
    next.send("GET /n HTTP/1.1\r\nHost: x\r\n\r\n");
    auto a = next.read_response();
    return a && a->status_line.find("200") != std::string::npos;
  }));
}

TEST_F(HttpTransportTest, Expect100ContinueIsAnswered) {
  HttpServerOptions o;
  o.max_body_bytes = 1000;
  start(echo_handler(), o);
  RawConn c(port());
  c.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n");
  auto go_on = c.read_response();  // the interim answer, before any body byte was sent
  ASSERT_TRUE(go_on);
  EXPECT_EQ(go_on->status_line, "HTTP/1.1 100 Continue");
  c.send("hello");
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_NE(r->status_line.find("200"), std::string::npos);
  EXPECT_NE(r->body.find("|hello"), std::string::npos) << r->body;
  // Too big: refused with 413 from the headers alone, no 100 Continue.
  RawConn big(port());
  big.send("POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nExpect: 100-continue\r\n\r\n");
  auto no = big.read_response();
  ASSERT_TRUE(no);
  EXPECT_NE(no->status_line.find("413"), std::string::npos) << no->status_line;
}

TEST_F(HttpTransportTest, AStreamToAClientThatStopsReadingIsDroppedAtTheBacklogBound) {
  HttpServerOptions o;
  o.read_timeout_seconds = 60;  // not the write deadline: the backlog bound must act first
  o.max_stream_backlog_bytes = 256 * 1024;
  std::promise<size_t> written;
  start(
      [&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
        if (req.path != "/s") return sink->respond({});
        sink->start_stream(200, "text/event-stream");
        workers_.spawn([sink, &written] {
          const std::string chunk = "data: " + std::string(1018, 'x') + "\n\n";
          size_t total = 0;
          while (total < (size_t{1} << 30) && sink->write(chunk) && sink->client_connected()) {
            total += chunk.size();
            if (total % (64 * 1024) == 0) std::this_thread::sleep_for(1ms);  // let the strand drain
          }
          sink->end_stream();
          written.set_value(total);
        });
      },
      o);
  RawConn c(port());
  c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");  // and never reads
  auto fut = written.get_future();
  ASSERT_EQ(fut.wait_for(20s), std::future_status::ready) << "the producer was never stopped";
  const size_t total = fut.get();
  std::printf("[ figures ] a client that stopped reading was dropped after %.1f MiB were produced\n",
              static_cast<double>(total) / (1 << 20));
  EXPECT_LT(total, size_t{256} << 20);  // bounded: socket buffers + the 256 KiB backlog, not 1 GiB
  EXPECT_TRUE(c.wait_closed(5000ms));
  HttpClient client(url());
  EXPECT_EQ(client.request("GET", "/ok").status, 200);  // and the server goes on serving
}

TEST_F(HttpTransportTest, AsyncAnswerFromAnotherThread) {
  start([&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    workers_.spawn([sink, path = req.path] {
      std::this_thread::sleep_for(20ms);
      sink->respond({202, "application/json", {}, "{\"path\":\"" + path + "\"}"});
    });
  });
  HttpClient client(url());
  for (int i = 0; i < 3; ++i) {
    auto r = client.request("GET", "/later");
    EXPECT_EQ(r.status, 202);
    EXPECT_EQ(r.body, R"({"path":"/later"})");
  }
}

TEST_F(HttpTransportTest, DroppedSinkAnswers500) {
  start([](HttpRequest&&, std::shared_ptr<ResponseSink>) {});
  HttpClient client(url());
  auto r = client.request("GET", "/nothing");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("handler did not respond"), std::string::npos);
  EXPECT_EQ(client.request("GET", "/again").status, 500);  // connection still usable
}

TEST_F(HttpTransportTest, ThrowingHandlerAnswers500) {
  start([](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    if (req.path == "/ok") return sink->respond({});
    throw std::runtime_error("boom");
  });
  HttpClient client(url());
  auto r = client.request("GET", "/throw");
  EXPECT_EQ(r.status, 500);
  EXPECT_NE(r.body.find("\"error\""), std::string::npos);
  EXPECT_NE(r.body.find("internal server error"), std::string::npos);
  EXPECT_EQ(client.request("GET", "/ok").status, 200);
}

TEST_F(HttpTransportTest, StreamingChunksArriveInOrder) {
  start([&](HttpRequest&&, std::shared_ptr<ResponseSink> sink) {
    sink->start_stream(200, "text/event-stream");
    workers_.spawn([sink] {
      for (int i = 0; i < 20; ++i) {
        sink->write("data: " + std::to_string(i) + "\n\n");
        if (i % 5 == 0) std::this_thread::sleep_for(2ms);
      }
      sink->write("data: [DONE]\n\n");
      sink->end_stream();
    });
  });
  HttpClient client(url());
  std::string got;
  int pieces = 0;
  auto r = client.request_stream("POST", "/stream", "{}", {}, [&](std::string_view d) {
    got += d;
    ++pieces;
    return true;
  });
  std::string want;
  for (int i = 0; i < 20; ++i) want += "data: " + std::to_string(i) + "\n\n";
  want += "data: [DONE]\n\n";
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(got, want);
  EXPECT_GE(pieces, 1);
  EXPECT_EQ(get_header(r, "content-type"), "text/event-stream");
  EXPECT_EQ(get_header(r, "cache-control"), "no-cache");
  EXPECT_EQ(get_header(r, "transfer-encoding"), "chunked");
  // The connection is reusable after a complete stream.
  EXPECT_EQ(client.request("GET", "/next").status, 200);
}

TEST_F(HttpTransportTest, StreamEarlyStopIsSeenByTheProducer) {
  std::promise<int> stopped_after;
  start([&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    if (req.path != "/stream") return sink->respond({});
    sink->start_stream(200, "text/event-stream");
    workers_.spawn([sink, &stopped_after] {
      int i = 0;
      for (; i < 5000; ++i) {
        if (!sink->write("data: tick\n\n") || !sink->client_connected()) break;
        std::this_thread::sleep_for(1ms);
      }
      sink->end_stream();
      stopped_after.set_value(i);
    });
  });
  HttpClient client(url());
  std::string first;
  auto r = client.request_stream("GET", "/stream", "", {}, [&](std::string_view d) {
    first = d;
    return false;
  });
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(first.substr(0, 12), "data: tick\n\n");
  auto fut = stopped_after.get_future();
  ASSERT_EQ(fut.wait_for(3s), std::future_status::ready);
  EXPECT_LT(fut.get(), 5000);
  EXPECT_EQ(client.request("GET", "/again").status, 200);  // reconnects
}

TEST_F(HttpTransportTest, DroppedSinkMidStreamTruncatesTheResponse) {
  start([](HttpRequest&&, std::shared_ptr<ResponseSink> sink) {
    sink->start_stream(200, "text/event-stream");
    sink->write("data: one\n\n");
  });  // sink dropped without end_stream()
  HttpClient client(url());
  std::string got;
  EXPECT_THROW(client.request_stream("GET", "/s", "", {},
                                     [&](std::string_view d) {
                                       got += d;
                                       return true;
                                     }),
               TransportError);
  EXPECT_EQ(got, "data: one\n\n");
}

TEST_F(HttpTransportTest, HeadGetsHeadersOnly) {
  start(echo_handler());
  HttpClient client(url());
  auto r = client.request("HEAD", "/h");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "");
  EXPECT_NE(get_header(r, "content-length"), "0");
  EXPECT_EQ(client.request("GET", "/g").body.substr(0, 6), "GET|/g");  // framing intact
}

// ------------------------------------------------------------------ pipelining

TEST_F(HttpTransportTest, PipelinedRequestsAnsweredInOrder) {
  start([&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    if (req.path == "/a") {  // the first one answers last
      workers_.spawn([sink] {
        std::this_thread::sleep_for(50ms);
        sink->respond({200, "text/plain", {}, "A"});
      });
    } else {
      sink->respond({200, "text/plain", {}, req.path.substr(1) == "b" ? "B" : "C"});
    }
  });
  RawConn c(port());
  c.send(
      "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
      "GET /c HTTP/1.1\r\nHost: x\r\n\r\n");
  for (const char* want : {"A", "B", "C"}) {
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->body, want);
  }
}

TEST_F(HttpTransportTest, PipeliningIsBounded) {
  std::mutex mu;
  std::vector<std::shared_ptr<ResponseSink>> held;
  std::condition_variable cv;
  HttpServerOptions o;
  o.max_pipelined = 2;
  start(
      [&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
        std::lock_guard lk(mu);
        sink->write("ignored: not streaming");  // misuse is ignored
        held.push_back(sink);
        static_cast<void>(req);
        cv.notify_all();
      },
      o);
  RawConn c(port());
  std::string five;
  for (int i = 0; i < 5; ++i) five += "GET /" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  c.send(five);
  int answered = 0;
  for (int round = 0; answered < 5; ++round) {
    ASSERT_LT(round, 10);
    std::vector<std::shared_ptr<ResponseSink>> batch;
    {
      std::unique_lock lk(mu);
      ASSERT_TRUE(cv.wait_for(lk, 2s, [&] { return !held.empty(); }));
      lk.unlock();
      std::this_thread::sleep_for(30ms);  // give the server the chance to over-read
      lk.lock();
      EXPECT_LE(held.size(), 2u);
      batch.swap(held);
    }
    for (auto& s : batch) {
      s->respond({200, "text/plain", {}, std::to_string(answered)});
      auto r = c.read_response();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->body, std::to_string(answered));
      ++answered;
    }
  }
}

// ------------------------------------------------------------------ client errors

TEST_F(HttpTransportTest, ClientConnectionRefused) {
  uint16_t dead_port;
  {
    HttpServerOptions o;
    o.port = 0;
    HttpServer s(o, echo_handler());
    s.start();
    dead_port = s.port();
  }
  HttpClient client("http://127.0.0.1:" + std::to_string(dead_port), 2s);
  try {
    client.request("GET", "/");
    FAIL() << "expected TransportError";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(dead_port)), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(HttpClient("ftp://example.com"), TransportError);
  EXPECT_THROW(HttpClient("127.0.0.1:80"), TransportError);
  HttpClient d("http://example.com/v1");
  EXPECT_EQ(d.host(), "example.com");
  EXPECT_EQ(d.port(), "80");
  HttpClient tls("https://example.com/v1");  // TLS (test_http_tls): port 443 by default, no connection yet
  EXPECT_EQ(tls.port(), "443");
}

TEST_F(HttpTransportTest, ClientTimeout) {
  std::shared_ptr<ResponseSink> parked;
  std::mutex mu;
  start([&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    if (req.path == "/slow") {
      std::lock_guard lk(mu);
      parked = std::move(sink);
    } else {
      sink->respond({});
    }
  });
  HttpClient client(url(), 200ms);
  auto t0 = Clock::now();
  try {
    client.request("GET", "/slow");
    FAIL() << "expected TransportError";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 200 ms"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - t0, 1500ms);
  EXPECT_EQ(client.request("GET", "/fast").status, 200);  // reconnects
  std::lock_guard lk(mu);
  ASSERT_TRUE(parked);
  EXPECT_TRUE(wait_until([&] { return !parked->client_connected(); }));  // client gave up
  parked->respond({});  // answering a gone client is harmless
  parked.reset();
}

TEST_F(HttpTransportTest, FiftyThreadsConcurrently) {
  std::atomic<int> served{0};
  start([&](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    ++served;
    sink->respond({200, "application/json", {}, std::move(req.body)});
  });
  constexpr int kThreads = 50, kRequests = 100;
  std::atomic<int> ok{0};
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      HttpClient client(url(), 10s);
      for (int i = 0; i < kRequests; ++i) {
        std::string body = "{\"t\":" + std::to_string(t) + ",\"i\":" + std::to_string(i) + "}";
        try {
          auto r = client.request("POST", "/echo", body);
          if (r.status == 200 && r.body == body) ++ok;
        } catch (const std::exception& e) {
          ADD_FAILURE() << e.what();
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(ok.load(), kThreads * kRequests);
  EXPECT_EQ(served.load(), kThreads * kRequests);
  std::printf("[   INFO   ] %d requests in %.3f s = %.0f req/s (client and server share the cores)\n",
              kThreads * kRequests, secs, kThreads * kRequests / secs);
}

// ------------------------------------------------------------------ shutdown

TEST_F(HttpTransportTest, StopAnswersInFlightRequestsWithinGrace) {
  std::promise<void> handled;
  start([&](HttpRequest&&, std::shared_ptr<ResponseSink> sink) {
    handled.set_value();
    workers_.spawn([sink] {
      std::this_thread::sleep_for(150ms);
      sink->respond({200, "text/plain", {}, "finished"});
    });
  });
  RawConn idle(port());  // an idle keep-alive connection must not hold stop() up
  auto fut = std::async(std::launch::async, [&] {
    HttpClient client(url(), 5s);
    return client.request("GET", "/work");
  });
  handled.get_future().wait();
  auto t0 = Clock::now();
  server_->stop(2000);
  auto took = Clock::now() - t0;
  auto r = fut.get();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "finished");
  EXPECT_LT(took, 1500ms);
  EXPECT_TRUE(idle.wait_closed(1000ms));
  server_->stop();  // idempotent
  EXPECT_FALSE(RawConn(port()).ok());
}

TEST_F(HttpTransportTest, StopAfterGraceClosesAndLateAnswersAreHarmless) {
  std::shared_ptr<ResponseSink> parked;
  std::promise<void> handled;
  start([&](HttpRequest&&, std::shared_ptr<ResponseSink> sink) {
    parked = std::move(sink);
    handled.set_value();
  });
  auto fut = std::async(std::launch::async, [&] {
    HttpClient client(url(), 5s);
    try {
      client.request("GET", "/never");
      return false;
    } catch (const TransportError&) {
      return true;
    }
  });
  handled.get_future().wait();
  auto t0 = Clock::now();
  server_->stop(100);
  EXPECT_LT(Clock::now() - t0, 1000ms);
  EXPECT_TRUE(fut.get());
  EXPECT_FALSE(parked->client_connected());
  parked->respond({});  // after stop: dropped, no crash
  server_.reset();      // the server goes first...
  parked.reset();       // ...the last sink after it
}

}  // namespace
}  // namespace swarm
