#include "job/job_validator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include <gtest/gtest.h>

#include "common/units.h"
#include "daemon/node/gpu_driver.h"
#include "job/shape_profile.h"
#include "tests/job/job_validator_fixture.h"
#include "text/tokenizer.h"

namespace offloadd::daemon {
namespace {

namespace fs = std::filesystem;
namespace v1 = offloadd::v1;
using testing_fixture::JobValidatorTest;


TEST_F(JobValidatorTest, ValidSpecGetsDefaultsAndCanonicalPaths) {
  const ValidationResult r = Validate(ValidSpec());
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_DOUBLE_EQ(r.resolved.training().learning_rate(), 5e-5);
  EXPECT_EQ(r.resolved.training().lr_scheduler_type(), "linear");
  EXPECT_EQ(r.resolved.training().per_device_train_batch_size(), 2);
  EXPECT_TRUE(r.resolved.dataset().mask_prompt());
  EXPECT_EQ(r.resolved.offload().offload_optimizer().device(), v1::OFFLOAD_DEVICE_CPU);
  EXPECT_EQ(r.resolved.output_dir(), fs::canonical(root_).string() + "/out/run1");
  // 2 layers of 12*64^2 + 13*64 plus token (50257*64) and position (256*64) embeddings, tied head.
  EXPECT_EQ(r.model_size.total_params, 50257 * 64 + 256 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
}

// Issue #29 item 25: the job record names the speculation policy in force: unset resolves to auto
// on a node with GPUs (the CPU updates overlap the backward under exact clipping) and to never on
// a CPU node (bitwise reproducible); a value the job sets stays.
TEST_F(JobValidatorTest, SpeculationDefaultIsResolvedPerNode) {
  ValidationResult r = Validate(ValidSpec());
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.offload().speculation(), v1::SPECULATION_NEVER);
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  r = Validate(ValidSpec());
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.offload().speculation(), v1::SPECULATION_AUTO);
  v1::JobSpec s = ValidSpec();
  s.mutable_offload()->set_speculation(v1::SPECULATION_NEVER);
  r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.offload().speculation(), v1::SPECULATION_NEVER);
  s.mutable_offload()->set_speculation(static_cast<v1::Speculation>(9));
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.speculation"), nullptr) << Describe(r);
}

// A node whose NVIDIA driver is too old for the bundled CUDA runtime has no usable GPU, but its
// jobs must not quietly train on the CPU: validation refuses them, naming the driver and floor.
TEST_F(JobValidatorTest, GpuWhoseDriverIsTooOldRefusesTheJob) {
  ASSERT_TRUE(Validate(ValidSpec()).ok());
  GpuDriverFacts old;
  old.driver_version = "570.86.15";
  old.driver_cuda_version = 12080;
  old.runtime_cuda_version = 13000;
  old.insufficient_driver = true;
  node_.gpu_driver_problem = GpuDriverProblem(old);
  const ValidationResult r = Validate(ValidSpec());
  const FieldViolation* v = Find(r, "resources");
  ASSERT_NE(v, nullptr) << Describe(r);
  EXPECT_NE(v->description.find("570.86.15"), std::string::npos) << v->description;
  EXPECT_NE(v->description.find(">= 580"), std::string::npos) << v->description;
  EXPECT_NE(v->description.find("train on the CPU"), std::string::npos) << v->description;
}

// The daemon validates with the system protobuf loaded (gRPC, the JobSpec); Debian's
// libsentencepiece bundles and exports protobuf-lite 3.14, which aborts such a process when linked
// into it. Through its dlopened shim (text/sentencepiece_shim.h) both work side by side.
TEST_F(JobValidatorTest, TokenizerModelLoadsBesideTheSystemProtobuf) {
  const char* src = std::getenv("OFFLOADD_SOURCE_DIR");
  const fs::path model = fs::path(src != nullptr ? src : ".") / ".." / "shared" / "data" /
                         "tokenizers" / "mistral-7b-v0.3" / "tokenizer.model";
  if (!fs::exists(model)) GTEST_SKIP() << model << " not found";
  const fs::path dir = root_ / "spm";
  fs::create_directories(dir);
  fs::copy_file(model, dir / "tokenizer.model");
  v1::JobSpec spec = ValidSpec();
  const std::string before = spec.SerializeAsString();
  auto tok = text::Tokenizer::FromDirectory(dir.string());
  if (!tok.ok() && tok.status().message().find("sanitizer builds") != std::string::npos)
    GTEST_SKIP() << tok.status().ToString();  // no RTLD_DEEPBIND under the sanitizers
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ(*(*tok)->Encode("Hello world", false), (std::vector<int32_t>{23325, 2294}));
  v1::JobSpec back;
  ASSERT_TRUE(back.ParseFromString(before));
  EXPECT_EQ(back.SerializeAsString(), before);
}

