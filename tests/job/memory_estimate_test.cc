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

}  // namespace
}  // namespace offloadd::daemon
