// HttpServer on Boost.Beast. Beast/Asio types never leave this file.
//
// Shape: one io_context run by `io_threads` threads; every connection owns a strand,
// and everything that touches a connection (reads, writes, the idle timer, answers
// coming from a ResponseSink on another thread) runs on that strand, so a connection
// needs no mutex. Requests are read ahead (bounded pipelining); each one gets a Slot
// in a FIFO. Answers fill their slot in any order; the writer only ever drains the
// head slot, so answers go out strictly in request order and never interleave.
// Answers are serialized to bytes when they arrive (status line, headers, body or
// chunk framing), which lets one write carry several pipelined answers or stream
// chunks that queued up while the previous write was in flight.
//
// TLS (options.tls_cert_file): the same connection code runs over an ssl_stream; every
// operation goes through with_stream() (the TLS stream, else the plain one) and tcp() (the
// TCP layer under it, for deadlines and closing). A TLS handshake has header_timeout to finish.
#include "http/http_transport.hpp"
#include "http/http_error.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <sys/resource.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/bind_handler.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/error.hpp"

namespace swarm {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Strand = net::strand<net::io_context::executor_type>;
using Clock = std::chrono::steady_clock;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;

constexpr std::uint32_t kHeaderLimit = 64 * 1024;
// After an error answer that closes the connection we keep reading (and discarding)
// for at most this long, so the peer's unread request bytes do not turn our close into
// a RST that destroys the answer before the peer reads it.
constexpr auto kLingerLimit = std::chrono::seconds(2);

// The server whose I/O thread this is: stop() there would join the calling thread.
thread_local const void* t_io_thread_of = nullptr;

// Transport-level errors (413, 431, malformed HTTP, too many connections) come before routing:
// they carry every API's error fields (http_error.hpp, ErrorStyle::ANY).
HttpResponse transport_error(int status, std::string_view message, ErrorKind kind, std::string_view code) {
  return error_response(ErrorStyle::ANY, status, error_type_for(kind), std::string(message),
                        std::string(code));
}

bool has_crlf(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = static_cast<char>(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = static_cast<char>(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

// Framing headers are owned by the transport; a handler cannot override them.
bool reserved_header(std::string_view name) {
  return iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
         iequals(name, "connection") || iequals(name, "server") || iequals(name, "content-type");
}

void append_number(std::string& out, std::uint64_t v, int base = 10) {
  char buf[24];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, base);
  (void)ec;
  out.append(buf, end);
}

struct Head {
  unsigned version = 11;
  int status = 200;
  std::string_view content_type;
  const std::vector<std::pair<std::string, std::string>>* extra = nullptr;
  bool keep_alive = true;
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
  bool no_cache = false;
};

// Status line and headers. Connection handling follows Beast's keep_alive() rules:
// HTTP/1.1 is persistent unless "Connection: close"; HTTP/1.0 only with "keep-alive".
void append_head(std::string& out, const Head& h) {
  out += h.version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  append_number(out, static_cast<std::uint64_t>(h.status));
  out += ' ';
  std::string_view reason = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(h.status)));
  if (reason.empty() || reason.front() == '<') reason = "Unknown";
  out += reason;
  out += "\r\nServer: swarm\r\n";
  if (!h.content_type.empty() && !has_crlf(h.content_type)) {
    out += "Content-Type: ";
    out += h.content_type;
    out += "\r\n";
  }
  if (h.content_length) {
    out += "Content-Length: ";
    append_number(out, *h.content_length);
    out += "\r\n";
  }
  if (h.chunked) out += "Transfer-Encoding: chunked\r\n";
  if (h.no_cache) out += "Cache-Control: no-cache\r\n";
  if (!h.keep_alive)
    out += "Connection: close\r\n";
  else if (h.version == 10)
    out += "Connection: keep-alive\r\n";
  if (h.extra) {
    for (const auto& [k, v] : *h.extra) {
      if (k.empty() || reserved_header(k) || has_crlf(k) || has_crlf(v)) continue;
      out += k;
      out += ": ";
      out += v;
      out += "\r\n";
    }
  }
  out += "\r\n";
}

class Connection;

// State shared by the server, its connections and their sinks. Connections hold a
// shared_ptr to it, so the io_context outlives every socket even when a sink kept by
// another thread outlives the HttpServer.
struct Core {
  Core(HttpServerOptions o, HttpHandler h)
      : options(std::move(o)), handler(std::move(h)), ioc(std::max(1, options.io_threads)) {}

