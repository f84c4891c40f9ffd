#pragma once
// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}): vocabulary,
// ranked merges, byte fallback (<0xNN> tokens), unknown-token fusing, ignore_merges,
// continuing_subword_prefix / end_of_word_suffix. Tokenize() turns one pre-token into ids with
// the same algorithm as `tokenizers` (repeatedly apply the lowest-ranked merge, leftmost first,
// via a priority queue over a linked list of symbols), and caches results by pre-token.
// Thread-safe: Tokenize may be called concurrently (the cache is mutex-guarded).

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace offloadd::text {

class BpeModel {
 public:
  // Parses the "model" object. Errors (INVALID_ARGUMENT) name the offending field: a missing
  // vocab, zero merges, a malformed merge, a merge whose parts or result are not in the vocab,
  // dropout (non-deterministic; not supported).
  static StatusOr<std::unique_ptr<BpeModel>> FromJson(const nlohmann::json& model);

  // Appends the ids for one pre-token (already normalized / byte-mapped) and, for each id, the
  // byte offset in `word` where its text starts.
  void Tokenize(std::string_view word, std::vector<int32_t>* ids,
                std::vector<uint32_t>* starts) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr when the id is not in the vocabulary.
  const std::string* IdToToken(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(id_to_token_.size()) - 1; }
  size_t num_merges() const { return merges_.size(); }

 private:
  BpeModel() = default;
  struct Encoded {
    std::vector<int32_t> ids;
    std::vector<uint32_t> starts;
  };
  void MergeWord(std::string_view word, Encoded* out) const;

  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  std::array<int32_t, 256> byte_ids_{};  // <0xNN> ids, -1 when absent

  // Pre-token cache, sharded by hash so that concurrent encoders rarely contend.
  static constexpr size_t kCacheShards = 16;
  static constexpr size_t kCacheCapacityPerShard = 4096;
  static constexpr size_t kMaxCachedWordBytes = 256;
  struct CacheShard {
    std::mutex mu;
    std::unordered_map<std::string, Encoded> map;
  };
  mutable std::array<CacheShard, kCacheShards> cache_;
};

}  // namespace offloadd::text
