#include "text/tokenizer_bpe.hpp"

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <utility>

#include "text/tokenizer_unicode.hpp"

namespace swarm::tokenizer_detail {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_unicode{};
  std::array<int16_t, 324> to_byte{};  // the alphabet lies in U+0021..U+0143
  ByteTables() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      to_byte[to_unicode[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

constexpr size_t kCacheShards = 16;
constexpr size_t kCacheEntriesPerShard = 4096;  // bounded: ~64k words per tokenizer
constexpr size_t kMaxCachedWordBytes = 128;

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_tables().to_unicode[b]; }

int unicode_to_byte(uint32_t cp) {
  return cp < byte_tables().to_byte.size() ? byte_tables().to_byte[cp] : -1;
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string out;
  out.reserve(token.size());
  for (size_t i = 0; i < token.size();) {
    int b = unicode_to_byte(unicode::next_code_point(token, i));
    if (b < 0) return std::nullopt;
    out += static_cast<char>(b);
  }
  return out;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(out, byte_to_unicode(static_cast<uint8_t>(c)));
  return out;
}

// (left id, right id) -> (rank, merged id), open addressing.
struct BpeModel::MergeTable {
  struct Slot {
    uint64_t key = kEmpty;
    uint32_t rank = 0;
    Id merged = -1;
  };
  static constexpr uint64_t kEmpty = ~0ull;
  std::vector<Slot> slots;
  size_t mask = 0;

  explicit MergeTable(size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 1) cap <<= 1;
    slots.resize(cap);
    mask = cap - 1;
  }
  static uint64_t key(Id a, Id b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  // A pair listed twice keeps its last rank, as HF's (and transformers.js's) map building does.
  void insert(Id a, Id b, uint32_t rank, Id merged) {
    uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k || slots[i].key == kEmpty) {
        slots[i] = Slot{k, rank, merged};
        return;
      }
    }
  }
  const Slot* find(Id a, Id b) const {
    uint64_t k = key(a, b);
    for (size_t i = hash(k) & mask;; i = (i + 1) & mask) {
      if (slots[i].key == k) return &slots[i];
      if (slots[i].key == kEmpty) return nullptr;
    }
  }
};

// Word -> ids, sharded so concurrent encodes rarely contend; each shard is cleared when full,
// which keeps memory bounded without LRU bookkeeping.
struct BpeModel::Cache {
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<Id>, StringHash, std::equal_to<>> map;
  };
  std::array<Shard, kCacheShards> shards;

  bool get(std::string_view word, size_t h, std::vector<Id>& out) {
    Shard& s = shards[h % kCacheShards];
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.map.find(word);
    if (it == s.map.end()) return false;
    out.insert(out.end(), it->second.begin(), it->second.end());
    return true;
  }
  void put(std::string_view word, size_t h, std::vector<Id> ids) {
    Shard& s = shards[h % kCacheShards];
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.map.size() >= kCacheEntriesPerShard) s.map.clear();
    s.map.emplace(std::string(word), std::move(ids));
  }
};

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
                   BpeOptions options)
    : vocab_(std::move(vocab)), options_(std::move(options)), cache_(std::make_unique<Cache>()) {
  plain_symbols_ = options_.continuing_subword_prefix.empty() && options_.end_of_word_suffix.empty();
  if (options_.unk_token) {
    auto it = vocab_.find(*options_.unk_token);
    if (it != vocab_.end()) unk_id_ = it->second;
  }
  byte_symbol_.fill(-1);
  byte_fallback_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::append_utf8(ch, byte_to_unicode(static_cast<uint8_t>(b)));
    if (auto it = vocab_.find(ch); it != vocab_.end()) byte_symbol_[b] = it->second;
    static const char* kHex = "0123456789ABCDEF";
    std::string fallback = std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">";
    if (auto it = vocab_.find(fallback); it != vocab_.end()) byte_fallback_[b] = it->second;
  }
  if (options_.byte_level && options_.ignore_merges) {
    for (const auto& [token, id] : vocab_)
      if (auto raw = byte_level_to_bytes(token)) raw_vocab_.emplace(std::move(*raw), id);
  }
  merges_ = std::make_unique<MergeTable>(merges.size());
  const std::string& prefix = options_.continuing_subword_prefix;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = vocab_.find(a);
    auto ib = vocab_.find(b);
    if (ia == vocab_.end() || ib == vocab_.end())
      throw std::invalid_argument("merge " + std::to_string(rank) + " (\"" + a + "\", \"" + b +
                                  "\") uses a token that is not in the vocabulary");
    std::string merged = a;
    merged += !prefix.empty() && b.compare(0, prefix.size(), prefix) == 0 ? b.substr(prefix.size()) : b;
    auto im = vocab_.find(merged);
    if (im == vocab_.end())
      throw std::invalid_argument("merge " + std::to_string(rank) + " result \"" + merged +
                                  "\" is not in the vocabulary");
    merges_->insert(ia->second, ib->second, static_cast<uint32_t>(rank), im->second);
  }
}

