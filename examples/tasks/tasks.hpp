// Procedurally generated, verifiable tasks for RL examples and learning tests, in the spirit of
// ReasoningGYM: every task is made from (family, difficulty, seed), so its id alone regenerates
// it, and a verifier scores a model's reply in [0, 1] without any model or network.
//
//   auto task = swarm::tasks::make_task("sort", /*difficulty=*/3, /*seed=*/7);
//   // task.prompt "sort 5092", task.answer "0259", task.id "sort-d3-s7"
//   double r = swarm::tasks::score(task, " 0259\n");  // 1.0
//
// Prompts and answers are kept short (a few characters): the intended model is a tiny
// character-level one with a small context. Nothing here needs libtorch or the network.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace swarm::tasks {

/// One generated task. A plain value type.
struct TaskInstance {
  std::string id;      // "<family>-d<difficulty>-s<seed>": task_from_id() regenerates the task
  std::string family;  // "sort", "reverse", "count", "base", "add"
  int difficulty = 1;  // 1 .. kMaxDifficulty
  uint64_t seed = 0;   // the generator seed
  std::string prompt;  // the user message, e.g. "sort 3141"
  std::string answer;  // the reference answer, e.g. "1134"
};

/// Difficulties every family accepts.
inline constexpr int kMinDifficulty = 1;
inline constexpr int kMaxDifficulty = 8;

/// How a reply that is not exactly the answer is scored.
enum class PartialCredit {
  NONE,      // 0 unless exact
  POSITION,  // share of answer characters matched at the same position, over max(len(reply), len(answer))
  PREFIX,    // length of the common prefix, over max(len(reply), len(answer))
  SHAPED,    // 0.5 x POSITION + 0.2 x right characters in any order (multiset overlap) + 0.15 x right
             // kind of characters (digit, lowercase, ...) + 0.15 x right length, each over
             // max(len(reply), len(answer)): a dense signal for a model that starts from random
             // weights (it first learns to answer with digits or letters of the right count, then
             // which ones, then their order)
};

/// Verifier settings. An exact reply always scores 1; any other reply scores
/// `partial_weight` × the partial-credit similarity (in [0, 1)), so partial credit never
/// reaches an exact answer's reward.
struct RewardOptions {
  PartialCredit partial = PartialCredit::POSITION;
  double partial_weight = 0.5;  // in [0, 1]
};

/// Parses "none", "position", "prefix" or "shaped"; throws std::invalid_argument otherwise.
PartialCredit parse_partial_credit(std::string_view name);
const char* partial_credit_name(PartialCredit p);

/// A task family: a seeded generator and a verifier. Implementations are stateless and
/// thread-safe.
class TaskFamily {
 public:
  virtual ~TaskFamily() = default;
  /// Short name used in ids and task mixes ("sort").
  virtual std::string_view name() const = 0;
  /// One line: what the task is and what difficulty controls.
  virtual std::string_view description() const = 0;
  /// Prompt and reference answer for (difficulty, seed); the same arguments always give the
  /// same task. `difficulty` must be in [kMinDifficulty, kMaxDifficulty].
  virtual std::pair<std::string, std::string> generate(int difficulty, uint64_t seed) const = 0;
  /// Longest reference answer at this difficulty, in characters (a max_tokens hint for a
  /// character-level model).
  virtual int max_answer_chars(int difficulty) const = 0;
};

/// Every family, in a stable order.
const std::vector<const TaskFamily*>& all_families();
/// The family names, in the order of all_families().
std::vector<std::string> family_names();
/// The family called `name`; throws std::invalid_argument naming the known families.
const TaskFamily& family(std::string_view name);

/// Generates a task; throws std::invalid_argument for an unknown family or a difficulty
/// out of range.
TaskInstance make_task(std::string_view family, int difficulty, uint64_t seed);
/// "sort-d3-s7" -> make_task("sort", 3, 7); throws std::invalid_argument if malformed.
TaskInstance task_from_id(std::string_view id);
/// The id make_task gives.
std::string task_id(std::string_view family, int difficulty, uint64_t seed);

/// The reply with leading and trailing whitespace removed: what the verifier compares.
std::string normalize_reply(std::string_view reply);
/// Similarity in [0, 1] of `reply` (already normalised) to `answer` under `partial`
/// (1 only for an exact match; NONE gives 0 or 1).
double similarity(std::string_view answer, std::string_view reply, PartialCredit partial);
/// The reward of a model reply, in [0, 1]: 1 for an exact answer (after trimming
/// whitespace), else partial credit as `options` says.
double score(const TaskInstance& task, std::string_view reply, const RewardOptions& options = {});
/// True if the trimmed reply is exactly the answer.
bool is_exact(const TaskInstance& task, std::string_view reply);

/// A weighted mix of families: "sort,reverse" (equal weights), "sort:2,add:1", or "all".
/// Not synchronised; const methods are safe to share.
class TaskMix {
 public:
  /// Throws std::invalid_argument naming the bad entry (unknown family, bad or non-positive
  /// weight, a family listed twice, an empty mix).
  static TaskMix parse(std::string_view spec);

  const std::vector<std::pair<std::string, double>>& entries() const { return entries_; }
  /// The families in mix order.
  std::vector<std::string> families() const;
  /// A family drawn by weight from `u` in [0, 1).
  const std::string& pick(double u) const;
  /// A deterministic task: family drawn by weight, then generated, all from `seed`.
  TaskInstance sample(int difficulty, uint64_t seed) const;
  /// "sort:1,add:1" form.
  std::string to_string() const;

 private:
  std::vector<std::pair<std::string, double>> entries_;
  double total_ = 0;
};

/// Mixes a 64-bit seed with more values (splitmix64): seeds for step/index streams.
uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b = 0);

}  // namespace swarm::tasks
