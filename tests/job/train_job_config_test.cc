// JobSpec -> trainer::TrainConfig, and which checkpoint a job continues from.
#include "job/train_job_config.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "common/file.h"
#include "job/job_validator.h"
#include "job/unsupported_options.h"
#include "trainer/state/checkpoint.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;
using trainer::ActivationMode;
using trainer::TrainConfig;

class TrainJobConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/offloadd-train-job-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    job_.set_id("job-1");
    v1::JobSpec& s = *job_.mutable_spec();
    s.mutable_model()->set_path("/models/m");
    s.mutable_dataset()->add_paths("/data/a.jsonl");
    s.set_output_dir(dir_ + "/out");
    ApplyJobDefaults(&s);  // what ValidateJobSpec resolves
    env_.set_worker_binary("/bin/offloadd-worker");
    env_.set_store_binary("/bin/offloadd-store");
    env_.set_worker_processes(2);
    env_.set_profile_dir("/var/lib/offloadd/profiles");
    env_.add_store_dirs("/nvme0");
    env_.add_store_dirs("/nvme1");
  }
  void TearDown() override { ASSERT_TRUE(RemoveTree(dir_).ok()); }

  TrainConfig Make() {
    auto c = MakeTrainConfig(job_, env_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? *c : TrainConfig{};
  }
  Status MakeError() { return MakeTrainConfig(job_, env_).status(); }

  // A valid one-layer checkpoint of `step` in `out`.
  std::string SaveCheckpoint(const std::string& out, int64_t step) {
    auto w = trainer::CheckpointWriter::Begin(out, step);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    std::vector<float> x(4, 1.0f);
    trainer::LayerState ls;
    ls.params = {{"w", {4}}};
    ls.master = ls.exp_avg = ls.exp_avg_sq = {std::span<const float>(x)};
    EXPECT_TRUE(w->WriteLayer(0, ls).ok());
    trainer::TrainerState st;
    st.global_step = step;
    auto info = w->Commit(st);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    return info.ok() ? info->path : "";
  }
  void AddRun() {
    auto* t = job_.add_transitions();
    t->set_state(v1::JOB_STATE_RUNNING);
  }

  std::string dir_;
  v1::Job job_;
  TrainerEnvironment env_ = DefaultTrainerEnvironment();
};

TEST_F(TrainJobConfigTest, MapsTheResolvedSpec) {
  v1::JobSpec& s = *job_.mutable_spec();
  s.mutable_tokenizer()->set_path("/tok/tokenizer.json");
  s.mutable_dataset()->set_format(v1::DATASET_FORMAT_ALPACA);
  s.mutable_dataset()->set_max_seq_length(256);
  s.mutable_dataset()->set_packing(true);
  s.mutable_dataset()->set_max_samples(200);
  s.mutable_training()->set_learning_rate(1e-3);
  s.mutable_training()->set_per_device_train_batch_size(4);
  s.mutable_training()->set_gradient_accumulation_steps(3);
  s.mutable_training()->set_max_steps(50);
  s.mutable_training()->set_lr_scheduler_type("cosine");
  s.mutable_training()->set_seed(7);
  s.mutable_training()->set_save_steps(10);
  s.mutable_training()->set_save_total_limit(2);
  s.mutable_training()->set_logging_steps(5);
  s.mutable_resources()->set_host_memory_limit(1 << 30);
  const TrainConfig c = Make();
  EXPECT_EQ(c.model_dir, "/models/m");
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.compute_dtype, "auto");
  EXPECT_EQ(c.data.paths, std::vector<std::string>{"/data/a.jsonl"});
  EXPECT_EQ(c.data.format, "alpaca");
  EXPECT_EQ(c.data.tokenizer_path, "/tok/tokenizer.json");
  EXPECT_EQ(c.data.max_seq_length, 256);
  EXPECT_TRUE(c.data.packing && c.data.mask_prompt && c.data.shuffle);
  EXPECT_EQ(c.data.max_samples, 200);
  EXPECT_DOUBLE_EQ(c.optim.learning_rate, 1e-3);
  EXPECT_EQ(c.optim.lr_scheduler_type, "cosine");
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optim.max_grad_norm, 1.0);
  EXPECT_EQ(c.batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 3);
  EXPECT_EQ(c.max_steps, 50);
  EXPECT_EQ(c.seed, 7u);
  EXPECT_EQ(c.save_steps, 10);
  EXPECT_EQ(c.save_total_limit, 2);
  EXPECT_EQ(c.logging_steps, 5);
  EXPECT_EQ(c.output_dir, dir_ + "/out");
  EXPECT_EQ(c.trace_path, dir_ + "/out/runs/trace.json");  // not in the model's directory
  EXPECT_EQ(c.offload.tier, trainer::StateTier::kCpu);
  EXPECT_EQ(c.offload.weights, trainer::OffloadPlanConfig::Weights::kStreamed);  // offload_param: cpu
  EXPECT_EQ(c.offload.activations, ActivationMode::kAuto);
  EXPECT_EQ(c.offload.host_memory_limit, 1u << 30);
  EXPECT_EQ(c.offload.nvme_block_size, 1u << 20);  // aio.block_size: the store's --block-size
  EXPECT_EQ(c.worker_binary, "/bin/offloadd-worker");
  EXPECT_EQ(c.worker_processes, 2u);
  EXPECT_EQ(c.profile_dir, "/var/lib/offloadd/profiles");  // the node profile, cached per node
  EXPECT_TRUE(c.resume_from.empty());
}