BpeModel::~BpeModel() = default;

std::optional<Id> BpeModel::lookup(std::string_view s) const {
  auto it = vocab_.find(s);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::tokenize(std::string_view word, std::vector<Id>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const Vocab& v = options_.byte_level ? raw_vocab_ : vocab_;
    if (auto it = v.find(word); it != v.end()) {
      out.push_back(it->second);
      return;
    }
  }
  bool cacheable = word.size() <= kMaxCachedWordBytes;
  size_t h = cacheable ? std::hash<std::string_view>{}(word) : 0;
  if (cacheable && cache_->get(word, h, out)) return;
  size_t first = out.size();
  merge_word(word, out);
  if (cacheable)
    cache_->put(word, h, std::vector<Id>(out.begin() + static_cast<std::ptrdiff_t>(first), out.end()));
}

void BpeModel::merge_word(std::string_view word, std::vector<Id>& out) const {
  struct Symbol {
    Id id;
    int32_t prev, next;
    bool alive;
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<uint64_t> heap;  // (rank << 32 | position), min-heap
  symbols.clear();
  heap.clear();
  auto add = [&](Id id) {
    int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back(Symbol{id, n - 1, n + 1, true});
  };

  // Initial symbols: one per character (byte-level: per byte), unknown ones through byte
  // fallback or <unk> (fused when fuse_unk), as the Rust implementation does.
  std::optional<Id> pending_unk;
  std::string symbol;
  for (size_t i = 0; i < word.size();) {
    size_t len = options_.byte_level ? 1 : unicode::char_length(static_cast<unsigned char>(word[i]));
    bool is_first = i == 0, is_last = i + len >= word.size();
    std::string_view piece = word.substr(i, len);
    i += len;
    std::optional<Id> id;
    if (options_.byte_level && plain_symbols_) {
      Id b = byte_symbol_[static_cast<uint8_t>(piece[0])];
      if (b >= 0) id = b;
    } else {
      symbol.clear();
      if (!is_first) symbol += options_.continuing_subword_prefix;
      if (options_.byte_level)
        unicode::append_utf8(symbol, byte_to_unicode(static_cast<uint8_t>(piece[0])));
      else
        symbol += piece;
      if (is_last) symbol += options_.end_of_word_suffix;
      id = lookup(symbol);
    }
    if (id) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      add(*id);
      continue;
    }
    if (options_.byte_fallback) {
      std::string_view bytes = options_.byte_level || plain_symbols_ ? piece : std::string_view(symbol);
      bool all = std::all_of(bytes.begin(), bytes.end(),
                             [&](char c) { return byte_fallback_[static_cast<uint8_t>(c)] >= 0; });
      if (all) {
        if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
        for (char c : bytes) add(byte_fallback_[static_cast<uint8_t>(c)]);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !options_.fuse_unk) add(*pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk) add(*pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  auto push = [&](uint32_t rank, int32_t pos) {
    heap.push_back((static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(pos));
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i)
    if (const auto* m = merges_->find(symbols[i].id, symbols[i + 1].id))
      push(m->rank, static_cast<int32_t>(i));

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    uint64_t top = heap.back();
    heap.pop_back();
    auto rank = static_cast<uint32_t>(top >> 32);
    auto pos = static_cast<int32_t>(top & 0xffffffffu);
    Symbol& left = symbols[pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const auto* m = merges_->find(left.id, right.id);
    if (m == nullptr || m->rank != rank) continue;  // stale entry
    left.id = m->merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = pos;
    if (left.prev >= 0)
      if (const auto* mp = merges_->find(symbols[left.prev].id, left.id)) push(mp->rank, left.prev);
    if (left.next >= 0)
      if (const auto* mn = merges_->find(left.id, symbols[left.next].id)) push(mn->rank, pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

}  // namespace swarm::tokenizer_detail