  HttpServerOptions options;
  HttpHandler handler;
  net::io_context ioc;
  std::chrono::seconds read_timeout{std::max(1, options.read_timeout_seconds)};
  std::chrono::seconds header_timeout{
      std::max(1, std::min(options.header_timeout_seconds, options.read_timeout_seconds))};
  size_t max_pipelined = static_cast<size_t>(std::max(1, options.max_pipelined));
  size_t max_connections = static_cast<size_t>(std::max(1, options.max_connections));
  std::atomic<std::uint64_t> refused_connections{0};
  std::atomic<std::uint64_t> failed_handshakes{0};
  std::unique_ptr<net::ssl::context> tls;  // set by HttpServer::start when TLS is on

  // Open connections, for stop(). Touched once per connection, not per request.
  std::mutex reg_mu;
  std::condition_variable reg_cv;
  std::unordered_map<Connection*, std::weak_ptr<Connection>> connections;

  // Guards posting from non-I/O threads: after stop() no handler may be queued any more
  // (a queued handler owning a Connection would keep the io_context alive forever).
  std::mutex post_mu;
  bool posts_open = true;

  std::atomic<bool> draining{false};
  std::atomic<std::uint64_t> error_ref{0};

  void add(Connection* c, std::weak_ptr<Connection> w) {
    std::lock_guard lk(reg_mu);
    connections.emplace(c, std::move(w));
  }
  void remove(Connection* c) {
    std::lock_guard lk(reg_mu);
    connections.erase(c);
    if (connections.empty()) reg_cv.notify_all();
  }
  size_t open_connections() {
    std::lock_guard lk(reg_mu);
    return connections.size();
  }
  std::vector<std::shared_ptr<Connection>> snapshot() {
    std::vector<std::shared_ptr<Connection>> out;
    std::lock_guard lk(reg_mu);
    out.reserve(connections.size());
    for (auto& [p, w] : connections)
      if (auto s = w.lock()) out.push_back(std::move(s));
    return out;
  }
  template <class F>
  void post_guarded(const Strand& strand, F&& f) {
    std::lock_guard lk(post_mu);
    if (posts_open) net::post(strand, std::forward<F>(f));
  }
};

// One request's place in the connection's answer queue.
struct Slot {
  std::uint64_t id = 0;
  unsigned version = 11;
  bool keep_alive = true;  // false: close the connection after this answer
  bool head_only = false;  // HEAD request: headers only
  bool started = false;    // an answer (full or stream head) has been serialized
  bool chunked = false;    // streaming with chunked framing (HTTP/1.1)
  bool done = false;       // every byte of the answer is in `out` (or was written)
  std::string out;         // serialized bytes not yet handed to the writer
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Core> core, tcp::socket socket, Strand strand)
      : core_(std::move(core)),
        strand_(std::move(strand)),
        plain_(core_->tls ? beast::tcp_stream(strand_) : beast::tcp_stream(std::move(socket))),
        timer_(strand_) {
    // The socket went to plain_ above only without TLS; with TLS it is still here.
    // NOLINTNEXTLINE(bugprone-use-after-move)
    if (core_->tls) tls_ = std::make_unique<TlsStream>(std::move(socket), *core_->tls);
    beast::error_code ec;
    auto ep = tcp().socket().remote_endpoint(ec);
    if (!ec) remote_address_ = ep.address().to_string();
    tcp().socket().set_option(tcp::no_delay(true), ec);
  }

  ~Connection() {
    if (!closed_) core_->remove(this);  // defensive: every path should have closed
  }

  // Everything below runs on strand_ unless said otherwise.

  void start() {
    core_->add(this, weak_from_this());
    net::dispatch(strand_, [self = shared_from_this()] {
      if (self->core_->draining.load()) {
        self->close();
        return;
      }
      if (self->tls_) return self->handshake();
      self->maybe_read();
    });
  }

  // Any thread: runs `f` on the strand (inline when already there).
  template <class F>
  void run_on_strand(F&& f) {
    if (strand_.running_in_this_thread())
      f();
    else
      core_->post_guarded(strand_, std::forward<F>(f));
  }

  bool connected() const { return connected_.load(std::memory_order_acquire); }
  const Strand& strand() const { return strand_; }

  void on_respond(std::uint64_t id, HttpResponse& r) {
    Slot* s = find_slot(id);
    if (!s || s->started) return;
    s->started = true;
    int status = (r.status >= 100 && r.status <= 999) ? r.status : 500;
    bool no_body = s->head_only || status < 200 || status == 204 || status == 304;
    if (core_->draining.load(std::memory_order_relaxed)) s->keep_alive = false;
    Head h;
    h.version = s->version;
    h.status = status;
    h.content_type = r.content_type;
    h.extra = &r.headers;
    h.keep_alive = s->keep_alive;
    if (!(status < 200 || status == 204 || status == 304)) h.content_length = r.body.size();
    s->out.reserve(s->out.size() + 160 + (no_body ? 0 : r.body.size()));
    append_head(s->out, h);
    if (!no_body) s->out += r.body;
    s->done = true;
    do_write();
  }

