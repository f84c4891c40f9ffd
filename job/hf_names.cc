#include "job/hf_names.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <string_view>
#include <tuple>

#include "common/message_text.h"
#include "job/batch_planner.h"

namespace offloadd::daemon {
namespace {

namespace v1 = offloadd::v1;

std::string Lower(std::string name) {  // COMPUTE_DTYPE_BF16 -> bf16 after the prefix is cut
  for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return name;
}

// "bf16" for COMPUTE_DTYPE_BF16; a value the enum does not define (proto3 keeps unknown numbers:
// a client may send any) is named by its number, for the validator's own enum check to refuse.
std::string EnumSuffix(const std::string& name, std::string_view prefix, int value) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return "unknown value " + std::to_string(value);
  }
  return Lower(name.substr(prefix.size()));
}

std::string DtypeName(v1::ComputeDtype d) {
  return EnumSuffix(v1::ComputeDtype_Name(d), "COMPUTE_DTYPE_", static_cast<int>(d));
}

std::string ModeName(v1::ActivationMode m) {
  return EnumSuffix(v1::ActivationMode_Name(m), "ACTIVATION_MODE_", static_cast<int>(m));
}

const char* Bool(bool b) { return b ? "true" : "false"; }

// bf16 / fp16 -> model.compute_dtype. As in transformers, both false (or one false and the other
// unset) trains in fp32.
void ResolveDtype(v1::JobSpec* spec, std::vector<FieldViolation>* out) {
  const v1::TrainingArguments& t = spec->training();
  if (!t.has_bf16() && !t.has_fp16()) return;
  if (t.bf16() && t.fp16()) {
    out->push_back({"training.fp16", "bf16 and fp16 are both true; set one (model.compute_dtype)"});
    return;
  }
  const v1::ComputeDtype want = t.bf16()   ? v1::COMPUTE_DTYPE_BF16
                                : t.fp16() ? v1::COMPUTE_DTYPE_FP16
                                           : v1::COMPUTE_DTYPE_FP32;
  const char* field = t.bf16() || (!t.fp16() && t.has_bf16()) ? "training.bf16" : "training.fp16";
  const v1::ComputeDtype have = spec->model().compute_dtype();
  if (have != v1::COMPUTE_DTYPE_UNSPECIFIED && have != want) {
    const std::string name = field + sizeof("training.") - 1;
    out->push_back({field, name + ": " + Bool(name == "bf16" ? t.bf16() : t.fp16()) + " means compute_dtype " +
                               DtypeName(want) + ", but model.compute_dtype is " + DtypeName(have) +
                               "; set only one of them"});
    return;
  }
  spec->mutable_model()->set_compute_dtype(want);
}

// gradient_checkpointing -> offload.activations.mode: recompute, or keep (what transformers does
// without it). Per-layer overrides still apply on top.
void ResolveCheckpointing(v1::JobSpec* spec, std::vector<FieldViolation>* out) {
  const v1::TrainingArguments& t = spec->training();
  if (!t.has_gradient_checkpointing()) return;
  const v1::ActivationMode want =
      t.gradient_checkpointing() ? v1::ACTIVATION_MODE_RECOMPUTE : v1::ACTIVATION_MODE_KEEP;
  const v1::ActivationMode have = spec->offload().activations().mode();
  if (have != v1::ACTIVATION_MODE_UNSPECIFIED && have != want) {
    out->push_back({"training.gradient_checkpointing",
                    std::string("gradient_checkpointing: ") + Bool(t.gradient_checkpointing()) +
                        " means offload.activations.mode " + ModeName(want) + ", but that is set to " +
                        (v1::ActivationMode_IsValid(have) ? ModeName(have) : std::to_string(have)) +
                        "; set only one of them"});
    return;
  }
  spec->mutable_offload()->mutable_activations()->set_mode(want);
}

// AdamW's names: the full-precision ones keep the spec's optimizer settings; the 8-bit ones
// (bitsandbytes' 8-bit AdamW: fp32 master, blockwise 8-bit states) mean optimizer.state_dtype
// int8, and contradict another state_dtype set beside them.
void ResolveOptim(v1::JobSpec* spec, std::vector<FieldViolation>* out) {
  const v1::TrainingArguments& t = spec->training();
  if (!t.has_optim()) return;
  const auto& names = AdamWOptimNames();
  if (std::find(names.begin(), names.end(), t.optim()) != names.end()) return;  // AdamW: what runs
  const auto& int8 = AdamW8bitOptimNames();
  if (std::find(int8.begin(), int8.end(), t.optim()) != int8.end()) {
    const v1::StateDtype have = spec->optimizer().state_dtype();
    if (have != v1::STATE_DTYPE_UNSPECIFIED && have != v1::STATE_DTYPE_INT8) {
      out->push_back(
          {"training.optim", "optim: " + t.optim() +
                                 " means optimizer.state_dtype int8, but that is set to " +
                                 EnumSuffix(v1::StateDtype_Name(have), "STATE_DTYPE_", have) +
                                 "; set only one of them"});
      return;
    }
    spec->mutable_optimizer()->set_state_dtype(v1::STATE_DTYPE_INT8);
    return;
  }
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  for (const std::string& n : int8) list += ", " + n;
  if (t.optim() == "adamw_torch_4bit") {
    out->push_back({"training.optim",
                    "'adamw_torch_4bit' is not available: 4-bit optimizer states are not "
                    "offered; the smallest are 8-bit (optim: adamw_8bit, or "
                    "optimizer.state_dtype: int8)"});
    return;
  }
  out->push_back({"training.optim", "'" + SafeMessageText(t.optim(), 128) +
                                        "' is not available: offloadd trains with AdamW (optim: " + list + ")"});
}

