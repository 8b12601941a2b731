#include "tasks.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <tuple>

namespace swarm::tasks {

namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// A fully specified stream (std:: distributions differ between standard libraries, and a
// task must be the same everywhere its id is read).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() { return splitmix64(state_); }
  // Uniform in [lo, hi]; the modulo bias is below 2^-40 for the small ranges used here.
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1));
  }
  char digit() { return static_cast<char>('0' + between(0, 9)); }

 private:
  uint64_t state_;
};

Rng task_rng(std::string_view family, int difficulty, uint64_t seed) {
  return Rng(mix_seed(seed, fnv1a(family), static_cast<uint64_t>(difficulty)));
}

int64_t ipow(int64_t b, int e) {
  int64_t r = 1;
  while (e-- > 0) r *= b;
  return r;
}

std::string to_base(int64_t value, int base) {
  if (value == 0) return "0";
  std::string s;
  for (; value > 0; value /= base) s += static_cast<char>('0' + value % base);
  std::reverse(s.begin(), s.end());
  return s;
}

// ------------------------------------------------------------------ families

class SortDigits final : public TaskFamily {
 public:
  std::string_view name() const override { return "sort"; }
  std::string_view description() const override {
    return "sort digits ascending: 'sort 3141' -> '1134'; difficulty d: d+1 digits";
  }
  std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const override {
    Rng rng = task_rng(name(), difficulty, seed);
    std::string digits;
    for (int i = 0; i < difficulty + 1; ++i) digits += rng.digit();
    std::string sorted = digits;
    std::sort(sorted.begin(), sorted.end());
    return {"sort " + digits, sorted};
  }
  int max_answer_chars(int difficulty) const override { return difficulty + 1; }
};

class ReverseString final : public TaskFamily {
 public:
  std::string_view name() const override { return "reverse"; }
  std::string_view description() const override {
    return "reverse lowercase letters: 'rev abc' -> 'cba'; difficulty d: d+1 letters";
  }
  std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const override {
    Rng rng = task_rng(name(), difficulty, seed);
    std::string s;
    for (int i = 0; i < difficulty + 1; ++i) s += static_cast<char>('a' + rng.between(0, 25));
    return {"rev " + s, std::string(s.rbegin(), s.rend())};
  }
  int max_answer_chars(int difficulty) const override { return difficulty + 1; }
};

class CountChar final : public TaskFamily {
 public:
  std::string_view name() const override { return "count"; }
  std::string_view description() const override {
    return "count a letter: 'count a abca' -> '2'; difficulty d: d+3 letters from the first 2+(d-1)/2 of the "
           "alphabet";
  }
  std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const override {
    Rng rng = task_rng(name(), difficulty, seed);
    const int letters = 2 + (difficulty - 1) / 2;
    const char target = static_cast<char>('a' + rng.between(0, letters - 1));
    std::string s;
    int count = 0;
    for (int i = 0; i < difficulty + 3; ++i) {
      s += static_cast<char>('a' + rng.between(0, letters - 1));
      count += s.back() == target;
    }
    return {std::string("count ") + target + " " + s, std::to_string(count)};
  }
  int max_answer_chars(int difficulty) const override { return difficulty + 3 >= 10 ? 2 : 1; }
};

class BaseConversion final : public TaskFamily {
 public:
  std::string_view name() const override { return "base"; }
  std::string_view description() const override {
    return "write a decimal number in a small base: 'base2 5' -> '101'; difficulty d: bases 2..min(d+1, 9), "
           "answers of d+1 digits";
  }
  std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const override {
    Rng rng = task_rng(name(), difficulty, seed);
    const int base = static_cast<int>(rng.between(2, std::min(difficulty + 1, 9)));
    const int64_t value = rng.between(ipow(base, difficulty), ipow(base, difficulty + 1) - 1);
    return {"base" + std::to_string(base) + " " + std::to_string(value), to_base(value, base)};
  }
  int max_answer_chars(int difficulty) const override { return difficulty + 1; }
};

class Addition final : public TaskFamily {
 public:
  std::string_view name() const override { return "add"; }
  std::string_view description() const override {
    return "add two numbers: '23+45' -> '68'; difficulty d: d-digit operands";
  }
  std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const override {
    Rng rng = task_rng(name(), difficulty, seed);
    const int64_t lo = difficulty == 1 ? 0 : ipow(10, difficulty - 1), hi = ipow(10, difficulty) - 1;
    const int64_t a = rng.between(lo, hi), b = rng.between(lo, hi);
    return {std::to_string(a) + "+" + std::to_string(b), std::to_string(a + b)};
  }
  int max_answer_chars(int difficulty) const override { return difficulty + 1; }
};