TEST_F(JobValidatorTest, EveryProblemIsReportedAtOnce) {
  v1::JobSpec s = ValidSpec();
  s.mutable_training()->set_learning_rate(-1);
  s.mutable_training()->set_lr_scheduler_type("exponential");
  s.mutable_training()->set_adam_beta2(1.5);
  s.mutable_dataset()->add_paths(root_ / "missing.jsonl");
  s.set_output_dir("");
  const ValidationResult r = Validate(s);
  EXPECT_NE(Find(r, "training.learning_rate"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "training.lr_scheduler_type"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "training.adam_beta2"), nullptr) << Describe(r);
  EXPECT_EQ(std::count_if(r.violations.begin(), r.violations.end(),
                          [](const FieldViolation& v) { return v.field == "training.adam_beta2"; }),
            1)
      << "one problem, one message\n" << Describe(r);
  ASSERT_NE(Find(r, "dataset.paths[1]"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "dataset.paths[1]")->description.find("does not exist"), std::string::npos);
  EXPECT_NE(Find(r, "output_dir"), nullptr) << Describe(r);
  EXPECT_GE(r.violations.size(), 5u);
}

TEST_F(JobValidatorTest, PathsMustResolveUnderAllowedRootsAfterSymlinks) {
  fs::create_symlink("/etc", root_ / "escape");
  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->set_paths(0, (root_ / "escape" / "hostname").string());
  s.set_output_dir("/tmp/../etc/offloadd-out");
  const ValidationResult r = Validate(s);
  const FieldViolation* d = Find(r, "dataset.paths[0]");
  ASSERT_NE(d, nullptr) << Describe(r);
  EXPECT_NE(d->description.find("outside the allowed roots"), std::string::npos) << d->description;
  EXPECT_NE(d->description.find("resolves to /etc/hostname"), std::string::npos) << d->description;
  EXPECT_NE(Find(r, "output_dir"), nullptr) << Describe(r);
}

TEST_F(JobValidatorTest, UnsupportedModelIsRejectedByName) {
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc) << R"({"model_type": "mamba", "vocab_size": 10})";
  const ValidationResult r = Validate(ValidSpec());
  const FieldViolation* m = Find(r, "model.path");
  ASSERT_NE(m, nullptr) << Describe(r);
  EXPECT_NE(m->description.find("mamba"), std::string::npos) << m->description;
}

TEST_F(JobValidatorTest, BadDatasetRecordNamesFileAndLine) {
  std::ofstream(root_ / "data.jsonl", std::ios::app) << "{\"instruction\": \"x\", \"output\": \n";
  v1::JobSpec s = ValidSpec();
  const ValidationResult r = Validate(s);
  const FieldViolation* d = Find(r, "dataset.paths[0]");
  ASSERT_NE(d, nullptr) << Describe(r);
  EXPECT_NE(d->description.find("data.jsonl:3"), std::string::npos) << d->description;
}

TEST_F(JobValidatorTest, TokenizerMismatchWithModelIsCaught) {
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << R"({"model_type": "gpt2", "vocab_size": 100, "n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256})";
  const ValidationResult r = Validate(ValidSpec());
  const FieldViolation* d = Find(r, "dataset.paths[0]");
  ASSERT_NE(d, nullptr) << Describe(r);
  EXPECT_NE(d->description.find("outside the model's vocabulary of 100"), std::string::npos) << d->description;
  // Every record fails alike: the mismatch is said once, not once per record checked.
  EXPECT_EQ(std::count_if(r.violations.begin(), r.violations.end(),
                          [](const FieldViolation& v) {
                            return v.description.find("outside the model's vocabulary") != std::string::npos;
                          }),
            1)
      << Describe(r);
}

TEST_F(JobValidatorTest, InfeasibleGpuBudgetGivesTheNumbers) {
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  v1::JobSpec s = ValidSpec();
  s.mutable_resources()->set_gpu_memory_limit(1 << 20);
  const ValidationResult r = Validate(s);
  const FieldViolation* g = Find(r, "resources.gpu_memory_limit");
  ASSERT_NE(g, nullptr) << Describe(r);
  EXPECT_NE(g->description.find("below the"), std::string::npos) << g->description;
  EXPECT_NE(g->description.find("LM head and loss"), std::string::npos) << g->description;
  EXPECT_NE(g->description.find("not even batch 1 fits"), std::string::npos) << g->description;
  // Between the floors of batch 1 and the job's batch, the refusal names the largest that fits.
  const int64_t batch = s.training().per_device_train_batch_size();
  ASSERT_GT(batch, 1);
  s.mutable_resources()->set_gpu_memory_limit(100ull << 30);
  s.mutable_training()->set_per_device_train_batch_size(1);
  const uint64_t floor1 = Validate(s).memory_floor.gpu_bytes;
  s.mutable_training()->set_per_device_train_batch_size(batch);
  const uint64_t floor_b = Validate(s).memory_floor.gpu_bytes;
  ASSERT_LT(floor1, floor_b);
  s.mutable_resources()->set_gpu_memory_limit(floor_b - 1);
  const ValidationResult r2 = Validate(s);  // Find points into it
  const FieldViolation* g2 = Find(r2, "resources.gpu_memory_limit");
  ASSERT_NE(g2, nullptr);
  EXPECT_NE(g2->description.find("the largest batch within"), std::string::npos) << g2->description;
  EXPECT_NE(g2->description.find(" is " + std::to_string(batch - 1) + " "), std::string::npos) << g2->description;
  s.mutable_resources()->set_gpu_memory_limit(floor_b);
  EXPECT_EQ(Find(Validate(s), "resources.gpu_memory_limit"), nullptr) << Describe(Validate(s));
  s.mutable_resources()->set_gpu_memory_limit(100ull << 30);
  EXPECT_NE(Find(Validate(s), "resources.gpu_memory_limit"), nullptr);
  // The automatic batch size needs its smallest candidate to fit: micro-batch 1's floor.
  s.mutable_training()->set_auto_find_batch_size(true);
  s.mutable_resources()->set_gpu_memory_limit(floor_b - 1);
  const ValidationResult a = Validate(s);
  EXPECT_EQ(Find(a, "resources.gpu_memory_limit"), nullptr) << Describe(a);
  EXPECT_EQ(a.memory_floor.gpu_bytes, floor1);
  s.mutable_resources()->set_gpu_memory_limit(floor1 - 1);
  const ValidationResult a2 = Validate(s);
  const FieldViolation* g3 = Find(a2, "resources.gpu_memory_limit");
  ASSERT_NE(g3, nullptr) << Describe(a2);
  EXPECT_NE(g3->description.find("at micro-batch 1 (the automatic batch size's smallest)"), std::string::npos)
      << g3->description;
}

