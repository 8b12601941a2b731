// HttpClient on Boost.Beast. Beast/Asio types and errors never leave this file: every
// failure becomes swarm::TransportError.
//
// Blocking calls with timeouts: Beast's tcp_stream only enforces expiry on asynchronous
// operations, so each step starts an async operation on a private io_context and runs
// that io_context until it completes (the usual Beast pattern for sync-with-timeout).
#include "client/http_client.hpp"

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <optional>
#include <string_view>

#include "swarm/errors.hpp"

namespace swarm {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

template <class Fields>
void copy_headers(const Fields& fields, HttpClientResponse& out) {
  out.headers.clear();
  for (const auto& f : fields)
    out.headers.emplace_back(lower(f.name_string()), std::string(f.value()));
}

}  // namespace

struct HttpClient::Impl {
  Impl(const std::string& base_url, std::chrono::milliseconds t) : stream(ioc), timeout(t) {
    parse_url(base_url);
  }

  void parse_url(const std::string& url) {
    const std::string_view kHttp = "http://";
    std::string_view u = url;
    if (u.substr(0, 8) == "https://")
      throw TransportError("HttpClient: https is not supported (base_url '" + url + "')");
    if (u.substr(0, kHttp.size()) != kHttp)
      throw TransportError("HttpClient: base_url must start with http:// (got '" + url + "')");
    u.remove_prefix(kHttp.size());
    auto slash = u.find('/');
    std::string_view authority = u.substr(0, slash);
    if (slash != std::string_view::npos) {
      prefix = std::string(u.substr(slash));
      while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
    }
    std::string_view port_part;
    if (!authority.empty() && authority.front() == '[') {  // [v6]:port
      auto close = authority.find(']');
      if (close == std::string_view::npos)
        throw TransportError("HttpClient: bad IPv6 address in base_url '" + url + "'");
      host = std::string(authority.substr(1, close - 1));
      auto rest = authority.substr(close + 1);
      if (!rest.empty() && rest.front() == ':') port_part = rest.substr(1);
    } else {
      auto colon = authority.rfind(':');
      host = std::string(authority.substr(0, colon));
      if (colon != std::string_view::npos) port_part = authority.substr(colon + 1);
    }
    if (host.empty()) throw TransportError("HttpClient: no host in base_url '" + url + "'");
    port = port_part.empty() ? "80" : std::string(port_part);
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
        std::stoi(port) > 65535)
      throw TransportError("HttpClient: bad port in base_url '" + url + "'");
    host_header =
        host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
  }

  std::string where() const { return host_header; }

  // Runs one asynchronous operation to completion on the private io_context.
  template <class Start>
  beast::error_code run(Start&& start) {
    beast::error_code result = net::error::would_block;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    ioc.restart();
    ioc.run();
    return result;
  }

  [[noreturn]] void fail(std::string_view what, beast::error_code ec) {
    close();
    if (ec == beast::error::timeout)
      throw TransportError("HTTP " + std::string(what) + " to " + where() + " timed out after " +
                           std::to_string(timeout.count()) + " ms");
    throw TransportError("HTTP " + std::string(what) + " to " + where() +
                         " failed: " + ec.message());
  }

  void connect(Clock::time_point deadline) {
    beast::error_code ec;
    if (endpoints.empty()) {
      auto addr = net::ip::make_address(host, ec);
      if (!ec) {
        endpoints.emplace_back(addr, static_cast<unsigned short>(std::stoi(port)));
      } else {
        tcp::resolver resolver(ioc);
        tcp::resolver::results_type results;
        ec = run([&](auto handler) {
          resolver.async_resolve(
              host, port, [&results, handler](beast::error_code e, tcp::resolver::results_type r) {
                results = std::move(r);
                handler(e);
              });
        });
        if (ec)
          throw TransportError("HTTP cannot resolve host of " + where() + ": " + ec.message());
        for (const auto& r : results) endpoints.push_back(r.endpoint());
      }
    }
    buffer.clear();
    stream.expires_at(deadline);
    ec = run([&](auto handler) {
      stream.async_connect(endpoints,
                           [handler](beast::error_code e, const tcp::endpoint&) { handler(e); });
    });
    if (ec) {
      if (ec != beast::error::timeout) endpoints.clear();  // re-resolve next time
      fail("connect", ec);
    }
    stream.socket().set_option(tcp::no_delay(true), ec);
    connected = true;
  }

  void close() {
    if (!connected && !stream.socket().is_open()) return;
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream.close();
    connected = false;
    buffer.clear();
  }

  http::request<http::string_body> make_request(
      const std::string& method, const std::string& path, const std::string& body,
      const std::vector<std::pair<std::string, std::string>>& extra,
      const std::string& content_type) {
    http::request<http::string_body> req;
    auto verb = http::string_to_verb(method);
    if (verb == http::verb::unknown)
      req.method_string(method);
    else
      req.method(verb);
    std::string target = prefix;
    if (path.empty() || path.front() != '/') target += '/';
    target += path;
    req.target(target);
    req.version(11);
    req.set(http::field::host, host_header);
    req.set(http::field::user_agent, "swarm-client");
    if (!body.empty() || verb == http::verb::post || verb == http::verb::put ||
        verb == http::verb::patch)
      req.set(http::field::content_type, content_type);
    for (const auto& [k, v] : extra) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    return req;
  }

  // Connects if needed and writes the request. Returns whether the connection was reused.
  bool send(http::request<http::string_body>& req, Clock::time_point deadline, bool& retry) {
    bool reused = connected;
    if (!connected) connect(deadline);
    stream.expires_at(deadline);
    auto ec = run([&](auto handler) { http::async_write(stream, req, handler); });
    if (ec) {
      if (reused && ec != beast::error::timeout) {
        close();
        retry = true;
        return reused;
      }
      fail("request", ec);
    }
    return reused;
  }

  net::io_context ioc;
  beast::tcp_stream stream;
  beast::flat_buffer buffer;
  std::chrono::milliseconds timeout;
  std::string host, port, prefix, host_header;
  std::vector<tcp::endpoint> endpoints;
  bool connected = false;
};