std::string known_families() {
  std::string s;
  for (const auto* f : all_families()) s += (s.empty() ? "" : ", ") + std::string(f->name());
  return s;
}

void check_difficulty(int difficulty) {
  if (difficulty < kMinDifficulty || difficulty > kMaxDifficulty)
    throw std::invalid_argument("task difficulty " + std::to_string(difficulty) + " is out of range [" +
                                std::to_string(kMinDifficulty) + ", " + std::to_string(kMaxDifficulty) + "]");
}

template <class T>
bool parse_number(std::string_view s, T& out) {
  if (s.empty()) return false;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

// Character kinds for the SHAPED partial credit.
constexpr int kCharKinds = 5;
int char_kind(char ch) {
  const auto c = static_cast<unsigned char>(ch);
  if (std::isdigit(c)) return 0;
  if (std::islower(c)) return 1;
  if (std::isupper(c)) return 2;
  if (std::isspace(c)) return 3;
  return 4;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

PartialCredit parse_partial_credit(std::string_view name) {
  if (name == "none") return PartialCredit::NONE;
  if (name == "position") return PartialCredit::POSITION;
  if (name == "prefix") return PartialCredit::PREFIX;
  if (name == "shaped") return PartialCredit::SHAPED;
  throw std::invalid_argument("unknown partial credit '" + std::string(name) +
                              "' (none, position, prefix, shaped)");
}

const char* partial_credit_name(PartialCredit p) {
  switch (p) {
    case PartialCredit::NONE:
      return "none";
    case PartialCredit::POSITION:
      return "position";
    case PartialCredit::PREFIX:
      return "prefix";
    case PartialCredit::SHAPED:
      return "shaped";
  }
  return "?";
}

const std::vector<const TaskFamily*>& all_families() {
  static const SortDigits sort;
  static const ReverseString reverse;
  static const CountChar count;
  static const BaseConversion base;
  static const Addition add;
  static const std::vector<const TaskFamily*> families = {&sort, &reverse, &count, &base, &add};
  return families;
}

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const auto* f : all_families()) names.emplace_back(f->name());
  return names;
}

const TaskFamily& family(std::string_view name) {
  for (const auto* f : all_families())
    if (f->name() == name) return *f;
  throw std::invalid_argument("unknown task family '" + std::string(name) + "' (known: " + known_families() +
                              ")");
}

std::string task_id(std::string_view family_name, int difficulty, uint64_t seed) {
  return std::string(family_name) + "-d" + std::to_string(difficulty) + "-s" + std::to_string(seed);
}

TaskInstance make_task(std::string_view family_name, int difficulty, uint64_t seed) {
  const TaskFamily& f = family(family_name);
  check_difficulty(difficulty);
  TaskInstance t;
  t.family = std::string(f.name());
  t.difficulty = difficulty;
  t.seed = seed;
  t.id = task_id(t.family, difficulty, seed);
  std::tie(t.prompt, t.answer) = f.generate(difficulty, seed);
  return t;
}

TaskInstance task_from_id(std::string_view id) {
  const auto bad = [&](const std::string& why) {
    return std::invalid_argument("malformed task id '" + std::string(id) + "': " + why +
                                 " (expected <family>-d<difficulty>-s<seed>, e.g. sort-d3-s7)");
  };
  const size_t d = id.find("-d");
  if (d == std::string_view::npos) throw bad("no '-d'");
  const size_t s = id.find("-s", d + 2);
  if (s == std::string_view::npos) throw bad("no '-s'");
  int difficulty = 0;
  uint64_t seed = 0;
  if (!parse_number(id.substr(d + 2, s - d - 2), difficulty)) throw bad("difficulty is not a number");
  if (!parse_number(id.substr(s + 2), seed)) throw bad("seed is not a number");
  return make_task(id.substr(0, d), difficulty, seed);
}

std::string normalize_reply(std::string_view reply) { return trim(reply); }