// A shape profile a job of the same model, batch and dtype recorded on this GPU
// replaces the static floor: its measured working set plus the weight buffers and a margin; the
// refusal says it was measured, and a profile of another shape or GPU is not used.
TEST_F(JobValidatorTest, ProfiledFloorReplacesTheEstimate) {
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  node_.profile_dir = (root_ / "profiles").string();
  v1::JobSpec s = ValidSpec();
  const ValidationResult plain = Validate(s);
  ASSERT_TRUE(plain.ok()) << Describe(plain);
  const uint64_t static_floor = plain.memory_floor.gpu_bytes;
  trainer::ShapeProfile p;
  p.gpu = "test GPU";
  p.model = "gpt2/4 layers/" + std::to_string(plain.model_size.total_params) + " params/0123456789abcdef";
  p.batch = s.training().per_device_train_batch_size();
  p.seq = s.dataset().max_seq_length();
  p.dtype = "BFloat16";
  p.key = trainer::ShapeProfileKey(p.gpu, p.model, p.batch, p.seq, p.dtype);
  p.workspace_bytes = 3ll << 30;
  p.measured_at = "2026-11-26T16:00:00Z";
  p.blocks.push_back({});
  p.blocks[0].name = "embedding";
  ASSERT_TRUE(trainer::WriteShapeProfile(node_.profile_dir, p).ok());
  const uint64_t weights = 3ull * static_cast<uint64_t>(plain.model_size.largest_block_params) * 2;
  const uint64_t measured = (3ull << 30) + weights + (256ull << 20);
  const ValidationResult r = Validate(s);
  EXPECT_EQ(r.memory_floor.gpu_bytes, measured);
  EXPECT_NE(r.memory_floor.gpu_breakdown.find("measured on this node: the shape profile of 2026-11-26T16:00:00Z on "
                                              "test GPU (working set 3 GiB"),
            std::string::npos)
      << r.memory_floor.gpu_breakdown;
  s.mutable_resources()->set_gpu_memory_limit(measured - 1);
  const ValidationResult refused = Validate(s);
  const FieldViolation* g = Find(refused, "resources.gpu_memory_limit");
  ASSERT_NE(g, nullptr) << Describe(refused);
  EXPECT_NE(g->description.find("measured on this node"), std::string::npos) << g->description;
  EXPECT_NE(g->description.find("the smallest budget for this batch is " + FormatByteSize(measured)), std::string::npos)
      << g->description;
  // Another GPU's or another batch's profile says nothing about this one.
  node_.gpus[0].name = "other GPU";
  EXPECT_EQ(Validate(s).memory_floor.gpu_bytes, static_floor);
  node_.gpus[0].name = "test GPU";
  s.mutable_training()->set_per_device_train_batch_size(p.batch + 1);
  EXPECT_EQ(Validate(s).memory_floor.gpu_breakdown.find("measured on this node"), std::string::npos);
}

// Optimizer states asked onto the GPU (device none, or a ratio below 1) count in its budget.
TEST_F(JobValidatorTest, OptimizerStatesOnTheGpuCountInItsBudget) {
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  v1::JobSpec s = ValidSpec();
  const ValidationResult base = Validate(s);
  ASSERT_TRUE(base.ok()) << Describe(base);
  s.mutable_resources()->set_gpu_memory_limit(base.memory_floor.gpu_bytes + 1);
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));  // everything on the CPU: fits
  auto* opt = s.mutable_offload()->mutable_offload_optimizer();
  opt->set_device(v1::OFFLOAD_DEVICE_NONE);
  ValidationResult r = Validate(s);
  const FieldViolation* d = Find(r, "offload.offload_optimizer.device");
  ASSERT_NE(d, nullptr) << Describe(r);
  EXPECT_NE(d->description.find("of optimizer states on the GPU"), std::string::npos) << d->description;
  opt->set_device(v1::OFFLOAD_DEVICE_CPU);
  opt->set_ratio(1.0);  // all of them kept on the CPU
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
  opt->set_ratio(0.5);
  EXPECT_NE(Find(Validate(s), "offload.offload_optimizer.ratio"), nullptr) << Describe(Validate(s));
}

