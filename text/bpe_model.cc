#include "text/bpe_model.h"

#include <cstdio>
#include <nlohmann/json.hpp>
#include <queue>

#include "text/unicode.h"

namespace offloadd::text {

namespace {

StatusOr<std::pair<std::string, std::string>> ParseMerge(const nlohmann::json& m, size_t index) {
  const std::string where = "model.merges[" + std::to_string(index) + "]";
  if (m.is_string()) {
    // Legacy form "left right": exactly one separating space (tokens cannot contain spaces).
    const std::string& s = m.get_ref<const std::string&>();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos) {
      return InvalidArgumentError(where + ": expected \"left right\", got \"" + s + "\"");
    }
    return std::make_pair(s.substr(0, sp), s.substr(sp + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return InvalidArgumentError(where + ": expected a string \"a b\" or a pair [a, b]");
}

std::string OptionalString(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : "";
}

bool OptionalBool(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_boolean() && it->get<bool>();
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::FromJson(const nlohmann::json& model) {
  std::unique_ptr<BpeModel> bpe(new BpeModel());
  auto dropout = model.find("dropout");
  if (dropout != model.end() && !dropout->is_null()) {
    return InvalidArgumentError("model.dropout is not supported (BPE dropout is random)");
  }
  auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object() || vocab->empty()) {
    return InvalidArgumentError("model.vocab: missing or empty object");
  }
  int32_t max_id = -1;
  bpe->vocab_.reserve(vocab->size());  // o200k / Qwen3.6's 248k: no rehashing while loading
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > INT32_MAX) {
      return InvalidArgumentError("model.vocab[\"" + it.key() +
                                  "\"]: id must be a non-negative integer");
    }
    const auto id = static_cast<int32_t>(it->get<int64_t>());
    bpe->vocab_.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  // Ids index a dense table. A real vocab is dense (ids 0..n-1, added tokens just past it); an id
  // far beyond the entries would make a 2^31-entry table from a few bytes (fuzz regression
  // tokenizer/sparse-vocab-id). Holes up to the entries' count plus 64 Ki are allowed.
  const size_t max_dense = 2 * vocab->size() + 65536;
  if (static_cast<size_t>(max_id) >= max_dense) {
    return InvalidArgumentError("model.vocab: id " + std::to_string(max_id) + " with only " +
                                std::to_string(vocab->size()) + " entries; ids must be dense (below " +
                                std::to_string(max_dense) + " here)");
  }
  bpe->id_to_token_.resize(static_cast<size_t>(max_id) + 1);
  bpe->has_id_.assign(static_cast<size_t>(max_id) + 1, false);
  for (const auto& [tok, id] : bpe->vocab_) {
    bpe->id_to_token_[id] = tok;
    bpe->has_id_[id] = true;
  }

  bpe->continuing_subword_prefix_ = OptionalString(model, "continuing_subword_prefix");
  bpe->end_of_word_suffix_ = OptionalString(model, "end_of_word_suffix");
  bpe->fuse_unk_ = OptionalBool(model, "fuse_unk");
  bpe->byte_fallback_ = OptionalBool(model, "byte_fallback");
  bpe->ignore_merges_ = OptionalBool(model, "ignore_merges");
  const std::string unk = OptionalString(model, "unk_token");
  if (!unk.empty()) {
    auto it = bpe->vocab_.find(unk);
    if (it == bpe->vocab_.end()) {
      return InvalidArgumentError("model.unk_token \"" + unk + "\" is not in the vocab");
    }
    bpe->unk_id_ = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    auto it = bpe->vocab_.find(name);
    bpe->byte_ids_[b] = it == bpe->vocab_.end() ? -1 : it->second;
  }

  auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array() || merges->empty()) {
    return InvalidArgumentError(
        "model.merges: missing or empty; a BPE tokenizer without merges would silently encode "
        "every text as single characters or bytes");
  }
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  bpe->merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    ASSIGN_OR_RETURN(auto pair, ParseMerge((*merges)[i], i));
    auto a = bpe->vocab_.find(pair.first);
    auto b = bpe->vocab_.find(pair.second);
    if (a == bpe->vocab_.end() || b == bpe->vocab_.end()) {
      return InvalidArgumentError("model.merges[" + std::to_string(i) + "]: \"" + pair.first +
                                  "\" + \"" + pair.second + "\" uses a token not in the vocab");
    }
    std::string merged = pair.first;
    if (prefix_len > 0 &&
        pair.second.compare(0, prefix_len, bpe->continuing_subword_prefix_) == 0) {
      merged += pair.second.substr(prefix_len);
    } else {
      merged += pair.second;
    }
    auto m = bpe->vocab_.find(merged);
    if (m == bpe->vocab_.end()) {
      return InvalidArgumentError("model.merges[" + std::to_string(i) + "]: result \"" + merged +
                                  "\" is not in the vocab");
    }
    // The first occurrence of a pair wins, as in `tokenizers`.
    bpe->merges_.emplace(PairKey(a->second, b->second), Merge{static_cast<int32_t>(i), m->second});
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || !has_id_[id]) return nullptr;
  return &id_to_token_[id];
}

void BpeModel::Tokenize(std::string_view word, std::vector<int32_t>* ids,
                        std::vector<uint32_t>* starts) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(std::string(word));
    if (it != vocab_.end()) {
      ids->push_back(it->second);
      starts->push_back(0);
      return;
    }
  }
  auto append = [&](const Encoded& e) {
    ids->insert(ids->end(), e.ids.begin(), e.ids.end());
    starts->insert(starts->end(), e.starts.begin(), e.starts.end());
  };
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  CacheShard& shard = cache_[std::hash<std::string_view>()(word) % kCacheShards];
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(std::string(word));
    if (it != shard.map.end()) {
      append(it->second);
      return;
    }
  }
  Encoded result;
  MergeWord(word, &result);
  append(result);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (shard.map.size() >= kCacheCapacityPerShard) shard.map.clear();
    shard.map.emplace(std::string(word), std::move(result));
  }
}

