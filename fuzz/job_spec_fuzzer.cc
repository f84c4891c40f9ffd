// Fuzzes CreateJob's validation (daemon/jobs/job_validator.h) on a JobSpec parsed from the input
// bytes (the protobuf wire format, as the gRPC handler receives it). JobService::CreateJob itself
// lives in offloadd_daemon_core, which links the trainer and LibTorch; its handler only parses the
// request and calls ValidateJobSpec, which is what this harness drives: sizes, enums, ranges,
// path policy, config.json, tokenizer, chat template and the first dataset records.
//
// The paths a spec names resolve under a fixed sandbox, kRoot, created at start-up: a tiny Llama
// model directory (config.json, model.safetensors, a 457-token byte-level tokenizer), datasets
// in several formats, a chat template, an output parent and an NVMe directory. kRoot is the only
// allowed root (PathPolicy and SetAllowedRoots, as the daemon configures them), so the seeds in
// the corpus name real files and mutations reach both the accept and the refuse paths.
// Checked: a spec that validates has resolved paths under kRoot.

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "common/safe_path.h"
#include "daemon/jobs/job_validator.h"
#include "fuzz/fuzz_util.h"

namespace od = offloadd::daemon;

namespace {

constexpr const char* kRoot = "/tmp/offloadd-fuzz-job-spec";

void Write(const std::string& rel, const std::string& contents) {
  std::ofstream out(std::string(kRoot) + "/" + rel, std::ios::binary | std::ios::trunc);
  out << contents;
  if (!out) offloadd::fuzz::SetupFailed("cannot write " + std::string(kRoot) + "/" + rel);
}

std::string ReadSource(const std::string& rel) {
  const std::string path = std::string(OFFLOADD_FUZZ_SOURCE_DIR) + "/" + rel;
  std::ifstream in(path, std::ios::binary);
  if (!in) offloadd::fuzz::SetupFailed("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void MakeSandbox() {
  for (const char* d : {"", "/model", "/data", "/out", "/nvme"}) {
    ::mkdir((std::string(kRoot) + d).c_str(), 0755);
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

struct Env {
  od::PathPolicy paths{{kRoot}};
  od::NodeBudget node;
};

const Env& GetEnv() {
  static const Env env = [] {
    MakeSandbox();
    offloadd::SetAllowedRoots({kRoot});
    Env e;
    e.node.host_memory_bytes = 64ull << 30;
    e.node.store_dirs.push_back({std::string(kRoot) + "/nvme", 1.0, 1ull << 40, 1ull << 39, ""});
    return e;
  }();
  return env;
}

bool UnderRoot(const std::string& p) {
  return p.empty() || p.rfind(std::string(kRoot) + "/", 0) == 0 || p == kRoot;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Protobuf logs every string field with invalid UTF-8 it parses: gigabytes over a long run.
  google::protobuf::SetLogHandler(nullptr);
  GetEnv();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  offloadd::v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  const Env& env = GetEnv();
  od::ValidationResult r = od::ValidateJobSpec(spec, env.paths, env.node);
  // OFFLOADD_FUZZ_VERBOSE=1 (when replaying seeds): why a spec was refused.
  static const bool verbose = std::getenv("OFFLOADD_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "job_spec: %zu violations\n", r.violations.size());
    for (const auto& v : r.violations) {
      std::fprintf(stderr, "  %s: %s\n", v.field.c_str(), v.description.c_str());
    }
  }
  if (!r.ok()) return 0;
  FUZZ_CHECK(UnderRoot(r.resolved.model().path()));
  FUZZ_CHECK(UnderRoot(r.resolved.tokenizer().path()));
  FUZZ_CHECK(UnderRoot(r.resolved.output_dir()));
  for (const std::string& p : r.resolved.dataset().paths()) FUZZ_CHECK(UnderRoot(p));
  return 0;
}
