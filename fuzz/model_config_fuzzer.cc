// Fuzzes the config.json parser of model directories (engine/model_config.h): the input is the
// file's text. A config that parses must describe a model the engine can size without overflow
// or division by zero (positive dimensions, head_dim x heads consistent).

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
  (void)offloadd::engine::DescribeDropout(c);
  (void)offloadd::engine::DropoutProblem(c, false);
  return 0;
}