  void on_start_stream(std::uint64_t id, int status, const std::string& content_type) {
    Slot* s = find_slot(id);
    if (!s || s->started) return;
    s->started = true;
    // HTTP/1.0 has no chunked encoding: the body then ends with the connection.
    s->chunked = s->version >= 11;
    if (!s->chunked || core_->draining.load(std::memory_order_relaxed)) s->keep_alive = false;
    Head h;
    h.version = s->version;
    h.status = (status >= 200 && status <= 999) ? status : 500;
    h.content_type = content_type;
    h.keep_alive = s->keep_alive;
    h.chunked = s->chunked;
    h.no_cache = true;
    append_head(s->out, h);
    do_write();
  }

  void on_chunk(std::uint64_t id, std::string& data) {
    Slot* s = find_slot(id);
    if (!s || !s->started || s->done || data.empty() || s->head_only) return;
    if (s->out.size() + write_buf_.size() + data.size() > core_->options.max_stream_backlog_bytes) {
      // The client stopped reading: drop it rather than buffer without bound. Its handler
      // sees a disconnect (the sink's write() returns false) and cancels the generation.
      spdlog::warn("http: dropping {}: {} bytes of a streamed answer wait for it to read (limit {})",
                   remote_address_, s->out.size() + write_buf_.size() + data.size(),
                   core_->options.max_stream_backlog_bytes);
      close();
      return;
    }
    if (s->chunked) {
      append_number(s->out, data.size(), 16);
      s->out += "\r\n";
      s->out += data;
      s->out += "\r\n";
    } else if (s->out.empty()) {
      s->out.swap(data);
    } else {
      s->out += data;
    }
    do_write();
  }

  // `abort`: the sink died mid-stream; close without the last chunk so the client sees
  // a truncated response instead of a seemingly complete one.
  void on_end_stream(std::uint64_t id, bool abort) {
    Slot* s = find_slot(id);
    if (!s || !s->started || s->done) return;
    if (abort)
      s->keep_alive = false;
    else if (s->chunked && !s->head_only)
      s->out += "0\r\n\r\n";
    s->done = true;
    do_write();
  }

