#pragma once
// The sandbox that job_spec_fuzzer and grpc_handlers_fuzzer validate job specs against
// (header-only; each harness is one TU): under `root`, a tiny Llama model directory (config.json,
// an empty safetensors file, a 457-token byte-level tokenizer), datasets in several formats, a
// chat template, an output parent and an NVMe directory. The seeds in fuzz/make_corpus.py name
// these files, so mutations reach both the accept and the refuse paths.

#include <sys/stat.h>

#include <fstream>
#include <iterator>
#include <string>

#include "fuzz/fuzz_util.h"

namespace offloadd::fuzz {

inline void WriteUnder(const std::string& root, const std::string& rel, const std::string& contents) {
  std::ofstream out(root + "/" + rel, std::ios::binary | std::ios::trunc);
  out << contents;
  if (!out) SetupFailed("cannot write " + root + "/" + rel);
}

inline std::string ReadSource(const std::string& rel) {
  const std::string path = SourceDir() + "/" + rel;
  std::ifstream in(path, std::ios::binary);
  if (!in) SetupFailed("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void MakeJobSandbox(const std::string& root) {
  auto Write = [&](const std::string& rel, const std::string& contents) { WriteUnder(root, rel, contents); };
  for (const char* d : {"", "/model", "/data", "/out", "/nvme"}) {
    ::mkdir((root + d).c_str(), 0755);
  }
  Write("model/config.json",
        R"({"model_type": "llama", "vocab_size": 457, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "eos_token_id": 456,
            "tie_word_embeddings": false})");
  // An empty but valid safetensors file: u64 header length 8, "{}" padded to 8 bytes.
  Write("model/model.safetensors", std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  Write("model/tokenizer.json", ReadSource("fuzz/data/tiny_bytelevel_tokenizer.json"));
  Write("model/tokenizer_config.json",
        R"({"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"})");
  Write("data/alpaca.jsonl",
        "{\"instruction\": \"Say hi\", \"input\": \"\", \"output\": \"hi\"}\n"
        "{\"instruction\": \"Add\", \"input\": \"1+1\", \"output\": \"2\", "
        "\"history\": [[\"a\", \"b\"]], \"system\": \"s\"}\n");
  Write("data/chat.json",
        R"([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}])");
  Write("data/sharegpt.json",
        R"([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
             "tools": "[]", "system": "sys"}])");
  Write("data/text.jsonl", "{\"text\": \"once upon a time\"}\n{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n");
  Write("data/pretok.jsonl", "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n");
  Write("template.jinja",
        "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}");
}

}  // namespace offloadd::fuzz