// The environment is the protocol's message itself: what the daemon builds is what the executor
// maps, with no struct in between whose copy could drop a field, and proto3's zeros are not taken
// for settings (an environment starts from DefaultTrainerEnvironment).
TEST_F(TrainJobConfigTest, TheEnvironmentCrossesTheWireUnchanged) {
  const TrainerEnvironment defaults = DefaultTrainerEnvironment();
  EXPECT_EQ(defaults.worker_processes(), 1u);
  EXPECT_EQ(defaults.adamw_kernel(), "auto");
  EXPECT_EQ(defaults.trace_steps(), 3);
  EXPECT_DOUBLE_EQ(defaults.progress_interval_seconds(), 10);
  EXPECT_DOUBLE_EQ(defaults.liveness_factor(), 10);
  env_.set_worker_threads(3);
  env_.set_adamw_kernel("avx2");
  env_.set_trace_steps(5);
  offloadd::internal::StartJob start;
  *start.mutable_job() = job_;
  *start.mutable_environment() = env_;
  offloadd::internal::StartJob received;
  ASSERT_TRUE(received.ParseFromString(start.SerializeAsString()));
  const TrainConfig sent = Make();
  auto got = MakeTrainConfig(received.job(), received.environment());
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->worker_threads, 3u);
  EXPECT_EQ(got->adamw_kernel, "avx2");
  EXPECT_EQ(got->trace_steps, 5);
  EXPECT_EQ(got->worker_binary, sent.worker_binary);
  EXPECT_EQ(got->store_binary, sent.store_binary);
  EXPECT_EQ(got->worker_processes, sent.worker_processes);
  EXPECT_EQ(got->profile_dir, sent.profile_dir);
  EXPECT_EQ(got->offload.nvme_dirs, sent.offload.nvme_dirs);
}

TEST_F(TrainJobConfigTest, DeviceAndDtypeFollowTheNode) {
  env_.set_has_gpu(true);
  job_.mutable_spec()->mutable_resources()->set_gpu_index(1);
  job_.mutable_spec()->mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  env_.set_gpu_memory_limit(8ull << 30);
  TrainConfig c = Make();
  EXPECT_EQ(c.device, "cuda:1");
  EXPECT_EQ(c.compute_dtype, "fp32");
  EXPECT_EQ(c.offload.gpu_memory_limit, 8ull << 30);
  job_.mutable_spec()->mutable_resources()->set_gpu_index(-1);
  job_.mutable_spec()->mutable_resources()->set_gpu_memory_limit(4ull << 30);
  job_.mutable_spec()->mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  c = Make();
  EXPECT_EQ(c.device, "cuda:0");
  EXPECT_EQ(c.compute_dtype, "bf16");
  EXPECT_EQ(c.offload.gpu_memory_limit, 4ull << 30);
}

