// Minimal asynchronous Beast server, modelled on Beast's http_server_async example.
#include "bare_beast.hpp"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace swarm::bench {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr const char* kBody = R"({"object":"ok","value":1})";

class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(tcp::socket socket) : stream_(std::move(socket)) {
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);
  }

  void run() {
    net::dispatch(stream_.get_executor(), beast::bind_front_handler(&Session::do_read, shared_from_this()));
  }

 private:
  void do_read() {
    req_ = {};
    stream_.expires_after(std::chrono::seconds(60));
    http::async_read(stream_, buffer_, req_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, std::size_t) {
    if (ec) return close();
    res_ = {};
    res_.result(http::status::ok);
    res_.version(req_.version());
    res_.set(http::field::server, "bare-beast");
    res_.set(http::field::content_type, "application/json");
    res_.keep_alive(req_.keep_alive());
    res_.body() = kBody;
    res_.prepare_payload();
    http::async_write(stream_, res_, beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, std::size_t) {
    if (ec || !res_.keep_alive()) return close();
    do_read();
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> req_;
  http::response<http::string_body> res_;
};

}  // namespace

struct BareBeastServer::Impl {
  Impl(std::string h, uint16_t p, int n)
      : host(std::move(h)),
        requested_port(p),
        threads_n(n < 1 ? 1 : n),
        ioc(std::make_unique<net::io_context>(threads_n)),
        acceptor(std::make_unique<tcp::acceptor>(net::make_strand(*ioc))) {}

  void do_accept() {
    acceptor->async_accept(net::make_strand(*ioc), [this](beast::error_code ec, tcp::socket s) {
      if (!acceptor->is_open()) return;
      if (!ec) std::make_shared<Session>(std::move(s))->run();
      do_accept();
    });
  }

  std::string host;
  uint16_t requested_port;
  int threads_n;
  std::unique_ptr<net::io_context> ioc;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::vector<std::thread> threads;
  uint16_t bound_port = 0;
  bool started = false;
  bool running = false;
};

BareBeastServer::BareBeastServer(std::string host, uint16_t port, int io_threads)
    : impl_(std::make_unique<Impl>(std::move(host), port, io_threads)) {}

BareBeastServer::~BareBeastServer() { stop(); }

void BareBeastServer::start() {
  Impl& m = *impl_;
  if (m.started) throw std::logic_error("BareBeastServer::start: already started");
  beast::error_code ec;
  tcp::endpoint ep(net::ip::make_address(m.host, ec), m.requested_port);
  if (!ec) m.acceptor->open(ep.protocol(), ec);
  if (!ec) m.acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) m.acceptor->bind(ep, ec);
  if (!ec) m.acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec)
    throw std::runtime_error("BareBeastServer: cannot listen on " + m.host + ":" +
                             std::to_string(m.requested_port) + ": " + ec.message());
  m.bound_port = m.acceptor->local_endpoint().port();
  m.started = m.running = true;
  m.do_accept();
  for (int i = 0; i < m.threads_n; ++i) m.threads.emplace_back([&m] { m.ioc->run(); });
}

uint16_t BareBeastServer::port() const { return impl_->bound_port; }

void BareBeastServer::stop() {
  Impl& m = *impl_;
  if (!m.running) return;
  m.running = false;
  m.ioc->stop();
  for (auto& t : m.threads) t.join();
  m.threads.clear();
  // Destroying the io_context destroys the pending handlers, hence every session and
  // its socket: clients see their connections close.
  m.acceptor.reset();
  m.ioc.reset();
}

}  // namespace swarm::bench
