// Specs that CreateJob accepted and that then failed once the job ran, or that
// trained nothing and SUCCEEDED, are refused by validation, each naming its field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>

#include "common/units.h"
#include "job/job_validator.h"
#include "job/unsupported_options.h"

namespace offloadd::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;

// A tiny GPT-2 directory with the real GPT-2 tokenizer (../shared/data) under an allowed root.
class JobRefusalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
    const fs::path tokenizer = fs::path(src ? src : ".") / ".." / "shared" / "data" / "tokenizers" /
                               "gpt2" / "tokenizer.json";
    if (!fs::exists(tokenizer)) GTEST_SKIP() << "../shared/data (real tokenizers) not present";
    char tmpl[] = "/tmp/offloadd_refusals_XXXXXX";
    root_ = fs::canonical(mkdtemp(tmpl));
    fs::create_directories(root_ / "model");
    std::ofstream(root_ / "model" / "config.json")
        << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
              "n_positions": 256})";
    std::ofstream(root_ / "model" / "model.safetensors") << "x";
    fs::copy_file(tokenizer, root_ / "model" / "tokenizer.json");
    Write("data.jsonl", R"({"instruction": "Say hi", "input": "", "output": "hi"})"
                        "\n");
    node_.host_memory_bytes = 64ull << 30;
    node_.cpu_cores = 4;  // CPU executors stand in for GPUs: resources.gpus 2 is placeable
    StoreDirFacts store;
    store.path = root_.string();
    store.capacity_bytes = store.available_bytes = 1ull << 40;
    node_.store_dirs.push_back(store);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(root_ / name) << text;
  }

  v1::JobSpec Spec(const std::string& data = "data.jsonl") const {
    v1::JobSpec s;
    s.mutable_model()->set_path(root_ / "model");
    s.mutable_dataset()->add_paths(root_ / data);
    s.mutable_dataset()->set_max_seq_length(128);
    s.mutable_training()->set_per_device_train_batch_size(2);
    s.set_output_dir(root_ / "out");
    s.set_dropout(v1::DROPOUT_MODE_DISABLE);
    return s;
  }

  ValidationResult Validate(const v1::JobSpec& s) const {
    return ValidateJobSpec(s, PathPolicy({root_}), node_);
  }

  static std::string Describe(const ValidationResult& r) {
    std::string out;
    for (const auto& v : r.violations) out += v.field + ": " + v.description + "\n";
    return out;
  }

  // The one violation of `r`, which must be on `field` and say `says`.
  static void ExpectOnly(const ValidationResult& r, const std::string& field,
                         const std::string& says) {
    ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
    EXPECT_EQ(r.violations[0].field, field) << Describe(r);
    EXPECT_NE(r.violations[0].description.find(says), std::string::npos) << Describe(r);
  }

  fs::path root_;
  NodeBudget node_;
};

TEST_F(JobRefusalsTest, TheBaseSpecIsValid) {
  const ValidationResult r = Validate(Spec());
  EXPECT_TRUE(r.ok()) << Describe(r);
}

TEST_F(JobRefusalsTest, OutputDirMustBeApartFromTheModel) {
  v1::JobSpec s = Spec();
  s.set_output_dir(root_ / "model");
  ExpectOnly(Validate(s), "output_dir", "is model.path");
  s.set_output_dir((root_ / "model" / ".." / "model").string() + "/");
  const ValidationResult again = Validate(s);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.violations[0].field, "output_dir") << Describe(again);
  s.set_output_dir(root_ / "model" / "run1");
  ExpectOnly(Validate(s), "output_dir", "lies inside model.path");
  s.set_output_dir(root_);
  ExpectOnly(Validate(s), "output_dir", "contains model.path");
  s.set_output_dir(root_ / "model-run");  // a sibling whose name starts like the model's
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
}

TEST_F(JobRefusalsTest, ANulByteInAPathIsRefusedNotCut) {
  v1::JobSpec s = Spec();
  s.set_output_dir((root_ / "out").string() + std::string("\0/../elsewhere", 14));
  ExpectOnly(Validate(s), "output_dir", "NUL byte at offset");
  s = Spec();
  s.mutable_dataset()->set_paths(0, (root_ / "data.jsonl").string() + std::string(1, '\0') + "x");
  ExpectOnly(Validate(s), "dataset.paths[0]", "NUL byte");
}