// Issue #29 item 25: speculation (CPU updates before the clipping norm is known) is the default on
// a GPU node and off on a CPU node; an explicit setting wins on either.
TEST_F(TrainJobConfigTest, SpeculationDefaultFollowsTheNode) {
  env_.set_has_gpu(true);
  EXPECT_EQ(Make().optim.speculation, "auto");
  env_.set_has_gpu(false);
  EXPECT_EQ(Make().optim.speculation, "never");
  auto* o = job_.mutable_spec()->mutable_offload();
  o->set_speculation(v1::SPECULATION_ALWAYS);
  EXPECT_EQ(Make().optim.speculation, "always");
  env_.set_has_gpu(true);
  o->set_speculation(v1::SPECULATION_NEVER);
  EXPECT_EQ(Make().optim.speculation, "never");
  o->set_speculation(v1::SPECULATION_AUTO);
  EXPECT_EQ(Make().optim.speculation, "auto");
}

// Optimizer states on the GPU: placed after the first step by default on a GPU node, none on a
// CPU node; device none puts all of them there, a ratio keeps that share on the host.
TEST_F(TrainJobConfigTest, OptimizerStatesOnTheGpu) {
  using Plan = trainer::OffloadPlanConfig;
  env_.set_has_gpu(false);
  EXPECT_EQ(Make().offload.device_optimizer_blocks, 0);
  env_.set_has_gpu(true);
  TrainConfig c = Make();
  EXPECT_EQ(c.offload.device_optimizer_blocks, Plan::kAutoDeviceOptimizer);
  EXPECT_LT(c.offload.device_optimizer_share, 0);
  auto* o = job_.mutable_spec()->mutable_offload()->mutable_offload_optimizer();
  o->set_ratio(0.25);
  EXPECT_DOUBLE_EQ(Make().offload.device_optimizer_share, 0.75);
  o->clear_ratio();
  o->set_device(v1::OFFLOAD_DEVICE_NONE);
  EXPECT_DOUBLE_EQ(Make().offload.device_optimizer_share, 1.0);
}

TEST_F(TrainJobConfigTest, NvmeStatesGoToAPerJobDirectory) {
  auto* o = job_.mutable_spec()->mutable_offload();
  o->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_NVME);
  o->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_NONE);
  o->mutable_aio()->set_queue_depth(64);
  TrainConfig c = Make();
  EXPECT_EQ(c.offload.tier, trainer::StateTier::kNvme);
  EXPECT_EQ(c.offload.nvme_dirs, (std::vector<std::string>{"/nvme0/job-1", "/nvme1/job-1"}));
  EXPECT_EQ(c.offload.nvme_queue_depth, 64u);
  EXPECT_EQ(c.offload.weights, trainer::OffloadPlanConfig::Weights::kResident);
  EXPECT_EQ(c.offload.param_tier, trainer::OffloadPlanConfig::ParamTier::kCpu);
  // offload_param: nvme puts the 16-bit weights in the same store, streamed from there.
  o->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_NVME);
  c = Make();
  EXPECT_EQ(c.offload.param_tier, trainer::OffloadPlanConfig::ParamTier::kNvme);
  EXPECT_EQ(c.offload.weights, trainer::OffloadPlanConfig::Weights::kStreamed);
  EXPECT_EQ(c.offload.nvme_dirs, (std::vector<std::string>{"/nvme0/job-1", "/nvme1/job-1"}));
  o->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_NONE);
  o->mutable_offload_optimizer()->set_nvme_path("/nvme1");
  EXPECT_EQ(Make().offload.nvme_dirs, std::vector<std::string>{"/nvme1/job-1"});
  env_.clear_store_dirs();
  o->mutable_offload_optimizer()->clear_nvme_path();
  EXPECT_EQ(MakeError().code(), StatusCode::kFailedPrecondition);
}