HttpClient::HttpClient(const std::string& base_url, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>(base_url, timeout)) {}
HttpClient::~HttpClient() = default;
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;

HttpClientResponse HttpClient::request(
    const std::string& method, const std::string& path, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& extra_headers,
    const std::string& content_type) {
  Impl& m = *impl_;
  auto req = m.make_request(method, path, body, extra_headers, content_type);
  for (int attempt = 0;; ++attempt) {
    const auto deadline = Clock::now() + m.timeout;
    bool retry = false;
    bool reused = m.send(req, deadline, retry);
    if (retry && attempt == 0) continue;
    if (retry) m.fail("request", net::error::connection_reset);

    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);
    if (req.method() == http::verb::head) parser.skip(true);
    m.stream.expires_at(deadline);
    auto ec = m.run([&](auto handler) { http::async_read(m.stream, m.buffer, parser, handler); });
    if (ec) {
      // A kept-alive connection the server had already closed: nothing was processed,
      // so one retry on a fresh connection is safe.
      if (reused && attempt == 0 && !parser.got_some() && ec != beast::error::timeout) {
        m.close();
        continue;
      }
      m.fail("request", ec);
    }
    auto& msg = parser.get();
    HttpClientResponse out;
    out.status = static_cast<int>(msg.result_int());
    copy_headers(msg, out);
    out.body = std::move(msg.body());
    if (!parser.keep_alive()) m.close();
    return out;
  }
}

HttpClientResponse HttpClient::request_stream(
    const std::string& method, const std::string& path, const std::string& body,
    const std::vector<std::pair<std::string, std::string>>& extra_headers,
    const std::function<bool(std::string_view)>& on_data, const std::string& content_type) {
  Impl& m = *impl_;
  auto req = m.make_request(method, path, body, extra_headers, content_type);
  for (int attempt = 0;; ++attempt) {
    auto deadline = Clock::now() + m.timeout;
    bool retry = false;
    bool reused = m.send(req, deadline, retry);
    if (retry && attempt == 0) continue;
    if (retry) m.fail("request", net::error::connection_reset);

    http::response_parser<http::buffer_body> parser;
    parser.body_limit(boost::none);
    if (req.method() == http::verb::head) parser.skip(true);
    m.stream.expires_at(deadline);
    auto ec =
        m.run([&](auto handler) { http::async_read_header(m.stream, m.buffer, parser, handler); });
    if (ec) {
      if (reused && attempt == 0 && !parser.got_some() && ec != beast::error::timeout) {
        m.close();
        continue;
      }
      m.fail("request", ec);
    }
    HttpClientResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    copy_headers(parser.get(), out);

    char piece[16 * 1024];
    while (!parser.is_done()) {
      parser.get().body().data = piece;
      parser.get().body().size = sizeof piece;
      // Once the body flows the timeout is an inactivity limit: a long stream is fine
      // as long as pieces keep arriving.
      m.stream.expires_after(m.timeout);
      ec = m.run([&](auto handler) { http::async_read_some(m.stream, m.buffer, parser, handler); });
      if (ec == http::error::need_buffer) ec = {};
      if (ec) m.fail("streaming read", ec);
      const size_t n = sizeof piece - parser.get().body().size;
      if (n > 0 && !on_data(std::string_view(piece, n))) {
        m.close();
        return out;
      }
    }
    if (!parser.keep_alive()) m.close();
    return out;
  }
}

void HttpClient::set_timeout(std::chrono::milliseconds timeout) { impl_->timeout = timeout; }
const std::string& HttpClient::host() const { return impl_->host; }
const std::string& HttpClient::port() const { return impl_->port; }
void HttpClient::close() { impl_->close(); }

}  // namespace swarm
