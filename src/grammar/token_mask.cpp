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
  // Sorted byte strings give the nodes in preorder as they are created: a new node is always
  // a child of the current path, and a shared prefix is always the last child made.
  struct Build {
    uint32_t parent;
    uint8_t byte;
    uint16_t depth;
    uint32_t last_child = 0;  // 0 = none
    std::vector<uint32_t> ids;
  };
  std::vector<Build> b(1, Build{0, 0, 0, 0, {}});
  for (uint32_t id : order) {
    uint32_t n = 0;
    for (unsigned char c : token_bytes[id]) {
      const uint32_t last = b[n].last_child;
      if (last != 0 && b[last].byte == c) {
        n = last;
      } else {
        const uint32_t child = static_cast<uint32_t>(b.size());
        b.push_back(Build{n, c, static_cast<uint16_t>(b[n].depth + 1), 0, {}});
        b[n].last_child = child;
        n = child;
      }
    }
    b[n].ids.push_back(id);
    max_depth_ = std::max(max_depth_, token_bytes[id].size());
  }
  nodes_.resize(b.size());
  for (size_t n = 0; n < b.size(); ++n) {
    Node& node = nodes_[n];
    node.end = static_cast<uint32_t>(n + 1);
    node.byte = b[n].byte;
    node.depth = b[n].depth;
    node.first_token = static_cast<uint32_t>(tokens_.size());
    node.num_tokens = static_cast<uint32_t>(b[n].ids.size());
    tokens_.insert(tokens_.end(), b[n].ids.begin(), b[n].ids.end());
  }
  for (size_t n = b.size(); n-- > 1;)  // children come after their parent: fold ends upwards
    nodes_[b[n].parent].end = std::max(nodes_[b[n].parent].end, nodes_[n].end);
}

TokenMasker::TokenMasker(std::shared_ptr<const TokenTrie> trie, std::vector<uint32_t> eos_ids, size_t cache_entries)
    : trie_(std::move(trie)), eos_ids_(std::move(eos_ids)), cache_entries_(std::max<size_t>(1, cache_entries)) {
  for (uint32_t id : eos_ids_)
    if (id >= trie_->vocab_size()) throw std::invalid_argument("TokenMasker: eos id beyond the vocabulary");
}

const TokenMask& TokenMasker::allowed(Matcher& matcher, Matcher::StateId state) {
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
  index_.emplace(state, lru_.begin());
  return lru_.front().second;
}

void TokenMasker::compute(Matcher& matcher, Matcher::StateId state_id, TokenMask& out) {
  const auto set = [&out](uint32_t id) { out[id >> 6] |= uint64_t{1} << (id & 63); };
  const Matcher::State& state = matcher.state_of(state_id);
  const bool accepting = !state.empty() && state.front() == 0;
  if (accepting)
    for (uint32_t id : eos_ids_) set(id);
  for (uint32_t id : matcher.allowed_special_tokens(state))
    if (id < trie_->vocab_size()) set(id);
  if (accepting && state.size() == 1) return;  // finished: nothing can follow
  // A preorder scan; cur_[d] is the state after the d bytes leading to the node. A step is a
  // lookup in the matcher's memoised transitions between state ids (0: refused).
  cur_.assign(trie_->max_depth() + 2, 0);
  cur_[0] = state_id;
  const TokenTrie::Node* nodes = trie_->nodes_.data();
  const uint32_t* tokens = trie_->tokens_.data();
  const uint32_t n = static_cast<uint32_t>(trie_->nodes_.size());
  for (uint32_t i = 1; i < n;) {
    const TokenTrie::Node& node = nodes[i];
    const Matcher::StateId next = matcher.step_id(cur_[node.depth - 1u], node.byte);
    if (next == 0) {
      i = node.end;  // nothing below can match either
      continue;
    }
    for (uint32_t k = 0; k < node.num_tokens; ++k) set(tokens[node.first_token + k]);
    cur_[node.depth] = next;
    ++i;
  }
}

}  // namespace swarm::grammar
