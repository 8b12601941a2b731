// The environment table (src/common/env.hpp) against the sources: every variable a program
// reads is in the table, read through env_value(), and every table entry is read somewhere.
#include "common/env.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

namespace fs = std::filesystem;

namespace {

// Every C++ file of the programs (not tests or benchmarks), path relative to the root -> text.
std::map<std::string, std::string> program_sources() {
  std::map<std::string, std::string> out;
  const fs::path root = SWARM_SOURCE_DIR;
  for (const char* dir : {"src", "tools", "kernels", "include"}) {
    for (const auto& e : fs::recursive_directory_iterator(root / dir)) {
      const auto ext = e.path().extension();
      if (!e.is_regular_file() || (ext != ".cpp" && ext != ".hpp" && ext != ".h" && ext != ".cu")) continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      out[fs::relative(e.path(), root).string()] = ss.str();
    }
  }
  return out;
}

std::set<std::string> table_names() {
  std::set<std::string> names;
  for (const auto& v : swarm::env_vars()) names.insert(std::string(v.name));
  return names;
}

TEST(Env, OnlyEnvCppCallsGetenv) {
  const auto sources = program_sources();
  ASSERT_GT(sources.size(), 100u);  // the walk found the tree
  for (const auto& [path, text] : sources) {
    if (path == "src/common/env.cpp") continue;
    EXPECT_EQ(text.find("getenv("), std::string::npos)
        << path << " reads the environment directly; use env_value() and add the name to env.cpp";
  }
}

TEST(Env, EveryNameReadIsInTheTableAndEveryEntryIsRead) {
  const auto sources = program_sources();
  const auto names = table_names();
  // Names read: env_value("X") and the token readers' read_token(file, "X", ...).
  const std::regex read_re(R"re((?:env_value|read_token)\([^;]*?"([A-Z][A-Z0-9_]+)")re");
  std::set<std::string> read;
  for (const auto& [path, text] : sources) {
    if (path == "src/common/env.cpp") continue;
    for (std::sregex_iterator it(text.begin(), text.end(), read_re), end; it != end; ++it) {
      read.insert((*it)[1].str());
      EXPECT_TRUE(names.count((*it)[1].str()))
          << path << " reads " << (*it)[1] << ", which env.cpp does not list";
    }
  }
  for (const auto& name : names)
    EXPECT_TRUE(read.count(name)) << name << " is listed in env.cpp but nothing reads it";
}

TEST(Env, ValueIsUnsetEmptyOrTheText) {
  ASSERT_EQ(unsetenv("SWARM_GEMM_SPLIT"), 0);
  EXPECT_FALSE(swarm::env_value("SWARM_GEMM_SPLIT").has_value());
  ASSERT_EQ(setenv("SWARM_GEMM_SPLIT", "", 1), 0);
  EXPECT_FALSE(swarm::env_value("SWARM_GEMM_SPLIT").has_value());
  ASSERT_EQ(setenv("SWARM_GEMM_SPLIT", "0", 1), 0);
  EXPECT_EQ(swarm::env_value("SWARM_GEMM_SPLIT").value_or("?"), "0");
  unsetenv("SWARM_GEMM_SPLIT");
}

TEST(Env, AnUnlistedNameIsAProgrammingError) {
  EXPECT_THROW(swarm::env_value("SWARM_NOT_A_VARIABLE"), std::logic_error);
}

TEST(Env, ReferenceHasOneRowPerVariable) {
  const std::string md = swarm::env_reference_markdown();
  size_t rows = 0;
  for (size_t p = md.find("\n| `"); p != std::string::npos; p = md.find("\n| `", p + 1)) ++rows;
  EXPECT_EQ(rows, swarm::env_vars().size());
  for (const auto& v : swarm::env_vars())
    EXPECT_NE(md.find("| `" + std::string(v.name) + "` |"), std::string::npos);
}

}  // namespace