  // stop(): answer what is in flight, read nothing new, close once idle.
  void begin_drain() {
    if (closed_) return;
    if (slots_.empty() && !writing_) close();
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    connected_.store(false, std::memory_order_release);
    beast::error_code ec;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ec);
    tcp().close();
    timer_.cancel();
    slots_.clear();
    core_->remove(this);
  }

 private:
  // The stream requests travel on: TLS when the server has a certificate, else plain TCP.
  template <class F>
  void with_stream(F&& f) {
    if (tls_)
      f(*tls_);
    else
      f(plain_);
  }
  // The TCP layer: deadlines (expires_*), the socket, closing.
  beast::tcp_stream& tcp() { return tls_ ? beast::get_lowest_layer(*tls_) : plain_; }

  void handshake() {
    set_deadline(core_->header_timeout);
    tls_->async_handshake(net::ssl::stream_base::server,
                          beast::bind_front_handler(&Connection::on_handshake, shared_from_this()));
  }

  void on_handshake(beast::error_code ec) {
    deadline_ = Clock::time_point::max();
    if (closed_) return;
    if (!ec) return maybe_read();
    const auto n = ++core_->failed_handshakes;
    // A plain HTTP request on the TLS port: say so in plain HTTP (OpenSSL read the request
    // line and recognised it), so a client configured with http:// gets a reason, not a reset.
    if (ec.category() == net::error::get_ssl_category() &&
        ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == SSL_R_HTTP_REQUEST) {
      spdlog::debug("http: {} sent plain HTTP to the TLS port", remote_address_);
      const std::string body = transport_error(400, "this server speaks HTTPS only: use an https:// URL",
                                               ErrorKind::INVALID_ARGUMENT, "tls_required")
                                   .body;
      plain_reply_ =
          "HTTP/1.1 400 Bad Request\r\nServer: swarm\r\nContent-Type: application/json\r\n"
          "Connection: close\r\nContent-Length: " +
          std::to_string(body.size()) + "\r\n\r\n" + body;
      tcp().expires_after(core_->header_timeout);
      net::async_write(tcp(), net::buffer(plain_reply_),
                       [self = shared_from_this()](beast::error_code, std::size_t) { self->close(); });
      return;
    }
    if (n == 1 || n % 1000 == 0)
      spdlog::info("http: {} TLS handshake(s) failed, the latest from {}: {}", n, remote_address_,
                   ec.message());
    close();
  }

  Slot* find_slot(std::uint64_t id) {
    if (closed_ || slots_.empty() || id < slots_.front().id) return nullptr;
    size_t idx = static_cast<size_t>(id - slots_.front().id);
    return idx < slots_.size() ? &slots_[idx] : nullptr;
  }

  bool idle() const { return slots_.empty() && !writing_; }

  // A request is read in three phases, each with its deadline: waiting for its first byte
  // (an idle keep-alive connection: read_timeout; a new connection: header_timeout), its
  // headers (header_timeout from the first byte: a client trickling headers is cut early),
  // then its body (read_timeout). The deadlines are our own timer (see set_deadline):
  // tcp_stream's expiry cannot be changed while a read is pending, and a read stays pending
  // while a long answer is computed (to notice disconnects and to pipeline).
  void maybe_read() {
    if (closed_ || reading_ || stop_reading_ || core_->draining.load(std::memory_order_relaxed)) return;
    if (slots_.size() >= core_->max_pipelined) return;  // resumed when an answer goes out
    parser_.emplace();
    parser_->body_limit(core_->options.max_body_bytes);
    parser_->header_limit(kHeaderLimit);
    tcp().expires_never();
    reading_ = true;
    if (buffer_.size() > 0) return read_header();  // pipelined bytes already here
    phase_ = Phase::IDLE;
    if (idle()) set_deadline(next_id_ == 1 ? core_->header_timeout : core_->read_timeout);
    with_stream([this](auto& s) {
      s.async_read_some(buffer_.prepare(4096),
                        beast::bind_front_handler(&Connection::on_first_bytes, shared_from_this()));
    });
  }

  void on_first_bytes(beast::error_code ec, std::size_t n) {
    if (closed_) return;
    if (ec) {
      reading_ = false;
      deadline_ = Clock::time_point::max();
      return on_read_error(ec == net::error::eof ? beast::error_code(http::error::end_of_stream) : ec);
    }
    buffer_.commit(n);
    read_header();
  }

  void read_header() {
    phase_ = Phase::HEADER;
    set_deadline(core_->header_timeout);
    with_stream([this](auto& s) {
      http::async_read_header(s, buffer_, *parser_,
                              beast::bind_front_handler(&Connection::on_header, shared_from_this()));
    });
  }

  void on_header(beast::error_code ec, std::size_t) {
    if (closed_) return;
    if (ec) return on_read(ec, 0);
    phase_ = Phase::BODY;
    deadline_ = Clock::time_point::max();
    if (parser_->is_done()) return on_read({}, 0);
    set_deadline(core_->read_timeout);
    // Expect: 100-continue: say "go on" before the body when nothing else is being written
    // (answers to earlier pipelined requests must go first; a client then sends its body
    // after its own short wait, as RFC 9110 lets it).
    const auto expect = parser_->get()[http::field::expect];
    if (parser_->get().version() >= 11 && iequals(expect, "100-continue") && slots_.empty() && !writing_) {
      writing_ = true;
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      with_stream([this](auto& s) {
        net::async_write(s, net::buffer(kContinue.data(), kContinue.size()),
                         [self = shared_from_this()](beast::error_code wec, std::size_t) {
                           self->writing_ = false;
                           if (self->closed_) return;
                           if (wec) return self->close();
                           self->read_body();
                           self->do_write();
                         });
      });
      return;
    }
    read_body();
  }

  void read_body() {
    with_stream([this](auto& s) {
      http::async_read(s, buffer_, *parser_,
                       beast::bind_front_handler(&Connection::on_read, shared_from_this()));
    });
  }

  void on_read(beast::error_code ec, std::size_t) {
    reading_ = false;
    deadline_ = Clock::time_point::max();
    phase_ = Phase::IDLE;
    if (closed_) return;
    if (ec) return on_read_error(ec);

    auto& msg = parser_->get();
    Slot& slot = slots_.emplace_back();
    slot.id = next_id_++;
    slot.version = msg.version() == 10 ? 10 : 11;
    slot.keep_alive = parser_->keep_alive();
    slot.head_only = msg.method() == http::verb::head;
    if (!slot.keep_alive) stop_reading_ = true;
    const std::uint64_t id = slot.id;  // `slot` may move when the handler answers inline

    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    auto q = req.target.find('?');
    req.path = q == std::string::npos ? req.target : req.target.substr(0, q);
    req.headers.reserve(8);
    for (const auto& f : msg) {
      std::string name(f.name_string());
      for (char& c : name)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
      req.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    req.body = std::move(msg.body());
    req.remote_address = remote_address_;
    req.secure = tls_ != nullptr;
    parser_.reset();

    dispatch_request(std::move(req), id);
    maybe_read();
  }

  void dispatch_request(HttpRequest&& req, std::uint64_t id);

  void on_read_error(beast::error_code ec) {
    if (ec == http::error::end_of_stream) {
      // Clean close between requests. Answers still owed are attempted (a half-closed
      // peer may still read them); the close itself counts as a disconnect, which is
      // how ordinary clients abandon a request.
      connected_.store(false, std::memory_order_release);
      stop_reading_ = true;
      if (idle()) close();
      return;
    }
    if (ec == http::error::partial_message ||
        ec.category() != http::make_error_code(http::error::end_of_stream).category()) {
      close();  // reset, EOF inside a request, or our deadline closed the socket
      return;
    }
    // Bad input: answer, then close after the answers queued before it.
    stop_reading_ = true;
    unsigned version = parser_ && parser_->is_header_done() && parser_->get().version() == 10 ? 10 : 11;
    HttpResponse r;
    if (ec == http::error::body_limit) {
      r = transport_error(413,
                          "request body exceeds " + std::to_string(core_->options.max_body_bytes) + " bytes",
                          ErrorKind::PAYLOAD_TOO_LARGE, "payload_too_large");
    } else if (ec == http::error::header_limit) {
      r = transport_error(431, "request headers exceed " + std::to_string(kHeaderLimit) + " bytes",
                          ErrorKind::INVALID_ARGUMENT, "headers_too_large");
    } else {
      r = transport_error(400, "malformed HTTP request: " + ec.message(), ErrorKind::INVALID_ARGUMENT,
                          "bad_request");
    }
    parser_.reset();
    Slot& slot = slots_.emplace_back();
    slot.id = next_id_++;
    slot.version = version;
    slot.keep_alive = false;
    on_respond(slot.id, r);
  }

  // Moves the bytes of the answers at the head of the queue into one write.
  void do_write() {
    if (writing_ || closed_) return;
    while (!slots_.empty()) {
      Slot& s = slots_.front();
      if (!s.out.empty()) {
        if (write_buf_.empty())
          write_buf_.swap(s.out);
        else
          write_buf_ += s.out;
        s.out.clear();
      }
      if (!s.done) break;
      bool keep = s.keep_alive;
      slots_.pop_front();
      if (!keep) {
        close_after_write_ = true;
        slots_.clear();  // nothing after a closing answer is ever sent
        break;
      }
    }
    if (write_buf_.empty()) {
      after_write_idle_check();
      return;
    }
    writing_ = true;
    tcp().expires_after(core_->read_timeout);  // a peer that stops reading is dropped
    with_stream([this](auto& s) {
      net::async_write(s, net::buffer(write_buf_),
                       beast::bind_front_handler(&Connection::on_write, shared_from_this()));
    });
  }

  void on_write(beast::error_code ec, std::size_t) {
    writing_ = false;
    write_buf_.clear();
    if (closed_) return;
    if (ec) {
      close();
      return;
    }
    if (close_after_write_ && slots_.empty()) {
      linger_close();
      return;
    }
    do_write();
  }

  // Called when there is nothing to write: resume reading, arm the idle deadline, or
  // finish a drain / a half-closed connection.
  void after_write_idle_check() {
    if (close_after_write_) return;
    if (slots_.empty()) {
      if (core_->draining.load(std::memory_order_relaxed) || (stop_reading_ && !reading_)) {
        close();
        return;
      }
      if (reading_ && phase_ == Phase::IDLE) set_deadline(core_->read_timeout);
    }
    maybe_read();
  }

  void linger_close() {
    // A pending read means the peer is not in the middle of sending; when stopping we
    // do not wait for the peer either.
    if (reading_ || core_->draining.load(std::memory_order_relaxed)) {
      close();
      return;
    }
    beast::error_code ec;
    tcp().socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      close();
      return;
    }
    deadline_ = Clock::now() + std::min<Clock::duration>(core_->read_timeout, kLingerLimit);
    arm_timer();
    tcp().expires_never();
    linger_read();
  }

  void linger_read() {
    buffer_.consume(buffer_.size());
    with_stream([this](auto& s) {
      s.async_read_some(buffer_.prepare(4096),
                        [self = shared_from_this()](beast::error_code ec, std::size_t) {
                          if (self->closed_) return;
                          if (ec) {
                            self->close();
                            return;
                          }
                          self->linger_read();
                        });
    });
  }

  // The idle / slow-request deadline: runs while a read is pending and no answer is
  // owed. One timer per connection, re-armed lazily, so a busy connection costs no
  // timer operations per request.
  void set_deadline(Clock::duration after) {
    deadline_ = Clock::now() + after;
    arm_timer();
  }

  void arm_timer() {
    if (closed_ || (timer_armed_ && timer_.expiry() <= deadline_)) return;
    timer_armed_ = true;
    timer_.expires_at(deadline_);  // cancels a later wait, if any
    timer_.async_wait(beast::bind_front_handler(&Connection::on_timer, shared_from_this()));
  }

  void on_timer(beast::error_code ec) {
    if (ec == net::error::operation_aborted) return;  // re-armed earlier, or closed
    timer_armed_ = false;
    if (ec || closed_ || deadline_ == Clock::time_point::max()) return;
    if (Clock::now() >= deadline_) {
      close();
      return;
    }
    arm_timer();
  }

  std::shared_ptr<Core> core_;
  Strand strand_;
  beast::tcp_stream plain_;         // the connection's TCP stream, unused (and unopened) with TLS
  std::unique_ptr<TlsStream> tls_;  // the TLS stream over the connection's TCP stream, or null
  std::string plain_reply_;         // the 400 a plain HTTP request on the TLS port gets
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<Slot> slots_;
  std::string write_buf_;
  std::string remote_address_;
  std::uint64_t next_id_ = 1;
  Clock::time_point deadline_ = Clock::time_point::max();
  enum class Phase { IDLE, HEADER, BODY } phase_ = Phase::IDLE;  // of the pending read
  bool reading_ = false;
  bool writing_ = false;
  bool stop_reading_ = false;
  bool close_after_write_ = false;
  bool closed_ = false;
  bool timer_armed_ = false;
  std::atomic<bool> connected_{true};
};

