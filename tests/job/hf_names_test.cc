// Hugging Face / TRL names in JobSpec.training: each maps onto the setting it stands for.
#include "job/hf_names.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

struct Resolved {
  v1::JobSpec spec;
  std::vector<FieldViolation> violations;
  std::string Fields() const {
    std::string out;
    for (const auto& v : violations) out += v.field + ": " + v.description + "\n";
    return out;
  }
};

Resolved Resolve(const v1::JobSpec& in) {
  Resolved r{in, {}};
  ResolveHfNames(&r.spec, &r.violations);
  return r;
}

TEST(HfNamesTest, Bf16AndFp16SetTheComputeDtype) {
  v1::JobSpec s;
  s.mutable_training()->set_bf16(true);
  s.mutable_training()->set_fp16(false);
  Resolved r = Resolve(s);
  ASSERT_TRUE(r.violations.empty()) << r.Fields();
  EXPECT_EQ(r.spec.model().compute_dtype(), v1::COMPUTE_DTYPE_BF16);
  EXPECT_FALSE(r.spec.training().has_bf16()) << "the name is cleared once it acted";
  EXPECT_FALSE(r.spec.training().has_fp16());

  s = {};
  s.mutable_training()->set_fp16(true);
  EXPECT_EQ(Resolve(s).spec.model().compute_dtype(), v1::COMPUTE_DTYPE_FP16);

  s = {};  // transformers without either: fp32
  s.mutable_training()->set_bf16(false);
  EXPECT_EQ(Resolve(s).spec.model().compute_dtype(), v1::COMPUTE_DTYPE_FP32);

  s = {};  // agreeing with compute_dtype is fine
  s.mutable_training()->set_bf16(true);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_BF16);
  EXPECT_TRUE(Resolve(s).violations.empty());
}

// A compute_dtype number the proto does not define (a client may send any) is named by its number
// in the contradiction, not thrown from (fuzz regression job_spec/unknown-compute-dtype-name).
TEST(HfNamesTest, AnUnknownComputeDtypeNumberIsNamedNotThrown) {
  v1::JobSpec s;
  s.mutable_training()->set_bf16(true);
  s.mutable_model()->set_compute_dtype(static_cast<v1::ComputeDtype>(99));
  Resolved r = Resolve(s);
  ASSERT_EQ(r.violations.size(), 1u) << r.Fields();
  EXPECT_EQ(r.violations[0].field, "training.bf16");
  EXPECT_NE(r.violations[0].description.find("model.compute_dtype is unknown value 99"), std::string::npos)
      << r.Fields();
}

TEST(HfNamesTest, TheAutomaticBatchSizeAndTrainBatchSize) {
  v1::JobSpec s;  // auto without a micro-batch: the cap defaults to 64
  s.mutable_training()->set_auto_find_batch_size(true);
  Resolved r = Resolve(s);
  ASSERT_TRUE(r.violations.empty()) << r.Fields();
  EXPECT_EQ(r.spec.training().per_device_train_batch_size(), 64);
  EXPECT_TRUE(r.spec.training().auto_find_batch_size()) << "an offloadd setting: kept";

  s.mutable_training()->set_per_device_train_batch_size(16);  // a cap of the user's
  s.mutable_training()->set_train_batch_size(32);
  r = Resolve(s);
  ASSERT_TRUE(r.violations.empty()) << r.Fields();
  EXPECT_EQ(r.spec.training().per_device_train_batch_size(), 16);

  s.mutable_training()->set_gradient_accumulation_steps(4);  // would not act: the choice sets it
  r = Resolve(s);
  ASSERT_EQ(r.violations.size(), 1u) << r.Fields();
  EXPECT_EQ(r.violations[0].field, "training.gradient_accumulation_steps");

  s = {};  // without auto, train_batch_size must be micro x accumulation (8 x 1 by default)
  s.mutable_training()->set_train_batch_size(8);
  EXPECT_TRUE(Resolve(s).violations.empty());
  s.mutable_training()->set_gradient_accumulation_steps(2);
  r = Resolve(s);
  ASSERT_EQ(r.violations.size(), 1u) << r.Fields();
  EXPECT_EQ(r.violations[0].field, "training.train_batch_size");
  EXPECT_NE(r.violations[0].description.find("8 is not per_device_train_batch_size x gradient_accumulation_steps (8 x 2)"),
            std::string::npos)
      << r.Fields();
  s.mutable_training()->set_train_batch_size(0);
  EXPECT_EQ(Resolve(s).violations.at(0).field, "training.train_batch_size");
}

