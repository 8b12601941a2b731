// The serving engine's scheduling loop (see serving_engine.hpp for the policy).
#include "inference/serving_engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <limits>
#include <mutex>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <spdlog/spdlog.h>

#include "common/latency_window.hpp"
#include "grammar/grammar.hpp"
#include "grammar/token_mask.hpp"
#include "inference/decoder_model_torch.hpp"
#include "inference/kv_cache_torch.hpp"
#include "inference/sampler_torch.hpp"
#include "kernels/cpu/serving_ops_torch.hpp"
#include "text/tokenizer.hpp"

namespace swarm {
namespace {

struct Request;

// A grammar in use, with the matcher and mask cache every sequence decoding with it shares
// (loop thread only).
struct Constrained {
  Constrained(std::shared_ptr<const grammar::Grammar> g, std::shared_ptr<const grammar::TokenTrie> trie,
              std::vector<uint32_t> eos)
      : grammar(std::move(g)),
        matcher(*grammar),
        masker(std::move(trie), std::move(eos), /*cache_entries=*/512) {}
  // The grammar's tables, the matcher's arena and transitions, the cached masks (estimated).
  size_t memory_bytes() const {
    return grammar->memory_bytes() + matcher.memory_bytes() + masker.memory_bytes();
  }
  std::shared_ptr<const grammar::Grammar> grammar;
  grammar::Matcher matcher;
  grammar::TokenMasker masker;
  uint64_t last_used = 0;  // when last handed to a sequence (Impl::constrained_uses)
};

// One sampled sequence (one choice of a request).
struct Sequence {
  std::shared_ptr<Request> request;
  int64_t choice = 0;
  int64_t slot = 0;             // key in the KV cache (unique per sequence)
  std::vector<int32_t> tokens;  // prompt + generated so far
  int64_t prompt_len = 0;
  int64_t computed = 0;  // tokens whose K/V are in the cache
  int64_t max_new = 0;
  SamplingConfig sampling;
  SamplerRng rng{0};
  std::optional<Tokenizer::IncrementalDecoder> decoder;
  std::string text;     // decoded completion (stop string cut off once found)
  size_t streamed = 0;  // bytes of `text` already sent through on_text
  GenerationChoice out;
  std::shared_ptr<Constrained> constraint;      // constrained decoding: set at its first sampling step
  grammar::Matcher::StateId grammar_state = 0;  // in constraint->matcher
  // Prefix cache: the chain keys of the first full blocks of `tokens` (from `root`), the
  // blocks [0, published) already cached or offered, and [published, inflight_end) the prompt
  // blocks it is computing that others wait for (Impl::inflight).
  uint64_t root = 0;
  std::vector<uint64_t> hashes;
  int64_t published = 0;
  int64_t inflight_end = 0;
  bool looked_up = false;  // its prompt counted in the prefix cache's queries
};

struct Request {
  GenerationRequest request;
  std::shared_ptr<GenerationObserver> observer;
  std::unordered_set<TokenId> stop_ids;
  size_t hold_back = 0;  // longest stop string - 1: text kept back while streaming
  int64_t unfinished = 0;
  bool ended = false;  // completed, failed or cancelled
  GenerationResult result;
  std::chrono::steady_clock::time_point submitted;
  bool admitted = false;  // a sequence of it has been admitted (queue wait recorded)
  bool sampled = false;   // a token of it has been sampled (ttft recorded)
};

using SeqPtr = std::unique_ptr<Sequence>;

}  // namespace

std::shared_ptr<const grammar::TokenTrie> vocabulary_trie(const Tokenizer& tokenizer) {
  const int64_t v = tokenizer.vocab_size();
  std::vector<std::string> bytes(static_cast<size_t>(v));
  std::vector<bool> special(static_cast<size_t>(v), false);
  for (int64_t id = 0; id < v; ++id) {
    try {
      bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(static_cast<TokenId>(id));
    } catch (const std::exception&) {
      // an unused id: never allowed
    }
    special[static_cast<size_t>(id)] = tokenizer.is_special(static_cast<TokenId>(id));
  }
  return std::make_shared<grammar::TokenTrie>(bytes, special);
}

struct ServingEngine::Impl {
  Impl(std::shared_ptr<DecoderModel> m, std::shared_ptr<const Tokenizer> t, ServingConfig c)
      : model(std::move(m)),
        tokenizer(std::move(t)),
        config(std::move(c)),
        cache(KvCache::for_model(model->config(),
                                 (config.kv_cache_tokens + config.block_size - 1) / config.block_size,
                                 config.block_size, model->scalar_type(), model->device())) {
    if (config.max_context <= 0) config.max_context = model->config().max_position_embeddings;
    config.max_context = std::min(config.max_context, model->config().max_position_embeddings);
    eos.insert(config.eos_token_ids.begin(), config.eos_token_ids.end());
    stats.kv_blocks_total = cache.num_blocks();
    stats.kv_blocks_free = cache.free_blocks();
    cache_bytes = cache.bytes();
    thread = std::thread([this] { loop(); });
  }

  // ---- shared with other threads (under mu)
  std::shared_ptr<DecoderModel> model;
  std::shared_ptr<const Tokenizer> tokenizer;
  ServingConfig config;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::deque<SeqPtr> incoming;
  int64_t queued = 0;  // sequences incoming + waiting (admission bound)
  std::deque<std::packaged_task<void()>> exclusive;
  bool stopping = false;
  std::string stop_reason;
  std::atomic<int64_t> policy_version{0};
  mutable std::mutex stats_mu;
  ServingStats stats;
  LatencyWindow queue_wait_window{ServingStats::kLatencyWindow};
  LatencyWindow ttft_window{ServingStats::kLatencyWindow};
  LatencyWindow step_window{ServingStats::kLatencyWindow};
  std::thread thread;