// The handler's way back to its connection. Every call is forwarded to the
// connection's strand; state_ makes "exactly one answer" hold across threads.
class ConnectionSink final : public ResponseSink {
 public:
  ConnectionSink(std::shared_ptr<Connection> conn, std::uint64_t id) : conn_(std::move(conn)), id_(id) {}

  ~ConnectionSink() override {
    int s = state_.load();
    if (s == kNone) {
      conn_->run_on_strand([c = conn_, id = id_] {
        HttpResponse r =
            transport_error(500, "handler did not respond", ErrorKind::INTERNAL, "internal_error");
        c->on_respond(id, r);
      });
    } else if (s == kStreaming) {
      conn_->run_on_strand([c = conn_, id = id_] { c->on_end_stream(id, /*abort=*/true); });
    }
  }

  void respond(HttpResponse response) override {
    int expected = kNone;
    if (!state_.compare_exchange_strong(expected, kDone)) return;  // already answered
    conn_->run_on_strand([c = conn_, id = id_, r = std::move(response)]() mutable { c->on_respond(id, r); });
  }

  void start_stream(int status, const std::string& content_type) override {
    int expected = kNone;
    if (!state_.compare_exchange_strong(expected, kStreaming)) return;
    conn_->run_on_strand(
        [c = conn_, id = id_, status, ct = content_type] { c->on_start_stream(id, status, ct); });
  }

