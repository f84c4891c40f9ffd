#include "jobspec/training_rules.h"

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "common/message_text.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;


// lr_scheduler_type and the lr_scheduler_kwargs its transformers schedule takes (get_scheduler
// raises for any other).
void CheckScheduler(const v1::TrainingArguments& t, Checker& c) {
  const std::string& s = t.lr_scheduler_type();
  if (s != "linear" && s != "cosine" && s != "cosine_with_min_lr" && s != "constant" &&
      s != "constant_with_warmup") {
    c.Add("training.lr_scheduler_type",
          "must be linear, cosine, cosine_with_min_lr, constant or "
          "constant_with_warmup, got '" +
              SafeMessageText(s, 128) + "'");
    return;
  }
  const v1::LrSchedulerKwargs& k = t.lr_scheduler_kwargs();
  const bool cosine = s == "cosine" || s == "cosine_with_min_lr";
  if (k.has_num_cycles()) {
    if (cosine) {
      c.Range("training.lr_scheduler_kwargs.num_cycles", k.num_cycles(), 0.0, 1e6,
              /*lo_open=*/true);
    } else {
      c.Add("training.lr_scheduler_kwargs.num_cycles",
            "only cosine and cosine_with_min_lr take num_cycles, not " + s);
    }
  }
  if (s != "cosine_with_min_lr") {
    for (const auto& [has, name] : {std::pair{k.has_min_lr(), std::string("min_lr")},
                                    std::pair{k.has_min_lr_rate(), std::string("min_lr_rate")}}) {
      if (has)
        c.Add("training.lr_scheduler_kwargs." + name,
              "only cosine_with_min_lr takes " + name + ", not " + s);
    }
    return;
  }
  if (k.has_min_lr() == k.has_min_lr_rate()) {
    c.Add("training.lr_scheduler_kwargs",
          std::string("cosine_with_min_lr needs exactly one of min_lr and ") + "min_lr_rate, got " +
              (k.has_min_lr() ? "both" : "neither"));
  } else if (k.has_min_lr()) {
    c.Range("training.lr_scheduler_kwargs.min_lr", k.min_lr(), 0.0, t.learning_rate());
  } else {
    c.Range("training.lr_scheduler_kwargs.min_lr_rate", k.min_lr_rate(), 0.0, 1.0);
  }
}

// transformers' report_to, for the integrations the daemon writes itself.
void CheckReportTo(const v1::TrainingArguments& t, Checker& c) {
  for (int i = 0; i < t.report_to_size(); ++i) {
    const std::string& v = t.report_to(i);
    const std::string field = "training.report_to[" + std::to_string(i) + "]";
    if (v == "none" && t.report_to_size() > 1) {
      c.Add(field, "\"none\" cannot be listed with other integrations");
    } else if (v == "mlflow" || v == "wandb") {
      c.Add(field, "must be tensorboard or none, got '" + v +
                       "' (the daemon writes TensorBoard event files itself; for " + v +
                       " follow the job with the Python SDK: offloadd.tracking.follow(job_id, "
                       "to=\"" +
                       v + "\"), docs/tracking.md)");
    } else if (v != "tensorboard" && v != "none") {
      c.Add(field, "must be tensorboard or none, got '" + SafeMessageText(v, 128) +
                       "' (the daemon writes TensorBoard event files itself; other trackers "
                       "are not written)");
    }
  }
}

void CheckTraining(const v1::TrainingArguments& t, Checker& c) {
  c.Range("training.learning_rate", t.learning_rate(), 0.0, 1.0, /*lo_open=*/true);
  c.Range<int64_t>("training.per_device_train_batch_size", t.per_device_train_batch_size(), 1,
                   65536);
  c.Range<int64_t>("training.gradient_accumulation_steps", t.gradient_accumulation_steps(), 1,
                   1 << 20);
  if (t.max_steps() == 0 || t.max_steps() < -1)
    c.Add("training.max_steps", "must be -1 (use num_train_epochs) or positive");
  if (t.max_steps() == -1)
    c.Range("training.num_train_epochs", t.num_train_epochs(), 0.0, 1e6, true);
  c.Range<int64_t>("training.warmup_steps", t.warmup_steps(), 0, int64_t{1} << 40);
  c.Range("training.warmup_ratio", t.warmup_ratio(), 0.0, 1.0);
  CheckScheduler(t, c);
  c.Range("training.weight_decay", t.weight_decay(), 0.0, 10.0);
  for (const auto& [value, field] : {std::pair{t.adam_beta1(), "training.adam_beta1"},
                                     std::pair{t.adam_beta2(), "training.adam_beta2"}}) {
    if (!(value >= 0.0 && value < 1.0))
      c.Add(field, "must be in [0, 1), got " + std::to_string(value));
  }
  c.Range("training.adam_epsilon", t.adam_epsilon(), 0.0, 1.0, true);
  c.Range("training.max_grad_norm", t.max_grad_norm(), 0.0, 1e12);
  c.Range<int64_t>("training.logging_steps", t.logging_steps(), 1, int64_t{1} << 40);
  c.Range<int64_t>("training.save_steps", t.save_steps(), 1, int64_t{1} << 40);
  c.Range<int64_t>("training.save_total_limit", t.save_total_limit(), 0, 1 << 20);
  CheckReportTo(t, c);
}

}  // namespace