  std::atomic<int64_t> cache_bytes{0};  // the pool's bytes (0 while released)

  // ---- scheduling thread only
  KvCache cache;
  bool paused = false;  // pause_generation: nothing is scheduled until resume_generation
  std::unordered_set<TokenId> eos;
  std::shared_ptr<const grammar::TokenTrie> trie;  // the vocabulary as bytes, built at first use
  std::map<const grammar::Grammar*, std::shared_ptr<Constrained>> constrained;  // grammars in use
  uint64_t constrained_uses = 0;                 // grammars handed to sequences so far (recency)
  std::deque<SeqPtr> waiting;                    // admission order (preempted ones go back to the front)
  std::vector<SeqPtr> running;                   // admission order
  std::vector<std::shared_ptr<Request>> active;  // requests not ended
  // Prefix cache: the weights version its blocks were computed by, that version's chain root,
  // and the keys of prompt blocks running sequences are computing now (with how many are).
  int64_t cache_version = 0;
  uint64_t cache_root = kv_chain_root(0);
  std::unordered_map<uint64_t, int64_t> inflight;

  // ------------------------------------------------------------------ submission
  void submit(GenerationRequest req, std::shared_ptr<GenerationObserver> observer) {
    const auto fail = [&](ErrorKind kind, const std::string& message) { observer->on_error(kind, message); };
    try {
      const int64_t prompt_len = static_cast<int64_t>(req.prompt_ids.size());
      const int64_t vocab = model->config().vocab_size;
      const SamplingParams& p = req.params;
      if (prompt_len == 0) return fail(ErrorKind::INVALID_ARGUMENT, "the prompt is empty");
      for (TokenId id : req.prompt_ids)
        if (id < 0 || id >= vocab)
          return fail(ErrorKind::INVALID_ARGUMENT, "prompt token id " + std::to_string(id) +
                                                       " is outside the vocabulary [0, " +
                                                       std::to_string(vocab) + ")");
      for (TokenId id : p.stop_token_ids)
        if (id < 0 || id >= vocab)
          return fail(ErrorKind::INVALID_ARGUMENT, "stop token id " + std::to_string(id) +
                                                       " is outside the vocabulary [0, " +
                                                       std::to_string(vocab) + ")");
      if (prompt_len >= config.max_context)
        return fail(ErrorKind::INVALID_ARGUMENT, "prompt is " + std::to_string(prompt_len) +
                                                     " tokens; the context length is " +
                                                     std::to_string(config.max_context));
      const int64_t kv_tokens = cache.num_blocks() * cache.block_size();
      if (prompt_len + 1 > kv_tokens)
        return fail(ErrorKind::INVALID_ARGUMENT, "prompt is " + std::to_string(prompt_len) +
                                                     " tokens; the KV cache holds " +
                                                     std::to_string(kv_tokens) + " (raise kv_cache_tokens)");
      if (p.n < 1) return fail(ErrorKind::INVALID_ARGUMENT, "n must be >= 1");
      if (p.max_tokens < 1) return fail(ErrorKind::INVALID_ARGUMENT, "max_tokens must be >= 1");

      auto request = std::make_shared<Request>();
      request->observer = observer;  // `fail` still uses `observer`
      request->stop_ids.insert(p.stop_token_ids.begin(), p.stop_token_ids.end());
      for (const auto& s : p.stop)
        request->hold_back = std::max(request->hold_back, s.empty() ? 0 : s.size() - 1);
      request->unfinished = p.n;
      request->result.choices.resize(static_cast<size_t>(p.n));

      SamplingConfig sc;
      sc.temperature = p.temperature;
      sc.top_p = p.top_p;
      sc.top_k = p.top_k;
      sc.top_logprobs = p.logprobs ? p.top_logprobs : 0;
      const int64_t max_new = std::min(p.max_tokens, config.max_context - prompt_len);

      std::vector<SeqPtr> seqs;
      for (int64_t c = 0; c < p.n; ++c) {
        auto s = std::make_unique<Sequence>();
        s->request = request;
        s->choice = c;
        s->tokens.assign(req.prompt_ids.begin(), req.prompt_ids.end());
        s->prompt_len = prompt_len;
        s->max_new = max_new;
        s->sampling = sc;
        s->rng = p.seed ? SamplerRng(*p.seed + static_cast<uint64_t>(c) * 0x9E3779B97F4A7C15ull)
                        : SamplerRng::from_random_seed();
        s->decoder.emplace(tokenizer->incremental_decoder(/*skip_special_tokens=*/true));
        seqs.push_back(std::move(s));
      }
      request->request = std::move(req);
      request->submitted = std::chrono::steady_clock::now();
      {
        std::lock_guard lk(mu);
        if (stopping)
          return fail(ErrorKind::UNAVAILABLE, "the inference engine is shutting down: " + stop_reason);
        if (queued + p.n > config.max_waiting_sequences)
          return fail(ErrorKind::UNAVAILABLE, "the inference engine's queue is full (" +
                                                  std::to_string(config.max_waiting_sequences) +
                                                  " sequences waiting); retry later");
        queued += p.n;
        for (auto& s : seqs) {
          s->slot = next_slot_locked++;
          incoming.push_back(std::move(s));
        }
      }
      cv.notify_one();
    } catch (const SwarmError& e) {
      fail(e.kind(), e.what());
    } catch (const std::exception& e) {
      fail(ErrorKind::INTERNAL, e.what());
    }
  }
  int64_t next_slot_locked = 0;