  bool write(std::string chunk) override {
    if (state_.load() != kStreaming || !conn_->connected()) return false;
    conn_->run_on_strand([c = conn_, id = id_, d = std::move(chunk)]() mutable { c->on_chunk(id, d); });
    return true;
  }

  void end_stream() override {
    int expected = kStreaming;
    if (!state_.compare_exchange_strong(expected, kDone)) return;
    conn_->run_on_strand([c = conn_, id = id_] { c->on_end_stream(id, /*abort=*/false); });
  }

  bool client_connected() const override { return conn_->connected(); }

  // Used by the transport when the handler threw: answers only if nothing was sent yet.
  bool answered() const { return state_.load() != kNone; }

 private:
  static constexpr int kNone = 0, kStreaming = 1, kDone = 2;
  std::shared_ptr<Connection> conn_;
  std::uint64_t id_;
  std::atomic<int> state_{kNone};
};

void Connection::dispatch_request(HttpRequest&& req, std::uint64_t id) {
  auto sink = std::make_shared<ConnectionSink>(shared_from_this(), id);
  try {
    core_->handler(std::move(req), sink);
  } catch (const std::exception& e) {
    auto ref = ++core_->error_ref;
    spdlog::error("http handler threw (ref {}): {}", ref, e.what());
    sink->respond(transport_error(500, "internal server error (ref " + std::to_string(ref) + ")",
                                  ErrorKind::INTERNAL, "internal_error"));
  } catch (...) {
    auto ref = ++core_->error_ref;
    spdlog::error("http handler threw a non-std exception (ref {})", ref);
    sink->respond(transport_error(500, "internal server error (ref " + std::to_string(ref) + ")",
                                  ErrorKind::INTERNAL, "internal_error"));
  }
}