TEST_F(JobValidatorTest, InfeasibleHostBudgetSuggestsNvme) {
  v1::JobSpec s = ValidSpec();
  s.mutable_resources()->set_host_memory_limit(1 << 20);
  const ValidationResult r = Validate(s);
  const FieldViolation* h = Find(r, "resources.host_memory_limit");
  ASSERT_NE(h, nullptr) << Describe(r);
  // The numbers: what the job needs (the trainer's own prediction) and the limit.
  EXPECT_NE(h->description.find(FormatByteSize(r.host_memory.total)), std::string::npos) << h->description;
  EXPECT_NE(h->description.find("more than the host memory limit of 1 MiB (resources.host_memory_limit)"),
            std::string::npos)
      << h->description;
  // The states in RAM: at least the fp32 master weights and both moments (12 B per parameter).
  EXPECT_GE(r.host_memory.arena, 12 * static_cast<uint64_t>(r.model_size.total_params));
}

// Host RAM as the trainer plans it: a model whose decoder layers outweigh its embedding (24 layers of
// 1024) needs less RAM with its states on NVMe, so a limit between the two tiers is refused with
// NVMe as the fix, and NVMe then needs 12 B per parameter (and the versions in flight) of store space.
TEST_F(JobValidatorTest, HostLimitBetweenTheTiersIsRefusedWithNvmeAsTheFixAndDiskIsChecked) {
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 1024, "n_layer": 24, "n_head": 16,
            "n_positions": 256})";
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  v1::JobSpec s = ValidSpec();
  ValidationResult r = Validate(s);
  ASSERT_EQ(Find(r, "offload.offload_optimizer.device"), nullptr) << Describe(r);
  // The default limit: what the node can give, its 64 GiB (nothing else known) less the 4 GiB
  // reserve.
  EXPECT_EQ(r.host_memory_limit, (64ull << 30) - trainer::HostMemoryReserve(64ull << 30));
  // With the node's probe: what is available now (another job holds the rest) less the reserve,
  // and the source says so.
  node_.host_memory.total = 64ull << 30;
  node_.host_memory.available = 20ull << 30;
  r = Validate(s);
  EXPECT_EQ(r.host_memory_limit, 16ull << 30);
  node_.host_memory = {};
  r = Validate(s);
  ASSERT_LT(r.nvme_tier_host_bytes, r.ram_tier_host_bytes);
  // 12 B per parameter, and the new versions of the largest block in flight (3 slots + 1 committing).
  EXPECT_EQ(r.nvme_tier_disk_bytes, 12 * static_cast<uint64_t>(r.model_size.total_params) +
                                        48 * static_cast<uint64_t>(r.model_size.largest_block_params));
  const uint64_t all_nvme_disk = r.nvme_tier_disk_bytes, all_nvme_host = r.nvme_tier_host_bytes;
  // The daemon's memory.host_memory_limit is the default when the job names none.
  node_.host_memory_limit = (r.nvme_tier_host_bytes + r.ram_tier_host_bytes) / 2;
  r = Validate(s);
  const FieldViolation* h = Find(r, "offload.offload_optimizer.device");
  ASSERT_NE(h, nullptr) << Describe(r);
  EXPECT_NE(h->description.find("the daemon's memory.host_memory_limit"), std::string::npos) << h->description;
  EXPECT_NE(h->description.find("the optimizer states on NVMe (offload.offload_optimizer.device: nvme)"),
            std::string::npos)
      << h->description;
  EXPECT_NE(h->description.find("this needs a store directory"), std::string::npos) << h->description;
  // On NVMe it fits the RAM; the store directories must hold what RAM does not: with a disk too
  // small for every block's states, as many blocks' states as the limit allows stay in RAM
  // (job/state_placement.h), and a disk of one page holds not even the rest.
  StoreDirFacts dir;
  dir.path = fs::canonical(root_);
  dir.available_bytes = 4096;
  node_.store_dirs.push_back(dir);
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  r = Validate(s);
  h = Find(r, "offload.offload_optimizer.device");
  ASSERT_NE(h, nullptr) << Describe(r);
  EXPECT_NE(h->description.find("on NVMe ("), std::string::npos) << h->description;
  EXPECT_NE(h->description.find("in RAM, but the store directories have 4 KiB free"),
            std::string::npos)
      << h->description;
  // One byte short of every block's states: the job fits RAM plus disk, part of its states in RAM.
  node_.store_dirs.back().available_bytes = all_nvme_disk - 1;
  r = Validate(s);
  EXPECT_EQ(Find(r, "offload.offload_optimizer.device"), nullptr) << Describe(r);
  EXPECT_LT(r.host_memory.disk_bytes, all_nvme_disk);
  EXPECT_GT(r.host_memory.total, all_nvme_host);
  EXPECT_LE(r.host_memory.total, r.host_memory_limit);
  // The capacity figures count the limit and the store directories' free space (job/capacity.h).
  EXPECT_NE(r.capacity_text.find("((host memory limit " + FormatByteSize(r.host_memory_limit) +
                                 " + " + FormatByteSize(all_nvme_disk - 1) +
                                 " free in the store directories) / 12 B per parameter)"),
            std::string::npos)
      << r.capacity_text;
  node_.store_dirs.back().available_bytes = all_nvme_disk;
  r = Validate(s);
  EXPECT_EQ(Find(r, "offload.offload_optimizer.device"), nullptr) << Describe(r);
  EXPECT_EQ(r.host_memory.total, r.nvme_tier_host_bytes);
}