void CheckTrainingValues(const v1::TrainingArguments& t, std::vector<FieldViolation>* out) {
  Checker c(out);
  CheckTraining(t, c);
}

void ApplyJobDefaults(v1::JobSpec* spec) {
  auto* t = spec->mutable_training();
  if (!t->has_learning_rate()) t->set_learning_rate(5e-5);
  if (!t->has_per_device_train_batch_size()) t->set_per_device_train_batch_size(8);
  if (!t->has_gradient_accumulation_steps()) t->set_gradient_accumulation_steps(1);
  if (!t->has_num_train_epochs()) t->set_num_train_epochs(3.0);
  if (!t->has_max_steps()) t->set_max_steps(-1);
  if (!t->has_warmup_steps()) t->set_warmup_steps(0);
  if (!t->has_warmup_ratio()) t->set_warmup_ratio(0.0);
  if (!t->has_lr_scheduler_type()) t->set_lr_scheduler_type("linear");
  const bool cosine =
      t->lr_scheduler_type() == "cosine" || t->lr_scheduler_type() == "cosine_with_min_lr";
  if (cosine && !t->lr_scheduler_kwargs().has_num_cycles())
    t->mutable_lr_scheduler_kwargs()->set_num_cycles(0.5);
  if (!t->has_weight_decay()) t->set_weight_decay(0.0);
  if (!t->has_adam_beta1()) t->set_adam_beta1(0.9);
  if (!t->has_adam_beta2()) t->set_adam_beta2(0.999);
  if (!t->has_adam_epsilon()) t->set_adam_epsilon(1e-8);
  if (!t->has_max_grad_norm()) t->set_max_grad_norm(1.0);
  if (!t->has_seed()) t->set_seed(42);
  if (!t->has_logging_steps()) t->set_logging_steps(500);
  if (!t->has_eval_steps() &&
      (spec->dataset().eval_paths_size() > 0 || spec->dataset().has_eval_split()))
    t->set_eval_steps(t->logging_steps());
  if (!t->has_save_steps()) t->set_save_steps(500);
  if (!t->has_save_total_limit()) t->set_save_total_limit(0);
  auto* d = spec->mutable_dataset();
  if (!d->has_mask_prompt()) d->set_mask_prompt(true);
  if (!d->has_max_seq_length()) d->set_max_seq_length(1024);
  if (!d->has_shuffle()) d->set_shuffle(true);
  auto* o = spec->mutable_offload();
  for (auto* target : {o->mutable_offload_optimizer(), o->mutable_offload_param()}) {
    if (!target->has_pin_memory()) target->set_pin_memory(true);
  }
  if (o->offload_optimizer().device() == v1::OFFLOAD_DEVICE_UNSPECIFIED) {
    o->mutable_offload_optimizer()->set_device(v1::OFFLOAD_DEVICE_CPU);
  }
  if (o->offload_param().device() == v1::OFFLOAD_DEVICE_UNSPECIFIED) {
    o->mutable_offload_param()->set_device(v1::OFFLOAD_DEVICE_CPU);
  }
  if (o->activations().mode() == v1::ACTIVATION_MODE_UNSPECIFIED) {
    o->mutable_activations()->set_mode(v1::ACTIVATION_MODE_AUTO);
  }
  if (!o->aio().has_block_size()) o->mutable_aio()->set_block_size(1u << 20);
  if (!o->aio().has_queue_depth()) o->mutable_aio()->set_queue_depth(32);
  auto* comp = spec->mutable_compression();
  if (comp->type() == v1::COMPRESSION_TYPE_UNSPECIFIED) comp->set_type(v1::COMPRESSION_TYPE_NONE);
  if (!comp->has_subspace_rank()) comp->set_subspace_rank(512);
  if (!comp->has_sparsity()) comp->set_sparsity(16);  // the seed's d
  // The seed's instruction-tuning runs re-check every 1000 iterations (a 7B check costs ~60 steps).
  if (!comp->has_projector_update_interval()) comp->set_projector_update_interval(1000);
  // model.compute_dtype stays UNSPECIFIED here: it resolves when the job is placed (bf16 on a
  // GPU, fp32 on the CPU).
}

}  // namespace offloadd::daemon
