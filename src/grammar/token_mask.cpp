#include "grammar/token_mask.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace swarm::grammar {

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& special)
    : vocab_size_(token_bytes.size()) {
  if (special.size() != token_bytes.size()) throw std::invalid_argument("TokenTrie: special[] size differs");
  std::vector<uint32_t> order;
  for (uint32_t id = 0; id < token_bytes.size(); ++id)
    if (!special[id] && !token_bytes[id].empty()) order.push_back(id);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) { return token_bytes[a] < token_bytes[b]; });
  // Build with per-node child maps first, then flatten breadth-first.
  struct Build {
    std::vector<std::pair<uint8_t, uint32_t>> kids;
    std::vector<uint32_t> ids;
  };
  std::vector<Build> b(1);
  for (uint32_t id : order) {
    uint32_t n = 0;
    for (unsigned char c : token_bytes[id]) {
      auto& kids = b[n].kids;
      if (!kids.empty() && kids.back().first == c) {
        n = kids.back().second;  // sorted input: a shared prefix is always the last child
      } else {
        const uint32_t child = static_cast<uint32_t>(b.size());
        kids.emplace_back(c, child);
        b.emplace_back();
        n = child;
      }
    }
    b[n].ids.push_back(id);
    max_depth_ = std::max(max_depth_, token_bytes[id].size());
  }
  nodes_.resize(b.size());
  for (size_t n = 0; n < b.size(); ++n) {
    Node& node = nodes_[n];
    node.first_child = static_cast<uint32_t>(children_.size());
    node.num_children = static_cast<uint32_t>(b[n].kids.size());
    for (const auto& [c, child] : b[n].kids) children_.push_back({c, child});
    node.first_token = static_cast<uint32_t>(tokens_.size());
    node.num_tokens = static_cast<uint32_t>(b[n].ids.size());
    tokens_.insert(tokens_.end(), b[n].ids.begin(), b[n].ids.end());
  }
}

size_t TokenMasker::StateHash::operator()(const Matcher::State& s) const noexcept {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t v : s) h = (h ^ v) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

TokenMasker::TokenMasker(std::shared_ptr<const TokenTrie> trie, std::vector<uint32_t> eos_ids, size_t cache_entries)
    : trie_(std::move(trie)), eos_ids_(std::move(eos_ids)), cache_entries_(std::max<size_t>(1, cache_entries)) {
  for (uint32_t id : eos_ids_)
    if (id >= trie_->vocab_size()) throw std::invalid_argument("TokenMasker: eos id beyond the vocabulary");
}

const TokenMask& TokenMasker::allowed(Matcher& matcher, const Matcher::State& state) {
  if (auto it = index_.find(state); it != index_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second->second;
  }
  ++misses_;
  TokenMask mask((trie_->vocab_size() + 63) / 64, 0);
  compute(matcher, state, mask);
  if (index_.size() >= cache_entries_) {
    index_.erase(lru_.back().first);
    lru_.pop_back();
  }
  lru_.emplace_front(state, std::move(mask));
  index_.emplace(lru_.front().first, lru_.begin());
  return lru_.front().second;
}

void TokenMasker::compute(Matcher& matcher, const Matcher::State& state, TokenMask& out) {
  const auto set = [&out](uint32_t id) { out[id >> 6] |= uint64_t{1} << (id & 63); };
  const bool accepting = !state.empty() && state.front() == 0;
  if (accepting)
    for (uint32_t id : eos_ids_) set(id);
  for (uint32_t id : matcher.allowed_special_tokens(state))
    if (id < trie_->vocab_size()) set(id);
  if (accepting && state.size() == 1) return;  // finished: nothing can follow
  // Depth-first over the trie. cur[d] is the state after d bytes: a memoised step result when
  // the state before was one stack (no copy), else a union built in scratch_[d].
  struct Frame {
    uint32_t node;
    uint32_t next_child;
  };
  std::vector<const Matcher::State*> cur{&state};
  // Sized once: cur[] points into these buffers, so they must not move while walking.
  if (scratch_.size() < trie_->max_depth() + 2) scratch_.resize(trie_->max_depth() + 2);
  std::vector<Frame> stack{{0, 0}};
  while (!stack.empty()) {
    Frame& f = stack.back();
    const TokenTrie::Node& node = trie_->nodes_[f.node];
    const size_t depth = stack.size() - 1;
    if (f.next_child == node.num_children) {
      stack.pop_back();
      cur.pop_back();
      continue;
    }
    const TokenTrie::Child& c = trie_->children_[node.first_child + f.next_child++];
    const Matcher::State& from = *cur[depth];
    const Matcher::State* next;
    if (from.size() == 1) {
      next = &matcher.step(from[0], c.byte);
    } else {
      Matcher::State& buf = scratch_[depth + 1];
      buf.clear();
      for (uint32_t st : from) {
        const Matcher::State& part = matcher.step(st, c.byte);
        buf.insert(buf.end(), part.begin(), part.end());
      }
      std::sort(buf.begin(), buf.end());
      buf.erase(std::unique(buf.begin(), buf.end()), buf.end());
      next = &buf;
    }
    if (next->empty()) continue;
    const TokenTrie::Node& child = trie_->nodes_[c.node];
    for (uint32_t k = 0; k < child.num_tokens; ++k) set(trie_->tokens_[child.first_token + k]);
    if (child.num_children) {
      stack.push_back({c.node, 0});
      cur.push_back(next);
    }
  }
}

}  // namespace swarm::grammar
