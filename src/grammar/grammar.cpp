#include "grammar/grammar.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace swarm::grammar {

uint32_t Grammar::add_rule(std::string name) {
  rules_.emplace_back();
  names_.push_back(name.empty() ? "r" + std::to_string(rules_.size() - 1) : std::move(name));
  return static_cast<uint32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(uint32_t rule, const std::vector<Element>& sequence) {
  if (rule >= rules_.size()) throw std::invalid_argument("grammar: no rule " + std::to_string(rule));
  rules_[rule].push_back(static_cast<uint32_t>(elements_.size()));
  for (const Element& e : sequence) {
    if (e.kind == Element::END) throw std::invalid_argument("grammar: END inside a sequence");
    elements_.push_back(e);
  }
  elements_.push_back(Element{});
}

uint32_t Grammar::rule_of(const std::vector<std::vector<Element>>& alternatives, std::string name) {
  const uint32_t r = add_rule(std::move(name));
  for (const auto& alt : alternatives) add_alternative(r, alt);
  return r;
}

void Grammar::validate() const {
  if (root_ >= rules_.size()) throw std::invalid_argument("grammar: no root rule");
  for (size_t r = 0; r < rules_.size(); ++r)
    if (rules_[r].empty())
      throw std::invalid_argument("grammar: rule '" + names_[r] + "' has no alternatives");
  for (const Element& e : elements_) {
    if (e.kind == Element::RULE && e.ref >= rules_.size())
      throw std::invalid_argument("grammar: reference to rule " + std::to_string(e.ref) +
                                  " that does not exist");
    if (e.kind == Element::BYTES && e.lo > e.hi) throw std::invalid_argument("grammar: empty byte range");
  }
}

size_t Grammar::memory_bytes() const {
  size_t bytes = elements_.capacity() * sizeof(Element) +
                 rules_.capacity() * sizeof(decltype(rules_)::value_type) +
                 names_.capacity() * sizeof(std::string);
  for (const auto& alts : rules_) bytes += alts.capacity() * sizeof(uint32_t);
  for (const std::string& name : names_)
    if (name.capacity() >= sizeof(std::string)) bytes += name.capacity() + 1;  // beyond the inline buffer
  return bytes;
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

struct ByteReader {
  std::string_view in;
  size_t pos = 0;
  uint8_t u8() {
    if (pos >= in.size()) throw std::invalid_argument("grammar: truncated serialized grammar");
    return static_cast<uint8_t>(in[pos++]);
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  // A count of items of at least `min_bytes` each: never more than the bytes left could hold.
  uint32_t count(size_t min_bytes) {
    const uint32_t n = u32();
    if (static_cast<uint64_t>(n) * min_bytes > in.size() - pos)
      throw std::invalid_argument("grammar: serialized grammar claims more than it holds");
    return n;
  }
};

}  // namespace

// Layout (little-endian u32s): rules, root; per rule: name length, name, alternatives; per
// alternative: elements; per element: kind, lo, hi (u8 each), ref.
std::string Grammar::serialize() const {
  std::string out;
  put_u32(out, static_cast<uint32_t>(rules_.size()));
  put_u32(out, root_);
  for (size_t r = 0; r < rules_.size(); ++r) {
    put_u32(out, static_cast<uint32_t>(names_[r].size()));
    out += names_[r];
    put_u32(out, static_cast<uint32_t>(rules_[r].size()));
    for (uint32_t start : rules_[r]) {
      uint32_t end = start;
      while (elements_[end].kind != Element::END) ++end;
      put_u32(out, end - start);
      for (uint32_t i = start; i < end; ++i) {
        const Element& e = elements_[i];
        out += static_cast<char>(e.kind);
        out += static_cast<char>(e.lo);
        out += static_cast<char>(e.hi);
        put_u32(out, e.ref);
      }
    }
  }
  return out;
}

Grammar Grammar::deserialize(std::string_view bytes) {
  ByteReader in{bytes};
  Grammar g;
  const uint32_t rules = in.count(8);
  const uint32_t root = in.u32();
  for (uint32_t r = 0; r < rules; ++r) g.add_rule();
  for (uint32_t r = 0; r < rules; ++r) {
    const uint32_t name_length = in.count(1);
    g.names_[r] = std::string(in.in.substr(in.pos, name_length));
    in.pos += name_length;
    const uint32_t alternatives = in.count(4);
    for (uint32_t a = 0; a < alternatives; ++a) {
      std::vector<Element> seq(in.count(7));
      for (Element& e : seq) {
        const uint8_t kind = in.u8();
        if (kind >= Element::END) throw std::invalid_argument("grammar: serialized element of unknown kind");
        e.kind = static_cast<Element::Kind>(kind);
        e.lo = in.u8();
        e.hi = in.u8();
        e.ref = in.u32();
      }
      g.add_alternative(r, seq);
    }
  }
  if (in.pos != bytes.size())
    throw std::invalid_argument("grammar: trailing bytes after a serialized grammar");
  g.set_root(root);
  g.validate();
  return g;
}

std::vector<Element> Grammar::literal(std::string_view text) {
  std::vector<Element> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(Element::byte(c));
  return out;
}

// ---------------------------------------------------------------------------------- Matcher

namespace {
constexpr uint32_t kNoPos = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kHolePos = kNoPos - 1;
constexpr int kMaxExpandDepth = 4096;  // deeper means a left-recursive (broken) grammar
}  // namespace

Matcher::Matcher(const Grammar& grammar) : g_(&grammar) {
  grammar.validate();
  nodes_.push_back({0, kNoPos});  // 0: the empty stack
  hole_ = intern(0, kHolePos);
  state_id(State{});  // state id 0: dead
  State init;
  for (uint32_t alt : g_->alternatives(g_->root())) expand(intern(0, alt), init, 0);
  normalize(init);
  state_ = std::move(init);
}

uint32_t Matcher::intern(uint32_t parent, uint32_t pos) {
  const uint64_t key = (static_cast<uint64_t>(parent) << 32) | pos;
  auto [it, inserted] = index_.try_emplace(key, static_cast<uint32_t>(nodes_.size()));
  if (inserted) nodes_.push_back({parent, pos});
  return it->second;
}

void Matcher::expand(uint32_t stack, std::vector<uint32_t>& out, int depth) {
  if (depth > kMaxExpandDepth) throw std::logic_error("grammar: left recursion (expansion too deep)");
  while (stack != 0) {
    if (stack == hole_) {  // a local stack popped into its hole: it stays there
      out.push_back(stack);
      return;
    }
    const Node n = nodes_[stack];
    const Element& e = g_->element(n.pos);
    if (e.kind == Element::END) {  // an empty alternative, or the end of one: continue below
      stack = n.parent;
      continue;
    }
    if (e.kind != Element::RULE) {
      out.push_back(stack);
      return;
    }
    // Replace the reference by its continuation, then push each alternative of the rule.
    const uint32_t cont =
        g_->element(n.pos + 1).kind == Element::END ? n.parent : intern(n.parent, n.pos + 1);
    for (uint32_t alt : g_->alternatives(e.ref)) expand(intern(cont, alt), out, depth + 1);
    return;
  }
  out.push_back(0);
}

void Matcher::consume(uint32_t stack, std::vector<uint32_t>& out) {
  const Node n = nodes_[stack];
  const uint32_t next = n.pos + 1;
  expand(g_->element(next).kind == Element::END ? n.parent : intern(n.parent, next), out, 0);
}

void Matcher::normalize(State& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

const Matcher::State& Matcher::step(uint32_t stack, uint8_t b) {
  static const State kNone;
  if (stack == 0 || stack == hole_) return kNone;
  const Element& e = g_->element(nodes_[stack].pos);
  if (e.kind != Element::BYTES || b < e.lo || b > e.hi) return kNone;  // the common case in a trie walk
  if (block_of_.size() <= stack) block_of_.resize(nodes_.size(), -1);
  if (block_of_[stack] < 0) {
    blocks_.emplace_back();
    blocks_.back().fill(-1);
    block_of_[stack] = static_cast<int32_t>(blocks_.size() - 1);
  }
  const size_t block = static_cast<size_t>(block_of_[stack]);
  int32_t index = blocks_[block][b];
  if (index < 0) {
    State next;
    consume(stack, next);  // may intern stacks (block_of_ is grown on their first step)
    normalize(next);
    state_words_ += next.capacity();
    step_results_.push_back(std::move(next));
    index = static_cast<int32_t>(step_results_.size() - 1);
    blocks_[block][b] = index;
  }
  return step_results_[static_cast<size_t>(index)];
}

Matcher::State Matcher::advance(const State& s, uint8_t b) {
  if (s.size() == 1) return step(s[0], b);
  State out;
  for (uint32_t stack : s) {
    const State& next = step(stack, b);
    out.insert(out.end(), next.begin(), next.end());
  }
  normalize(out);
  return out;
}

Matcher::State Matcher::advance_token(const State& s, uint32_t id) {
  State out;
  for (uint32_t stack : s) {
    const Element& e = top(stack);
    if (e.kind == Element::TOKEN && e.ref == id) consume(stack, out);
  }
  normalize(out);
  return out;
}

bool Matcher::feed_byte(uint8_t b) {
  State next = advance(state_, b);
  if (next.empty()) return false;
  state_ = std::move(next);
  return true;
}

bool Matcher::feed_bytes(std::string_view bytes) {
  State s = state_;
  for (unsigned char c : bytes) {
    s = advance(s, c);
    if (s.empty()) return false;
  }
  state_ = std::move(s);
  return true;
}

bool Matcher::feed_token(uint32_t id) {
  State next = advance_token(state_, id);
  if (next.empty()) return false;
  state_ = std::move(next);
  return true;
}

size_t Matcher::SetHash::operator()(const State& s) const noexcept {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t v : s) h = (h ^ v) * 0x100000001b3ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

Matcher::StateId Matcher::state_id(const State& s) {
  auto [it, inserted] = set_index_.try_emplace(s, static_cast<StateId>(sets_.size()));
  if (inserted) {
    sets_.push_back(s);
    set_block_.push_back(-1);
    state_words_ += 2 * s.size();  // the state and its index key
  }
  return it->second;
}

size_t Matcher::memory_bytes() const {
  // Hash nodes: the value, a next pointer and the cached hash.
  constexpr size_t kHashNode = 2 * sizeof(void*);
  return nodes_.capacity() * sizeof(Node) +
         index_.size() * (sizeof(uint64_t) + sizeof(uint32_t) + kHashNode) +
         index_.bucket_count() * sizeof(void*) + block_of_.capacity() * sizeof(int32_t) +
         blocks_.capacity() * sizeof(blocks_[0]) + step_results_.size() * sizeof(State) +
         sets_.size() * sizeof(State) + set_index_.size() * (sizeof(State) + sizeof(StateId) + kHashNode) +
         set_index_.bucket_count() * sizeof(void*) + set_block_.capacity() * sizeof(int32_t) +
         set_blocks_.capacity() * sizeof(set_blocks_[0]) + state_words_ * sizeof(uint32_t);
}

Matcher::StateId Matcher::step_id_slow(StateId id, uint8_t b) {
  if (set_block_[id] < 0) {
    set_blocks_.emplace_back();
    set_blocks_.back().fill(kUnknown);
    set_block_[id] = static_cast<int32_t>(set_blocks_.size() - 1);
  }
  const StateId next = id == 0 ? 0 : state_id(advance(sets_[id], b));  // sets_ is a deque: stable
  set_blocks_[static_cast<size_t>(set_block_[id])][b] = next;
  return next;
}

std::vector<uint32_t> Matcher::allowed_special_tokens(const State& s) const {
  std::vector<uint32_t> out;
  for (uint32_t stack : s) {
    const Element& e = top(stack);
    if (e.kind == Element::TOKEN) out.push_back(e.ref);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

Matcher::Local Matcher::local_view(uint32_t stack, int depth) {
  std::array<uint32_t, 8> pos{};
  if (depth < 1 || depth > static_cast<int>(pos.size()))
    throw std::invalid_argument("local_view: depth 1..8");
  uint32_t s = stack;
  int kept = 0;
  for (; kept < depth && s != 0 && s != hole_; ++kept) {
    pos[static_cast<size_t>(kept)] = nodes_[s].pos;
    s = nodes_[s].parent;
  }
  if (s == 0 || s == hole_) return {stack, kNoBelow};  // nothing below to cut
  uint32_t local = hole_;
  for (int i = kept; i-- > 0;) local = intern(local, pos[static_cast<size_t>(i)]);
  return {local, s};
}

std::array<uint64_t, 4> Matcher::first_bytes(uint32_t stack) {
  std::array<uint64_t, 4> bits{};
  std::vector<uint32_t> tops;
  expand(stack, tops, 0);
  for (uint32_t t : tops) {
    const Element& e = top(t);
    if (e.kind != Element::BYTES) continue;
    for (unsigned b = e.lo; b <= e.hi; ++b) bits[b >> 6] |= uint64_t{1} << (b & 63);
  }
  return bits;
}

}  // namespace swarm::grammar