TEST_F(JobValidatorTest, NvmeNeedsAConfiguredStoreDirectory) {
  v1::JobSpec s = ValidSpec();
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  EXPECT_NE(Find(Validate(s), "offload.offload_optimizer.device"), nullptr);
  StoreDirFacts dir;
  dir.path = fs::canonical(root_);
  dir.available_bytes = 1ull << 40;
  node_.store_dirs.push_back(dir);
  s.mutable_offload()->mutable_offload_optimizer()->set_nvme_path("/somewhere/else");
  const ValidationResult r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_optimizer.nvme_path"), nullptr) << Describe(r);
  s.mutable_offload()->mutable_offload_optimizer()->set_nvme_path(root_);
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
}

// Issue #17 item 2: a setting that would not act is refused, naming the field and what to do; the
// daemon's storage.aio is the default of a job's offload.aio (and the job's own value wins).
TEST_F(JobValidatorTest, KnobsThatWouldNotActAreRefusedAndAioDefaultsToTheDaemons) {
  v1::JobSpec s = ValidSpec();
  StoreDirFacts dir;
  dir.path = fs::canonical(root_);
  dir.available_bytes = 1ull << 40;
  node_.store_dirs.push_back(dir);
  s.mutable_offload()->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_NVME);
  s.mutable_offload()->mutable_offload_optimizer()->set_pin_memory(false);
  ValidationResult r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_param.device"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_param.device")
                ->description.find("needs offload_optimizer.device nvme"),
            std::string::npos);
  ASSERT_NE(Find(r, "offload.offload_optimizer.pin_memory"), nullptr) << Describe(r);
  EXPECT_EQ(Find(r, "offload.offload_param.pin_memory"), nullptr);  // unset: true, the default
  s.mutable_offload()->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_CPU);
  s.mutable_offload()->mutable_offload_optimizer()->set_pin_memory(true);
  node_.aio_block_size = 256 * 1024;
  node_.aio_queue_depth = 8;
  r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.offload().aio().block_size(), 256u * 1024);
  EXPECT_EQ(r.resolved.offload().aio().queue_depth(), 8u);
  s.mutable_offload()->mutable_aio()->set_block_size(64 * 1024);
  r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.offload().aio().block_size(), 64u * 1024);
}

// offload_param: nvme runs where the trainer reads the weights back (the states on NVMe, 16-bit
// compute, one process); elsewhere it is refused naming the field and what it needs.
TEST_F(JobValidatorTest, ParamsOnNvmeRunWithStatesThereAndAreRefusedWhereTheyCannotAct) {
  v1::JobSpec s = ValidSpec();
  StoreDirFacts dir;
  dir.path = fs::canonical(root_);
  dir.available_bytes = 1ull << 40;
  node_.store_dirs.push_back(dir);
  s.mutable_offload()->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_NVME);
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  ValidationResult r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  // Every NVMe block's 16-bit weights are priced on the disk, not in RAM.
  EXPECT_GT(r.host_memory.nvme_weight_params, 0u);
  EXPECT_EQ(r.host_memory.nvme_weight_params, r.host_memory.nvme_params);

  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_param.device"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_param.device")->description.find("16-bit compute"),
            std::string::npos);
  s.mutable_model()->clear_compute_dtype();  // resolves to fp32 on this node without a GPU
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_param.device"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_param.device")->description.find("resolves to fp32"),
            std::string::npos);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  s.mutable_resources()->set_gpus(2);
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_param.device"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_param.device")->description.find("data parallelism"),
            std::string::npos);
  s.mutable_resources()->clear_gpus();
  s.mutable_offload()->mutable_offload_param()->set_nvme_path("/elsewhere");
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_param.nvme_path"), nullptr) << Describe(r);
}

