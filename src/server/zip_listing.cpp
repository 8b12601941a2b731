#include "server/zip_listing.hpp"

#include <cstdint>

#include "common/error.hpp"

namespace swarm {
namespace {

constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr uint32_t kCentralFileHeader = 0x02014b50;
constexpr size_t kEndRecordSize = 22;
constexpr size_t kCentralHeaderSize = 46;

uint32_t le32(std::string_view b, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(b[at])) |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(b[at + 3])) << 24;
}

uint16_t le16(std::string_view b, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(b[at]) | static_cast<unsigned char>(b[at + 1])
                                                                       << 8);
}

[[noreturn]] void not_a_zip(const std::string& why) {
  throw SwarmError(ErrorKind::INVALID_ARGUMENT, "Uploaded file is not a valid zip file (" + why + ").");
}

}  // namespace

std::vector<std::string> zip_member_names(std::string_view bytes) {
  if (bytes.size() < kEndRecordSize) not_a_zip("shorter than a zip end record");
  // The end record sits in the last 22 + 65535 (comment) bytes; search backwards.
  size_t end = std::string_view::npos;
  const size_t lowest = bytes.size() > kEndRecordSize + 0xFFFF ? bytes.size() - kEndRecordSize - 0xFFFF : 0;
  for (size_t at = bytes.size() - kEndRecordSize + 1; at-- > lowest;) {
    if (le32(bytes, at) == kEndOfCentralDirectory &&
        at + kEndRecordSize + le16(bytes, at + 20) == bytes.size()) {
      end = at;
      break;
    }
  }
  if (end == std::string_view::npos) not_a_zip("no end-of-central-directory record");
  const uint16_t count = le16(bytes, end + 10);
  const uint32_t dir_size = le32(bytes, end + 12);
  const uint32_t dir_offset = le32(bytes, end + 16);
  if (count == 0xFFFF || dir_size == 0xFFFFFFFFu || dir_offset == 0xFFFFFFFFu)
    not_a_zip("zip64 is not supported");
  if (static_cast<uint64_t>(dir_offset) + dir_size > end) not_a_zip("central directory out of bounds");
  std::vector<std::string> names;
  size_t at = dir_offset;
  for (uint16_t i = 0; i < count; ++i) {
    if (at + kCentralHeaderSize > end || le32(bytes, at) != kCentralFileHeader)
      not_a_zip("bad central directory entry");
    const size_t name_len = le16(bytes, at + 28), extra_len = le16(bytes, at + 30),
                 comment_len = le16(bytes, at + 32);
    if (at + kCentralHeaderSize + name_len + extra_len + comment_len > end)
      not_a_zip("truncated central directory");
    names.emplace_back(bytes.substr(at + kCentralHeaderSize, name_len));
    at += kCentralHeaderSize + name_len + extra_len + comment_len;
  }
  return names;
}

void check_agentjet_code_zip(std::string_view bytes) {
  const std::vector<std::string> names = zip_member_names(bytes);
  SWARM_REQUIRE(!names.empty(), ErrorKind::INVALID_ARGUMENT, "Uploaded zip file is empty.");
  bool has_ajet_dir = false;
  for (const std::string& raw : names) {
    std::string name = raw;
    for (char& c : name)
      if (c == '\\') c = '/';
    bool unsafe = name.empty() || name.front() == '/' || (name.size() > 1 && name[1] == ':') ||
                  name.find('\0') != std::string::npos;
    for (size_t start = 0; !unsafe && start <= name.size();) {
      const size_t slash = name.find('/', start);
      const std::string part =
          name.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
      if (part == "..") unsafe = true;
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    SWARM_REQUIRE(!unsafe, ErrorKind::INVALID_ARGUMENT, "Unsafe zip member path: " + raw);
    const bool under = name == "ajet" || name == "ajet/" || name.rfind("ajet/", 0) == 0;
    SWARM_REQUIRE(under, ErrorKind::INVALID_ARGUMENT, "Zip member must be under ajet/: " + raw);
    if (name.rfind("ajet/", 0) == 0) has_ajet_dir = true;
  }
  SWARM_REQUIRE(has_ajet_dir, ErrorKind::INVALID_ARGUMENT,
                "Uploaded zip file does not contain an ajet/ directory.");
}

}  // namespace swarm
