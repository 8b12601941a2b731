// Byte-level context-free grammars and an incremental matcher for constrained decoding
//. No torch, no HTTP.
//
// A Grammar is a set of rules; a rule is a list of alternatives; an alternative is a sequence
// of elements: a byte range, a reference to a rule, or one specific token id (a special token
// such as Qwen's <tool_call>, which must be generated as that token, not spelled out).
// Grammars are built by code (json_schema_grammar.hpp), never parsed from text. Rules must
// not be left-recursive (the matcher would not terminate expanding them); repetition is
// written right-recursively.
//
// The Matcher follows a set of parse stacks (a pushdown automaton run on every alternative at
// once). Stacks are hash-consed in the matcher's arena, so equal stacks are one id: sets of
// stacks are small sorted id vectors, comparable and cacheable. Advancing a set by one byte is
// memoised per (stack, byte), so checking every token of a vocabulary against the current
// state (TokenMasker) costs a trie walk over cached transitions.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace swarm::grammar {

struct Element {
  enum Kind : uint8_t { BYTES, RULE, TOKEN, END };
  Kind kind = END;
  uint8_t lo = 0, hi = 0;  // BYTES: the inclusive range
  uint32_t ref = 0;        // RULE: rule id; TOKEN: token id
  static Element bytes(uint8_t lo, uint8_t hi) { return {BYTES, lo, hi, 0}; }
  static Element byte(uint8_t b) { return {BYTES, b, b, 0}; }
  static Element rule(uint32_t id) { return {RULE, 0, 0, id}; }
  static Element token(uint32_t id) { return {TOKEN, 0, 0, id}; }
};

class Grammar {
 public:
  /// A new rule without alternatives (add them before matching).
  uint32_t add_rule(std::string name = "");
  /// Appends an alternative: the sequence of elements (possibly empty: ε).
  void add_alternative(uint32_t rule, const std::vector<Element>& sequence);
  /// Convenience: a rule with the given alternatives.
  uint32_t rule_of(const std::vector<std::vector<Element>>& alternatives, std::string name = "");
  void set_root(uint32_t rule) { root_ = rule; }

  uint32_t root() const { return root_; }
  size_t num_rules() const { return rules_.size(); }
  size_t num_elements() const { return elements_.size(); }
  const Element& element(uint32_t pos) const { return elements_[pos]; }
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rules_[rule]; }
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  /// Throws std::invalid_argument for a rule without alternatives or a dangling reference.
  void validate() const;
  /// Estimated heap bytes of the tables (elements, rules, names): what a cache of compiled
  /// grammars charges for it.
  size_t memory_bytes() const;

  /// The elements of a literal byte string.
  static std::vector<Element> literal(std::string_view text);

  /// A compact binary form of the rules (names, alternatives, root), for sending a compiled
  /// grammar to another process (the serving ranks: dist/serve_link.hpp).
  std::string serialize() const;
  /// The grammar serialize() wrote, rebuilt rule by rule and validated; throws
  /// std::invalid_argument for a truncated or inconsistent buffer.
  static Grammar deserialize(std::string_view bytes);

 private:
  std::vector<Element> elements_;             // every alternative's sequence, each ending with END
  std::vector<std::vector<uint32_t>> rules_;  // rule -> start position of each alternative
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

/// The state of one constrained sequence. Not thread-safe; one per sequence (copyable: a copy
/// shares nothing).
class Matcher {
 public:
  explicit Matcher(const Grammar& grammar);

  /// A state: sorted, unique stack ids (stack 0 is the empty stack: the grammar is complete).
  using State = std::vector<uint32_t>;

  const State& state() const { return state_; }
  void set_state(State s) { state_ = std::move(s); }
  /// False once no stack is left (the input so far is not a prefix of the language).
  bool alive() const { return !state_.empty(); }
  /// The input so far is a whole sentence of the grammar.
  bool accepting() const { return !state_.empty() && state_.front() == 0; }
  /// No byte or token can follow (only end of output).
  bool finished() const { return state_.size() == 1 && state_.front() == 0; }

