// Fuzzes CreateJob's validation (job/job_validator.h) on a JobSpec parsed from the input
// bytes (the protobuf wire format, as the gRPC handler receives it): ValidateJobSpec alone, fast,
// on sizes, enums, ranges, path policy, config.json, tokenizer, chat template and the first
// dataset records. grpc_handlers_fuzzer drives the whole server (CreateJob and the other calls).
//
// The paths a spec names resolve under a fixed sandbox, kRoot, created at start-up
// (fuzz/job_sandbox.h). kRoot is the only
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
#include "fuzz/fuzz_util.h"
#include "fuzz/job_sandbox.h"
#include "job/job_validator.h"

namespace od = offloadd::daemon;

namespace {

constexpr const char* kRoot = "/tmp/offloadd-fuzz-job-spec";

struct Env {
  od::PathPolicy paths{{kRoot}};
  od::NodeBudget node;
};

const Env& GetEnv() {
  static const Env env = [] {
    offloadd::fuzz::MakeJobSandbox(kRoot);
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
