#include "overwatch/terminal.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>

namespace swarm::overwatch {
namespace {

// Signal handlers only set these and write a byte to the self-pipe, which wakes poll()
// even when the signal arrives between the flag check and the call.
volatile std::sig_atomic_t g_stop = 0;
volatile std::sig_atomic_t g_resize = 0;
int g_pipe[2] = {-1, -1};

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};
struct sigaction g_previous[sizeof(kSignals) / sizeof(kSignals[0])];

void on_signal(int sig) {
  const int saved_errno = errno;
  if (sig == SIGWINCH) {
    g_resize = 1;
  } else {
    g_stop = 1;
  }
  if (g_pipe[1] >= 0) {
    const char b = 1;
    [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &b, 1);
  }
  errno = saved_errno;
}

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // the terminal is gone; nothing useful left to do
    }
    off += static_cast<size_t>(n);
  }
}

constexpr const char* kEnter = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";  // alternate screen, hide cursor
constexpr const char* kLeave = "\x1b[0m\x1b[?25h\x1b[?1049l";        // show cursor, main screen

}  // namespace

int terminal_columns(int fd, int fallback) {
  struct winsize ws {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return fallback;
}

int terminal_rows(int fd, int fallback) {
  struct winsize ws {};
  if (::ioctl(fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0) return ws.ws_row;
  return fallback;
}

std::string screen_bytes(const std::vector<std::string>& lines, int rows) {
  // Each row is cleared before it is written (not after: clearing to the end of a line
  // whose last column is filled would erase that column on most terminals).
  std::string out = "\x1b[H";
  const size_t n = rows > 0 ? std::min(lines.size(), static_cast<size_t>(rows)) : lines.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += "\r\n";
    out += "\x1b[2K";
    out += lines[i];
  }
  if (rows <= 0 || n < static_cast<size_t>(rows)) out += "\r\n\x1b[J";
  return out;
}

TerminalSession::TerminalSession() {
  if (::pipe(g_pipe) == 0) {
    for (int fd : g_pipe) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
  }
  g_stop = 0;
  g_resize = 0;
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i) {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: a blocking call returns EINTR and the loop looks at the flags
    ::sigaction(kSignals[i], &sa, &g_previous[i]);
  }
  stdin_tty_ = ::isatty(0) != 0;
  if (stdin_tty_ && ::tcgetattr(0, &saved_termios_) == 0) {
    termios_saved_ = true;
    struct termios raw = saved_termios_;
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);  // ISIG stays: Ctrl-C is SIGINT
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(0, TCSANOW, &raw);
  }
  write_all(1, kEnter);
}

TerminalSession::~TerminalSession() { restore(); }

void TerminalSession::restore() {
  if (restored_) return;
  restored_ = true;
  write_all(1, kLeave);
  if (termios_saved_) ::tcsetattr(0, TCSANOW, &saved_termios_);
  for (size_t i = 0; i < sizeof(kSignals) / sizeof(kSignals[0]); ++i)
    ::sigaction(kSignals[i], &g_previous[i], nullptr);
  for (int& fd : g_pipe) {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void TerminalSession::draw(const std::vector<std::string>& lines) {
  write_all(1, screen_bytes(lines, rows()));
}

bool TerminalSession::quit_requested() const { return quit_ || g_stop != 0; }

TerminalSession::Event TerminalSession::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (quit_requested()) return Event::QUIT;
    if (g_resize) {
      g_resize = 0;
      return Event::RESIZE;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Event::TIMEOUT;

    struct pollfd fds[2] = {{g_pipe[0], POLLIN, 0}, {0, POLLIN, 0}};
    const nfds_t nfds = stdin_tty_ && !stdin_eof_ ? 2 : 1;
    const int n = ::poll(fds, nfds, static_cast<int>(left.count()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Event::TIMEOUT;
    }
    if (fds[0].revents & POLLIN) {
      char buf[64];
      while (::read(g_pipe[0], buf, sizeof(buf)) > 0) {}
      continue;  // the flags say what happened
    }
    if (nfds == 2 && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buf[64];
      const ssize_t got = ::read(0, buf, sizeof(buf));
      if (got <= 0) {
        if (got == 0 || (errno != EINTR && errno != EAGAIN)) stdin_eof_ = true;
        continue;
      }
      for (ssize_t i = 0; i < got; ++i) {
        if (buf[i] == 'q' || buf[i] == 'Q') {
          quit_ = true;
          return Event::QUIT;
        }
      }
      for (ssize_t i = 0; i < got; ++i)
        if (buf[i] == 'r' || buf[i] == ' ') return Event::REFRESH;
    }
  }
}

}  // namespace swarm::overwatch
