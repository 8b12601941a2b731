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
  std::sort(order.begin(), order.end(),
            [&](uint32_t a, uint32_t b) { return token_bytes[a] < token_bytes[b]; });
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
  parent_.resize(b.size());
  for (size_t n = 0; n < b.size(); ++n) parent_[n] = b[n].parent;
  for (size_t n = 1; n < b.size(); ++n)
    if (nodes_[n].depth >= 2) by_byte_[nodes_[n].byte].push_back(static_cast<uint32_t>(n));
  child_start_.fill(static_cast<uint32_t>(nodes_.size()));
  for (size_t n = nodes_.size(); n-- > 1;)  // root children come in increasing byte order
    if (nodes_[n].depth == 1)
      for (int c = nodes_[n].byte; c >= 0 && child_start_[static_cast<size_t>(c)] > n; --c)
        child_start_[static_cast<size_t>(c)] = static_cast<uint32_t>(n);
}

TokenMasker::TokenMasker(std::shared_ptr<const TokenTrie> trie, std::vector<uint32_t> eos_ids,
                         size_t cache_entries, size_t local_entries, size_t cache_bytes)
    : trie_(std::move(trie)),
      eos_ids_(std::move(eos_ids)),
      cache_(cache_entries, cache_bytes - cache_bytes / 3),
      local_cache_(local_entries, cache_bytes / 3) {
  for (uint32_t id : eos_ids_)
    if (id >= trie_->vocab_size()) throw std::invalid_argument("TokenMasker: eos id beyond the vocabulary");
}

std::shared_ptr<const TokenMask> TokenMasker::allowed_shared(Matcher& matcher, Matcher::StateId state) {
  if (auto cached = cache_.find(state)) {
    ++hits_;
    return cached;
  }
  ++misses_;
  auto mask = std::make_shared<TokenMask>((trie_->vocab_size() + 63) / 64, 0);
  compute(matcher, state, *mask);
  const size_t bytes = mask_bytes(*mask);
  return cache_.insert(state, std::move(mask), bytes);
}

size_t TokenMasker::memory_bytes() const {
  constexpr size_t kFirstBytesNode = sizeof(uint32_t) + sizeof(std::array<uint64_t, 4>) + 2 * sizeof(void*);
  return cached_bytes() + first_bytes_.size() * kFirstBytesNode +
         first_bytes_.bucket_count() * sizeof(void*) +
         (cur_.capacity() + candidates_.capacity() + path_nodes_.capacity() + path_states_.capacity()) *
             sizeof(uint32_t);
}

void TokenMasker::walk(Matcher& matcher, uint32_t from, uint32_t end, Matcher::StateId parent_state,
                       TokenMask& out) {
  // A preorder scan; cur_[d] is the state after the d bytes leading to the node. A step is a
  // lookup in the matcher's memoised transitions between state ids (0: refused).
  const TokenTrie::Node* nodes = trie_->nodes_.data();
  const uint32_t* tokens = trie_->tokens_.data();
  if (cur_.size() < trie_->max_depth() + 2) cur_.assign(trie_->max_depth() + 2, 0);
  cur_[nodes[from].depth - 1u] = parent_state;
  for (uint32_t i = from; i < end;) {
    const TokenTrie::Node& node = nodes[i];
    const Matcher::StateId next = matcher.step_id(cur_[node.depth - 1u], node.byte);
    if (next == 0) {
      i = node.end;  // nothing below can match either
      continue;
    }
    for (uint32_t k = 0; k < node.num_tokens; ++k) {
      const uint32_t id = tokens[node.first_token + k];
      out[id >> 6] |= uint64_t{1} << (id & 63);
    }
    cur_[node.depth] = next;
    ++i;
  }
}

std::shared_ptr<const TokenMask> TokenMasker::local_mask(Matcher& matcher, uint32_t local_stack) {
  if (auto cached = local_cache_.find(local_stack)) {
    ++local_hits_;
    return cached;
  }
  ++local_misses_;
  auto mask = std::make_shared<TokenMask>((trie_->vocab_size() + 63) / 64, 0);
  const uint32_t n = static_cast<uint32_t>(trie_->nodes_.size());
  if (n > 1) walk(matcher, 1, n, matcher.state_id(Matcher::State{local_stack}), *mask);
  const size_t bytes = mask_bytes(*mask);
  return local_cache_.insert(local_stack, std::move(mask), bytes);
}

TokenMask TokenMasker::scan(Matcher& matcher, Matcher::StateId state_id) {
  TokenMask out((trie_->vocab_size() + 63) / 64, 0);
  const Matcher::State& state = matcher.state_of(state_id);
  const bool accepting = !state.empty() && state.front() == 0;
  if (accepting)
    for (uint32_t id : eos_ids_) out[id >> 6] |= uint64_t{1} << (id & 63);
  for (uint32_t id : matcher.allowed_special_tokens(state))
    if (id < trie_->vocab_size()) out[id >> 6] |= uint64_t{1} << (id & 63);
  const uint32_t n = static_cast<uint32_t>(trie_->nodes_.size());
  if (n > 1 && state_id != 0) walk(matcher, 1, n, state_id, out);
  return out;
}

