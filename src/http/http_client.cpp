// HttpClient on Boost.Beast. Beast/Asio types and errors never leave this file: every
// failure becomes swarm::TransportError.
//
// Blocking calls with timeouts: Beast's tcp_stream only enforces expiry on asynchronous
// operations, so each step starts an async operation on a private io_context and runs
// that io_context until it completes (the usual Beast pattern for sync-with-timeout).
//
// https:// URLs: the same code over an ssl_stream (with_stream() picks the stream, tcp() is
// the TCP layer under it). The server's certificate must chain to a trusted CA (the system's,
// plus ca_file / $SWARM_CA_FILE) and name the host of the URL; anything else fails the
// handshake with the reason.
#include "http/http_client.hpp"
#include "common/env.hpp"

#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "swarm/errors.hpp"

namespace swarm {

namespace {

// The names a server certificate is issued for: its subjectAltName DNS names and IP addresses,
// else its subject's common name ("a, b, 10.0.0.5"; "(no names)" when it has none).
std::string certificate_names(X509* cert) {
  std::vector<std::string> names;
  auto* sans = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; sans && i < sk_GENERAL_NAME_num(sans) && names.size() < 8; ++i) {
    const GENERAL_NAME* g = sk_GENERAL_NAME_value(sans, i);
    if (g->type == GEN_DNS) {
      const ASN1_STRING* s = g->d.dNSName;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)), ASN1_STRING_length(s));
    } else if (g->type == GEN_IPADD) {
      const ASN1_OCTET_STRING* ip = g->d.iPAddress;
      const unsigned char* b = ASN1_STRING_get0_data(ip);
      if (ASN1_STRING_length(ip) == 4) {
        names.push_back(
            boost::asio::ip::make_address_v4(boost::asio::ip::address_v4::bytes_type{b[0], b[1], b[2], b[3]})
                .to_string());
      } else if (ASN1_STRING_length(ip) == 16) {
        boost::asio::ip::address_v6::bytes_type v6{};
        std::copy(b, b + 16, v6.begin());
        names.push_back(boost::asio::ip::make_address_v6(v6).to_string());
      }
    }
  }
  GENERAL_NAMES_free(sans);
  if (names.empty()) {
    char cn[256] = {};
    if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn) > 0)
      names.emplace_back(cn);
  }
  if (names.empty()) return "(no names)";
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

// One client TLS context per CA file, shared by every connection (loading the system's CAs
// costs milliseconds; an SSL_CTX may be shared across threads once set up).
std::shared_ptr<net::ssl::context> client_tls_context(const std::string& ca_file) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<net::ssl::context>> cache;
  std::lock_guard lk(mu);
  auto& slot = cache[ca_file];
  if (slot) return slot;
  auto ctx = std::make_shared<net::ssl::context>(net::ssl::context::tls_client);
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                   net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 |
                   net::ssl::context::no_compression);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  beast::error_code ec;
  ctx->set_default_verify_paths(ec);  // the system's CAs (and $SSL_CERT_FILE / $SSL_CERT_DIR)
  if (!ca_file.empty()) {
    ctx->load_verify_file(ca_file, ec);
    if (ec)
      throw TransportError("HttpClient: cannot load the CA file '" + ca_file +
                           "' (PEM certificates expected): " + ec.message());
  }
  ctx->set_verify_mode(net::ssl::verify_peer);
  slot = std::move(ctx);
  return slot;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

template <class Fields>
void copy_headers(const Fields& fields, HttpClientResponse& out) {
  out.headers.clear();
  for (const auto& f : fields) out.headers.emplace_back(lower(f.name_string()), std::string(f.value()));
}

}  // namespace

struct HttpClient::Impl {
  Impl(const std::string& base_url, std::chrono::milliseconds t, std::string ca) : stream(ioc), timeout(t) {
    parse_url(base_url);
    if (secure) {
      if (ca.empty())
        if (auto v = env_value("SWARM_CA_FILE")) ca = *v;
      tls_ctx = client_tls_context(ca);
    }
  }

