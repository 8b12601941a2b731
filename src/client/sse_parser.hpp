// Incremental parser of a server-sent-events stream (text/event-stream), private to the SDK.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace swarm {

/// Splits a byte stream into SSE events and hands each event's `data` to a callback.
/// Input may be cut anywhere (inside a line, inside a CRLF). Multiple `data:` lines of an
/// event are joined with '\n'; comments (":...") and other fields are ignored.
/// Not thread-safe.
class SseParser {
 public:
  /// Called with the data of each complete event; return false to stop parsing.
  using OnEvent = std::function<bool(const std::string& data)>;

  explicit SseParser(OnEvent on_event) : on_event_(std::move(on_event)) {}

  /// Feeds more bytes. Returns false once the callback asked to stop.
  bool feed(std::string_view bytes);
  /// Dispatches a final event that was not terminated by a blank line.
  bool finish();

 private:
  bool process_line(std::string_view line);
  bool dispatch();

  OnEvent on_event_;
  std::string line_;  // the current, incomplete line
  std::string data_;  // data of the current event
  bool has_data_ = false;
  bool pending_cr_ = false;  // last byte was '\r' (a following '\n' belongs to it)
  bool stopped_ = false;
};

}  // namespace swarm