TEST(HfNamesTest, ContradictionsAreRefusedAtTheHfName) {
  v1::JobSpec s;
  s.mutable_training()->set_bf16(true);
  s.mutable_training()->set_fp16(true);
  s.mutable_training()->set_gradient_checkpointing(true);
  s.mutable_offload()->mutable_activations()->set_mode(v1::ACTIVATION_MODE_OFFLOAD_CPU);
  s.mutable_training()->set_max_length(2048);
  s.mutable_dataset()->set_max_seq_length(512);
  s.mutable_training()->set_completion_only_loss(false);
  s.mutable_training()->set_assistant_only_loss(true);
  s.mutable_training()->set_optim("adafactor");
  Resolved r = Resolve(s);
  std::vector<std::string> fields;
  for (const auto& v : r.violations) fields.push_back(v.field);
  EXPECT_EQ(fields, (std::vector<std::string>{"training.fp16", "training.gradient_checkpointing", "training.optim",
                                              "training.max_length", "training.assistant_only_loss"}))
      << r.Fields();
  EXPECT_NE(r.Fields().find("offload.activations.mode recompute, but that is set to offload_cpu"), std::string::npos)
      << r.Fields();
  EXPECT_NE(r.Fields().find("'adafactor' is not available: offloadd trains with AdamW (optim: adamw_torch, "
                            "adamw_torch_fused"),
            std::string::npos)
      << r.Fields();
  EXPECT_EQ(r.spec.offload().activations().mode(), v1::ACTIVATION_MODE_OFFLOAD_CPU) << "left as it was";
  EXPECT_EQ(r.spec.dataset().max_seq_length(), 512);

  s = {};
  s.mutable_training()->set_bf16(true);
  s.mutable_model()->set_compute_dtype(v1::COMPUTE_DTYPE_FP32);
  r = Resolve(s);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_EQ(r.violations[0].field, "training.bf16");
  EXPECT_NE(r.violations[0].description.find("bf16: true means compute_dtype bf16, but model.compute_dtype is fp32"),
            std::string::npos)
      << r.violations[0].description;
}

TEST(HfNamesTest, CheckpointingOptimAndTrlNamesAct) {
  v1::JobSpec s;
  s.mutable_training()->set_gradient_checkpointing(true);
  s.mutable_training()->set_max_length(2048);
  s.mutable_training()->set_assistant_only_loss(false);
  Resolved r = Resolve(s);
  ASSERT_TRUE(r.violations.empty()) << r.Fields();
  EXPECT_EQ(r.spec.offload().activations().mode(), v1::ACTIVATION_MODE_RECOMPUTE);
  EXPECT_EQ(r.spec.dataset().max_seq_length(), 2048);
  EXPECT_TRUE(r.spec.dataset().has_mask_prompt());
  EXPECT_FALSE(r.spec.dataset().mask_prompt());
  EXPECT_FALSE(r.spec.training().has_gradient_checkpointing() || r.spec.training().has_max_length() ||
               r.spec.training().has_assistant_only_loss());

  s = {};
  s.mutable_training()->set_gradient_checkpointing(false);  // transformers keeps every activation
  s.mutable_training()->set_completion_only_loss(true);
  r = Resolve(s);
  EXPECT_EQ(r.spec.offload().activations().mode(), v1::ACTIVATION_MODE_KEEP);
  EXPECT_TRUE(r.spec.dataset().mask_prompt());

  for (const std::string& name : AdamWOptimNames()) {
    s = {};
    s.mutable_training()->set_optim(name);
    r = Resolve(s);
    EXPECT_TRUE(r.violations.empty()) << name << ": " << r.Fields();
    EXPECT_FALSE(r.spec.training().has_optim());
  }
  for (const char* other : {"paged_adamw_32bit", "sgd", "adafactor", "adamw_torch_4bit", ""}) {
    s = {};
    s.mutable_training()->set_optim(other);
    EXPECT_EQ(Resolve(s).violations.size(), 1u) << other;
  }
}

// bitsandbytes' 8-bit AdamW names are int8 optimizer states (fp32 master); 4-bit is refused by
// name.
TEST(HfNamesTest, EightBitOptimNamesMeanInt8States) {
  for (const std::string& name : AdamW8bitOptimNames()) {
    v1::JobSpec s;
    s.mutable_training()->set_optim(name);
    Resolved r = Resolve(s);
    EXPECT_TRUE(r.violations.empty()) << name << ": " << r.Fields();
    EXPECT_EQ(r.spec.optimizer().state_dtype(), v1::STATE_DTYPE_INT8) << name;
    EXPECT_EQ(r.spec.optimizer().master_dtype(), v1::MASTER_DTYPE_UNSPECIFIED) << name;
    EXPECT_FALSE(r.spec.training().has_optim());

    s.mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_INT8);  // the same thing twice: fine
    EXPECT_TRUE(Resolve(s).violations.empty()) << name;
    s.mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_BF16);
    r = Resolve(s);
    ASSERT_EQ(r.violations.size(), 1u) << name;
    EXPECT_EQ(r.violations[0].field, "training.optim");
    EXPECT_NE(r.Fields().find("optim: " + name +
                              " means optimizer.state_dtype int8, but that is set to bf16"),
              std::string::npos)
        << r.Fields();
    EXPECT_EQ(r.spec.optimizer().state_dtype(), v1::STATE_DTYPE_BF16) << "left as it was";
  }
  v1::JobSpec s;
  s.mutable_training()->set_optim("adamw_torch_4bit");
  const Resolved r = Resolve(s);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_NE(r.Fields().find(
                "'adamw_torch_4bit' is not available: 4-bit optimizer states are not offered"),
            std::string::npos)
      << r.Fields();
}

}  // namespace
}  // namespace offloadd::daemon