// The server's TLS settings: TLS 1.2 or newer, the certificate chain and its key, checked to
// belong together. Every failure is a std::runtime_error naming the file and OpenSSL's reason.
std::unique_ptr<net::ssl::context> load_tls_context(const std::string& cert_file,
                                                    const std::string& key_file) {
  if (cert_file.empty() || key_file.empty())
    throw std::runtime_error("TLS needs both a certificate (--tls-cert) and its private key (--tls-key)");
  auto ctx = std::make_unique<net::ssl::context>(net::ssl::context::tls_server);
  ctx->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                   net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1 |
                   net::ssl::context::no_compression);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  // A key with a passphrase would make OpenSSL prompt on the terminal: refuse instead.
  ctx->set_password_callback(
      [](std::size_t, net::ssl::context::password_purpose) -> std::string { return {}; });
  beast::error_code ec;
  ctx->use_certificate_chain_file(cert_file, ec);
  if (ec)
    throw std::runtime_error("TLS: cannot load the certificate chain '" + cert_file +
                             "' (PEM expected): " + ec.message());
  ctx->use_private_key_file(key_file, net::ssl::context::pem, ec);
  if (ec && ec.category() == net::error::get_ssl_category() &&
      ERR_GET_REASON(static_cast<unsigned long>(ec.value())) == X509_R_KEY_VALUES_MISMATCH)
    throw std::runtime_error("TLS: the private key '" + key_file + "' does not belong to the certificate '" +
                             cert_file + "'");
  if (ec)
    throw std::runtime_error("TLS: cannot load the private key '" + key_file +
                             "' (unencrypted PEM expected): " + ec.message());
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
    throw std::runtime_error("TLS: the private key '" + key_file + "' does not belong to the certificate '" +
                             cert_file + "'");
  return ctx;
}

}  // namespace

struct HttpServer::Impl {
  Impl(HttpServerOptions options, HttpHandler handler)
      : core(std::make_shared<Core>(std::move(options), std::move(handler))),
        acceptor_strand(net::make_strand(core->ioc)),
        acceptor(acceptor_strand),
        retry_timer(acceptor_strand) {}

  void do_accept() {
    auto strand = net::make_strand(core->ioc);
    acceptor.async_accept(strand, [this, strand](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // E.g. out of file descriptors: back off instead of spinning.
        spdlog::warn("http accept failed: {}", ec.message());
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](beast::error_code e) {
          if (!e && acceptor.is_open()) do_accept();
        });
        return;
      }
      if (core->open_connections() >= core->max_connections) {
        refuse(std::move(socket));
      } else {
        std::make_shared<Connection>(core, std::move(socket), strand)->start();
      }
      do_accept();
    });
  }

  // A connection over max_connections: a 503 written without waiting (a fresh socket's send
  // buffer is empty), then closed. Nothing of it is kept.
  void refuse(tcp::socket socket) {
    const auto n = ++core->refused_connections;
    if (n == 1 || n % 1000 == 0)
      spdlog::warn(
          "http: {} connection(s) refused with 503: {} are open, the most allowed (--max-connections)", n,
          core->max_connections);
    const std::string body = transport_error(503, "too many open connections; retry later",
                                             ErrorKind::UNAVAILABLE, "too_many_connections")
                                 .body;
    std::string out =
        "HTTP/1.1 503 Service Unavailable\r\nServer: swarm\r\nContent-Type: application/json\r\nRetry-After: "
        "1\r\n"
        "Connection: close\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    beast::error_code ec;
    socket.non_blocking(true, ec);
    if (!core->tls) net::write(socket, net::buffer(out), ec);  // a TLS client could not read it: just close
    socket.shutdown(tcp::socket::shutdown_both, ec);
    socket.close(ec);
  }

  std::shared_ptr<Core> core;
  Strand acceptor_strand;
  tcp::acceptor acceptor;
  net::steady_timer retry_timer;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  std::mutex lifecycle_mu;
  bool running = false;
  bool started_once = false;
  std::atomic<std::uint16_t> bound_port{0};
};

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler)
    : impl_(std::make_unique<Impl>(std::move(options), std::move(handler))) {}

HttpServer::~HttpServer() { stop(0); }

