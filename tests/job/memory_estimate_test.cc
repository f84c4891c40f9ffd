// The validator's GPU memory floor: the LM head is counted as the chunked loss runs it, so a batch
// PyTorch trains in 6 GiB is not refused for logits the engine never materialises at once.
#include "job/memory_estimate.h"

#include <gtest/gtest.h>

namespace offloadd::daemon {
namespace {

engine::ModelConfig TinyLlama() {  // TinyLlama-1.1B's config.json
  engine::ModelConfig c;
  c.vocab_size = 32000;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.num_layers = 22;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  return c;
}

TEST(MemoryEstimateTest, TinyLlamaParameterCount) {
  const ModelSize s = EstimateModelSize(TinyLlama());
  EXPECT_EQ(s.total_params, 1100048384);  // what transformers' num_parameters() reports
  EXPECT_EQ(s.largest_block_params, 32000 * 2048);
}

// The supported families, counted from their parts (q/k norms, sandwich norms, fused tensors, tied
// heads): totals are transformers' num_parameters() of the same configs.
TEST(MemoryEstimateTest, ParameterCountsFromThePartsOfEachFamily) {
  struct Case {
    const char* json;
    int64_t params;
  };
  const Case cases[] = {
      {R"({"model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
           "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": true})",
       596049920},  // Qwen3-0.6B
      {R"({"model_type": "gemma3_text", "vocab_size": 262144, "hidden_size": 1152,
           "intermediate_size": 6912, "num_hidden_layers": 26, "num_attention_heads": 4,
           "num_key_value_heads": 1, "head_dim": 256})",
       999885952},  // Gemma-3-1B
      {R"({"model_type": "phi3", "vocab_size": 200064, "hidden_size": 3072,
           "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 24,
           "num_key_value_heads": 8, "tie_word_embeddings": true, "partial_rotary_factor": 0.75})",
       3836021760},  // Phi-4-mini
      {R"({"model_type": "olmo2", "vocab_size": 100352, "hidden_size": 2048,
           "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 16,
           "num_key_value_heads": 16})",
       1484916736},  // OLMo-2-1B
  };
  for (const Case& k : cases) {
    auto c = engine::ParseModelConfig(k.json, "config.json");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(EstimateModelSize(*c).total_params, k.params) << c->model_type;
  }
}

TEST(MemoryEstimateTest, HeadIsCountedPerChunk) {
  const engine::ModelConfig c = TinyLlama();
  const ModelSize s = EstimateModelSize(c);
  // Chunk: 128 MiB of fp32 logits = 1048 tokens of a 32000 vocabulary.
  const uint64_t chunk = (128ull << 20) / (32000 * 4);
  ASSERT_EQ(chunk, 1048u);
  const uint64_t head = chunk * 32000 * (2 * 2 + 12) + 32000ull * 2048 * 4;
  const uint64_t weights = 3ull * 2 * 32000 * 2048;  // two weight buffers + one gradient, bf16
  for (int64_t batch : {8, 32}) {
    const uint64_t tokens = static_cast<uint64_t>(batch) * 1024;
    const uint64_t layer = tokens * (8 * 2048 + 3 * 5632) * 2;
    const MemoryFloor f = EstimateMemoryFloor(s, c, batch, 1024, 2);
    EXPECT_EQ(f.gpu_bytes, weights + layer + head) << "batch " << batch;
    EXPECT_NE(f.gpu_breakdown.find("chunks of 1048 tokens"), std::string::npos) << f.gpu_breakdown;
  }
  // Batch 32 x 1024 was refused in 6 GiB while the whole [32768, 32000] logits were counted
  // (13.1 GB); the chunked head leaves the floor under 6 GiB.
  EXPECT_LT(EstimateMemoryFloor(s, c, 32, 1024, 2).gpu_bytes, 6ull << 30);
  // Fewer tokens than a chunk: the head holds only those.
  const MemoryFloor small = EstimateMemoryFloor(s, c, 1, 16, 2);
  EXPECT_NE(small.gpu_breakdown.find("chunks of 16 tokens"), std::string::npos) << small.gpu_breakdown;
}

// Past one MLP tile (engine/tiles.h: 1 GiB of gate and up, 47662 TinyLlama rows in bf16) the
// MLP's intermediates stop growing with the sequence; the rest of the layer stays linear.
TEST(MemoryEstimateTest, LongSequencesPriceOneMlpTile) {
  const engine::ModelConfig c = TinyLlama();
  const ModelSize s = EstimateModelSize(c);
  const uint64_t rows = (1ull << 30) / (2 * 5632 * 2);
  ASSERT_EQ(rows, 47662u);
  const uint64_t short_layer = 32768ull * (8 * 2048 + 3 * 5632) * 2;
  const uint64_t long_layer = 131072ull * 8 * 2048 * 2 + rows * 3 * 5632 * 2;
  EXPECT_EQ(EstimateMemoryFloor(s, c, 1, 131072, 2).gpu_bytes -
                EstimateMemoryFloor(s, c, 1, 32768, 2).gpu_bytes,
            long_layer - short_layer);
}