void BpeModel::MergeWord(std::string_view word, Encoded* out) const {
  // 1. Initial symbols: one per character (with prefix/suffix), falling back to <0xNN> byte
  //    tokens or to the (optionally fused) unknown token.
  std::vector<int32_t> syms;
  std::vector<uint32_t> sym_start;  // byte offset in `word` where each symbol's text starts
  syms.reserve(word.size());
  sym_start.reserve(word.size());
  uint32_t unk_start = 0;
  std::optional<int32_t> pending_unk;
  std::string piece;
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    pos += Utf8SeqLen(static_cast<unsigned char>(word[pos]));
    if (pos > word.size()) pos = word.size();
    piece.clear();
    if (begin != 0) piece += continuing_subword_prefix_;
    piece.append(word.substr(begin, pos - begin));
    if (pos == word.size()) piece += end_of_word_suffix_;
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      if (pending_unk) {
        syms.push_back(*std::exchange(pending_unk, std::nullopt));
        sym_start.push_back(unk_start);
      }
      syms.push_back(it->second);
      sym_start.push_back(static_cast<uint32_t>(begin));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : piece) all = all && byte_ids_[b] >= 0;
      if (all) {
        // Note: like `tokenizers`, a pending unknown is not flushed before byte tokens.
        for (unsigned char b : piece) {
          syms.push_back(byte_ids_[b]);
          sym_start.push_back(static_cast<uint32_t>(begin));
        }
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) {
        syms.push_back(*pending_unk);
        sym_start.push_back(unk_start);
      }
      if (!pending_unk || !fuse_unk_) unk_start = static_cast<uint32_t>(begin);
      pending_unk = *unk_id_;
    }
    // No unk token: the character is dropped, as `tokenizers` does.
  }
  if (pending_unk) {
    syms.push_back(*pending_unk);
    sym_start.push_back(unk_start);
  }

  // 2. Merges: a min-heap of (rank, position) over a doubly linked list of symbols.
  const int n = static_cast<int>(syms.size());
  std::vector<int> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    auto it = merges_.find(PairKey(syms[i], syms[next[i]]));
    if (it != merges_.end()) heap.push({it->second.rank, i, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const int i = top.pos;
    if (!alive[i] || next[i] < 0) continue;
    auto it = merges_.find(PairKey(syms[i], syms[next[i]]));
    if (it == merges_.end() || it->second.new_id != top.new_id) {
      continue;  // stale entry: one side was merged away since it was queued
    }
    const int j = next[i];
    syms[i] = top.new_id;
    alive[j] = false;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    push(prev[i]);
    push(i);
  }
  for (int i = 0; i >= 0 && i < n; i = next[i]) {
    out->ids.push_back(syms[i]);
    out->starts.push_back(sym_start[i]);
  }
}

}  // namespace offloadd::text