  // ------------------------------------------------------------------ loop
  // Moves submitted sequences into the waiting queue and hands back the exclusive tasks.
  std::deque<std::packaged_task<void()>> take_new_work_locked() {
    while (!incoming.empty()) {
      SeqPtr s = std::move(incoming.front());
      incoming.pop_front();
      if (s->choice == 0) active.push_back(s->request);
      waiting.push_back(std::move(s));
    }
    std::deque<std::packaged_task<void()>> tasks;
    tasks.swap(exclusive);
    return tasks;
  }

  void loop() {
    for (;;) {
      std::deque<std::packaged_task<void()>> tasks;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] {
          return stopping || !incoming.empty() || !exclusive.empty() ||
                 (!paused && (!waiting.empty() || !running.empty()));
        });
        if (stopping) break;
        tasks = take_new_work_locked();
      }
      for (auto& task : tasks) task();  // exceptions land in the caller's future
      drop_cancelled();
      if (!paused && (!waiting.empty() || !running.empty())) {
        try {
          step();
        } catch (const std::exception& e) {
          // A failing step (a bug, out of memory) fails every request in flight (their cache
          // state is unknown), never the server.
          spdlog::error("inference engine: step failed: {}", e.what());
          fail_all(ErrorKind::INTERNAL, std::string("inference step failed: ") + e.what());
        }
      }
      publish_stats();
    }
    // Shutting down.
    std::deque<std::packaged_task<void()>> tasks;
    {
      std::lock_guard lk(mu);
      tasks = take_new_work_locked();
    }
    for (auto& task : tasks) task();
    fail_all(ErrorKind::UNAVAILABLE, "the inference engine stopped: " + stop_reason);
    publish_stats();
  }

  // Removes every sequence of `r` from the queues (freeing its KV blocks) and ends it.
  void end_request(const std::shared_ptr<Request>& r, ErrorKind kind, const std::string& message) {
    if (r->ended) return;
    r->ended = true;
    int64_t dropped_waiting = 0;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if ((*it)->request == r) {
        it = waiting.erase(it);
        ++dropped_waiting;
      } else {
        ++it;
      }
    }
    for (auto it = running.begin(); it != running.end();) {
      if ((*it)->request == r) {
        release_blocks(**it);
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (dropped_waiting > 0) {
      std::lock_guard lk(mu);
      queued -= dropped_waiting;
    }
    std::erase(active, r);
    try {
      r->observer->on_error(kind, message);
    } catch (const std::exception& e) {
      spdlog::warn("inference engine: observer on_error threw: {}", e.what());
    }
  }

  void fail_all(ErrorKind kind, const std::string& message) {
    std::vector<std::shared_ptr<Request>> all = active;
    {
      std::lock_guard lk(stats_mu);
      stats.failed_requests += static_cast<int64_t>(all.size());
    }
    for (const auto& r : all) end_request(r, kind, message);
  }

  void drop_cancelled() {
    std::vector<std::shared_ptr<Request>> gone;
    for (const auto& r : active) {
      bool cancelled = false;
      try {
        cancelled = r->observer->cancelled();
      } catch (const std::exception&) {
        cancelled = true;
      }
      if (cancelled) gone.push_back(r);
    }
    if (gone.empty()) return;
    {
      std::lock_guard lk(stats_mu);
      stats.cancelled_requests += static_cast<int64_t>(gone.size());
    }
    for (const auto& r : gone)
      end_request(r, ErrorKind::CONFLICT, "generation cancelled: the client went away or the episode ended");
  }

  // ---- prefix cache (docs/concepts.md "Prefix caching")

  // Follows the weights now serving: the blocks of another version are never matched again.
  // Running sequences keep the blocks they hold (kv_cache_on_swap keep) but publish no more.
  void follow_weights_version() {
    const int64_t v = policy_version.load();
    if (v == cache_version) return;
    cache_version = v;
    cache_root = kv_chain_root(v);
    cache.allocator().drop_cached();
    inflight.clear();
  }

  // The chain keys of s's first `blocks` full blocks under the current root.
  const std::vector<uint64_t>& chain_of(Sequence& s, int64_t blocks) {
    if (s.root != cache_root) {
      s.root = cache_root;
      s.hashes.clear();
    }
    const int64_t bs = cache.block_size();
    while (static_cast<int64_t>(s.hashes.size()) < blocks) {
      const int64_t i = static_cast<int64_t>(s.hashes.size());
      s.hashes.push_back(kv_block_hash(i == 0 ? s.root : s.hashes.back(), s.tokens.data() + i * bs, bs));
    }
    return s.hashes;
  }

  // Offers the full blocks s has computed since the last call to the prefix cache.
  void publish_blocks(Sequence& s) {
    if (!config.prefix_caching || s.root != cache_root) return;  // admitted under other weights
    const int64_t full = s.computed / cache.block_size();
    if (full <= s.published) return;
    const std::vector<uint64_t>& h = chain_of(s, full);
    const int64_t bs = cache.block_size();
    for (int64_t i = s.published; i < full; ++i) {
      const auto k = static_cast<size_t>(i);
      cache.allocator().publish(s.slot, i, h[k], i == 0 ? s.root : h[k - 1], s.tokens.data() + i * bs);
      if (i < s.inflight_end) forget_inflight(h[k]);
    }
    s.published = full;
  }

  void forget_inflight(uint64_t key) {
    auto it = inflight.find(key);
    if (it != inflight.end() && --it->second <= 0) inflight.erase(it);
  }

  // Gives back s's KV blocks (cached ones stay findable) and what it was computing for others.
  void release_blocks(Sequence& s) {
    if (s.root == cache_root)
      for (int64_t i = s.published; i < s.inflight_end; ++i)
        forget_inflight(s.hashes[static_cast<size_t>(i)]);
    s.published = s.inflight_end = 0;
    cache.release(s.slot);
  }

  // Frees the KV blocks of the most recently admitted running sequence and puts it back at
  // the front of the waiting queue; it will be recomputed from its tokens so far.
  void preempt_last() {
    SeqPtr victim = std::move(running.back());
    running.pop_back();
    release_blocks(*victim);
    victim->computed = 0;
    waiting.push_front(std::move(victim));
    {
      std::lock_guard lk(mu);
      ++queued;
    }
    std::lock_guard lk(stats_mu);
    ++stats.preemptions;
  }

  struct Planned {
    Sequence* seq;
    int64_t count;  // new tokens fed this step
  };

  void step() {
    const auto t0 = std::chrono::steady_clock::now();
    follow_weights_version();
    std::vector<Planned> plan;
    int64_t budget = config.max_step_tokens;
    int64_t decode_tokens = 0, prefill_tokens = 0;

    // 1. Decoding sequences: one token each. A sequence that cannot grow preempts the most
    //    recently admitted one (possibly itself).
    for (size_t i = 0; i < running.size();) {
      Sequence& s = *running[i];
      const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
      if (remaining != 1) {
        ++i;
        continue;
      }
      if (!cache.ensure_capacity(s.slot, s.computed + 1)) {
        if (running.size() == 1) {
          // Alone and still out of blocks: the cache cannot hold this sequence any longer.
          finish(s, "length", /*flush=*/true);
          continue;  // finish() removed it from `running`
        }
        preempt_last();
        continue;  // retry the same index (it may have been the victim)
      }
      plan.push_back({&s, 1});
      --budget;
      ++decode_tokens;
      ++i;
    }
    // 2. Running sequences still in their prompt: a chunk each from what is left.
    for (auto& sp : running) {
      Sequence& s = *sp;
      const int64_t remaining = static_cast<int64_t>(s.tokens.size()) - s.computed;
      if (remaining <= 1 || budget <= 0) continue;
      const int64_t chunk = std::min(remaining, budget);
      SWARM_CHECK(cache.capacity(s.slot) >= s.computed + chunk,
                  "serving engine: prefill without reserved blocks");
      plan.push_back({&s, chunk});
      budget -= chunk;
      prefill_tokens += chunk;
    }
    // 3. Admission in FIFO order while the batch, the budget and the cache allow. A new
    //    sequence needs room for its whole context plus one token, and leaves one free block
    //    per running sequence so those can keep growing. With prefix caching it starts from
    //    the cached full blocks its tokens begin with (at least one token is always computed,
    //    for the logits), and one whose next block is being computed by a running sequence
    //    waits for it (passed over, keeping its place) instead of computing it again.
    const int64_t bs = cache.block_size();
    for (auto it = waiting.begin(); it != waiting.end() && budget > 0 &&
                                    static_cast<int64_t>(running.size()) < config.max_batch_sequences;) {
      Sequence& s = **it;
      const int64_t len = static_cast<int64_t>(s.tokens.size());
      const int64_t need = len + 1;
      std::vector<int64_t> hit;
      if (config.prefix_caching) {
        const int64_t matchable = (len - 1) / bs;
        const std::vector<uint64_t>& h = chain_of(s, matchable);
        hit = cache.allocator().match(cache_root, h, s.tokens.data(), matchable);
        if (static_cast<int64_t>(hit.size()) < matchable && inflight.count(h[hit.size()]) != 0) {
          ++it;
          continue;
        }
      }
      const int64_t new_blocks = cache.allocator().blocks_for(need) - static_cast<int64_t>(hit.size());
      const int64_t available = cache.free_blocks() - cache.allocator().unreferenced(hit);
      if (!running.empty() && available - new_blocks < static_cast<int64_t>(running.size())) break;
      // The whole context is reserved now, so prefill chunks never wait for blocks.
      if (!cache.allocator().attach(s.slot, hit, need)) {
        if (!running.empty()) break;
        // Nothing else holds blocks and it still does not fit (a preempted sequence that grew
        // to the whole cache): it ends here.
        running.push_back(std::move(*it));
        it = waiting.erase(it);
        {
          std::lock_guard lk(mu);
          --queued;
        }
        finish(*running.back(), "length", /*flush=*/true);
        continue;
      }
      s.computed = static_cast<int64_t>(hit.size()) * bs;
      s.published = static_cast<int64_t>(hit.size());
      if (config.prefix_caching) {
        s.inflight_end = len / bs;
        const std::vector<uint64_t>& h = chain_of(s, s.inflight_end);
        for (int64_t i = s.published; i < s.inflight_end; ++i) ++inflight[h[static_cast<size_t>(i)]];
        if (!s.looked_up) {
          s.looked_up = true;
          std::lock_guard lk(stats_mu);
          stats.prefix_cache_queries_tokens += len;
          stats.prefix_cache_hit_tokens += s.computed;
        }
      }
      const int64_t chunk = std::min(len - s.computed, budget);
      if (!s.request->admitted) {
        s.request->admitted = true;
        record_latency(queue_wait_window, s.request->submitted);
      }
      running.push_back(std::move(*it));
      it = waiting.erase(it);
      {
        std::lock_guard lk(mu);
        --queued;
      }
      plan.push_back({running.back().get(), chunk});
      budget -= chunk;
      if (chunk == 1 && len == 1) {
        ++decode_tokens;
      } else {
        prefill_tokens += chunk;
      }
    }
    if (plan.empty()) return;

    // 4. One packed forward pass.
    std::vector<StepInput> inputs;
    inputs.reserve(plan.size());
    for (const Planned& pl : plan) {
      StepInput in;
      in.seq_slot = pl.seq->slot;
      in.start_pos = pl.seq->computed;
      in.tokens.assign(pl.seq->tokens.begin() + pl.seq->computed,
                       pl.seq->tokens.begin() + pl.seq->computed + pl.count);
      inputs.push_back(std::move(in));
    }
    torch::Tensor logits = model->forward_step(inputs, cache);

    // 5. Publish the blocks the step filled; sample where the whole context is now cached.
    std::vector<int64_t> rows;
    std::vector<Sequence*> sampled;
    std::vector<SamplingConfig> configs;
    std::vector<SamplerRng*> rngs;
    for (size_t r = 0; r < plan.size(); ++r) {
      Sequence* s = plan[r].seq;
      s->computed += plan[r].count;
      publish_blocks(*s);
      if (s->computed == static_cast<int64_t>(s->tokens.size())) {
        rows.push_back(static_cast<int64_t>(r));
        sampled.push_back(s);
        configs.push_back(s->sampling);
        rngs.push_back(&s->rng);
      }
    }
    if (!sampled.empty()) {
      torch::Tensor chosen = logits;
      if (rows.size() != plan.size())
        chosen = logits.index_select(
            0, torch::tensor(rows, torch::TensorOptions().dtype(torch::kLong)).to(logits.device()));
      // Constrained rows sample from the masked logits but record the model's own log-prob
      // of the token (what the trainer recomputes), see docs/openai_api.md.
      std::vector<SampledToken> tokens = sample_rows(chosen, sampled, configs, rngs);
      for (size_t i = 0; i < sampled.size(); ++i) accept(*sampled[i], tokens[i]);
    }

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::lock_guard lk(stats_mu);
    ++stats.steps;
    stats.decode_tokens += decode_tokens;
    stats.prefill_tokens += prefill_tokens;
    stats.busy_seconds += seconds;
    step_window.add(seconds);
  }

  // The shared matcher and mask cache of a grammar (the trie of the vocabulary is built once).
  std::shared_ptr<Constrained> constrained_for(const std::shared_ptr<const grammar::Grammar>& g) {
    // Memory stays bounded: a matcher whose arena of parse stacks has grown past its bound, or
    // past half the byte bound (e.g. deeply nested free JSON over a long run), is replaced by a
    // fresh one for new sequences; each grammar caches at most 512 masks by state and 256 by cut
    // stack, within TokenMasker::kDefaultCacheBytes (sequences decoding the same schema in step
    // share states, and masks); and the grammars kept are at most kMaxGrammars, together at most
    // kMaxBytes with their matchers and masks (trim_constrained).
    constexpr size_t kMaxArena = 1 << 18;  // stacks; each stepped one holds a 1 KiB memo block
    constexpr size_t kMaxGrammars = 16;
    constexpr size_t kMaxBytes = grammar::kDefaultGrammarCacheBytes;
    ++constrained_uses;
    if (auto it = constrained.find(g.get()); it != constrained.end()) {
      if (it->second->matcher.arena_size() < kMaxArena && it->second->memory_bytes() <= kMaxBytes / 2) {
        it->second->last_used = constrained_uses;
        return it->second;
      }
      constrained.erase(it);
    }
    if (!trie) trie = vocabulary_trie(*tokenizer);
    std::vector<uint32_t> eos_ids;
    for (TokenId id : eos)
      if (id >= 0 && id < tokenizer->vocab_size()) eos_ids.push_back(static_cast<uint32_t>(id));
    auto c = std::make_shared<Constrained>(g, trie, std::move(eos_ids));
    c->last_used = constrained_uses;
    constrained[g.get()] = c;
    trim_constrained(kMaxGrammars, kMaxBytes);
    return c;
  }

  // Drops the least recently used grammars that no sequence holds until at most `entries` are
  // kept within `bytes`. One a sequence holds stays (its masks and matcher are in use); it goes
  // with its last sequence, or at a later call once no sequence holds it.
  void trim_constrained(size_t entries, size_t bytes) {
    size_t total = 0;
    for (const auto& kv : constrained) total += kv.second->memory_bytes();
    while (constrained.size() > entries || total > bytes) {
      auto lru = constrained.end();
      for (auto it = constrained.begin(); it != constrained.end(); ++it)
        if (it->second.use_count() == 1 &&
            (lru == constrained.end() || it->second->last_used < lru->second->last_used))
          lru = it;
      if (lru == constrained.end()) break;  // all in use
      total -= lru->second->memory_bytes();
      constrained.erase(lru);
    }
  }

  // Sampling, with constrained decoding: every token a sequence's grammar does not allow next
  // gets logit -inf (so before temperature / top-k / top-p), and the row records the model's
  // own log-prob of the token it drew.
  std::vector<SampledToken> sample_rows(torch::Tensor& chosen, const std::vector<Sequence*>& seqs,
                                        const std::vector<SamplingConfig>& configs,
                                        std::vector<SamplerRng*>& rngs) {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Sequence& s = *seqs[i];
      if (!s.request->request.grammar) continue;
      if (!s.constraint) {
        s.constraint = constrained_for(s.request->request.grammar);
        s.grammar_state = s.constraint->matcher.state_id(s.constraint->matcher.state());
      }
      rows.push_back(static_cast<int64_t>(i));
    }
    if (rows.empty()) return sample_tokens(chosen, configs, rngs);
    const int64_t vocab = chosen.size(1);
    // Each row's mask as bits; a row that allows nothing (cannot happen with a byte-complete
    // vocabulary) may end instead. The rows share the masks with the grammars' caches: a later
    // row's new state may evict an earlier row's mask from the cache within this step.
    std::vector<std::shared_ptr<const grammar::TokenMask>> masks;
    for (int64_t r : rows) {
      Sequence& s = *seqs[static_cast<size_t>(r)];
      std::shared_ptr<const grammar::TokenMask> m =
          s.constraint->masker.allowed_shared(s.constraint->matcher, s.grammar_state);
      const int64_t words = std::min<int64_t>(static_cast<int64_t>(m->size()), (vocab + 63) / 64);
      bool any = false;
      for (int64_t w = 0; w < words && !any; ++w) any = (*m)[static_cast<size_t>(w)] != 0;
      if (any) {
        masks.push_back(std::move(m));
        continue;
      }
      auto fallback = std::make_shared<grammar::TokenMask>((vocab + 63) / 64, 0);
      for (TokenId id : eos)
        if (id >= 0 && id < vocab) (*fallback)[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
      masks.push_back(std::move(fallback));
    }
    std::vector<float> temps;
    for (int64_t r : rows) {
      const double t = configs[static_cast<size_t>(r)].temperature;
      temps.push_back(static_cast<float>(logprob_temperature(t)));
    }
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (chosen.is_cpu() && chosen.scalar_type() == torch::kFloat && chosen.is_contiguous()) {
      // The model's own statistics first (one fused pass per row), then -inf straight into the
      // rows (`chosen` is this step's own tensor): inside a JSON string almost every word of the
      // mask is all ones and costs one compare. A drawn token is allowed, so its logit is the
      // model's.
      const bool all = rows.size() == seqs.size();
      const torch::Tensor idx = torch::tensor(rows, torch::TensorOptions().dtype(torch::kLong));
      const std::vector<SoftmaxRowStats> stats =
          softmax_row_stats(all ? chosen : chosen.index_select(0, idx), temps);
      float* base = chosen.data_ptr<float>();
      for (size_t k = 0; k < rows.size(); ++k) {
        float* row = base + rows[k] * vocab;
        const grammar::TokenMask& m = *masks[k];
        for (int64_t w = 0; w * 64 < vocab; ++w) {
          const uint64_t bits = w < static_cast<int64_t>(m.size()) ? m[static_cast<size_t>(w)] : 0;
          if (bits == ~uint64_t{0}) continue;
          const int64_t end = std::min<int64_t>(64, vocab - w * 64);
          float* at = row + w * 64;
          for (int64_t j = 0; j < end; ++j) at[j] = (bits >> j) & 1u ? at[j] : kNegInf;  // no branch
        }
      }
      std::vector<SampledToken> tokens = sample_tokens(chosen, configs, rngs);
      for (size_t k = 0; k < rows.size(); ++k) {
        SampledToken& t = tokens[static_cast<size_t>(rows[k])];
        t.logprob = base[rows[k] * vocab + t.id] / temps[k] - stats[k].max - stats[k].log_sum;
      }
      return tokens;
    }
    // Elsewhere (an accelerator, other dtypes): a boolean tensor of the allowed tokens, and the
    // model's log-probs from log_softmax of the unmasked rows.
    torch::Tensor allowed = torch::zeros({static_cast<int64_t>(rows.size()), vocab}, torch::kBool);
    bool* a = allowed.data_ptr<bool>();
    for (size_t k = 0; k < rows.size(); ++k) {
      bool* row = a + static_cast<int64_t>(k) * vocab;
      const grammar::TokenMask& m = *masks[k];
      const int64_t n = std::min<int64_t>(vocab, static_cast<int64_t>(m.size()) * 64);
      for (int64_t w = 0; w * 64 < n; ++w) {
        uint64_t bits = m[static_cast<size_t>(w)];
        while (bits) {
          const int64_t id = w * 64 + __builtin_ctzll(bits);
          bits &= bits - 1;
          if (id < vocab) row[id] = true;
        }
      }
    }
    const torch::Tensor idx =
        torch::tensor(rows, torch::TensorOptions().dtype(torch::kLong)).to(chosen.device());
    const torch::Tensor unmasked = chosen.index_select(0, idx).to(torch::kFloat);
    torch::Tensor masked = chosen.clone();
    torch::Tensor sub = masked.index_select(0, idx);
    sub.masked_fill_(allowed.to(chosen.device()).logical_not(), kNegInf);
    masked.index_copy_(0, idx, sub);
    std::vector<SampledToken> tokens = sample_tokens(masked, configs, rngs);
    const torch::Tensor t =
        torch::tensor(temps, torch::TensorOptions().dtype(torch::kFloat)).to(chosen.device()).view({-1, 1});
    const torch::Tensor logp = torch::log_softmax(unmasked / t, 1).to(torch::kCPU).contiguous();
    const float* lp = logp.data_ptr<float>();
    for (size_t k = 0; k < rows.size(); ++k) {
      SampledToken& tok = tokens[static_cast<size_t>(rows[k])];
      tok.logprob = lp[static_cast<int64_t>(k) * vocab + tok.id];
    }
    return tokens;
  }

  // Moves a constrained sequence's grammar state past the sampled token.
  void advance_grammar(Sequence& s, TokenId id) {
    if (!s.constraint || eos.count(id)) return;
    grammar::Matcher& m = s.constraint->matcher;
    const grammar::Matcher::State& before = m.state_of(s.grammar_state);
    grammar::Matcher::State next = m.advance_token(before, static_cast<uint32_t>(id));
    if (!tokenizer->is_special(id)) {
      grammar::Matcher::StateId by_bytes = s.grammar_state;
      for (unsigned char b : tokenizer->token_bytes(id))
        if ((by_bytes = m.step_id(by_bytes, b)) == 0) break;
      if (next.empty()) {
        s.grammar_state = by_bytes;
        return;
      }
      const grammar::Matcher::State& bytes_state = m.state_of(by_bytes);
      next.insert(next.end(), bytes_state.begin(), bytes_state.end());
      std::sort(next.begin(), next.end());
      next.erase(std::unique(next.begin(), next.end()), next.end());
    }
    s.grammar_state = m.state_id(next);
  }

  void record_latency(LatencyWindow& window, std::chrono::steady_clock::time_point since) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
    std::lock_guard lk(stats_mu);
    window.add(seconds);
  }

  // Records a sampled token and applies the stop rules.
  void accept(Sequence& s, const SampledToken& t) {
    Request& r = *s.request;
    if (!r.sampled) {
      r.sampled = true;
      record_latency(ttft_window, r.submitted);
    }
    advance_grammar(s, t.id);
    s.tokens.push_back(t.id);
    s.out.ids.push_back(t.id);
    s.out.logprobs.push_back(t.logprob);
    s.out.versions.push_back(policy_version.load(std::memory_order_relaxed));  // changes only between steps
    if (s.sampling.top_logprobs > 0) {
      std::vector<TokenAlternative> alts;
      alts.reserve(t.top.size());
      for (const auto& [id, lp] : t.top) alts.push_back({id, lp});
      s.out.top.push_back(std::move(alts));
    }
    if (eos.count(t.id) || r.stop_ids.count(t.id)) return finish(s, "stop", /*flush=*/true);
    const size_t before = s.text.size();
    s.text += s.decoder->push(t.id);
    if (s.text.size() > before && cut_at_stop_string(s, before)) return finish(s, "stop", /*flush=*/false);
    if (static_cast<int64_t>(s.out.ids.size()) >= s.max_new) return finish(s, "length", /*flush=*/true);
    // A complete grammar with no end-of-sequence token to sample: nothing more can follow.
    if (s.constraint && eos.empty() && s.constraint->matcher.state_of(s.grammar_state).size() == 1 &&
        s.constraint->matcher.state_of(s.grammar_state)[0] == 0)
      return finish(s, "stop", /*flush=*/true);
    stream(s, /*final=*/false);
  }

  // Looks for a stop string that ends in the text added after `before`; cuts the text there.
  bool cut_at_stop_string(Sequence& s, size_t before) {
    const auto& stops = s.request->request.params.stop;
    size_t best = std::string::npos;
    for (const auto& stop : stops) {
      if (stop.empty()) continue;
      const size_t from = before >= stop.size() - 1 ? before - (stop.size() - 1) : 0;
      const size_t pos = s.text.find(stop, from);
      if (pos != std::string::npos) best = std::min(best, pos);
    }
    if (best == std::string::npos) return false;
    s.text.resize(best);
    if (s.streamed > best) s.streamed = best;  // cannot happen: hold-back keeps stops unsent
    return true;
  }

  void stream(Sequence& s, bool final) {
    size_t safe = s.text.size();
    if (!final) {
      const size_t hold = s.request->hold_back;
      safe = safe > hold ? safe - hold : 0;
      while (safe > s.streamed && (static_cast<unsigned char>(s.text[safe]) & 0xC0) == 0x80) --safe;
    }
    if (safe <= s.streamed) return;
    const std::string delta = s.text.substr(s.streamed, safe - s.streamed);
    s.streamed = safe;
    try {
      s.request->observer->on_text(s.choice, delta);
    } catch (const std::exception& e) {
      spdlog::warn("inference engine: observer on_text threw: {}", e.what());
    }
  }

  // Ends one sequence: final text, KV freed, and the request completed when it was the last.
  void finish(Sequence& s, const char* reason, bool flush) {
    if (flush) {
      const size_t before = s.text.size();
      s.text += s.decoder->flush();
      if (s.text.size() > before) cut_at_stop_string(s, before);
    }
    stream(s, /*final=*/true);
    std::shared_ptr<Request> r = s.request;
    s.out.text = std::move(s.text);
    s.out.finish_reason = reason;
    r->result.choices[static_cast<size_t>(s.choice)] = std::move(s.out);
    release_blocks(s);
    const Sequence* ptr = &s;
    std::erase_if(running, [ptr](const SeqPtr& p) { return p.get() == ptr; });  // destroys s
    if (--r->unfinished > 0) return;
    r->ended = true;
    std::erase(active, r);
    r->result.policy_version = policy_version.load();
    for (const GenerationChoice& c : r->result.choices)
      if (!c.versions.empty())
        r->result.policy_version = std::min(r->result.policy_version, c.versions.front());
    {
      std::lock_guard lk(stats_mu);
      ++stats.completed_requests;
    }
    try {
      r->observer->on_complete(std::move(r->result));
    } catch (const std::exception& e) {
      spdlog::warn("inference engine: observer on_complete threw: {}", e.what());
    }
  }

  void publish_stats() {
    int64_t q;
    {
      std::lock_guard lk(mu);
      q = queued;
    }
    std::lock_guard lk(stats_mu);
    stats.running = static_cast<int64_t>(running.size());
    stats.waiting = q;
    stats.kv_blocks_free = cache.free_blocks();
    stats.kv_blocks_cached = cache.allocator().cached_blocks();
  }

  void shutdown(const std::string& reason) {
    {
      std::lock_guard lk(mu);
      if (!stopping) {
        stopping = true;
        stop_reason = reason;
      }
    }
    cv.notify_all();
    if (thread.joinable() && thread.get_id() != std::this_thread::get_id()) thread.join();
  }
};

