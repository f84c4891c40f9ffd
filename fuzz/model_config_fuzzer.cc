// Fuzzes the config.json parser of model directories (engine/model_config.h): the input is the
// file's text. A config that parses must describe a model the engine can size without overflow
// or division by zero (positive dimensions, head_dim x heads consistent) and consistent parts.

#include <cstddef>
#include <cstdint>

#include "engine/model_config.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto config = offloadd::engine::ParseModelConfig(offloadd::fuzz::AsText(data, size), "config.json");
  if (!config.ok()) return 0;
  const auto& c = *config;
  FUZZ_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0);
  FUZZ_CHECK(c.num_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0);
  // The parts are consistent: one layer type per layer, a window where a layer slides, RoPE that
  // rotates an even number of dimensions of a head, longrope factors for each frequency.
  FUZZ_CHECK(c.sliding.empty() || static_cast<int64_t>(c.sliding.size()) == c.num_layers);
  FUZZ_CHECK(c.sliding.empty() == (c.sliding_window == 0));
  FUZZ_CHECK(c.num_heads % c.num_kv_heads == 0);
  FUZZ_CHECK(c.attn_scale > 0);
  const bool rotary = c.arch == offloadd::engine::Architecture::kLlama;
  for (const offloadd::engine::RopeConfig* r : {&c.rope, &c.rope_local}) {
    if (!rotary || (r == &c.rope_local && !c.has_local_rope)) continue;
    FUZZ_CHECK(r->rotary_dim >= 2 && r->rotary_dim % 2 == 0 && r->rotary_dim <= c.head_dim);
    FUZZ_CHECK(r->theta > 0);
    if (r->type == "longrope") {
      FUZZ_CHECK(static_cast<int64_t>(r->short_factor.size()) == r->rotary_dim / 2);
      FUZZ_CHECK(static_cast<int64_t>(r->long_factor.size()) == r->rotary_dim / 2);
    }
  }
  const auto counts = offloadd::engine::CountParams(c);
  FUZZ_CHECK(counts.total > 0 && counts.layer > 0);
  (void)offloadd::engine::DescribeParts(c);
  (void)offloadd::engine::SequenceLengthProblem(c, 1 << 20);
  (void)offloadd::engine::DescribeDropout(c);
  (void)offloadd::engine::DropoutProblem(c, false);
  return 0;
}