void HttpServer::start() {
  Impl& m = *impl_;
  std::lock_guard lk(m.lifecycle_mu);
  if (m.started_once) throw std::logic_error("HttpServer::start: already started");
  const auto& o = m.core->options;
  beast::error_code ec;
  auto address = net::ip::make_address(o.host, ec);
  if (ec) throw std::runtime_error("HttpServer: invalid listen address '" + o.host + "'");
  tcp::endpoint ep(address, o.port);
  auto fail = [&](const char* what) {
    beast::error_code ignored;
    m.acceptor.close(ignored);
    throw std::runtime_error("HttpServer: cannot " + std::string(what) + " " + o.host + ":" +
                             std::to_string(o.port) + ": " + ec.message());
  };
  if (!o.tls_cert_file.empty() || !o.tls_key_file.empty())
    m.core->tls = load_tls_context(o.tls_cert_file, o.tls_key_file);
  m.acceptor.open(ep.protocol(), ec);
  if (ec) fail("open socket for");
  m.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (ec) fail("set SO_REUSEADDR on");
  m.acceptor.bind(ep, ec);
  if (ec == net::error::address_in_use) {
    // Another process (often an earlier server) holds the port: say so, and what to do, since
    // clients pointed at this port would otherwise talk to that one.
    beast::error_code ignored;
    m.acceptor.close(ignored);
    throw std::runtime_error(
        "HttpServer: port " + std::to_string(o.port) + " on " + o.host +
        " is already in use by another process (an earlier swarm-server? `curl http://" + o.host + ":" +
        std::to_string(o.port) +
        "/health` tells). Stop it, or choose another port: --port N, or --port 0 for any free "
        "one (the log names it)");
  }
  if (ec) fail("bind");
  m.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("listen on");
  m.bound_port = m.acceptor.local_endpoint(ec).port();

  // Each connection is a file descriptor: raise the soft limit (often 1024) to fit
  // max_connections plus room for files, or lower max_connections to what the hard limit allows.
  rlimit rl{};
  const rlim_t want = static_cast<rlim_t>(m.core->max_connections) + 256;
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
    if (rl.rlim_cur < want) {
      const size_t fit =
          rl.rlim_cur > 512 ? static_cast<size_t>(rl.rlim_cur - 256) : static_cast<size_t>(rl.rlim_cur / 2);
      spdlog::warn("http: the open-file limit is {}: at most {} connections (not {}); raise `ulimit -n`",
                   static_cast<unsigned long long>(rl.rlim_cur), fit, m.core->max_connections);
      m.core->max_connections = std::max<size_t>(1, fit);
    }
  }

  m.started_once = true;
  m.running = true;
  m.work.emplace(m.core->ioc.get_executor());
  net::post(m.acceptor_strand, [&m] { m.do_accept(); });
  const int n = std::max(1, o.io_threads);
  m.threads.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    m.threads.emplace_back([core = m.core] {
      t_io_thread_of = core.get();
      for (;;) {
        try {
          core->ioc.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("http io thread: unexpected exception: {}", e.what());
        } catch (...) {
          spdlog::error("http io thread: unexpected non-std exception");
        }
      }
    });
  }
}

uint16_t HttpServer::port() const { return impl_->bound_port.load(); }

bool HttpServer::tls() const { return impl_->core->tls != nullptr; }

void HttpServer::stop(int grace_ms) {
  Impl& m = *impl_;
  if (t_io_thread_of == m.core.get()) throw std::logic_error("HttpServer::stop: called from an I/O thread");
  std::lock_guard lk(m.lifecycle_mu);
  if (!m.running) return;
  m.running = false;
  Core& core = *m.core;

  // 1. No new connections, no new requests; idle connections close now.
  core.draining.store(true);
  net::post(m.acceptor_strand, [&m] {
    beast::error_code ec;
    m.acceptor.close(ec);
    m.retry_timer.cancel();
  });
  for (auto& c : core.snapshot()) net::post(c->strand(), [c] { c->begin_drain(); });

  // 2. Requests in flight get up to grace_ms to be answered (connections close once idle).
  {
    std::unique_lock reg(core.reg_mu);
    core.reg_cv.wait_for(reg, std::chrono::milliseconds(std::max(0, grace_ms)),
                         [&] { return core.connections.empty(); });
  }

  // 3. Close the rest and stop the threads.
  for (auto& c : core.snapshot()) net::post(c->strand(), [c] { c->close(); });
  m.work.reset();
  core.ioc.stop();
  for (auto& t : m.threads)
    if (t.joinable()) t.join();
  m.threads.clear();

  // 4. Single-threaded cleanup: run what is still queued (the closes above and the
  //    aborted operations they complete), after which nothing may be queued any more.
  {
    std::lock_guard plk(core.post_mu);
    core.posts_open = false;
  }
  core.ioc.restart();
  core.ioc.poll();
  for (auto& c : core.snapshot()) c->close();  // anything poll could not reach
  core.ioc.poll();
}

}  // namespace swarm