  void parse_url(const std::string& url) {
    std::string_view u = url;
    if (u.substr(0, 8) == "https://") {
      secure = true;
      u.remove_prefix(8);
    } else if (u.substr(0, 7) == "http://") {
      u.remove_prefix(7);
    } else {
      throw TransportError("HttpClient: base_url must start with http:// or https:// (got '" + url + "')");
    }
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
    port = port_part.empty() ? (secure ? "443" : "80") : std::string(port_part);
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5 ||
        std::stoi(port) > 65535)
      throw TransportError("HttpClient: bad port in base_url '" + url + "'");
    host_header = host.find(':') != std::string::npos ? "[" + host + "]:" + port : host + ":" + port;
  }

  std::string where() const { return host_header; }

  // The stream requests travel on (TLS for https://), and the TCP layer under it.
  template <class F>
  beast::error_code with_stream(F&& f) {
    return tls ? f(*tls) : f(stream);
  }
  beast::tcp_stream& tcp() { return tls ? beast::get_lowest_layer(*tls) : stream; }

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
    throw TransportError("HTTP " + std::string(what) + " to " + where() + " failed: " + ec.message());
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
          resolver.async_resolve(host, port,
                                 [&results, handler](beast::error_code e, tcp::resolver::results_type r) {
                                   results = std::move(r);
                                   handler(e);
                                 });
        });
        if (ec) throw TransportError("HTTP cannot resolve host of " + where() + ": " + ec.message());
        for (const auto& r : results) endpoints.push_back(r.endpoint());
      }
    }
    buffer.clear();
    if (secure) tls = std::make_unique<TlsStream>(ioc, *tls_ctx);  // an SSL session is not reusable
    tcp().expires_at(deadline);
    ec = run([&](auto handler) {
      tcp().async_connect(endpoints, [handler](beast::error_code e, const tcp::endpoint&) { handler(e); });
    });
    if (ec) {
      if (ec != beast::error::timeout) endpoints.clear();  // re-resolve next time
      fail("connect", ec);
    }
    tcp().socket().set_option(tcp::no_delay(true), ec);
    if (tls) handshake();
    connected = true;
  }

  // TLS: SNI with the host name, the certificate checked against the CAs and the URL's host.
  void handshake() {
    beast::error_code ec;
    const bool by_address = (net::ip::make_address(host, ec), !ec);
    if (!by_address) SSL_set_tlsext_host_name(tls->native_handle(), host.c_str());
    std::string issued_for;  // the certificate's names, when they are not the URL's host
    tls->set_verify_callback([&](bool preverified, net::ssl::verify_context& vc) {
      X509_STORE_CTX* store = vc.native_handle();
      if (!preverified || X509_STORE_CTX_get_error_depth(store) > 0) return preverified;
      X509* cert = X509_STORE_CTX_get_current_cert(store);
      const bool matches = by_address ? X509_check_ip_asc(cert, host.c_str(), 0) == 1
                                      : X509_check_host(cert, host.data(), host.size(), 0, nullptr) == 1;
      if (!matches) {
        issued_for = certificate_names(cert);
        X509_STORE_CTX_set_error(store,
                                 by_address ? X509_V_ERR_IP_ADDRESS_MISMATCH : X509_V_ERR_HOSTNAME_MISMATCH);
      }
      return matches;
    });
    ec = run([&](auto handler) { tls->async_handshake(net::ssl::stream_base::client, handler); });
    if (!ec) return;
    const long verify = SSL_get_verify_result(tls->native_handle());
    if (verify != X509_V_OK) {
      close();
      if (!issued_for.empty())
        throw TransportError("HTTPS " + where() + ": the server's certificate is not trusted: it is for " +
                             issued_for + ", not " + host +
                             " (connect by one of those names, or issue the certificate with " +
                             (by_address ? "IP:" : "DNS:") + host + " in its subjectAltName)");
      throw TransportError(
          "HTTPS " + where() +
          ": the server's certificate is not trusted: " + X509_verify_cert_error_string(verify) +
          " (give its CA with ca_file / $SWARM_CA_FILE, and connect by a name it was issued for)");
    }
    if (ec == beast::error::timeout) fail("TLS handshake", ec);
    close();
    throw TransportError("HTTPS " + where() + ": TLS handshake failed: " + ec.message() +
                         " (is the server serving TLS? a plain server needs an http:// URL)");
  }

  void close() {
    if (!connected && !tcp().socket().is_open()) return;
    beast::error_code ec;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
    tcp().close();
    connected = false;
    buffer.clear();
  }

  http::request<http::string_body> make_request(const std::string& method, const std::string& path,
                                                const std::string& body,
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
    if (!body.empty() || verb == http::verb::post || verb == http::verb::put || verb == http::verb::patch)
      req.set(http::field::content_type, content_type);
    for (const auto& [k, v] : extra) req.set(k, v);
    req.body() = body;
    req.prepare_payload();
    return req;
  }

  // Whether a kept-alive connection is still open for a new request: the peer has neither
  // closed it (end of stream) nor sent anything unasked (a TLS close_notify, an error page).
  // One non-blocking peek; no bytes are consumed.
  bool still_open() {
    if (buffer.size() > 0) return false;
    char byte;
    const ssize_t n = ::recv(tcp().socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }

  // Connects if needed and writes the request. Returns whether the connection was reused.
  bool send(http::request<http::string_body>& req, Clock::time_point deadline, bool& retry) {
    // A connection the server closed while idle is replaced before the request goes out: after
    // it has gone out, only an idempotent request may be sent again (see request()).
    if (connected && !still_open()) close();
    bool reused = connected;
    if (!connected) connect(deadline);
    tcp().expires_at(deadline);
    auto ec =
        with_stream([&](auto& s) { return run([&](auto handler) { http::async_write(s, req, handler); }); });
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
  beast::tcp_stream stream;        // plain http://
  std::unique_ptr<TlsStream> tls;  // https://: one per connection
  std::shared_ptr<net::ssl::context> tls_ctx;
  bool secure = false;
  beast::flat_buffer buffer;
  std::chrono::milliseconds timeout;
  std::string host, port, prefix, host_header;
  std::vector<tcp::endpoint> endpoints;
  bool connected = false;
};

namespace {
// RFC 9110 9.2.2: a request that may be repeated with the same effect.
bool idempotent(const http::request<http::string_body>& req) {
  switch (req.method()) {
    case http::verb::get:
    case http::verb::head:
    case http::verb::put:
    case http::verb::delete_:
    case http::verb::options:
    case http::verb::trace:
      return true;
    default:
      return false;
  }
}
}  // namespace

HttpClient::HttpClient(const std::string& base_url, std::chrono::milliseconds timeout,
                       const std::string& ca_file)
    : impl_(std::make_unique<Impl>(base_url, timeout, ca_file)) {}
HttpClient::~HttpClient() = default;
HttpClient::HttpClient(HttpClient&&) noexcept = default;
HttpClient& HttpClient::operator=(HttpClient&&) noexcept = default;

HttpClientResponse HttpClient::request(const std::string& method, const std::string& path,
                                       const std::string& body,
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
    m.tcp().expires_at(deadline);
    auto ec = m.with_stream([&](auto& s) {
      return m.run([&](auto handler) { http::async_read(s, m.buffer, parser, handler); });
    });
    if (ec) {
      // A kept-alive connection that closed with no answer: the server may have closed it
      // while idle (nothing processed) or failed after processing the request, so only an
      // idempotent request is sent again, once, on a fresh connection. A POST is not: its
      // caller decides (the SDK retries the routes the server answers idempotently).
      if (reused && attempt == 0 && !parser.got_some() && ec != beast::error::timeout && idempotent(req)) {
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
    m.tcp().expires_at(deadline);
    auto ec = m.with_stream([&](auto& s) {
      return m.run([&](auto handler) { http::async_read_header(s, m.buffer, parser, handler); });
    });
    if (ec) {
      if (reused && attempt == 0 && !parser.got_some() && ec != beast::error::timeout && idempotent(req)) {
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
      m.tcp().expires_after(m.timeout);
      ec = m.with_stream([&](auto& s) {
        return m.run([&](auto handler) { http::async_read_some(s, m.buffer, parser, handler); });
      });
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
