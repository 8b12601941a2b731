// The nesting pre-scan that every untrusted JSON document passes before it is parsed
// (common/json_nesting.hpp).
#include <gtest/gtest.h>

#include <string>

#include "common/error.hpp"
#include "common/json_nesting.hpp"

namespace swarm {
namespace {

std::string nested(size_t n) { return std::string(n, '[') + std::string(n, ']'); }

TEST(JsonNesting, CountsArraysAndObjects) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth("{}"), 1);
  EXPECT_EQ(json_nesting_depth("[]"), 1);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}], "c": {}})"), 4);
  EXPECT_EQ(json_nesting_depth(nested(128)), 128);
  EXPECT_TRUE(json_nesting_within(nested(128)));
  EXPECT_FALSE(json_nesting_within(nested(129)));
}

TEST(JsonNesting, BracketsInsideStringsDoNotCount) {
  EXPECT_EQ(json_nesting_depth(R"({"a": "[[[[{{{{"})"), 1);
  // Escaped quotes and backslashes keep the string open (or closed) as JSON does.
  EXPECT_EQ(json_nesting_depth(R"({"a": "\"[[[[", "b": "\\", "c": [[]]})"), 3);
  EXPECT_EQ(json_nesting_depth(R"(["\\\"[["])"), 1);
}

TEST(JsonNesting, StopsAtTheFirstLevelOverTheLimit) {
  // Returns limit + 1, not the full depth, so a 100,000-deep input costs no more than 129 levels.
  EXPECT_EQ(json_nesting_depth(nested(100000)), kMaxJsonNesting + 1);
  EXPECT_EQ(json_nesting_depth(nested(10), 4), 5);
  // Unbalanced or invalid text is scanned all the same (the parser then says what is wrong).
  EXPECT_EQ(json_nesting_depth("]]]]["), 1);
  EXPECT_EQ(json_nesting_depth(std::string(200, '{')), kMaxJsonNesting + 1);
}

TEST(JsonNesting, RequireNamesTheDocument) {
  EXPECT_NO_THROW(require_json_nesting(nested(128), "x"));
  try {
    require_json_nesting(nested(129), "tokenizer.json");
    FAIL() << "no error";
  } catch (const SwarmError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::INVALID_ARGUMENT);
    EXPECT_STREQ(e.what(), "tokenizer.json is nested deeper than 128 levels");
  }
}

}  // namespace
}  // namespace swarm
