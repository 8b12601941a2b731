// The example task library (examples/tasks/): determinism per seed, ids that regenerate their
// task, verifiers on exact / wrong / partial replies, rewards in [0, 1], task mixes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "tasks/tasks.hpp"

namespace swarm::tasks {
namespace {

bool all_of_class(const std::string& s, int (*pred)(int)) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [&](unsigned char c) { return pred(c) != 0; });
}

TEST(ExampleTasks, KnownFamilies) {
  const auto names = family_names();
  for (const char* expected : {"sort", "reverse", "count", "base", "add"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const auto* f : all_families()) EXPECT_FALSE(f->description().empty()) << f->name();
}

TEST(ExampleTasks, PinnedExamples) {
  // The format of each family, on a few fixed seeds (these strings are part of the contract:
  // changing a generator changes every task id's meaning).
  const TaskInstance sort = make_task("sort", 3, 7);
  EXPECT_EQ(sort.id, "sort-d3-s7");
  EXPECT_EQ(sort.prompt.substr(0, 5), "sort ");
  EXPECT_EQ(sort.prompt.size(), 5u + 4u);
  std::string digits = sort.prompt.substr(5);
  std::sort(digits.begin(), digits.end());
  EXPECT_EQ(sort.answer, digits);

  const TaskInstance rev = make_task("reverse", 2, 1);
  EXPECT_EQ(rev.prompt.substr(0, 4), "rev ");
  EXPECT_EQ(rev.answer, std::string(rev.prompt.rbegin(), rev.prompt.rbegin() + 3));

  const TaskInstance count = make_task("count", 1, 3);
  ASSERT_EQ(count.prompt.substr(0, 6), "count ");
  const char target = count.prompt[6];
  const std::string letters = count.prompt.substr(8);
  EXPECT_EQ(letters.size(), 4u);
  EXPECT_EQ(count.answer, std::to_string(std::count(letters.begin(), letters.end(), target)));

  const TaskInstance base = make_task("base", 1, 0);
  EXPECT_EQ(base.prompt.substr(0, 6), "base2 ");
  const int value = std::stoi(base.prompt.substr(6));
  EXPECT_EQ(base.answer, value == 2 ? "10" : "11");

  const TaskInstance add = make_task("add", 2, 5);
  const size_t plus = add.prompt.find('+');
  ASSERT_NE(plus, std::string::npos);
  const int a = std::stoi(add.prompt.substr(0, plus)), b = std::stoi(add.prompt.substr(plus + 1));
  EXPECT_GE(a, 10);
  EXPECT_LE(a, 99);
  EXPECT_GE(b, 10);
  EXPECT_LE(b, 99);
  EXPECT_EQ(add.answer, std::to_string(a + b));
}

// Every family at every difficulty: deterministic, id round trip, well-formed and short,
// the answer checked by an independent computation, and the max_answer_chars hint holds.
TEST(ExampleTasks, EveryFamilyEveryDifficulty) {
  for (const auto& name : family_names()) {
    const TaskFamily& f = family(name);
    for (int d = kMinDifficulty; d <= kMaxDifficulty; ++d) {
      std::set<std::string> prompts;
      for (uint64_t seed : {0ull, 1ull, 2ull, 42ull, 12345ull, 0xFFFFFFFFFFFFFFFFull}) {
        SCOPED_TRACE(name + " d" + std::to_string(d) + " seed " + std::to_string(seed));
        const TaskInstance t = make_task(name, d, seed);
        const TaskInstance again = make_task(name, d, seed);
        EXPECT_EQ(t.prompt, again.prompt);
        EXPECT_EQ(t.answer, again.answer);
        const TaskInstance from_id = task_from_id(t.id);
        EXPECT_EQ(from_id.family, name);
        EXPECT_EQ(from_id.difficulty, d);
        EXPECT_EQ(from_id.seed, seed);
        EXPECT_EQ(from_id.prompt, t.prompt);
        EXPECT_EQ(from_id.answer, t.answer);
        EXPECT_FALSE(t.answer.empty());
        EXPECT_LE(static_cast<int>(t.answer.size()), f.max_answer_chars(d));
        EXPECT_LE(t.prompt.size(), 24u) << t.prompt;
        EXPECT_DOUBLE_EQ(score(t, t.answer), 1.0);
        EXPECT_TRUE(is_exact(t, "\n " + t.answer + " \n"));
        prompts.insert(t.prompt);

        const std::string arg = t.prompt.substr(t.prompt.find(' ') + 1);
        if (name == "sort") {
          EXPECT_EQ(arg.size(), static_cast<size_t>(d + 1));
          EXPECT_TRUE(all_of_class(arg, ::isdigit));
          EXPECT_TRUE(std::is_sorted(t.answer.begin(), t.answer.end()));
          EXPECT_TRUE(std::is_permutation(arg.begin(), arg.end(), t.answer.begin(), t.answer.end()));
        } else if (name == "reverse") {
          EXPECT_EQ(arg.size(), static_cast<size_t>(d + 1));
          EXPECT_TRUE(all_of_class(arg, ::islower));
          EXPECT_EQ(t.answer, std::string(arg.rbegin(), arg.rend()));
        } else if (name == "count") {
          const char target = arg[0];
          const std::string letters = arg.substr(2);
          EXPECT_EQ(letters.size(), static_cast<size_t>(d + 3));
          EXPECT_EQ(t.answer, std::to_string(std::count(letters.begin(), letters.end(), target)));
        } else if (name == "base") {
          const int base = std::stoi(t.prompt.substr(4, t.prompt.find(' ') - 4));
          EXPECT_GE(base, 2);
          EXPECT_LE(base, std::min(d + 1, 9));
          EXPECT_EQ(t.answer.size(), static_cast<size_t>(d + 1));
          EXPECT_NE(t.answer[0], '0');
          EXPECT_EQ(std::stoll(t.answer, nullptr, base), std::stoll(arg));
        } else if (name == "add") {
          const size_t plus = t.prompt.find('+');
          const long long a = std::stoll(t.prompt.substr(0, plus)), b = std::stoll(t.prompt.substr(plus + 1));
          EXPECT_EQ(t.prompt.substr(0, plus).size(), static_cast<size_t>(d));
          EXPECT_EQ(t.answer, std::to_string(a + b));
        } else {
          ADD_FAILURE() << "no independent check for family " << name;
        }
      }
      // Different seeds give different tasks (except where the space is tiny).
      if (!(name == "base" && d == 1)) {
        EXPECT_GE(prompts.size(), 3u) << name << " d" << d;
      }
    }
  }
}

TEST(ExampleTasks, SeedsAndFamiliesGiveDifferentStreams) {
  std::set<std::string> prompts;
  for (uint64_t seed = 0; seed < 50; ++seed) prompts.insert(make_task("sort", 5, seed).prompt);
  EXPECT_GE(prompts.size(), 45u);
  // The same seed in two families is not the same random stream.
  EXPECT_NE(make_task("sort", 3, 9).prompt.substr(5), make_task("add", 4, 9).prompt.substr(0, 4));
}

TEST(ExampleTasks, VerifierExactWrongPartial) {
  TaskInstance t;
  t.family = "sort";
  t.answer = "1134";
  RewardOptions pos{PartialCredit::POSITION, 0.5};
  EXPECT_DOUBLE_EQ(score(t, "1134", pos), 1.0);
  EXPECT_DOUBLE_EQ(score(t, "  1134\n", pos), 1.0);
  EXPECT_DOUBLE_EQ(score(t, "", pos), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "   ", pos), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "9999", pos), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "1130", pos), 0.5 * 3 / 4);   // 3 of 4 in place
  EXPECT_DOUBLE_EQ(score(t, "0134", pos), 0.5 * 3 / 4);   // position, not prefix
  EXPECT_DOUBLE_EQ(score(t, "11340", pos), 0.5 * 4 / 5);  // too long: length penalty
  EXPECT_DOUBLE_EQ(score(t, "11", pos), 0.5 * 2 / 4);     // too short
  EXPECT_DOUBLE_EQ(score(t, "113 4", pos), 0.5 * 3 / 5);  // inner whitespace is not trimmed
  EXPECT_LT(score(t, "1130", pos), score(t, "1134", pos));
  EXPECT_LT(score(t, "1000", pos), score(t, "1100", pos));

  RewardOptions prefix{PartialCredit::PREFIX, 1.0};
  EXPECT_DOUBLE_EQ(score(t, "1134", prefix), 1.0);
  EXPECT_DOUBLE_EQ(score(t, "0134", prefix), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "1139", prefix), 3.0 / 4);
  EXPECT_DOUBLE_EQ(score(t, "113", prefix), 3.0 / 4);
  EXPECT_DOUBLE_EQ(score(t, "11345", prefix), 4.0 / 5);  // full weight still below exact

  // SHAPED: 0.5 position + 0.2 right characters (any order) + 0.15 right kind + 0.15 right length.
  RewardOptions shaped{PartialCredit::SHAPED, 1.0};
  EXPECT_DOUBLE_EQ(score(t, "1134", shaped), 1.0);
  EXPECT_DOUBLE_EQ(score(t, "", shaped), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "9999", shaped), 0.15 + 0.15);        // digits, right count
  EXPECT_DOUBLE_EQ(score(t, "4311", shaped), 0.2 + 0.15 + 0.15);  // right digits, wrong order
  EXPECT_DOUBLE_EQ(score(t, "1139", shaped), 0.5 * 0.75 + 0.2 * 0.75 + 0.15 + 0.15);
  EXPECT_DOUBLE_EQ(score(t, "ab", shaped), 0.15 * 0.5);  // only the length, half
  EXPECT_DOUBLE_EQ(score(t, "113", shaped), (0.5 + 0.2 + 0.15 + 0.15) * 0.75);
  EXPECT_DOUBLE_EQ(score(t, "4311", RewardOptions{PartialCredit::SHAPED, 0.5}), 0.5 * 0.5);
  EXPECT_LT(score(t, "9999", shaped), score(t, "4311", shaped));
  EXPECT_LT(score(t, "4311", shaped), score(t, "1139", shaped));
  EXPECT_EQ(parse_partial_credit("shaped"), PartialCredit::SHAPED);

  RewardOptions none{PartialCredit::NONE, 1.0};
  EXPECT_DOUBLE_EQ(score(t, "1134", none), 1.0);
  EXPECT_DOUBLE_EQ(score(t, "1130", none), 0.0);
  EXPECT_DOUBLE_EQ(score(t, "1130", RewardOptions{PartialCredit::POSITION, 0.0}), 0.0);
}

