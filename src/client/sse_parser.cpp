#include "client/sse_parser.hpp"

namespace swarm {

bool SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (stopped_) return false;
    if (pending_cr_) {
      pending_cr_ = false;
      if (c == '\n') continue;  // second half of a CRLF already handled
    }
    if (c == '\r' || c == '\n') {
      pending_cr_ = (c == '\r');
      std::string line;
      line.swap(line_);
      if (!process_line(line)) return false;
    } else {
      line_.push_back(c);
    }
  }
  return !stopped_;
}

bool SseParser::finish() {
  if (stopped_) return false;
  if (!line_.empty()) {
    std::string line;
    line.swap(line_);
    if (!process_line(line)) return false;
  }
  return dispatch();
}

bool SseParser::process_line(std::string_view line) {
  if (line.empty()) return dispatch();   // blank line ends the event
  if (line.front() == ':') return true;  // comment / keep-alive
  const auto colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value;
  if (colon != std::string_view::npos) {
    value = line.substr(colon + 1);
    if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  }
  if (field == "data") {
    if (has_data_) data_.push_back('\n');
    data_.append(value);
    has_data_ = true;
  }
  return true;
}

bool SseParser::dispatch() {
  if (!has_data_) return true;
  std::string data;
  data.swap(data_);
  has_data_ = false;
  if (!on_event_(data)) stopped_ = true;
  return !stopped_;
}

}  // namespace swarm