// Activations offloaded to NVMe use the same per-job store directories; the states stay in RAM.
TEST_F(TrainJobConfigTest, NvmeActivationsUseThePerJobDirectories) {
  auto* a = job_.mutable_spec()->mutable_offload()->mutable_activations();
  (*a->mutable_layer_overrides())[2] = v1::ACTIVATION_MODE_OFFLOAD_NVME;
  TrainConfig c = Make();
  EXPECT_EQ(c.offload.layer_overrides.at(2), ActivationMode::kOffloadNvme);
  EXPECT_EQ(c.offload.tier, trainer::StateTier::kCpu);
  EXPECT_EQ(c.offload.nvme_dirs, (std::vector<std::string>{"/nvme0/job-1", "/nvme1/job-1"}));
  a->set_mode(v1::ACTIVATION_MODE_OFFLOAD_NVME);
  EXPECT_EQ(Make().offload.activations, ActivationMode::kOffloadNvme);
  env_.clear_store_dirs();
  const Status s = MakeError();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("offload.activations: offload_nvme needs a store directory"), std::string::npos)
      << s.message();
}

TEST_F(TrainJobConfigTest, ActivationPolicy) {
  auto* a = job_.mutable_spec()->mutable_offload()->mutable_activations();
  a->set_mode(v1::ACTIVATION_MODE_RECOMPUTE);
  (*a->mutable_layer_overrides())[0] = v1::ACTIVATION_MODE_KEEP;
  (*a->mutable_layer_overrides())[3] = v1::ACTIVATION_MODE_OFFLOAD_CPU;
  const TrainConfig c = Make();
  EXPECT_EQ(c.offload.activations, ActivationMode::kRecompute);
  EXPECT_EQ(c.offload.layer_overrides.at(0), ActivationMode::kKeep);
  EXPECT_EQ(c.offload.layer_overrides.at(3), ActivationMode::kOffloadCpu);
}

TEST_F(TrainJobConfigTest, CompressionLspMapsToTheTrainersLspMode) {
  job_.mutable_spec()->mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP16);
  EXPECT_EQ(Make().compute_dtype, "fp16");  // implemented: dynamic loss scaling
  EXPECT_FALSE(Make().lsp.enabled);
  auto* comp = job_.mutable_spec()->mutable_compression();
  comp->set_type(v1::COMPRESSION_TYPE_LSP);
  comp->set_subspace_rank(64);
  comp->set_sparsity(8);
  comp->set_projector_update_interval(25);
  const TrainConfig c = Make();
  EXPECT_TRUE(c.lsp.enabled);
  EXPECT_EQ(c.lsp.rank, 64);
  EXPECT_EQ(c.lsp.nonzeros, 8);
  EXPECT_EQ(c.lsp.check_every, 25);
  EXPECT_FALSE(c.lsp.identity);
}

TEST_F(TrainJobConfigTest, EvalPathsBecomeTheTrainersEvalData) {
  EXPECT_TRUE(Make().eval_data.paths.empty());
  auto* d = job_.mutable_spec()->mutable_dataset();
  d->add_eval_paths("/data/held_out.jsonl");
  d->set_max_samples(10);
  job_.mutable_spec()->mutable_training()->set_eval_steps(25);
  const TrainConfig c = Make();
  EXPECT_EQ(c.eval_data.paths, std::vector<std::string>{"/data/held_out.jsonl"});
  EXPECT_EQ(c.eval_data.format, c.data.format);
  EXPECT_EQ(c.eval_data.max_seq_length, c.data.max_seq_length);
  EXPECT_EQ(c.eval_data.max_samples, 0);  // every held-out record
  EXPECT_EQ(c.data.max_samples, 10);
  EXPECT_EQ(c.eval_steps, 25);
}

TEST_F(TrainJobConfigTest, EvalSplitHoldsOutOfTheTrainingRecords) {
  auto* d = job_.mutable_spec()->mutable_dataset();
  d->set_eval_split(0.05);
  d->set_max_samples(10);
  job_.mutable_spec()->mutable_training()->set_eval_steps(25);
  const TrainConfig c = Make();
  EXPECT_EQ(c.data.eval_split, 0.05);
  EXPECT_FALSE(c.data.held_out);  // trains on the rest
  EXPECT_EQ(c.eval_data.paths, c.data.paths);
  EXPECT_EQ(c.eval_data.eval_split, 0.05);
  EXPECT_TRUE(c.eval_data.held_out);  // evaluates the held-out records
  EXPECT_EQ(c.eval_data.max_samples, 0);
  EXPECT_EQ(c.eval_steps, 25);
}