TEST(ExampleTasks, RewardsStayInRange) {
  const std::vector<std::string> replies = {"",     " ",       "0",       "1",
                                            "x",    "12",      "abc",     "99999999999999999999",
                                            "\n\t", "sort 12", "<|eos|>", std::string(300, '7')};
  for (const auto& name : family_names()) {
    for (int d = kMinDifficulty; d <= kMaxDifficulty; d += 3) {
      const TaskInstance t = make_task(name, d, 77);
      for (PartialCredit p :
           {PartialCredit::NONE, PartialCredit::POSITION, PartialCredit::PREFIX, PartialCredit::SHAPED}) {
        for (double w : {0.0, 0.3, 1.0, 2.0, -1.0}) {
          for (const auto& reply : replies) {
            const double r = score(t, reply, RewardOptions{p, w});
            EXPECT_GE(r, 0.0) << name << " '" << reply << "'";
            EXPECT_LE(r, 1.0) << name << " '" << reply << "'";
            if (r == 1.0) {
              EXPECT_TRUE(is_exact(t, reply));
            }
          }
          // A reply one character off (same length) is partial, never exact.
          std::string off = t.answer;
          off.back() = off.back() == '0' ? '1' : '0';
          EXPECT_LT(score(t, off, RewardOptions{p, w}), 1.0);
        }
      }
    }
  }
}

