#pragma once
// DataSource: the job's training data as a stream of micro-batches of token ids, ready for
// engine::Model::PrepareBatch. Wraps the tokenizer, chat template, text::DatasetReader and
// text::Batcher (or, for benchmarks, uniformly random tokens). Torch-free.
//
// A micro-batch holds batch_size sequences right-padded to the longest one (rounded up to a
// multiple of 8, or to a length bucket with DataConfig::length_buckets; at most max_seq_length,
// batch_planner.h PaddedLength): padding has target kIgnoreIndex, so it never adds to
// the loss, and causal attention keeps real tokens from seeing it. Targets are the HF labels
// shifted left by one (transformers' ForCausalLMLoss). With packing, segment ids restrict
// attention to each document (document_ids of the Batcher; padding gets its own segment).
//
// Resuming: State() is a JSON string (the Batcher cursor, or the synthetic counter); Restore()
// continues the exact same stream. Thread-compatible.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "job/train_config.h"

namespace offloadd::trainer {

struct MicroBatchData {
  int64_t batch = 0, seq = 0;
  std::vector<int64_t> input_ids;    // [batch * seq]
  std::vector<int64_t> targets;      // [batch * seq], -100 where no loss is taken
  std::vector<int64_t> position_ids;  // [batch * seq]
  std::vector<int64_t> segment_ids;  // [batch * seq] with packing, else empty
  int64_t tokens = 0;                // real (non-padding) tokens
  int64_t trained_tokens = 0;        // targets != -100
};

class DataSource {
 public:
  // vocab_size bounds the token ids (checked for every document: a tokenizer that does not match
  // the model fails here, naming the file and id, instead of corrupting the embedding lookup).
  static StatusOr<std::unique_ptr<DataSource>> Create(const DataConfig& config,
                                                      const std::string& model_dir,
                                                      int64_t vocab_size, int32_t batch_size,
                                                      uint64_t seed);
  ~DataSource();

  StatusOr<MicroBatchData> Next();
  // Sequences per epoch (counted by packing epoch 0; exact without packing).
  int64_t sequences_per_epoch() const { return sequences_per_epoch_; }
  double epoch() const;  // fractional epochs consumed so far
  std::string State() const;
  Status Restore(const std::string& state);
  // Without packing, the tokens of each document's sequence (at most max_seq_length): the
  // length distribution the step planner prices variable-length batches from. Empty for
  // synthetic or packed data (every micro-batch has the full length).
  std::vector<int64_t> SequenceLengths() const;
  // Totals of the loaded dataset, for logs.
  std::string Describe() const;

  // The chat template the records were rendered with, when any were: its
  // Jinja source and where it came from. The exported model carries it.
  struct TemplateUse {
    std::string source;
    std::string origin;    // "the tokenizer's own", "the file X", "offloadd's built-in template"
    bool tokenizers_own = false;
    std::string tokenizer_dir;  // the directory the tokenizer was read from
  };
  const TemplateUse* template_use() const;

 private:
  struct Impl;
  explicit DataSource(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  int64_t sequences_per_epoch_ = 0;
};

// HF Trainer's step count: max_steps when > 0, else
// ceil(num_train_epochs * max(1, ceil(sequences / batch) / accumulation)).
int64_t TotalSteps(int64_t max_steps, double num_train_epochs, int64_t sequences_per_epoch,
                   int32_t batch_size, int32_t accumulation_steps);

}  // namespace offloadd::trainer