// max_length -> dataset.max_seq_length; completion_only_loss / assistant_only_loss ->
// dataset.mask_prompt (offloadd has one switch for prompt/completion and chat records).
void ResolveTrlData(v1::JobSpec* spec, std::vector<FieldViolation>* out) {
  const v1::TrainingArguments& t = spec->training();
  v1::DatasetSpec* d = spec->mutable_dataset();
  if (t.has_max_length()) {
    if (d->has_max_seq_length() && d->max_seq_length() != t.max_length()) {
      out->push_back({"training.max_length", "max_length " + std::to_string(t.max_length()) +
                                                 " contradicts dataset.max_seq_length " +
                                                 std::to_string(d->max_seq_length()) + "; set only one of them"});
    } else {
      d->set_max_seq_length(t.max_length());
    }
  }
  if (t.has_completion_only_loss() && t.has_assistant_only_loss() &&
      t.completion_only_loss() != t.assistant_only_loss()) {
    out->push_back({"training.assistant_only_loss",
                    "completion_only_loss and assistant_only_loss both map to dataset.mask_prompt (loss on the "
                    "responses only, for prompt/completion and chat records alike) and must agree"});
    return;
  }
  for (const auto& [has, value, field] :
       {std::tuple{t.has_completion_only_loss(), t.completion_only_loss(), "training.completion_only_loss"},
        std::tuple{t.has_assistant_only_loss(), t.assistant_only_loss(), "training.assistant_only_loss"}}) {
    if (!has) continue;
    if (d->has_mask_prompt() && d->mask_prompt() != value) {
      out->push_back({field, std::string(field + sizeof("training.") - 1) + ": " + Bool(value) +
                                 " contradicts dataset.mask_prompt: " + Bool(d->mask_prompt()) +
                                 "; set only one of them"});
      return;
    }
    d->set_mask_prompt(value);
  }
}

// auto_find_batch_size and train_batch_size (job/batch_planner.h): a train_batch_size is
// either the micro-batch times the accumulation, or, with the automatic batch size, what they
// are chosen to multiply to (then an accumulation set beside it would not act). The automatic
// batch size's cap defaults to 64 micro-batch sequences.
void ResolveBatchSize(v1::JobSpec* spec, std::vector<FieldViolation>* out) {
  v1::TrainingArguments* t = spec->mutable_training();
  if (t->has_train_batch_size()) {
    const int64_t g = t->train_batch_size();
    if (g < 1 || g > (1 << 24)) {
      out->push_back({"training.train_batch_size", "must be in [1, 16777216], got " + std::to_string(g)});
      return;
    }
    if (t->auto_find_batch_size()) {
      if (t->has_gradient_accumulation_steps()) {
        out->push_back({"training.gradient_accumulation_steps",
                        "set beside train_batch_size with the automatic batch size, which chooses the "
                        "accumulation (train_batch_size / the micro-batch); set one of them"});
      }
    } else {
      const int64_t micro = t->has_per_device_train_batch_size() ? t->per_device_train_batch_size() : 8;
      const int64_t acc = t->has_gradient_accumulation_steps() ? t->gradient_accumulation_steps() : 1;
      if (micro * acc != g) {
        out->push_back({"training.train_batch_size",
                        std::to_string(g) + " is not per_device_train_batch_size x gradient_accumulation_steps (" +
                            std::to_string(micro) + " x " + std::to_string(acc) +
                            "); set one of them, or per_device_train_batch_size: auto"});
      }
    }
  }
  if (t->auto_find_batch_size() && !t->has_per_device_train_batch_size()) t->set_per_device_train_batch_size(trainer::kDefaultAutoBatchCap);
}

}  // namespace

const std::vector<std::string>& AdamWOptimNames() {
  static const std::vector<std::string> kNames = {"adamw_torch",      "adamw_torch_fused", "adamw_hf",
                                                  "adamw_apex_fused", "adamw_torch_xla",   "adamw_torch_npu_fused"};
  return kNames;
}

const std::vector<std::string>& AdamW8bitOptimNames() {
  static const std::vector<std::string> kNames = {"adamw_8bit", "adamw_bnb_8bit"};
  return kNames;
}

void ResolveHfNames(v1::JobSpec* spec, std::vector<FieldViolation>* violations) {
  ResolveDtype(spec, violations);
  ResolveCheckpointing(spec, violations);
  ResolveOptim(spec, violations);
  ResolveTrlData(spec, violations);
  ResolveBatchSize(spec, violations);
  v1::TrainingArguments* t = spec->mutable_training();
  t->clear_bf16();
  t->clear_fp16();
  t->clear_gradient_checkpointing();
  t->clear_optim();
  t->clear_max_length();
  t->clear_completion_only_loss();
  t->clear_assistant_only_loss();
}

}  // namespace offloadd::daemon