// resources.hosts: as many hosts as the daemon's cluster has (itself and cluster.peers),
// resources.gpus_per_host ranks on each (bounded as resources.gpus is); what the trainer does not
// build across hosts is refused before anything starts.
TEST_F(JobRefusalsTest, JobsAcrossHosts) {
  v1::JobSpec s = Spec();
  s.mutable_resources()->set_hosts(2);
  ExpectOnly(Validate(s), "resources.hosts", "this daemon's cluster has 1 host(s)");
  node_.cluster_hosts = 2;
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));

  s.mutable_resources()->set_gpus_per_host(2);  // 2 CPU executors per host on 4 cores
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
  s.mutable_resources()->set_gpus_per_host(5);
  ExpectOnly(Validate(s), "resources.gpus_per_host", "at most one CPU executor per core (4)");
  s.mutable_resources()->set_gpus_per_host(2);
  s.mutable_training()->set_auto_find_batch_size(true);  // the trainer's data-parallel refusal
  ExpectOnly(Validate(s), "training.per_device_train_batch_size",
             "resources.hosts 2 x gpus_per_host 2");
  s.mutable_training()->set_auto_find_batch_size(false);
  s.mutable_resources()->set_gpus_per_host(1);
  s.mutable_resources()->set_gpus(2);
  ExpectOnly(Validate(s), "resources.gpus", "a job across hosts sets resources.gpus_per_host");
  s.mutable_resources()->clear_gpus();
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  ExpectOnly(Validate(s), "offload.offload_optimizer.device", "nvme is not built across hosts");

  s = Spec();  // one host: gpus_per_host is not the way to ask for GPUs
  s.mutable_resources()->set_gpus_per_host(2);
  ExpectOnly(Validate(s), "resources.gpus_per_host", "a job on one host sets resources.gpus");
}

// Across H hosts each host holds 1/H of the optimizer states (ZeRO-1) and the whole weights its
// ranks read, once: the host's share is priced, not the whole arena on every host. A limit
// between the two is refused on one host and accepted across two; below the share, refused with
// the share's numbers.
TEST_F(JobRefusalsTest, AJobAcrossHostsIsPricedByEachHostsShare) {
  node_.cluster_hosts = 2;
  v1::JobSpec s = Spec();
  const ValidationResult one = Validate(s);
  ASSERT_TRUE(one.ok()) << Describe(one);
  s.mutable_resources()->set_hosts(2);
  const ValidationResult two = Validate(s);
  ASSERT_TRUE(two.ok()) << Describe(two);
  const auto params = static_cast<uint64_t>(one.model_size.total_params);
  // A CPU node computes in fp32: the ranks read fp32 weights, one copy per host.
  EXPECT_EQ(two.host_memory.device, 4 * params);
  EXPECT_EQ(one.host_memory.device, 0u);
  // The arena: 16 B per parameter (fp32 master, moments, gradient staging); host 0's slice of
  // every block is ceil(n / 2), so at most half the arena plus a page per block and region.
  EXPECT_GE(one.host_memory.arena, 16 * params);
  EXPECT_GE(two.host_memory.arena, 8 * params);
  EXPECT_LE(two.host_memory.arena, one.host_memory.arena / 2 + (1 << 20));
  EXPECT_EQ(two.host_memory.processes, one.host_memory.processes);
  ASSERT_LT(two.host_memory.total, one.host_memory.total);

  const uint64_t between = (one.host_memory.total + two.host_memory.total) / 2;
  s.mutable_resources()->set_host_memory_limit(between);
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
  s.mutable_resources()->clear_hosts();
  ExpectOnly(Validate(s), "resources.host_memory_limit",
             "the job needs host RAM " + FormatByteSize(one.host_memory.total));

  // Two ranks per host: the host's slice is the same size (ceil(n / 4) twice), its ranks share
  // one copy of the whole weights.
  s.mutable_resources()->set_hosts(2);
  s.mutable_resources()->clear_host_memory_limit();
  s.mutable_resources()->set_gpus_per_host(2);
  const ValidationResult four = Validate(s);
  ASSERT_TRUE(four.ok()) << Describe(four);
  EXPECT_EQ(four.host_memory.device, 4 * params);
  EXPECT_LE(four.host_memory.arena, two.host_memory.arena + (1 << 20));

  // Below the share: refused with the share's numbers, and no NVMe tier offered (not built across
  // hosts).
  s.mutable_resources()->set_gpus_per_host(1);
  s.mutable_resources()->set_host_memory_limit(two.host_memory.total - 1);
  const ValidationResult r = Validate(s);
  ExpectOnly(r, "resources.host_memory_limit",
             "each of the job's 2 hosts holds its 1/2 of the optimizer states and the whole "
             "weights its ranks read: the job needs host RAM " +
                 FormatByteSize(two.host_memory.total) + " (arena " +
                 FormatByteSize(two.host_memory.arena) + ", the device's weights and activations " +
                 FormatByteSize(4 * params));
  EXPECT_EQ(r.violations[0].description.find("NVMe"), std::string::npos)
      << r.violations[0].description;
  std::cout << "one host " << FormatByteSize(one.host_memory.total) << ", each of two "
            << FormatByteSize(two.host_memory.total) << "; refused: " << r.violations[0].description
            << "\n";
}

