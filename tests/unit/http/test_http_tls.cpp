// HttpServer and HttpClient over TLS, with self-signed certificates made for each test:
// round trips and streams over https, the client refusing what it cannot verify (unknown CA,
// a certificate for another host), plain HTTP on the TLS port answered with a reason, an https
// client on a plain port, stalled handshakes cut without starving others, bad key files.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "http/http_client.hpp"
#include "http/http_transport.hpp"
#include "support/scratch_dir.hpp"
#include "support/tls_cert.hpp"
#include "swarm/errors.hpp"

namespace swarm {
namespace {

using namespace std::chrono_literals;
using testing::make_self_signed;
using testing::ScratchDir;
using testing::TlsFiles;

HttpHandler echo_handler() {
  return [](HttpRequest&& req, std::shared_ptr<ResponseSink> sink) {
    if (req.path == "/stream") {
      sink->start_stream(200, "text/event-stream");
      for (int i = 0; i < 5; ++i) sink->write("data: " + std::to_string(i) + "\n\n");
      sink->end_stream();
      return;
    }
    HttpResponse r;
    r.body = req.method + " " + req.target + " " + (req.secure ? "secure" : "plain") + " " + req.body;
    sink->respond(std::move(r));
  };
}

// A plain TCP connection: sends bytes and reads until the peer closes or `timeout` passes.
std::string raw_exchange(uint16_t port, const std::string& send, std::chrono::milliseconds timeout,
                         bool* closed) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  *closed = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return got;
  }
  if (!send.empty()) (void)::send(fd, send.data(), send.size(), MSG_NOSIGNAL);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= 0ms) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      *closed = true;
      break;
    }
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

class HttpTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("SWARM_CA_FILE");
    files_ = make_self_signed(dir_.path(), "server", "localhost", "DNS:localhost,IP:127.0.0.1");
  }
  void TearDown() override {
    if (server_) server_->stop(500);
  }
  void start(HttpServerOptions o) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o, echo_handler());
    server_->start();
  }
  void start_tls(int header_timeout = 10) {
    HttpServerOptions o;
    o.tls_cert_file = files_.cert;
    o.tls_key_file = files_.key;
    o.header_timeout_seconds = header_timeout;
    start(o);
    ASSERT_TRUE(server_->tls());
  }
  std::string https_url(const std::string& host = "127.0.0.1") const {
    return "https://" + host + ":" + std::to_string(server_->port());
  }

  ScratchDir dir_{"swarm-tls"};
  TlsFiles files_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpTlsTest, RoundTripsAndStreamsOverHttpsWithTheCertificateAsCa) {
  start_tls();
  HttpClient client(https_url(), 5s, files_.cert);
  for (int i = 0; i < 3; ++i) {  // keep-alive: the same TLS session carries every request
    auto r = client.request("POST", "/echo?i=" + std::to_string(i), "body" + std::to_string(i));
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(r.body, "POST /echo?i=" + std::to_string(i) + " secure body" + std::to_string(i));
  }
  std::string streamed;
  auto r = client.request_stream("GET", "/stream", "", {}, [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(streamed, "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: 3\n\ndata: 4\n\n");
  // By name too: the certificate names localhost.
  HttpClient by_name(https_url("localhost"), 5s, files_.cert);
  EXPECT_EQ(by_name.request("GET", "/x").body, "GET /x secure ");
}

TEST_F(HttpTlsTest, TheCaFileMayComeFromTheEnvironment) {
  start_tls();
  setenv("SWARM_CA_FILE", files_.cert.c_str(), 1);
  HttpClient client(https_url(), 5s);
  EXPECT_EQ(client.request("GET", "/env").status, 200);
  unsetenv("SWARM_CA_FILE");
}

TEST_F(HttpTlsTest, AnUntrustedCertificateIsRefusedWithTheReason) {
  start_tls();
  HttpClient client(https_url(), 5s);  // the system's CAs only: a self-signed certificate is not among them
  try {
    client.request("GET", "/x");
    FAIL() << "an unverified server was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("not trusted"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("self-signed"), std::string::npos) << e.what();
  }
  // Another certificate as CA does not vouch for this one.
  auto other = make_self_signed(dir_.path(), "other", "localhost", "DNS:localhost,IP:127.0.0.1");
  HttpClient wrong_ca(https_url(), 5s, other.cert);
  EXPECT_THROW(wrong_ca.request("GET", "/x"), TransportError);
}

TEST_F(HttpTlsTest, ACertificateForAnotherHostIsRefused) {
  files_ = make_self_signed(dir_.path(), "elsewhere", "example.org", "DNS:example.org");
  start_tls();
  HttpClient client(https_url(), 5s, files_.cert);  // trusted, but not issued for 127.0.0.1
  try {
    client.request("GET", "/x");
    FAIL() << "a certificate for another host was accepted";
  } catch (const TransportError& e) {
    // The message names what the certificate is for and what was asked.
    EXPECT_NE(std::string(e.what()).find("not trusted: it is for example.org, not 127.0.0.1"),
              std::string::npos)
        << e.what();
  }
  HttpClient by_name(https_url("localhost"), 5s, files_.cert);
  try {
    by_name.request("GET", "/x");
    FAIL() << "a certificate for another name was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("it is for example.org, not localhost"), std::string::npos)
        << e.what();
  }
  // A certificate for several names lists them, addresses too.
  files_ = make_self_signed(dir_.path(), "several", "trainer.example", "DNS:trainer.example,IP:10.0.0.5");
  server_->stop(500);
  start_tls();
  HttpClient several(https_url(), 5s, files_.cert);
  try {
    several.request("GET", "/x");
    FAIL() << "a certificate for other names was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("it is for trainer.example, 10.0.0.5, not 127.0.0.1"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(HttpTlsTest, PlainHttpOnTheTlsPortGetsA400SayingHttps) {
  start_tls();
  HttpClient plain("http://127.0.0.1:" + std::to_string(server_->port()), 5s);
  auto r = plain.request("GET", "/x");
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("https://"), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("tls_required"), std::string::npos) << r.body;
  // The server still serves TLS clients.
  HttpClient client(https_url(), 5s, files_.cert);
  EXPECT_EQ(client.request("GET", "/x").status, 200);
}

TEST_F(HttpTlsTest, AnHttpsClientOnAPlainServerFailsClearly) {
  start(HttpServerOptions{});
  EXPECT_FALSE(server_->tls());
  HttpClient client(https_url(), 5s, files_.cert);
  try {
    client.request("GET", "/x");
    FAIL() << "TLS over a plain server succeeded";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("TLS handshake failed"), std::string::npos) << e.what();
  }
  HttpClient plain("http://127.0.0.1:" + std::to_string(server_->port()), 5s);
  EXPECT_EQ(plain.request("GET", "/x").body, "GET /x plain ");
}

TEST_F(HttpTlsTest, AStalledHandshakeIsCutAtTheHeaderTimeoutAndOthersAreServed) {
  start_tls(/*header_timeout=*/1);
  std::thread staller([&] {
    bool closed = false;
    auto t0 = std::chrono::steady_clock::now();
    raw_exchange(server_->port(), "", 5s, &closed);  // connects, never says ClientHello
    EXPECT_TRUE(closed);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  });
  std::this_thread::sleep_for(100ms);
  HttpClient client(https_url(), 5s, files_.cert);
  EXPECT_EQ(client.request("GET", "/meanwhile").status, 200);
  staller.join();
}

TEST_F(HttpTlsTest, GarbageInsteadOfAClientHelloClosesTheConnection) {
  start_tls();
  bool closed = false;
  raw_exchange(server_->port(), std::string(300, '\x16') + "garbage", 3s, &closed);
  EXPECT_TRUE(closed);
  HttpClient client(https_url(), 5s, files_.cert);
  EXPECT_EQ(client.request("GET", "/after").status, 200);
}

TEST_F(HttpTlsTest, UnusableCertificateOrKeyFilesFailTheStartWithTheirName) {
  auto expect_start_error = [&](HttpServerOptions o, const std::string& needle) {
    o.host = "127.0.0.1";
    o.port = 0;
    HttpServer server(o, echo_handler());
    try {
      server.start();
      FAIL() << "started with " << o.tls_cert_file << " / " << o.tls_key_file;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  HttpServerOptions o;
  o.tls_cert_file = (dir_.path() / "missing.crt").string();
  o.tls_key_file = files_.key;
  expect_start_error(o, "missing.crt");
  o.tls_cert_file = files_.cert;
  o.tls_key_file = "";
  expect_start_error(o, "--tls-key");
  auto other = make_self_signed(dir_.path(), "other", "localhost", "DNS:localhost");
  o.tls_key_file = other.key;
  expect_start_error(o, "does not belong");
  std::ofstream(dir_.path() / "garbage.key") << "not a key\n";
  o.tls_key_file = (dir_.path() / "garbage.key").string();
  expect_start_error(o, "garbage.key");
}

TEST_F(HttpTlsTest, AnUnreadableCaFileIsAClearClientError) {
  try {
    HttpClient client("https://127.0.0.1:1", 1s, (dir_.path() / "nope.pem").string());
    FAIL() << "a missing CA file was accepted";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.pem"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace swarm