TEST(ExampleTasks, BadInputsGiveClearErrors) {
  try {
    make_task("sorting", 1, 0);
    FAIL() << "no error for an unknown family";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown task family 'sorting'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sort, reverse, count, base, add"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_task("sort", 0, 0), std::invalid_argument);
  EXPECT_THROW(make_task("sort", kMaxDifficulty + 1, 0), std::invalid_argument);
  for (const char* id : {"", "sort", "sort-d3", "sort-dx-s1", "sort-d3-s", "sort-d3-s-1", "sort-d3-s1x",
                         "nope-d3-s1", "sort-d99-s1"})
    EXPECT_THROW(task_from_id(id), std::invalid_argument) << id;
  EXPECT_THROW(parse_partial_credit("partial"), std::invalid_argument);
  EXPECT_EQ(parse_partial_credit("prefix"), PartialCredit::PREFIX);
  EXPECT_STREQ(partial_credit_name(PartialCredit::POSITION), "position");
}

TEST(ExampleTasks, TaskMixParsing) {
  const TaskMix equal = TaskMix::parse("sort,reverse");
  EXPECT_EQ(equal.families(), (std::vector<std::string>{"sort", "reverse"}));
  EXPECT_EQ(equal.to_string(), "sort:1,reverse:1");

  const TaskMix weighted = TaskMix::parse(" sort:2 , add:0.5 ");
  ASSERT_EQ(weighted.entries().size(), 2u);
  EXPECT_DOUBLE_EQ(weighted.entries()[0].second, 2.0);
  EXPECT_DOUBLE_EQ(weighted.entries()[1].second, 0.5);
  EXPECT_EQ(weighted.pick(0.0), "sort");
  EXPECT_EQ(weighted.pick(0.79), "sort");
  EXPECT_EQ(weighted.pick(0.81), "add");
  EXPECT_EQ(weighted.pick(0.9999999), "add");

  EXPECT_EQ(TaskMix::parse("all").families(), family_names());

  for (const char* bad : {"", " ", "sort,", ",sort", "sort:0", "sort:-1", "sort:x", "sort:", "sort:1:2",
                          "sort,sort", "bogus", "sort,bogus:1"})
    EXPECT_THROW(TaskMix::parse(bad), std::invalid_argument) << "'" << bad << "'";
  try {
    TaskMix::parse("sort:2,bogus");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("bogus"), std::string::npos) << e.what();
  }
}

TEST(ExampleTasks, MixSamplingFollowsWeightsAndIsDeterministic) {
  const TaskMix mix = TaskMix::parse("sort:3,add:1");
  std::map<std::string, int> counts;
  for (uint64_t i = 0; i < 4000; ++i) {
    const uint64_t seed = mix_seed(9, i);
    const TaskInstance t = mix.sample(2, seed);
    EXPECT_EQ(t.seed, seed);
    EXPECT_EQ(t.prompt, mix.sample(2, seed).prompt);
    EXPECT_EQ(t.prompt, task_from_id(t.id).prompt);
    ++counts[t.family];
  }
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_NEAR(counts["sort"] / 4000.0, 0.75, 0.03);
  EXPECT_NE(mix_seed(1, 2, 3), mix_seed(1, 3, 2));
  EXPECT_EQ(mix_seed(1, 2, 3), mix_seed(1, 2, 3));
}

}  // namespace
}  // namespace swarm::tasks