TEST_F(JobRefusalsTest, CombinationsTheTrainerRefusesAtStart) {
  v1::JobSpec s = Spec();
  s.mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  ExpectOnly(Validate(s), "offload.offload_optimizer.device",
             "not supported with compression.type lsp");

  s = Spec();
  s.mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);
  s.mutable_resources()->set_gpus(2);
  ExpectOnly(Validate(s), "resources.gpus", "with compression.type lsp is not built yet");

  // The automatic batch with ranks of one host: rank 0 chooses among what fits every rank.
  s = Spec();
  s.mutable_training()->set_auto_find_batch_size(true);
  s.mutable_resources()->set_gpus(2);
  EXPECT_TRUE(UnsupportedOptions(s).empty()) << Describe(Validate(s));

  // Each alone is fine.
  for (auto alone : {std::function<void(v1::JobSpec&)>(
                         [](v1::JobSpec& x) { x.mutable_resources()->set_gpus(2); }),
                     std::function<void(v1::JobSpec&)>([](v1::JobSpec& x) {
                       x.mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);
                     }),
                     std::function<void(v1::JobSpec&)>([](v1::JobSpec& x) {
                       x.mutable_training()->set_auto_find_batch_size(true);
                     })}) {
    v1::JobSpec one = Spec();
    alone(one);
    EXPECT_TRUE(UnsupportedOptions(one).empty()) << one.ShortDebugString();
  }
}

// Compact optimizer modes: bf16 and int8 states with an fp32 master are run by the trainer and
// accepted, and a bf16 master with bf16 compute, on the NVMe tier too; what they do not run with
// yet (NVMe states with data parallelism, LSP, GPU states with data parallelism, a bf16 master
// with other compute) is refused naming the field and the mode;
// an unknown number is named.
TEST_F(JobRefusalsTest, CompactStatesAreAcceptedAndWhatTheTrainerDoesNotRunIsRefused) {
  v1::JobSpec s = Spec();
  for (v1::StateDtype d : {v1::STATE_DTYPE_INT8, v1::STATE_DTYPE_BF16}) {
    s = Spec();
    s.mutable_optimizer()->set_state_dtype(d);
    const ValidationResult r = Validate(s);
    EXPECT_TRUE(r.ok()) << Describe(r);
  }
  s = Spec();
  s.mutable_training()->set_optim("adamw_bnb_8bit");  // resolves to state_dtype int8
  const ValidationResult bnb = Validate(s);
  EXPECT_TRUE(bnb.ok()) << Describe(bnb);
  // A bf16 master is the device's bf16 weights: accepted with bf16 compute, refused with fp16
  // and where compute_dtype resolves to fp32 (unset, on this node without a GPU).
  s = Spec();
  s.mutable_optimizer()->set_master_dtype(v1::MASTER_DTYPE_BF16);
  ExpectOnly(Validate(s), "optimizer.master_dtype", "resolves to fp32");
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  const ValidationResult bf16_master = Validate(s);
  EXPECT_TRUE(bf16_master.ok()) << Describe(bf16_master);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP16);
  ExpectOnly(Validate(s), "optimizer.master_dtype",
             "bf16 needs model.compute_dtype bf16, not fp16");
  // The NVMe tier stores and stages the compact formats: accepted with one rank; with several
  // ranks (not built) refused naming the mode and the group.
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  EXPECT_TRUE(UnsupportedOptions(s).empty()) << s.ShortDebugString();
  s = Spec();
  s.mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_INT8);
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  EXPECT_TRUE(UnsupportedOptions(s).empty()) << s.ShortDebugString();
  s.mutable_resources()->set_gpus(2);
  const std::vector<FieldViolation> nvme = UnsupportedOptions(s);
  ASSERT_EQ(nvme.size(), 1u);
  EXPECT_EQ(nvme[0].field, "offload.offload_optimizer.device");
  EXPECT_NE(nvme[0].description.find("optimizer.state_dtype int8 and resources.gpus 2"),
            std::string::npos)
      << nvme[0].description;
  // Several ranks of one host share rank 0's compact arena: int8 states and a bf16 master are
  // accepted; GPU-resident states (each rank's replica starts from fp32 states) are refused by
  // name.
  s = Spec();
  s.mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_INT8);
  s.mutable_resources()->set_gpus(2);
  EXPECT_TRUE(UnsupportedOptions(s).empty());
  s.mutable_offload()->mutable_offload_optimizer()->set_ratio(0.5);
  const std::vector<FieldViolation> dp_gpu = UnsupportedOptions(s);
  ASSERT_EQ(dp_gpu.size(), 1u);
  EXPECT_EQ(dp_gpu[0].field, "offload.offload_optimizer.ratio");
  EXPECT_NE(dp_gpu[0].description.find("optimizer.state_dtype int8 and resources.gpus 2"),
            std::string::npos)
      << dp_gpu[0].description;
  s = Spec();
  s.mutable_optimizer()->set_master_dtype(v1::MASTER_DTYPE_BF16);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  s.mutable_resources()->set_gpus(2);
  EXPECT_TRUE(UnsupportedOptions(s).empty());
  s = Spec();
  s.mutable_optimizer()->set_state_dtype(static_cast<v1::StateDtype>(9));
  ExpectOnly(Validate(s), "optimizer.state_dtype", "unknown value 9");
  s = Spec();
  s.mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_FP32);
  s.mutable_optimizer()->set_master_dtype(v1::MASTER_DTYPE_FP32);
  const ValidationResult exact = Validate(s);
  EXPECT_TRUE(exact.ok()) << Describe(exact);
}