// A weighted mixture: each dataset keeps its files and weight, and its format and mask_prompt
// where it sets them (else the job's); held-out files evaluate alone, an eval_split is each's.
TEST_F(TrainJobConfigTest, DatasetMixtureMapsEachDatasetWithTheJobsDefaults) {
  auto* d = job_.mutable_spec()->mutable_dataset();
  d->clear_paths();
  d->set_format(v1::DATASET_FORMAT_MESSAGES);
  d->set_mask_prompt(true);
  d->set_stopping_strategy("all_exhausted");
  auto* a = d->add_datasets();
  a->add_paths("/data/a.jsonl");
  a->set_weight(3);
  auto* b = d->add_datasets();
  b->add_paths("/data/b.jsonl");
  b->add_paths("/data/b2.jsonl");
  b->set_weight(0.5);
  b->set_format(v1::DATASET_FORMAT_TEXT);
  b->set_mask_prompt(false);
  d->add_eval_paths("/data/held_out.jsonl");
  job_.mutable_spec()->mutable_training()->set_eval_steps(5);
  TrainConfig c = Make();
  ASSERT_EQ(c.data.mixture.size(), 2u);
  EXPECT_EQ(c.data.mixture[0].paths, std::vector<std::string>{"/data/a.jsonl"});
  EXPECT_EQ(c.data.mixture[0].weight, 3);
  EXPECT_EQ(c.data.mixture[0].format, "messages");
  EXPECT_TRUE(c.data.mixture[0].mask_prompt);
  EXPECT_EQ(c.data.mixture[1].paths, (std::vector<std::string>{"/data/b.jsonl", "/data/b2.jsonl"}));
  EXPECT_EQ(c.data.mixture[1].weight, 0.5);
  EXPECT_EQ(c.data.mixture[1].format, "text");
  EXPECT_FALSE(c.data.mixture[1].mask_prompt);
  EXPECT_EQ(c.data.stopping_strategy, "all_exhausted");
  EXPECT_TRUE(c.eval_data.mixture.empty());  // eval_paths: those files, unmixed
  d->clear_eval_paths();
  d->set_eval_split(0.1);
  c = Make();
  EXPECT_EQ(c.eval_data.mixture.size(), 2u);  // the held-out records of each dataset
  EXPECT_TRUE(c.eval_data.held_out);
  EXPECT_EQ(c.data.eval_split, 0.1);
}

// Every setting acts on its own; what remains unsupported are combinations (job_refusals_test), and
// a job stored before such an entry existed fails to start with its words.
TEST_F(TrainJobConfigTest, NoSettingIsUnsupported) {
  v1::JobSpec* spec = job_.mutable_spec();
  spec->mutable_compression()->set_type(v1::COMPRESSION_TYPE_LSP);
  EXPECT_TRUE(UnsupportedOptions(*spec).empty());
  spec->mutable_resources()->set_gpus(2);
  auto c = MakeTrainConfig(job_, env_);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(std::string(c.status().message()).find("resources.gpus: "), std::string::npos)
      << c.status().ToString();
}

TEST_F(TrainJobConfigTest, FreshJobStartsFromScratchOrTheSpecsCheckpoint) {
  AddRun();
  auto r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "");
  const std::string other = SaveCheckpoint(dir_ + "/other", 6);
  job_.mutable_spec()->set_resume_from_checkpoint(other);
  r = ResumePoint(job_);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, other);
}

TEST_F(TrainJobConfigTest, RerunJobResumesFromItsOwnNewestCheckpoint) {
  const std::string other = SaveCheckpoint(dir_ + "/other", 6);
  job_.mutable_spec()->set_resume_from_checkpoint(other);
  SaveCheckpoint(dir_ + "/out", 5);
  const std::string newest = SaveCheckpoint(dir_ + "/out", 10);
  AddRun();
  AddRun();  // paused or interrupted once, running again
  auto r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, newest);
}