ServingEngine::ServingEngine(std::shared_ptr<DecoderModel> model, std::shared_ptr<const Tokenizer> tokenizer,
                             ServingConfig config) {
  SWARM_REQUIRE(model && tokenizer, ErrorKind::INVALID_ARGUMENT,
                "serving engine: model and tokenizer are required");
  SWARM_REQUIRE(config.block_size >= 1, ErrorKind::INVALID_ARGUMENT,
                "serving engine: block_size must be >= 1");
  SWARM_REQUIRE(config.kv_cache_tokens >= 1, ErrorKind::INVALID_ARGUMENT,
                "serving engine: kv_cache_tokens must be >= 1");
  SWARM_REQUIRE(
      config.max_batch_sequences >= 1 && config.max_step_tokens >= 1 && config.max_waiting_sequences >= 1,
      ErrorKind::INVALID_ARGUMENT, "serving engine: batch, step and queue limits must be >= 1");
  impl_ = std::make_unique<Impl>(std::move(model), std::move(tokenizer), std::move(config));
}

ServingEngine::~ServingEngine() { impl_->shutdown("the engine was released"); }

void ServingEngine::submit(GenerationRequest request, std::shared_ptr<GenerationObserver> observer) {
  impl_->submit(std::move(request), std::move(observer));
}