TEST_F(JobRefusalsTest, AJsonArrayWithATrailingCommaIsRefused) {
  std::string array = "[";
  for (int i = 0; i < 12; ++i)
    array += R"({"instruction": "Say hi", "input": "", "output": "hi"},)"
             "\n";
  Write("trailing.json", array + "]\n");
  ExpectOnly(Validate(Spec("trailing.json")), "dataset.paths[0]",
             ":13: an empty element in the JSON array");
  Write("fine.json", array.substr(0, array.size() - 2) + "\n]\n");
  const ValidationResult fine = Validate(Spec("fine.json"));
  EXPECT_TRUE(fine.ok()) << Describe(fine);
}

TEST_F(JobRefusalsTest, APretokenizedRecordWithNoTokensIsRefused) {
  Write("empty.jsonl", R"({"input_ids": [1, 2, 3]})"
                       "\n"
                       R"({"input_ids": []})"
                       "\n");
  v1::JobSpec s = Spec("empty.jsonl");
  s.mutable_dataset()->set_format(v1::DATASET_FORMAT_PRETOKENIZED);
  ExpectOnly(Validate(s), "dataset.paths[0]",
             "empty.jsonl:2: the record has no tokens (empty input_ids)");
}

TEST_F(JobRefusalsTest, ADatasetWithNothingToTrainIsRefused) {
  Write("masked.jsonl", R"({"input_ids": [1, 2, 3], "labels": [-100, -100, -100]})"
                        "\n"
                        R"({"input_ids": [4, 5], "labels": [4, -100]})"
                        "\n");  // labels[0] never trains
  v1::JobSpec s = Spec("masked.jsonl");
  s.mutable_dataset()->set_format(v1::DATASET_FORMAT_PRETOKENIZED);
  ExpectOnly(Validate(s), "dataset.paths", "no record has a token to train on");
  // One trained label anywhere (here in a second file) is enough.
  Write("one.jsonl", R"({"input_ids": [4, 5], "labels": [-100, 5]})"
                     "\n");
  s.mutable_dataset()->add_paths(root_ / "one.jsonl");
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
  // Cut at max_seq_length, the trained label is gone.
  Write(
      "late.jsonl",
      R"({"input_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], "labels": [-100, -100, -100, -100, -100, -100, -100, -100, -100, 10]})"
      "\n");
  v1::JobSpec late = Spec("late.jsonl");
  late.mutable_dataset()->set_format(v1::DATASET_FORMAT_PRETOKENIZED);
  late.mutable_dataset()->set_max_seq_length(8);
  ExpectOnly(Validate(late), "dataset.paths", "within dataset.max_seq_length (8)");
  // A file longer than the preview may train later on: not refused on its first records.
  std::string many;
  for (int i = 0; i < 20; ++i)
    many += R"({"input_ids": [1, 2], "labels": [-100, -100]})"
            "\n";
  Write("many.jsonl", many + R"({"input_ids": [1, 2], "labels": [-100, 2]})"
                             "\n");
  v1::JobSpec big = Spec("many.jsonl");
  big.mutable_dataset()->set_format(v1::DATASET_FORMAT_PRETOKENIZED);
  EXPECT_TRUE(Validate(big).ok()) << Describe(Validate(big));
}

}  // namespace
}  // namespace offloadd::daemon
