#pragma once
// Turns documents into training sequences of at most max_seq_length tokens.
//
// Order: each epoch visits every document once, in dataset order or (shuffle) in a permutation
// that depends only on (seed, epoch, number of documents):
//   state = seed XOR (epoch * 0x9E3779B97F4A7C15)            (uint64 arithmetic)
//   order = [0, 1, ..., n-1]
//   for i = n-1 down to 1: j = splitmix64(state) mod (i+1); swap(order[i], order[j])
// where splitmix64 is Vigna's generator: state += 0x9E3779B97F4A7C15; z = state;
//   z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9; z = (z ^ (z >> 27)) * 0x94D049BB133111EB;
//   return z ^ (z >> 31).
//
// Packing (greedy, in order): documents are appended to the current sequence while they fit;
// a document that does not fit starts the next sequence; a sequence never spans two epochs.
// A document longer than max_seq_length is truncated to it (or dropped, with drop_overlong).
// Without packing each sequence holds one document. Inside a sequence, position_ids restart
// at 0 for every document, cu_seqlens gives the document boundaries (flash-attention varlen
// layout) and document_ids tags every token, so attention must be restricted to equal
// document ids; the first label of every document is kIgnoreIndex, so no token is trained to
// predict across a boundary (the HF causal-LM loss shifts labels left by one).
// With pad_id, sequences are padded to max_seq_length (labels kIgnoreIndex, position 0,
// document id -1, not counted in cu_seqlens).
//
// With a mixture (mixture.h), the epoch's order is Mixture::EpochOrder instead: the documents
// are the datasets' concatenated, and an epoch is as long as that order.
//
// Resuming: the cursor (epoch, index of the next document in that epoch's order) determines all
// later sequences, so SaveState()/RestoreState() reproduce the stream exactly.
// Thread-compatible.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "text/dataset.h"
#include "text/mixture.h"

namespace offloadd::text {

// Vigna's splitmix64 step (the generator above): advances *state and returns the next value.
// The batcher's shuffle and the dataset mixture (text/mixture.h) draw from it.
uint64_t SplitMix64(uint64_t* state);

struct BatcherOptions {
  int32_t max_seq_length = 2048;
  bool packing = true;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_overlong = false;     // else truncate
  std::optional<int32_t> pad_id;  // pad every sequence to max_seq_length when set
  // Several datasets mixed by weight: its total must be the number of documents.
  std::shared_ptr<const Mixture> mixture;
};

struct PackedSequence {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
  std::vector<int32_t> position_ids;
  std::vector<int32_t> cu_seqlens;    // [0, end of doc 0, end of doc 1, ..., real tokens]
  std::vector<int32_t> document_ids;  // per token: 0, 1, ... within the sequence; -1 padding
  std::vector<uint64_t> sources;      // dataset index of each document
};

struct Cursor {
  uint64_t epoch = 0;
  uint64_t index = 0;  // next position in the epoch's document order
  friend bool operator==(const Cursor&, const Cursor&) = default;
};

struct BatcherStats {
  uint64_t truncated = 0;  // documents cut to max_seq_length
  uint64_t dropped = 0;    // documents skipped by drop_overlong
};

class Batcher {
 public:
  // Fails when max_seq_length < 1 or no document can ever be emitted.
  static StatusOr<Batcher> Create(std::shared_ptr<const std::vector<Document>> documents,
                                  const BatcherOptions& options);

  PackedSequence Next();

  const Cursor& cursor() const { return cursor_; }
  const BatcherStats& stats() const { return stats_; }
  // JSON {"epoch","index","seed","num_documents","max_seq_length","packing","shuffle"} and, with a
  // mixture, "mixture" (Mixture::Fingerprint).
  std::string SaveState() const;
  // Restores a SaveState() string; FAILED_PRECONDITION if it was saved for a different dataset
  // size or options, INVALID_ARGUMENT if malformed.
  Status RestoreState(std::string_view state);

  static std::vector<uint32_t> EpochOrder(size_t n, uint64_t seed, uint64_t epoch, bool shuffle);

 private:
  Batcher(std::shared_ptr<const std::vector<Document>> docs, const BatcherOptions& options)
      : docs_(std::move(docs)), options_(options) {}
  void EnsureOrder();
  void Finish(PackedSequence* seq) const;

  std::shared_ptr<const std::vector<Document>> docs_;
  BatcherOptions options_;
  Cursor cursor_;
  std::vector<uint32_t> order_;
  std::optional<uint64_t> order_epoch_;
  BatcherStats stats_;
};

}  // namespace offloadd::text
