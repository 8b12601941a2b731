// zip_member_names / check_agentjet_code_zip: reading an uploaded archive's directory
// (POST /sync_train_code) and AgentJet's rules for it.
#include "server/zip_listing.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/error.hpp"

namespace swarm {
namespace {

void put16(std::string& s, uint16_t v) {
  s.push_back(static_cast<char>(v & 0xff));
  s.push_back(static_cast<char>(v >> 8));
}
void put32(std::string& s, uint32_t v) {
  put16(s, static_cast<uint16_t>(v & 0xffff));
  put16(s, static_cast<uint16_t>(v >> 16));
}

// A stored (uncompressed) zip with these members, each holding its own name; CRCs are not
// checked by the reader, so they are left 0.
std::string make_zip(const std::vector<std::string>& names, const std::string& comment = "") {
  std::string out, dir;
  for (const std::string& name : names) {
    const uint32_t offset = static_cast<uint32_t>(out.size());
    put32(out, 0x04034b50);
    put16(out, 20), put16(out, 0), put16(out, 0), put16(out, 0), put16(out, 0);
    put32(out, 0), put32(out, static_cast<uint32_t>(name.size())),
        put32(out, static_cast<uint32_t>(name.size()));
    put16(out, static_cast<uint16_t>(name.size())), put16(out, 0);
    out += name;
    out += name;  // the data
    put32(dir, 0x02014b50);
    put16(dir, 20), put16(dir, 20), put16(dir, 0), put16(dir, 0), put16(dir, 0), put16(dir, 0);
    put32(dir, 0), put32(dir, static_cast<uint32_t>(name.size())),
        put32(dir, static_cast<uint32_t>(name.size()));
    put16(dir, static_cast<uint16_t>(name.size())), put16(dir, 0), put16(dir, 0), put16(dir, 0),
        put16(dir, 0);
    put32(dir, 0), put32(dir, offset);
    dir += name;
  }
  const uint32_t dir_offset = static_cast<uint32_t>(out.size());
  out += dir;
  put32(out, 0x06054b50);
  put16(out, 0), put16(out, 0);
  put16(out, static_cast<uint16_t>(names.size())), put16(out, static_cast<uint16_t>(names.size()));
  put32(out, static_cast<uint32_t>(dir.size())), put32(out, dir_offset);
  put16(out, static_cast<uint16_t>(comment.size()));
  out += comment;
  return out;
}

std::string error_of(const std::string& bytes) {
  try {
    check_agentjet_code_zip(bytes);
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

TEST(ZipListing, ListsMembersInDirectoryOrderEvenWithAComment) {
  const std::vector<std::string> names = {"ajet/", "ajet/__init__.py", "ajet/tuner_lib/x.py"};
  EXPECT_EQ(zip_member_names(make_zip(names)), names);
  EXPECT_EQ(zip_member_names(make_zip(names, "made by a test; PK\x05\x06 inside the comment")), names);
  EXPECT_TRUE(zip_member_names(make_zip({})).empty());
}

TEST(ZipListing, RejectsWhatIsNotAZip) {
  EXPECT_NE(error_of("").find("not a valid zip"), std::string::npos);
  EXPECT_NE(error_of("{\"yaml_as_string\": \"model: m\"}").find("not a valid zip"), std::string::npos);
  std::string zip = make_zip({"ajet/a.py"});
  EXPECT_NE(error_of(zip.substr(0, zip.size() - 30)).find("not a valid zip"),
            std::string::npos);  // truncated
  std::string bad_offset = zip;
  bad_offset[bad_offset.size() - 6] = '\x7f';  // central directory offset beyond the end record
  EXPECT_NE(error_of(bad_offset).find("not a valid zip"), std::string::npos);
}

TEST(ZipListing, AppliesAgentJetsRules) {
  EXPECT_EQ(error_of(make_zip({"ajet/", "ajet/main.py"})), "");
  EXPECT_EQ(error_of(make_zip({"ajet/main.py"})), "");
  EXPECT_NE(error_of(make_zip({})).find("Uploaded zip file is empty."), std::string::npos);
  EXPECT_NE(
      error_of(make_zip({"ajet/../../etc/passwd"})).find("Unsafe zip member path: ajet/../../etc/passwd"),
      std::string::npos);
  EXPECT_NE(error_of(make_zip({"/abs.py"})).find("Unsafe zip member path"), std::string::npos);
  EXPECT_NE(error_of(make_zip({"C:\\\\x.py"})).find("Unsafe zip member path"), std::string::npos);
  EXPECT_NE(
      error_of(make_zip({"ajet/a.py", "other/x.py"})).find("Zip member must be under ajet/: other/x.py"),
      std::string::npos);
  EXPECT_NE(error_of(make_zip({"ajetx/a.py"})).find("must be under ajet/"), std::string::npos);
  EXPECT_NE(error_of(make_zip({"ajet"})).find("does not contain an ajet/ directory"), std::string::npos);
}

}  // namespace
}  // namespace swarm
