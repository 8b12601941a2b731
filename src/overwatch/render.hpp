// swarm-overwatch's renderer: a FrameInput becomes lines of text (with ANSI colours when
// asked). Pure functions, no I/O and no clocks, so every frame is unit-testable.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "overwatch/monitor.hpp"

namespace swarm::overwatch {

struct RenderOptions {
  int width = 100;          // terminal columns; every line fits in them
  int height = 0;           // terminal rows; 0 = unlimited (--once)
  bool color = true;        // ANSI SGR colours
  bool interactive = true;  // full-screen mode: the footer says how to quit
  int max_list_rows = 30;   // rows per list (running episodes, tasks) when height is 0
};

/// Renders the whole screen: the dashboard when the server is reachable, the
/// unreachable screen otherwise. At most `height` lines (when set), each at most
/// `width` columns wide.
std::vector<std::string> render_frame(const FrameInput& in, const RenderOptions& options);

// ---- building blocks (exposed for tests)

/// "0.4s", "12s", "3m05s", "2h07m", "3d04h"; "-" for negative or non-finite input.
std::string format_duration(double seconds);

/// 1234 → "1234", 12345 → "12.3k", 1234567 → "1.23M".
std::string format_count(int64_t n);

/// The last `width` values as block characters ▁▂▃▄▅▆▇█ scaled between their min and max;
/// all-equal values draw as ▄, NaN as a space. Shorter than `width` when there are fewer values.
std::string sparkline(const std::vector<double>& values, size_t width);

/// `width` cells: full blocks for done/target, an eighth-block for the remainder, then ░.
/// A target <= 0 draws an empty bar; done beyond the target a full one.
std::string progress_bar(double done, double target, size_t width);

/// Terminal columns of `s`: ANSI escape sequences take none, East Asian wide characters two,
/// every other UTF-8 code point one.
size_t display_width(std::string_view s);

/// `line` cut to at most `width` columns (ending in "…" when cut), escape sequences kept
/// and colours reset at the end when cut.
std::string fit_line(std::string_view line, size_t width);

/// Server-supplied text made safe for a terminal: control characters (ESC included)
/// become '?', invalid UTF-8 bytes too.
std::string sanitize(std::string_view text);

/// `text` wrapped at spaces into lines of at most `width` columns (long words are cut).
std::vector<std::string> wrap_text(std::string_view text, size_t width);

}  // namespace swarm::overwatch