double similarity(std::string_view answer, std::string_view reply, PartialCredit partial) {
  if (reply == answer) return 1.0;
  const size_t longest = std::max(answer.size(), reply.size());
  const size_t common = std::min(answer.size(), reply.size());
  const auto share = [&](size_t n) { return static_cast<double>(n) / static_cast<double>(longest); };
  size_t hits = 0;
  switch (partial) {
    case PartialCredit::NONE:
      return 0.0;
    case PartialCredit::POSITION:
    case PartialCredit::SHAPED:
      for (size_t i = 0; i < common; ++i) hits += answer[i] == reply[i];
      break;
    case PartialCredit::PREFIX:
      while (hits < common && answer[hits] == reply[hits]) ++hits;
      break;
  }
  // Not exact, so hits < longest: every term below stays under 1 and so does the result.
  if (partial != PartialCredit::SHAPED) return share(hits);
  if (reply.empty()) return 0.0;
  bool kinds[kCharKinds] = {};
  int available[256] = {};
  for (char c : answer) {
    kinds[char_kind(c)] = true;
    ++available[static_cast<unsigned char>(c)];
  }
  size_t right_kind = 0, right_chars = 0;
  for (char c : reply) {
    right_kind += kinds[char_kind(c)];
    if (available[static_cast<unsigned char>(c)] > 0)
      --available[static_cast<unsigned char>(c)], ++right_chars;
  }
  const double length = share(common);  // 1 - |len difference| / longest
  return 0.5 * share(hits) + 0.2 * share(right_chars) + 0.15 * share(right_kind) + 0.15 * length;
}

double score(const TaskInstance& task, std::string_view reply, const RewardOptions& options) {
  const std::string r = normalize_reply(reply);
  if (r == task.answer) return 1.0;
  const double w = std::clamp(options.partial_weight, 0.0, 1.0);
  return w * similarity(task.answer, r, options.partial);
}

bool is_exact(const TaskInstance& task, std::string_view reply) {
  return normalize_reply(reply) == task.answer;
}

// ------------------------------------------------------------------ TaskMix

TaskMix TaskMix::parse(std::string_view spec) {
  TaskMix mix;
  const std::string s = trim(spec);
  if (s.empty()) throw std::invalid_argument("empty task mix (e.g. 'sort,reverse' or 'sort:2,add:1')");
  if (s == "all") {
    for (const auto& name : family_names()) mix.entries_.emplace_back(name, 1.0);
  } else {
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t comma = s.find(',', pos);
      if (comma == std::string::npos) comma = s.size();
      const std::string item = trim(std::string_view(s).substr(pos, comma - pos));
      pos = comma + 1;
      if (item.empty()) throw std::invalid_argument("task mix '" + s + "' has an empty entry");
      std::string name = item;
      double weight = 1.0;
      if (const size_t colon = item.find(':'); colon != std::string::npos) {
        name = trim(std::string_view(item).substr(0, colon));
        const std::string w = trim(std::string_view(item).substr(colon + 1));
        char* end = nullptr;
        weight = std::strtod(w.c_str(), &end);
        if (w.empty() || end != w.c_str() + w.size() || !std::isfinite(weight) || weight <= 0)
          throw std::invalid_argument("task mix entry '" + item + "': the weight must be a positive number");
      }
      family(name);  // throws for an unknown name
      for (const auto& [seen, unused] : mix.entries_)
        if (seen == name) throw std::invalid_argument("task mix '" + s + "' lists '" + name + "' twice");
      mix.entries_.emplace_back(name, weight);
    }
  }
  for (const auto& [name, w] : mix.entries_) mix.total_ += w;
  return mix;
}

std::vector<std::string> TaskMix::families() const {
  std::vector<std::string> out;
  for (const auto& [name, w] : entries_) out.push_back(name);
  return out;
}

const std::string& TaskMix::pick(double u) const {
  double acc = 0;
  for (const auto& [name, w] : entries_) {
    acc += w / total_;
    if (u < acc) return name;
  }
  return entries_.back().first;  // u close to 1 and rounding
}

TaskInstance TaskMix::sample(int difficulty, uint64_t seed) const {
  uint64_t state = seed ^ 0x5bd1e9955bd1e995ull;
  const double u = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
  return make_task(pick(u), difficulty, seed);
}

std::string TaskMix::to_string() const {
  std::string s;
  for (const auto& [name, w] : entries_) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", w);
    s += (s.empty() ? "" : ",") + name + ":" + buf;
  }
  return s;
}

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t state = seed;
  uint64_t h = splitmix64(state);
  state = h ^ a;
  h = splitmix64(state);
  state = h ^ b;
  return splitmix64(state);
}

}  // namespace swarm::tasks