  /// The state after `b` (empty when `b` is not allowed).
  State advance(const State& s, uint8_t b);
  /// The stacks one stack becomes after byte `b` (memoised; the reference stays valid).
  const State& step(uint32_t stack, uint8_t b);
  /// The state after the token `id` when it is a TOKEN element of the grammar (empty if not).
  State advance_token(const State& s, uint32_t id);
  /// Advances this matcher's state; returns false (state unchanged) when not allowed.
  bool feed_byte(uint8_t b);
  bool feed_bytes(std::string_view bytes);
  bool feed_token(uint32_t id);
  /// TOKEN elements that may come next.
  std::vector<uint32_t> allowed_special_tokens(const State& s) const;

  /// States as ids (a lazily built DFA over the stack sets): equal states are one id, id 0 is
  /// the dead (empty) state, and a byte step between ids is one table lookup once computed.
  using StateId = uint32_t;
  StateId state_id(const State& s);
  const State& state_of(StateId id) const { return sets_[id]; }
  /// The state after byte `b` (memoised per id and byte; 0 when `b` is not allowed).
  StateId step_id(StateId id, uint8_t b) {
    const int32_t block = set_block_[id];
    if (block >= 0) {
      const uint32_t next = set_blocks_[static_cast<size_t>(block)][b];
      if (next != kUnknown) return next;
    }
    return step_id_slow(id, b);
  }

  /// Parse stacks plus interned states: what bounds this matcher's memory.
  size_t arena_size() const { return nodes_.size() + sets_.size(); }
  /// Estimated heap bytes of the arena and its memoised transition tables (constant time).
  size_t memory_bytes() const;

  // Local views of stacks, for masks that are shared between contexts (TokenMasker): the top
  // `depth` frames of a stack over a placeholder bottom, the hole. A run of the local stack
  // mirrors the real one until it pops into the hole, where the real run goes on in the frames
  // below (`below`). The hole is a stack of its own: it matches no byte and no token, and it
  // is never the empty stack, so a state holding it is alive.
  struct Local {
    uint32_t stack = 0;  // the truncated stack (the stack itself when it is shallower)
    uint32_t below = 0;  // what the hole stands for; kNoBelow when nothing was cut
  };
  static constexpr uint32_t kNoBelow = 0xffffffffu;
  Local local_view(uint32_t stack, int depth);
  uint32_t hole() const { return hole_; }
  /// The bytes the stack can match first (after expanding its rule references): a 256-bit set.
  std::array<uint64_t, 4> first_bytes(uint32_t stack);
  /// The element on top of a stack (END for the empty stack and the hole).
  const Element& top(uint32_t stack) const {
    static const Element kEnd{};
    return stack == 0 || stack == hole_ ? kEnd : g_->element(nodes_[stack].pos);
  }

 private:
  struct Node {
    uint32_t parent;  // stack below (0 = bottom)
    uint32_t pos;     // element position to match next
  };
  uint32_t intern(uint32_t parent, uint32_t pos);
  // Expands a stack until its top is a terminal (BYTES / TOKEN) or it is empty; appends results.
  void expand(uint32_t stack, std::vector<uint32_t>& out, int depth);
  // The stack with its top element consumed.
  void consume(uint32_t stack, std::vector<uint32_t>& out);
  static void normalize(State& s);
  StateId step_id_slow(StateId id, uint8_t b);
  static constexpr uint32_t kUnknown = 0xffffffffu;
  struct SetHash {
    size_t operator()(const State& s) const noexcept;
  };

  const Grammar* g_;
  uint32_t hole_ = 0;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, uint32_t> index_;
  // step(stack, byte) memo: a stack stepped at least once has a block of 256 indices into
  // step_results_ (-1: not computed yet); a deque, so references to results stay valid.
  std::vector<int32_t> block_of_;  // per stack, -1 = none
  std::vector<std::array<int32_t, 256>> blocks_;
  std::deque<State> step_results_;
  // Interned states (deque: references stay valid) and their per-byte transitions.
  std::deque<State> sets_;
  std::unordered_map<State, StateId, SetHash> set_index_;
  std::vector<int32_t> set_block_;  // per state id, -1 = none
  std::vector<std::array<uint32_t, 256>> set_blocks_;
  size_t state_words_ = 0;  // stack ids held by step_results_, sets_ and set_index_ (memory_bytes)
  State state_;
};

}  // namespace swarm::grammar
