// Small file helpers for model directories: whole-file reads and atomic writes
// (temporary file in the target's directory, fsync, rename), with errors that name the path.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>

namespace swarm {

/// Reads a whole file. Throws SwarmError(INVALID_ARGUMENT) naming the path when it cannot.
std::string read_text_file(const std::filesystem::path& path);

/// A file written under a temporary name next to `path` and renamed onto it by commit().
/// Destroying it without commit() removes the temporary file, so readers never see a
/// half-written file. Not thread-safe; one writer per object.
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  /// Appends bytes. Throws SwarmError(INTERNAL) with the path and errno text on failure.
  void write(std::span<const std::byte> bytes);
  void write(std::string_view text);
  /// Bytes written so far.
  size_t size() const noexcept { return written_; }
  /// fsync + rename onto the final path.
  void commit();

 private:
  std::filesystem::path path_;
  std::filesystem::path tmp_path_;
  int fd_ = -1;
  size_t written_ = 0;
};

/// Writes `text` to `path` atomically.
void write_text_file_atomic(const std::filesystem::path& path, std::string_view text);

}  // namespace swarm