void TokenMasker::compute(Matcher& matcher, Matcher::StateId state_id, TokenMask& out) {
  const auto set = [&out](uint32_t id) { out[id >> 6] |= uint64_t{1} << (id & 63); };
  const Matcher::State state = matcher.state_of(state_id);  // a copy: interning below may grow the arena
  const bool accepting = !state.empty() && state.front() == 0;
  if (accepting)
    for (uint32_t id : eos_ids_) set(id);
  for (uint32_t id : matcher.allowed_special_tokens(state))
    if (id < trie_->vocab_size()) set(id);
  if (accepting && state.size() == 1) return;  // finished: nothing can follow
  // 1. Per stack: what its cut view accepts on its own (cached), and the trie nodes where a
  //    token may go on below the cut: a byte the frames below match first, inside the subtree
  //    of the stack's first byte.
  candidates_.clear();
  if (first_bytes_.size() > 65536) first_bytes_.clear();
  // Stacks of a state often share their cut view (the same rule position reached in several
  // contexts, e.g. one digit position of a bounded number under each exponent range): each
  // distinct view's mask is merged once, each distinct (view's first bytes, frames below) walked once.
  views_.clear();
  for (uint32_t stack : state) {
    const Element& top = matcher.top(stack);
    if (top.kind != Element::BYTES) continue;
    const Matcher::Local view = matcher.local_view(stack, kLocalDepth);
    views_.push_back({view.stack, view.below, top.lo, top.hi});
  }
  std::sort(views_.begin(), views_.end());
  views_.erase(std::unique(views_.begin(), views_.end()), views_.end());
  uint32_t merged = Matcher::kNoBelow;
  for (const CutView& view : views_) {
    if (view.stack != merged) {  // sorted by stack first: each local mask once
      merged = view.stack;
      const std::shared_ptr<const TokenMask> local = local_mask(matcher, view.stack);
      for (size_t w = 0; w < out.size(); ++w) out[w] |= (*local)[w];
    }
    if (view.below == Matcher::kNoBelow) continue;
    auto fb = first_bytes_.find(view.below);
    if (fb == first_bytes_.end())
      fb = first_bytes_.emplace(view.below, matcher.first_bytes(view.below)).first;
    const uint32_t lo = trie_->child_start_[view.lo], hi = trie_->child_start_[view.hi + 1u];
    for (unsigned c = 0; c < 256; ++c) {
      if (!((fb->second[c >> 6] >> (c & 63)) & 1u)) continue;
      const std::vector<uint32_t>& nodes = trie_->by_byte_[c];
      auto first = std::lower_bound(nodes.begin(), nodes.end(), lo);
      auto last = std::lower_bound(first, nodes.end(), hi);
      candidates_.insert(candidates_.end(), first, last);
    }
  }
  if (candidates_.empty()) return;
  std::sort(candidates_.begin(), candidates_.end());
  candidates_.erase(std::unique(candidates_.begin(), candidates_.end()), candidates_.end());
  // 2. Each candidate's subtree with the real state, reached along the candidate's path (paths
  //    share their prefixes; a refused prefix skips every candidate below it).
  const TokenTrie::Node* nodes = trie_->nodes_.data();
  const uint32_t* parent = trie_->parent_.data();
  path_nodes_.assign(trie_->max_depth() + 2, 0);
  path_states_.assign(trie_->max_depth() + 2, 0);
  path_states_[0] = state_id;
  size_t path_len = 1;   // depths 0 .. path_len-1 of path_nodes_/path_states_ are valid
  uint32_t covered = 0;  // candidates before this preorder index are done
  std::vector<uint32_t> up;
  for (uint32_t cand : candidates_) {
    if (cand < covered) continue;
    up.clear();
    for (uint32_t x = parent[cand]; x != 0; x = parent[x]) {
      const size_t d = nodes[x].depth;
      if (d < path_len && path_nodes_[d] == x) break;
      up.push_back(x);
    }
    bool dead = false;
    for (size_t k = up.size(); k-- > 0;) {
      const uint32_t x = up[k];
      const size_t d = nodes[x].depth;
      path_nodes_[d] = x;
      path_states_[d] = matcher.step_id(path_states_[d - 1], nodes[x].byte);
      path_len = d + 1;
      if (path_states_[d] == 0) {
        covered = nodes[x].end;
        dead = true;
        break;
      }
    }
    if (dead) continue;
    const size_t pd = nodes[parent[cand]].depth;
    if (path_states_[pd] == 0) {  // the candidate's parent was refused on an earlier path
      covered = std::max(covered, nodes[parent[cand]].end);
      continue;
    }
    path_len = pd + 1;
    walk(matcher, cand, nodes[cand].end, path_states_[pd], out);
    covered = nodes[cand].end;
  }
}

}  // namespace swarm::grammar