void ServingEngine::set_policy_version(int64_t version) { impl_->policy_version = version; }
int64_t ServingEngine::policy_version() const { return impl_->policy_version.load(); }

void ServingEngine::run_exclusive(std::function<void()> fn) {
  std::packaged_task<void()> task(std::move(fn));
  std::future<void> done = task.get_future();
  {
    std::lock_guard lk(impl_->mu);
    SWARM_REQUIRE(!impl_->stopping, ErrorKind::UNAVAILABLE, "the inference engine is shutting down");
    impl_->exclusive.push_back(std::move(task));
  }
  impl_->cv.notify_one();
  done.get();
}

void ServingEngine::recompute_running() {
  SWARM_CHECK(std::this_thread::get_id() == impl_->thread.get_id(),
              "ServingEngine::recompute_running is only for functions run_exclusive runs");
  // Back to front onto the waiting queue's front: they are readmitted in the order they ran.
  while (!impl_->running.empty()) impl_->preempt_last();
}

int64_t ServingEngine::pause_generation(bool free_kv_cache) {
  int64_t freed = 0;
  run_exclusive([&] {
    if (impl_->paused) return;
    impl_->paused = true;
    if (!free_kv_cache) return;
    // Running sequences give their blocks back and are prefilled again after the resume.
    while (!impl_->running.empty()) impl_->preempt_last();
    freed = impl_->cache.bytes();
    impl_->cache.release_storage();
    impl_->cache_bytes = 0;
  });
  return freed;
}

void ServingEngine::resume_generation() {
  run_exclusive([&] {
    if (!impl_->cache.has_storage()) {
      impl_->cache.allocate_storage();
      impl_->cache_bytes = impl_->cache.bytes();
    }
    impl_->paused = false;
  });
}

void ServingEngine::shutdown(const std::string& reason) { impl_->shutdown(reason); }

ServingStats ServingEngine::stats() const {
  std::lock_guard lk(impl_->stats_mu);
  ServingStats s = impl_->stats;
  s.latency_samples = static_cast<int64_t>(impl_->ttft_window.size());
  s.queue_wait_p50_seconds = impl_->queue_wait_window.percentile(50);
  s.queue_wait_p99_seconds = impl_->queue_wait_window.percentile(99);
  s.ttft_p50_seconds = impl_->ttft_window.percentile(50);
  s.ttft_p99_seconds = impl_->ttft_window.percentile(99);
  s.step_p50_seconds = impl_->step_window.percentile(50);
  s.step_p99_seconds = impl_->step_window.percentile(99);
  return s;
}

const ServingConfig& ServingEngine::config() const { return impl_->config; }
int64_t ServingEngine::kv_cache_bytes() const { return impl_->cache_bytes.load(); }

}  // namespace swarm
