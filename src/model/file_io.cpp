#include "model/file_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/error.hpp"

namespace swarm {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

}  // namespace

std::string read_text_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "cannot read " + path.string() + ": " + errno_text(errno));
  }
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) {
    throw SwarmError(ErrorKind::INVALID_ARGUMENT, "error while reading " + path.string());
  }
  return std::move(out).str();
}

AtomicFile::AtomicFile(std::filesystem::path path) : path_(std::move(path)) {
  // mkstemp in the destination directory: rename() is only atomic within one file system.
  std::string templ = path_.string() + ".tmp.XXXXXX";
  fd_ = ::mkstemp(templ.data());
  if (fd_ < 0) {
    throw SwarmError(ErrorKind::INTERNAL,
                     "cannot create a temporary file for " + path_.string() + ": " + errno_text(errno));
  }
  tmp_path_ = templ;
  ::fchmod(fd_, 0644);  // mkstemp creates 0600; model files are meant to be shared
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFile::write(std::span<const std::byte> bytes) {
  SWARM_CHECK(fd_ >= 0, "write after commit to " + path_.string());
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    // Linux writes at most ~2 GiB per call; loop over partial writes.
    ssize_t n = ::write(fd_, p, std::min<size_t>(left, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SwarmError(ErrorKind::INTERNAL, "cannot write " + path_.string() + ": " + errno_text(errno));
    }
    p += n;
    left -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFile::write(std::string_view text) {
  write(std::as_bytes(std::span<const char>(text.data(), text.size())));
}

void AtomicFile::commit() {
  SWARM_CHECK(fd_ >= 0, "double commit of " + path_.string());
  if (::fsync(fd_) != 0) {
    throw SwarmError(ErrorKind::INTERNAL, "cannot fsync " + path_.string() + ": " + errno_text(errno));
  }
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    throw SwarmError(ErrorKind::INTERNAL, "cannot close " + path_.string() + ": " + errno_text(err));
  }
  if (::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    throw SwarmError(ErrorKind::INTERNAL, "cannot rename onto " + path_.string() + ": " + errno_text(err));
  }
}

void write_text_file_atomic(const std::filesystem::path& path, std::string_view text) {
  AtomicFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace swarm