TEST_F(JobValidatorTest, OptimizerRatioIsAShareInUnitRange) {
  v1::JobSpec s = ValidSpec();
  auto* opt = s.mutable_offload()->mutable_offload_optimizer();
  opt->set_ratio(0.5);
  EXPECT_TRUE(Validate(s).ok()) << Describe(Validate(s));
  opt->set_ratio(1.5);
  s.mutable_offload()->mutable_offload_param()->set_ratio(0.5);
  ValidationResult r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_optimizer.ratio"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_optimizer.ratio")->description.find("must be in [0, 1]"), std::string::npos);
  ASSERT_NE(Find(r, "offload.offload_param.ratio"), nullptr) << Describe(r);
  s.mutable_offload()->mutable_offload_param()->clear_ratio();
  opt->set_ratio(0.5);
  opt->set_device(v1::OFFLOAD_DEVICE_NONE);
  r = Validate(s);
  ASSERT_NE(Find(r, "offload.offload_optimizer.ratio"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "offload.offload_optimizer.ratio")->description.find("device none"), std::string::npos);
}

// Settings the pipeline does not implement are refused before a job is queued, each with its
// field path and next to the spec's other problems.
TEST_F(JobValidatorTest, UnimplementedSettingsAreFieldViolations) {
  v1::JobSpec s = ValidSpec();
  s.mutable_training()->set_learning_rate(-1);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP16);  // implemented: no problem
  s.mutable_offload()->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NONE);  // implemented
  auto& overrides = *s.mutable_offload()->mutable_activations()->mutable_layer_overrides();
  overrides[1] = v1::ACTIVATION_MODE_OFFLOAD_NVME;  // implemented: no problem
  overrides[0] = v1::ACTIVATION_MODE_RECOMPUTE;
  s.mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);  // implemented on a CPU node
  const ValidationResult r = Validate(s);
  EXPECT_EQ(Find(r, "compression.type"), nullptr) << Describe(r);
  EXPECT_EQ(Find(r, "offload.offload_optimizer.device"), nullptr) << Describe(r);
  EXPECT_EQ(Find(r, "model.compute_dtype"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "training.learning_rate"), nullptr) << Describe(r);
  EXPECT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.resolved.compression().sparsity(), 16);  // the seed's d by default
  EXPECT_EQ(r.resolved.compression().subspace_rank(), 512);

  // LSP on a node with a GPU: its CUDA path computes in bf16, so another compute dtype is refused
  // at the dtype; unset (auto: bf16 on a GPU) or bf16 is accepted.
  GpuFacts gpu;
  gpu.name = "test GPU";
  gpu.total_memory_bytes = 80ull << 30;
  node_.gpus.push_back(gpu);
  v1::JobSpec lsp = ValidSpec();
  lsp.mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);
  const ValidationResult on_gpu = Validate(lsp);
  EXPECT_TRUE(on_gpu.ok()) << Describe(on_gpu);
  lsp.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  const ValidationResult fp32 = Validate(lsp);
  ASSERT_EQ(fp32.violations.size(), 1u) << Describe(fp32);
  EXPECT_EQ(fp32.violations[0].field, "model.compute_dtype");
  EXPECT_NE(fp32.violations[0].description.find("computes in bf16"), std::string::npos);
}

// Held-out records: resolved and checked like the training files; eval_steps defaults to
// logging_steps (transformers) and needs them.
TEST_F(JobValidatorTest, EvalPathsAreCheckedAndEvalStepsDefaultsToLoggingSteps) {
  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->add_eval_paths(root_ / "data.jsonl");
  s.mutable_training()->set_logging_steps(7);
  ValidationResult r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.training().eval_steps(), 7);
  EXPECT_EQ(r.resolved.dataset().eval_paths(0), fs::canonical(root_ / "data.jsonl").string());
  s.mutable_dataset()->add_eval_paths("/etc/passwd");
  s.mutable_training()->set_eval_steps(0);
  r = Validate(s);
  EXPECT_NE(Find(r, "dataset.eval_paths[1]"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "training.eval_steps"), nullptr) << Describe(r);
  v1::JobSpec no_paths = ValidSpec();
  no_paths.mutable_training()->set_eval_steps(10);
  r = Validate(no_paths);
  ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.violations[0].field, "training.eval_steps");
  EXPECT_NE(r.violations[0].description.find("dataset.eval_paths"), std::string::npos);
}

