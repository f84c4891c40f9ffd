// offloadd-generate: greedy text generation with the engine and the native tokenizer (a demo and
// a smoke test of a model directory; no KV cache, so each step re-runs the whole prefix).
//
//   offloadd-generate --model DIR [--prompt TEXT] [--max-new-tokens N] [--stop-ids 1,2]
//                     [--device cpu|cuda] [--dtype f32|bf16]
//
// The prompt is encoded with the tokenizer's special tokens (e.g. Llama's BOS); an empty prompt
// is the BOS token alone. Generation stops at config.json's eos_token_id(s), or at --stop-ids
// when given (llama2.c models stop at BOS). Prints the decoded continuation and a newline.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/torch_boundary.h"
#include "text/tokenizer.h"

namespace offloadd::engine {
namespace {

Status Run(int argc, char** argv) {
  std::string dir, prompt, device = "cpu", dtype = "f32", stops;
  int64_t max_new = 128;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return InvalidArgumentError("missing value for " + k);
    std::string v = argv[++i];
    if (k == "--model")
      dir = v;
    else if (k == "--prompt")
      prompt = v;
    else if (k == "--max-new-tokens")
      max_new = std::atoll(v.c_str());
    else if (k == "--stop-ids")
      stops = v;
    else if (k == "--device")
      device = v;
    else if (k == "--dtype")
      dtype = v;
    else
      return InvalidArgumentError("unknown flag " + k);
  }
  if (dir.empty()) return InvalidArgumentError("--model is required");
  ASSIGN_OR_RETURN(auto tok, text::Tokenizer::FromDirectory(dir));
  const c10::Device dev(device == "cuda" ? c10::kCUDA : c10::kCPU);
  ASSIGN_OR_RETURN(auto model,
                   Model::Load(dir, {dtype == "bf16" ? c10::kBFloat16 : c10::kFloat, dev}));
  std::vector<int64_t> ids;
  if (prompt.empty()) {
    if (model->config().bos_token_id < 0)
      return InvalidArgumentError("empty prompt and no bos_token_id");
    ids.push_back(model->config().bos_token_id);
  } else {
    ASSIGN_OR_RETURN(auto enc, tok->Encode(prompt, /*add_special_tokens=*/true));
    ids.assign(enc.begin(), enc.end());
  }
  std::vector<int64_t> stop_ids = model->config().eos_token_ids;
  if (!stops.empty()) {
    stop_ids.clear();
    std::stringstream ss(stops);
    std::string item;
    while (std::getline(ss, item, ',')) stop_ids.push_back(std::atoll(item.c_str()));
  }
  ASSIGN_OR_RETURN(auto out, model->GenerateGreedy(ids, max_new, stop_ids));
  std::vector<int32_t> fresh(out.begin() + static_cast<std::ptrdiff_t>(ids.size()), out.end());
  ASSIGN_OR_RETURN(std::string text, tok->Decode(fresh, /*skip_special_tokens=*/true));
  std::printf("%s\n", text.c_str());
  return OkStatus();
}

}  // namespace
}  // namespace offloadd::engine

int main(int argc, char** argv) {
  const offloadd::Status st =
      offloadd::engine::RunTorch("generation", [&] { return offloadd::engine::Run(argc, argv); });
  if (!st.ok()) {
    std::fprintf(stderr, "offloadd-generate: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
