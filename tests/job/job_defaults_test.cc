// The choice between a job's value and its default is made once (jobspec/job_defaults.h): the
// spec job validation resolves and the trainer configuration the executor makes agree on every
// defaulted field, whether the executor is handed the resolved spec or the one the client sent.
#include "jobspec/job_defaults.h"

#include "job/host_memory.h"
#include "job/train_job_config.h"
#include "tests/job/job_validator_fixture.h"

namespace offloadd::daemon::testing_fixture {
namespace {

// The TrainConfig fields a job's defaults reach.
void ExpectSameDefaults(const trainer::TrainConfig& a, const trainer::TrainConfig& b) {
  EXPECT_EQ(a.optim.learning_rate, b.optim.learning_rate);
  EXPECT_EQ(a.optim.lr_scheduler_type, b.optim.lr_scheduler_type);
  EXPECT_EQ(a.optim.warmup_steps, b.optim.warmup_steps);
  EXPECT_EQ(a.optim.warmup_ratio, b.optim.warmup_ratio);
  EXPECT_EQ(a.optim.num_cycles, b.optim.num_cycles);
  EXPECT_EQ(a.optim.weight_decay, b.optim.weight_decay);
  EXPECT_EQ(a.optim.beta1, b.optim.beta1);
  EXPECT_EQ(a.optim.beta2, b.optim.beta2);
  EXPECT_EQ(a.optim.eps, b.optim.eps);
  EXPECT_EQ(a.optim.max_grad_norm, b.optim.max_grad_norm);
  EXPECT_EQ(a.optim.speculation, b.optim.speculation);
  EXPECT_EQ(a.batch_size, b.batch_size);
  EXPECT_EQ(a.gradient_accumulation_steps, b.gradient_accumulation_steps);
  EXPECT_EQ(a.num_train_epochs, b.num_train_epochs);
  EXPECT_EQ(a.max_steps, b.max_steps);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.logging_steps, b.logging_steps);
  EXPECT_EQ(a.save_steps, b.save_steps);
  EXPECT_EQ(a.save_total_limit, b.save_total_limit);
  EXPECT_EQ(a.data.mask_prompt, b.data.mask_prompt);
  EXPECT_EQ(a.data.shuffle, b.data.shuffle);
  EXPECT_EQ(a.data.max_seq_length, b.data.max_seq_length);
  EXPECT_EQ(a.offload.weights, b.offload.weights);
  EXPECT_EQ(a.offload.activations, b.offload.activations);
  EXPECT_EQ(a.offload.tier, b.offload.tier);
  EXPECT_EQ(a.offload.gpu_memory_limit, b.offload.gpu_memory_limit);
  EXPECT_EQ(a.offload.host_memory_limit, b.offload.host_memory_limit);
  EXPECT_EQ(a.lsp.enabled, b.lsp.enabled);
}

TEST_F(JobValidatorTest, ValidationAndTheTrainerConfigAgreeOnEveryDefault) {
  node_.aio_block_size = 4u << 20;  // the daemon's storage.aio
  node_.aio_queue_depth = 8;
  node_.host_memory_limit = 16ull << 30;  // memory.host_memory_limit
  node_.gpu_memory_limit = 20ull << 30;   // memory.gpu_memory_limit
  for (const bool gpu : {false, true}) {
    SCOPED_TRACE(gpu ? "GPU node" : "CPU node");
    node_.gpus.clear();
    if (gpu) {
      GpuFacts card;
      card.name = "NVIDIA H100 80GB HBM3";
      card.total_memory_bytes = card.free_memory_bytes = 80ull << 30;
      node_.gpus.push_back(card);
    }
    const v1::JobSpec sent = ValidSpec();  // learning rate, steps, aio, speculation... unset
    const ValidationResult r = Validate(sent);
    ASSERT_TRUE(r.ok()) << Describe(r);
    TrainerEnvironment env = DefaultTrainerEnvironment();  // as the daemon configures its executors
    env.set_has_gpu(gpu);
    env.set_host_memory_limit(node_.host_memory_limit);
    env.set_gpu_memory_limit(node_.gpu_memory_limit);
    v1::Job job;
    job.set_id("job-1");
    *job.mutable_spec() = r.resolved;
    auto from_resolved = MakeTrainConfig(job, env);
    ASSERT_TRUE(from_resolved.ok()) << from_resolved.status().ToString();
    *job.mutable_spec() = sent;
    auto from_sent = MakeTrainConfig(job, env);
    ASSERT_TRUE(from_sent.ok()) << from_sent.status().ToString();
    ExpectSameDefaults(*from_resolved, *from_sent);

    // What validation checked is what the trainer is given.
    const v1::JobSpec& s = r.resolved;
    const trainer::TrainConfig& c = *from_resolved;
    EXPECT_EQ(c.optim.learning_rate, s.training().learning_rate());
    EXPECT_EQ(c.optim.learning_rate, 5e-5);
    EXPECT_EQ(c.num_train_epochs, 3.0);
    EXPECT_EQ(c.optim.speculation, gpu ? "auto" : "never");
    EXPECT_EQ(s.offload().speculation(), gpu ? v1::SPECULATION_AUTO : v1::SPECULATION_NEVER);
    EXPECT_EQ(c.offload.nvme_block_size, 4u << 20);
    EXPECT_EQ(c.offload.nvme_queue_depth, 8u);
    EXPECT_EQ(c.offload.host_memory_limit, 16ull << 30);
    trainer::NodeMemory mem;
    mem.total = node_.host_memory_bytes;
    EXPECT_EQ(r.host_memory_limit,
              trainer::DefaultHostMemoryLimit(c.offload.host_memory_limit, mem).bytes);
    EXPECT_EQ(c.offload.gpu_memory_limit, 20ull << 30);
    // The record shows what the job asked: the daemon's budgets stay beside it.
    EXPECT_EQ(s.resources().host_memory_limit(), 0u);
  }
}

TEST(ResolveJobDefaultsTest, TheJobsOwnValueWinsAndAResolvedSpecResolvesToItself) {
  JobDefaults d;
  d.has_gpu = true;
  d.aio_block_size = 2u << 20;
  d.host_memory_limit = 8ull << 30;
  d.gpu_memory_limit = 10ull << 30;
  v1::JobSpec spec;
  spec.mutable_training()->set_learning_rate(1e-4);
  spec.mutable_offload()->set_speculation(v1::SPECULATION_NEVER);
  spec.mutable_offload()->mutable_aio()->set_block_size(64u << 10);
  spec.mutable_resources()->set_gpu_memory_limit(4ull << 30);
  const ResolvedJob r = ResolveJobDefaults(spec, d);
  EXPECT_EQ(r.spec.training().learning_rate(), 1e-4);
  EXPECT_EQ(r.spec.training().max_grad_norm(), 1.0);  // job.proto's default
  EXPECT_EQ(r.spec.offload().speculation(), v1::SPECULATION_NEVER);
  EXPECT_EQ(r.spec.offload().aio().block_size(), 64u << 10);
  EXPECT_EQ(r.spec.offload().aio().queue_depth(), 32u);  // no daemon value: job.proto's
  EXPECT_EQ(r.gpu_memory_limit, 4ull << 30);
  EXPECT_EQ(r.host_memory_limit, 8ull << 30);
  const ResolvedJob again = ResolveJobDefaults(r.spec, d);
  EXPECT_EQ(again.spec.SerializeAsString(), r.spec.SerializeAsString());
}

}  // namespace
}  // namespace offloadd::daemon::testing_fixture