// What the engine would refuse mid-job for this model is refused up front; a sliding window
// shorter than the sequence is implemented and accepted.
TEST_F(JobValidatorTest, LayerOverridesAndSequenceLengthAreCheckedAgainstTheModel) {
  v1::JobSpec s = ValidSpec();
  auto& overrides = *s.mutable_offload()->mutable_activations()->mutable_layer_overrides();
  overrides[1] = v1::ACTIVATION_MODE_RECOMPUTE;  // the model's last layer: fine
  overrides[2] = v1::ACTIVATION_MODE_RECOMPUTE;
  ValidationResult r = Validate(s);
  ASSERT_EQ(r.violations.size(), 1u) << Describe(r);
  EXPECT_EQ(r.violations[0].field, "offload.activations.layer_overrides[2]");
  EXPECT_NE(r.violations[0].description.find("2 layers (0 to 1)"), std::string::npos) << Describe(r);

  const std::string mistral =
      R"({"model_type": "mistral", "vocab_size": 50257, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "sliding_window": 64)";
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << mistral << R"(, "max_position_embeddings": 1024})";
  s = ValidSpec();  // max_seq_length 128, twice the window
  EXPECT_EQ(Find(Validate(s), "dataset.max_seq_length"), nullptr) << Describe(Validate(s));

  // Dynamic RoPE past max_position_embeddings: transformers' frequencies depend on the longest
  // sequence seen so far in the run.
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << mistral << R"(, "max_position_embeddings": 96,
          "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})";
  r = Validate(s);
  const FieldViolation* w = Find(r, "dataset.max_seq_length");
  ASSERT_NE(w, nullptr) << Describe(r);
  EXPECT_NE(w->description.find("\"dynamic\""), std::string::npos) << w->description;
  EXPECT_NE(w->description.find("max_position_embeddings (96)"), std::string::npos) << w->description;
  EXPECT_NE(w->description.find("got max_seq_length 128"), std::string::npos) << w->description;
  s.mutable_dataset()->set_max_seq_length(96);
  EXPECT_EQ(Find(Validate(s), "dataset.max_seq_length"), nullptr) << Describe(Validate(s));

  // GPT-2's learned positions.
  std::ofstream(root_ / "model" / "config.json", std::ios::trunc)
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
            "n_positions": 64})";
  const ValidationResult gpt2 = Validate(s);  // Find points into it: keep it alive
  w = Find(gpt2, "dataset.max_seq_length");
  ASSERT_NE(w, nullptr) << Describe(gpt2);
  EXPECT_NE(w->description.find("n_positions is 64"), std::string::npos) << w->description;
}

// A RoPE model with 512 positions asked for 8192 tokens per sequence passed validation and made
// no step in 20 minutes; RoPE scaling that extends the positions as the family says still passes.
// Issue #18 defect 14: NaN passed every range check (`v < lo || v > hi` is false for NaN), open
// enums took any number, and a negative max_samples or a GPU index on a GPU-less node went through.
TEST_F(JobValidatorTest, NanUnknownEnumsNegativeSamplesAndAbsentGpusAreRefused) {
  v1::JobSpec s = ValidSpec();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto* t = s.mutable_training();
  t->set_learning_rate(nan);
  t->set_num_train_epochs(nan);
  t->set_warmup_ratio(nan);
  t->set_weight_decay(nan);
  t->set_adam_epsilon(nan);
  t->set_max_grad_norm(nan);
  s.mutable_model()->set_compute_dtype(static_cast<v1::ComputeDtype>(77));
  s.mutable_dataset()->set_format(static_cast<v1::DatasetFormat>(99));
  s.mutable_offload()->mutable_activations()->set_mode(static_cast<v1::ActivationMode>(42));
  s.mutable_compression()->set_type(static_cast<v1::CompressionType>(9));
  s.set_dropout(static_cast<v1::DropoutMode>(5));
  s.mutable_dataset()->set_max_samples(-3);
  s.mutable_resources()->set_gpu_index(5);
  const ValidationResult r = Validate(s);
  for (const char* f : {"training.learning_rate", "training.num_train_epochs", "training.warmup_ratio",
                        "training.weight_decay", "training.adam_epsilon", "training.max_grad_norm"}) {
    const FieldViolation* v = Find(r, f);
    ASSERT_NE(v, nullptr) << f << "\n" << Describe(r);
    EXPECT_NE(v->description.find("nan"), std::string::npos) << v->description;
  }
  for (const char* f : {"model.compute_dtype", "dataset.format", "offload.activations.mode", "compression.type",
                        "dropout"}) {
    const FieldViolation* v = Find(r, f);
    ASSERT_NE(v, nullptr) << f << "\n" << Describe(r);
    EXPECT_NE(v->description.find("unknown value"), std::string::npos) << v->description;
  }
  ASSERT_NE(Find(r, "dataset.max_samples"), nullptr) << Describe(r);
  ASSERT_NE(Find(r, "resources.gpu_index"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "resources.gpu_index")->description.find("0 GPU(s); got index 5"), std::string::npos);
  // 0 is the unset value: it stands for the CPU on a node without GPUs.
  v1::JobSpec ok = ValidSpec();
  ok.mutable_resources()->set_gpu_index(0);
  EXPECT_TRUE(Validate(ok).ok()) << Describe(Validate(ok));
}

TEST_F(JobValidatorTest, OverflowingModelSizesAreRefusedNotWrapped) {
  std::ofstream(root_ / "model" / "config.json")
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 9223372036854775807, "n_layer": 2,
            "n_head": 4, "n_positions": 256})";
  ValidationResult r = Validate(ValidSpec());
  ASSERT_NE(Find(r, "model.path"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "model.path")->description.find("n_embd: must be <= 16777216"), std::string::npos)
      << Describe(r);
  std::ofstream(root_ / "model" / "config.json")
      << R"({"model_type": "llama", "vocab_size": 16777216, "hidden_size": 16777216, "intermediate_size": 16777216,
            "num_hidden_layers": 16777216, "num_attention_heads": 1})";
  r = Validate(ValidSpec());
  ASSERT_NE(Find(r, "model.path"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "model.path")->description.find("beyond the 2^50 offloadd accepts"), std::string::npos)
      << Describe(r);
}