// A refusal names the longest sequence that fits at batch 1: the floor at that length fits, 8
// tokens more do not.
TEST(MemoryEstimateTest, LargestSeqLengthWithinIsTheLastThatFits) {
  const engine::ModelConfig c = TinyLlama();
  const ModelSize s = EstimateModelSize(c);
  const uint64_t budget = EstimateMemoryFloor(s, c, 1, 20000, 2).gpu_bytes;
  const int64_t len = LargestSeqLengthWithin(s, c, 1, 2, budget, 131072);
  EXPECT_EQ(len % 8, 0);
  EXPECT_GE(len, 20000 - 8);
  EXPECT_LE(EstimateMemoryFloor(s, c, 1, len, 2).gpu_bytes, budget);
  EXPECT_GT(EstimateMemoryFloor(s, c, 1, len + 8, 2).gpu_bytes, budget);
  EXPECT_EQ(LargestSeqLengthWithin(s, c, 1, 2, 1 << 20, 131072), 0);  // not even 8 tokens
}

TEST(MemoryEstimateTest, LargestBatchWithinIsTheLastThatFits) {
  const engine::ModelConfig c = TinyLlama();
  const ModelSize s = EstimateModelSize(c);
  const uint64_t f8 = EstimateMemoryFloor(s, c, 8, 1024, 2).gpu_bytes;
  const uint64_t f9 = EstimateMemoryFloor(s, c, 9, 1024, 2).gpu_bytes;
  ASSERT_LT(f8, f9);
  EXPECT_EQ(LargestBatchWithin(s, c, 1024, 2, f8, 64), 8);
  EXPECT_EQ(LargestBatchWithin(s, c, 1024, 2, f9 - 1, 64), 8);
  EXPECT_EQ(LargestBatchWithin(s, c, 1024, 2, f9, 64), 9);
  EXPECT_EQ(LargestBatchWithin(s, c, 1024, 2, 1ull << 50, 64), 64);  // capped at the job's batch
  EXPECT_EQ(LargestBatchWithin(s, c, 1024, 2, 1 << 20, 64), 0);       // not even batch 1
}

// A mixture of experts with a dense layer between sparse ones (Qwen3-MoE's mlp_only_layers): the
// host RAM estimate and the step estimate price each block as the trainer lays it out, every
// expert of each sparse layer in its block, the dense layer at its own size and the final norm in
// the head's block (the layers were all priced at the largest, a sparse one, and the head at 0).
TEST(MemoryEstimateTest, HostMemoryCountsEveryExpertOfEachSparseLayer) {
  auto c = engine::ParseModelConfig(
      R"({"model_type": "qwen3_moe", "vocab_size": 128, "hidden_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "num_hidden_layers": 3, "intermediate_size": 96, "moe_intermediate_size": 32,
          "num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [1],
          "decoder_sparse_step": 1, "tie_word_embeddings": true})",
      "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const ModelSize s = EstimateModelSize(*c);
  const uint64_t attn = 12288 + 32 + 128;                   // q, k, v, o; q/k norms; two norms
  const uint64_t sparse = attn + 8 * 64 + 8 * 3 * 64 * 32;  // router + 8 experts
  const uint64_t dense = attn + 3 * 64 * 96;
  const trainer::HostMemoryInputs in = JobHostMemoryInputs(v1::JobSpec(), *c, s, 2, true);
  EXPECT_EQ(in.optimizer.block_elements,
            (std::vector<uint64_t>{128 * 64, sparse, dense, sparse, 64}));
  uint64_t sum = 0;
  for (uint64_t e : in.optimizer.block_elements) sum += e;
  EXPECT_EQ(sum, 163360u);  // transformers' num_parameters() of this config
  EXPECT_EQ(static_cast<int64_t>(sum), s.total_params);
  // At least 14 B of arena per parameter (grad staging, fp32 master, exp_avg, exp_avg_sq).
  EXPECT_GE(trainer::PredictHostMemory(in).arena, 14 * sum);
}

// A dense model's blocks are what they were: every layer at layer_params, the head the rest.
TEST(MemoryEstimateTest, DenseBlocksAreUnchanged) {
  const engine::ModelConfig c = TinyLlama();
  const ModelSize s = EstimateModelSize(c);
  std::vector<uint64_t> old{static_cast<uint64_t>(s.embedding_params)};
  for (int l = 0; l < 22; ++l) old.push_back(static_cast<uint64_t>(s.layer_params));
  old.push_back(static_cast<uint64_t>(s.total_params - s.embedding_params - 22 * s.layer_params));
  EXPECT_EQ(JobHostMemoryInputs(v1::JobSpec(), c, s, 2, true).optimizer.block_elements, old);
  ModelSize without = s;  // a size made without per-layer figures
  without.layers.clear();
  EXPECT_EQ(JobHostMemoryInputs(v1::JobSpec(), c, without, 2, true).optimizer.block_elements, old);
}

}  // namespace
}  // namespace offloadd::daemon