// Across hosts a checkpoint is committed by partition 0's directory, which a resume names (every
// rank then restores its own partition); output_dir itself holds none.
TEST_F(TrainJobConfigTest, AJobAcrossHostsResumesFromPartitionZero) {
  job_.mutable_spec()->mutable_resources()->set_hosts(2);
  SaveCheckpoint(dir_ + "/out/partition-1-of-2", 10);
  const std::string zero = SaveCheckpoint(dir_ + "/out/partition-0-of-2", 10);
  AddRun();
  AddRun();  // paused once, running again
  auto r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, zero);
  job_.set_latest_checkpoint_step(10);
  auto failed = CheckpointForFailedJob(job_);
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(*failed, zero);
}

// Issue #18 item 8: a checkpoint whose tensor bytes were flipped is not resumed from; the job
// continues from the newest intact one instead of failing or using corrupt weights.
TEST_F(TrainJobConfigTest, RerunJobSkipsACorruptNewestCheckpoint) {
  const std::string good = SaveCheckpoint(dir_ + "/out", 5);
  const std::string newest = SaveCheckpoint(dir_ + "/out", 10);
  const std::string layer = newest + "/model-layer-00000.safetensors";
  const int fd = ::open(layer.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, st.st_size - 2), 1);  // a byte of the last float
  b ^= 0x10;
  ASSERT_EQ(::pwrite(fd, &b, 1, st.st_size - 2), 1);
  ::close(fd);
  AddRun();
  AddRun();
  auto r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, good);
}

TEST_F(TrainJobConfigTest, FirstRunRefusesAnOutputDirWithSomeoneElsesCheckpoints) {
  SaveCheckpoint(dir_ + "/out", 5);
  AddRun();
  auto r = ResumePoint(job_);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("checkpoint-5"), std::string::npos) << r.status().message();
  job_.mutable_spec()->set_resume_from_checkpoint(dir_ + "/out/checkpoint-5");  // explicitly continuing it
  r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, dir_ + "/out/checkpoint-5");
}

// overwrite_output_dir was not a setting: another run's checkpoints made the job fail once
// started. Now the first run removes them and starts from scratch; a rerun resumes its own.
TEST_F(TrainJobConfigTest, OverwriteOutputDirRemovesAnotherRunsCheckpointsFirst) {
  SaveCheckpoint(dir_ + "/out", 5);
  SaveCheckpoint(dir_ + "/out", 9);
  job_.mutable_spec()->set_overwrite_output_dir(true);
  AddRun();
  auto r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "") << "from scratch";
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out/checkpoint-5"));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/out/checkpoint-9"));
  SaveCheckpoint(dir_ + "/out", 2);  // its own, then a restart
  AddRun();
  r = ResumePoint(job_);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, dir_ + "/out/checkpoint-2");
}

}  // namespace
}  // namespace offloadd::daemon

namespace offloadd::daemon {
namespace {

// lr_scheduler_kwargs reach the trainer's schedule; min_lr becomes a rate of learning_rate as
// transformers computes it.
TEST_F(TrainJobConfigTest, SchedulerKwargsReachTheTrainer) {
  EXPECT_DOUBLE_EQ(Make().optim.num_cycles, 0.5);
  EXPECT_DOUBLE_EQ(Make().optim.min_lr_rate, 0.0);
  v1::TrainingArguments* t = job_.mutable_spec()->mutable_training();
  t->set_lr_scheduler_type("cosine_with_min_lr");
  t->set_learning_rate(2e-4);
  t->mutable_lr_scheduler_kwargs()->set_min_lr(2e-5);
  t->mutable_lr_scheduler_kwargs()->set_num_cycles(1.5);
  TrainConfig c = Make();
  EXPECT_EQ(c.optim.lr_scheduler_type, "cosine_with_min_lr");
  EXPECT_DOUBLE_EQ(c.optim.num_cycles, 1.5);
  EXPECT_DOUBLE_EQ(c.optim.min_lr_rate, 0.1);
  t->mutable_lr_scheduler_kwargs()->clear_min_lr();
  t->mutable_lr_scheduler_kwargs()->set_min_lr_rate(0.25);
  EXPECT_DOUBLE_EQ(Make().optim.min_lr_rate, 0.25);
}

}  // namespace
}  // namespace offloadd::daemon