TEST_F(JobValidatorTest, DropoutTheEngineWouldIgnoreNeedsDropoutDisable) {
  v1::JobSpec s = ValidSpec();
  s.clear_dropout();
  ValidationResult r = Validate(s);
  const FieldViolation* v = Find(r, "dropout");
  ASSERT_NE(v, nullptr) << Describe(r);
  EXPECT_NE(v->description.find("embd_pdrop=0.1, attn_pdrop=0.1, resid_pdrop=0.1"), std::string::npos)
      << v->description;
  std::ofstream(root_ / "model" / "config.json")
      << R"({"model_type": "gpt2", "vocab_size": 50257, "n_embd": 64, "n_layer": 2, "n_head": 4,
            "n_positions": 256, "embd_pdrop": 0, "attn_pdrop": 0.0, "resid_pdrop": 0,
            "summary_first_dropout": 0.1})";
  r = Validate(s);
  EXPECT_TRUE(r.ok()) << Describe(r);
}

}  // namespace
}  // namespace offloadd::daemon

namespace offloadd::daemon {
namespace {

// Issue #17: HF names act through validation (the resolved spec shows the setting) and their
// problems come back with everything else.
TEST_F(JobValidatorTest, HfNamesResolveIntoTheSettingsTheyStandFor) {
  v1::JobSpec s = ValidSpec();
  s.mutable_dataset()->clear_max_seq_length();
  s.mutable_training()->set_bf16(true);
  s.mutable_training()->set_gradient_checkpointing(true);
  s.mutable_training()->set_optim("adamw_torch");
  s.mutable_training()->set_max_length(64);
  s.mutable_training()->set_completion_only_loss(false);
  ValidationResult r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_EQ(r.resolved.model().compute_dtype(), v1::COMPUTE_DTYPE_BF16);
  EXPECT_EQ(r.resolved.offload().activations().mode(), v1::ACTIVATION_MODE_RECOMPUTE);
  EXPECT_EQ(r.resolved.dataset().max_seq_length(), 64) << "max_length wins over the default of 1024";
  EXPECT_FALSE(r.resolved.dataset().mask_prompt());
  EXPECT_FALSE(r.resolved.training().has_bf16() || r.resolved.training().has_optim());

  s = ValidSpec();
  s.mutable_training()->set_optim("adafactor");
  s.mutable_training()->set_learning_rate(-1);
  s.set_output_dir("");
  r = Validate(s);
  EXPECT_NE(Find(r, "training.optim"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "training.learning_rate"), nullptr) << Describe(r);
  EXPECT_NE(Find(r, "output_dir"), nullptr) << Describe(r);
}

TEST_F(JobValidatorTest, SchedulerKwargsAreCheckedAgainstTheSchedule) {
  v1::JobSpec s = ValidSpec();
  s.mutable_training()->set_lr_scheduler_type("cosine_with_min_lr");
  s.mutable_training()->mutable_lr_scheduler_kwargs()->set_min_lr(1e-6);
  ValidationResult r = Validate(s);
  ASSERT_TRUE(r.ok()) << Describe(r);
  EXPECT_DOUBLE_EQ(r.resolved.training().lr_scheduler_kwargs().num_cycles(), 0.5) << "transformers' default";

  const auto refused = [&](const std::function<void(v1::TrainingArguments*)>& edit, const std::string& field,
                           const std::string& text) {
    v1::JobSpec bad = ValidSpec();
    edit(bad.mutable_training());
    const ValidationResult res = Validate(bad);
    const FieldViolation* v = Find(res, field);
    ASSERT_NE(v, nullptr) << field << "\n" << Describe(res);
    EXPECT_NE(v->description.find(text), std::string::npos) << v->description;
  };
  refused([](auto* t) { t->set_lr_scheduler_type("cosine_with_min_lr"); }, "training.lr_scheduler_kwargs",
          "needs exactly one of min_lr and min_lr_rate, got neither");
  refused([](auto* t) {
            t->set_lr_scheduler_type("cosine_with_min_lr");
            t->mutable_lr_scheduler_kwargs()->set_min_lr(1e-6);
            t->mutable_lr_scheduler_kwargs()->set_min_lr_rate(0.1);
          },
          "training.lr_scheduler_kwargs", "got both");
  refused([](auto* t) {
            t->set_lr_scheduler_type("cosine_with_min_lr");
            t->mutable_lr_scheduler_kwargs()->set_min_lr_rate(1.5);
          },
          "training.lr_scheduler_kwargs.min_lr_rate", "must be in [0, 1]");
  refused([](auto* t) { t->mutable_lr_scheduler_kwargs()->set_num_cycles(2); }, "training.lr_scheduler_kwargs.num_cycles",
          "only cosine and cosine_with_min_lr take num_cycles, not linear");
  refused([](auto* t) {
            t->set_lr_scheduler_type("cosine");
            t->mutable_lr_scheduler_kwargs()->set_min_lr(1e-6);
          },
          "training.lr_scheduler_kwargs.min_lr", "only cosine_with_min_lr takes min_lr, not cosine");
}

}  // namespace
}  // namespace offloadd::daemon
