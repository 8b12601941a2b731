#include "plot/png_writer.hpp"

#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <exception>
#include <string>
#include <system_error>

#include "common/error.hpp"

namespace swarm::plot {
namespace {

// What libpng's callbacks share with encode_png. It lives in encode_png's frame, above the
// setjmp in run_libpng, so libpng's longjmp never skips it.
struct EncodeState {
  const PngSink* sink = nullptr;
  std::exception_ptr sink_error;  // what the sink threw, rethrown once libpng has unwound
  char error[256] = {};           // libpng's error message
};

// libpng's error callback must not return. It keeps the message and jumps back to the setjmp
// in run_libpng; only libpng frames and the (already finished) body of on_write lie between.
[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<EncodeState*>(png_get_error_ptr(png));
  std::snprintf(state->error, sizeof state->error, "%s", message ? message : "unknown libpng error");
  png_longjmp(png, 1);
}

// Warnings (e.g. about ancillary chunks) do not affect the image: they are dropped instead of
// going to stderr.
void on_warning(png_structp, png_const_charp) {}

void on_write(png_structp png, png_bytep data, size_t length) {
  auto* state = static_cast<EncodeState*>(png_get_io_ptr(png));
  bool failed = false;
  try {
    (*state->sink)(std::span<const uint8_t>(data, length));
  } catch (...) {
    state->sink_error = std::current_exception();
    failed = true;
  }
  // Outside the handler: png_error longjmps, which must not leave a catch block.
  if (failed) png_error(png, "the output stopped accepting data");
}

// Required: with a null flush callback libpng would fflush() the io pointer as a FILE*.
void on_flush(png_structp) {}

// Owns a libpng write struct and its info struct.
class PngWriteGuard {
 public:
  explicit PngWriteGuard(EncodeState& state) {
    png_ = png_create_write_struct(PNG_LIBPNG_VER_STRING, &state, on_error, on_warning);
    if (png_ == nullptr)
      throw SwarmError(ErrorKind::INTERNAL, "PNG encoding failed: cannot create the libpng write struct");
    info_ = png_create_info_struct(png_);
    if (info_ == nullptr) {
      png_destroy_write_struct(&png_, nullptr);
      throw SwarmError(ErrorKind::INTERNAL, "PNG encoding failed: cannot create the libpng info struct");
    }
  }
  ~PngWriteGuard() { png_destroy_write_struct(&png_, &info_); }
  PngWriteGuard(const PngWriteGuard&) = delete;
  PngWriteGuard& operator=(const PngWriteGuard&) = delete;

  png_structp png() const { return png_; }
  png_infop info() const { return info_; }

 private:
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

// Every libpng call that can fail happens here, under one setjmp. A libpng error longjmps back
// to it, so this frame holds no object with a destructor and nothing it changes after the
// setjmp is read after the jump. Returns false when libpng reported an error.
bool run_libpng(png_structp png, png_infop info, EncodeState* state, const RgbImage& image) {
  if (setjmp(png_jmpbuf(png))) return false;
  png_set_write_fn(png, state, on_write, on_flush);
  png_set_IHDR(png, info, static_cast<png_uint_32>(image.width()), static_cast<png_uint_32>(image.height()),
               8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  const uint8_t* row = image.pixels().data();
  const size_t stride = static_cast<size_t>(image.width()) * 3;
  for (int y = 0; y < image.height(); ++y, row += stride) png_write_row(png, row);
  png_write_end(png, nullptr);
  return true;
}

// A file descriptor closed on scope exit (unless close() was called and checked).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int close() {
    const int rc = ::close(fd_);
    fd_ = -1;
    return rc;
  }

 private:
  int fd_;
};

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

}  // namespace

void encode_png(const RgbImage& image, const PngSink& sink) {
  EncodeState state;
  state.sink = &sink;
  bool ok;
  {
    PngWriteGuard guard(state);
    ok = run_libpng(guard.png(), guard.info(), &state, image);
  }
  if (state.sink_error) std::rethrow_exception(state.sink_error);
  if (!ok) throw SwarmError(ErrorKind::INTERNAL, std::string("PNG encoding failed: ") + state.error);
}

std::vector<uint8_t> encode_png(const RgbImage& image) {
  std::vector<uint8_t> out;
  out.reserve(static_cast<size_t>(image.width()) * static_cast<size_t>(image.height()) / 8 + 1024);
  encode_png(image,
             [&out](std::span<const uint8_t> piece) { out.insert(out.end(), piece.begin(), piece.end()); });
  return out;
}

void write_png(const std::filesystem::path& path, const RgbImage& image) {
  const std::filesystem::path dir = path.parent_path().empty() ? "." : path.parent_path();
  const std::filesystem::path tmp =
      dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  auto fail = [&](const std::string& why) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "cannot write " + path.string() + ": " + why);
  };

  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666));
  if (fd.get() < 0) fail(errno_text(errno));
  try {
    encode_png(image, [&](std::span<const uint8_t> piece) {
      while (!piece.empty()) {
        const ssize_t n = ::write(fd.get(), piece.data(), piece.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) throw std::system_error(n < 0 ? errno : EIO, std::generic_category());
        piece = piece.subspan(static_cast<size_t>(n));
      }
    });
  } catch (const std::system_error& e) {
    fail(e.code().message());
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    throw;  // an encoding error, already a SwarmError
  }
  if (fd.close() != 0) fail(errno_text(errno));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail(ec.message());
}

}  // namespace swarm::plot
