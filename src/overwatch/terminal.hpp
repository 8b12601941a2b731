// The terminal side of swarm-overwatch: its size, and the full-screen session
// (alternate screen, keys without echo, signals) that always restores the terminal.
#pragma once

#include <termios.h>

#include <chrono>
#include <string>
#include <vector>

namespace swarm::overwatch {

/// Columns of the terminal on `fd` (ioctl TIOCGWINSZ), or `fallback` when `fd` is not a
/// terminal or reports no size.
int terminal_columns(int fd, int fallback = 100);
/// Rows of the terminal on `fd`, or `fallback`.
int terminal_rows(int fd, int fallback = 40);

/// The whole frame as bytes for a full-screen redraw: cursor home, each line on a cleared
/// row, the rest of the screen cleared. Never writes past `rows` lines, never scrolls.
std::string screen_bytes(const std::vector<std::string>& lines, int rows);

/// Full-screen mode on stdin/stdout: the alternate screen, a hidden cursor, keys read
/// without echo or line buffering (Ctrl-C still raises SIGINT). SIGINT, SIGTERM and SIGHUP
/// end a wait with QUIT; SIGWINCH with RESIZE. The destructor restores the terminal
/// (screen, cursor, termios) and the previous signal handlers.
/// One instance per process; NOT thread-safe (the main thread owns it).
class TerminalSession {
 public:
  enum class Event { TIMEOUT, QUIT, RESIZE, REFRESH };

  TerminalSession();
  ~TerminalSession();
  TerminalSession(const TerminalSession&) = delete;
  TerminalSession& operator=(const TerminalSession&) = delete;

  int columns() const { return terminal_columns(1); }
  int rows() const { return terminal_rows(1); }

  /// Redraws the screen with `lines` (already fitted to the width).
  void draw(const std::vector<std::string>& lines);

  /// Waits up to `timeout` for a key (q/Q: QUIT, r or space: REFRESH) or a signal.
  Event wait(std::chrono::milliseconds timeout);

  /// True once a stop signal arrived or q was pressed.
  bool quit_requested() const;

 private:
  void restore();

  bool stdin_tty_ = false;
  bool stdin_eof_ = false;
  bool termios_saved_ = false;
  bool restored_ = false;
  bool quit_ = false;
  struct termios saved_termios_ {};
};

}  // namespace swarm::overwatch
