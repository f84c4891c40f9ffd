// offloadctl convert: DeepSpeed ds_config.json keys (config_convert.h; docs/convert.md).
#include <algorithm>
#include <map>
#include <string>

#include "client/cpp/config_convert_internal.h"

namespace offloadd::client::convert {

Status Converter::DeepSpeedOptimizer(const YAML::Node& opt) {
  const std::string type = opt["type"] ? opt["type"].Scalar() : "";
  std::string lower = type;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool adamw = lower == "adamw" || (lower == "adam" && !(opt["params"] && opt["params"]["adam_w_mode"] &&
                                                                IsOff(opt["params"]["adam_w_mode"])));
  if (!adamw) {
    Drop("optimizer", opt, "offloadd implements AdamW only (DeepSpeed Adam with adam_w_mode, or AdamW); '" + type +
                               "' is not converted");
    return OkStatus();
  }
  if (lower == "adam") Note("optimizer Adam with adam_w_mode (its default) is AdamW");
  const YAML::Node params = opt["params"];
  if (!params) return OkStatus();
  for (const auto& kv : params) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note("optimizer.params." + k + ": auto (filled from the training arguments): left to them");
    } else if (k == "lr") {
      RETURN_IF_ERROR(Set("training.learning_rate", v, "optimizer.params.lr"));
    } else if (k == "eps") {
      RETURN_IF_ERROR(Set("training.adam_epsilon", v, "optimizer.params.eps"));
    } else if (k == "weight_decay") {
      RETURN_IF_ERROR(Set("training.weight_decay", v, "optimizer.params.weight_decay"));
    } else if (k == "betas" && v.IsSequence() && v.size() == 2) {
      RETURN_IF_ERROR(Set("training.adam_beta1", v[0], "optimizer.params.betas"));
      RETURN_IF_ERROR(Set("training.adam_beta2", v[1], "optimizer.params.betas"));
    } else if (k != "adam_w_mode" && k != "torch_adam") {
      Drop("optimizer.params." + k, v);
    }
  }
  return OkStatus();
}

Status Converter::DeepSpeedScheduler(const YAML::Node& sched) {
  const std::string type = sched["type"] ? sched["type"].Scalar() : "";
  static const std::map<std::string, std::string> kTypes = {
      {"WarmupLR", "constant_with_warmup"}, {"WarmupDecayLR", "linear"}, {"WarmupCosineLR", "cosine_with_min_lr"}};
  auto t = kTypes.find(type);
  if (t == kTypes.end()) {
    Drop("scheduler", sched, "schedule '" + type + "' has no offloadd equivalent (WarmupLR, WarmupDecayLR and "
                             "WarmupCosineLR convert)");
    return OkStatus();
  }
  RETURN_IF_ERROR(Set("training.lr_scheduler_type", Str(t->second), "scheduler.type"));
  const YAML::Node p = sched["params"];
  if (!p) return OkStatus();
  for (const auto& kv : p) {
    const std::string k = kv.first.Scalar(), key = "scheduler.params." + k;
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note(key + ": auto (filled from the training arguments): left to them");
    } else if (k == "warmup_num_steps") {
      RETURN_IF_ERROR(Set("training.warmup_steps", v, key));
    } else if (k == "total_num_steps") {
      RETURN_IF_ERROR(Set("training.max_steps", v, key));
    } else if (k == "warmup_max_lr") {
      RETURN_IF_ERROR(Set("training.learning_rate", v, key));
    } else if (k == "cos_min_ratio") {
      RETURN_IF_ERROR(Set("training.lr_scheduler_kwargs.min_lr_rate", v, key));
    } else if ((k == "warmup_min_lr" || k == "warmup_min_ratio") && v.IsScalar() && v.as<double>() == 0) {
      ++out_.unset_keys;  // offloadd's warmup starts from 0, as these say
    } else if (k == "warmup_type" && v.Scalar() == "linear") {
      ++out_.unset_keys;  // offloadd's warmup is linear
    } else {
      Drop(key, v, "offloadd's warmup is linear from 0 to learning_rate");
    }
  }
  if (type == "WarmupCosineLR" && !set_.count("training.lr_scheduler_kwargs.min_lr_rate")) {
    RETURN_IF_ERROR(Set("training.lr_scheduler_kwargs.min_lr_rate", YAML::Node(0.0001), "scheduler.params"));
    Note("WarmupCosineLR's cos_min_ratio defaults to 0.0001: written as min_lr_rate");
  }
  return OkStatus();
}

Status Converter::DeepSpeedZero(const YAML::Node& zero) {
  for (const auto& kv : zero) {
    const std::string k = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (k == "offload_optimizer" || k == "offload_param") {
      if (!v.IsMap()) return InvalidArgumentError(source_ + ": zero_optimization." + k + " must be a mapping");
      for (const auto& o : v) {
        const std::string ok = o.first.Scalar(), key = "zero_optimization." + k + "." + ok;
        if (ok == "pin_memory" && o.second.IsScalar() && IsOff(o.second) && o.second.Scalar() != "") {
          // Not "off" in the sense of nothing lost: offloadd always pins, and the daemon refuses
          // false. The run trains the same either way.
          out_.operational.push_back({source_, key, Render(o.second),
                                      "offloadd stages every host-GPU copy through pinned memory; false is "
                                      "not built (the training is the same)"});
        } else if (ok == "device" || ok == "nvme_path" || ok == "pin_memory" || ok == "ratio") {
          RETURN_IF_ERROR(Set("offload." + k + "." + ok, o.second, key));
        } else {
          Drop(key, o.second, "offloadd sizes its own buffers (buffer_count, buffer_size, max_in_cpu)",
               Group::kInternal);
        }
      }
    } else if (k == "stage") {
      Note("zero_optimization.stage " + v.Scalar() + ": offloadd keeps one copy of the fp32 weights and Adam "
           "states where offload_* say, shared by all its data-parallel ranks (docs/data_parallel.md)");
    } else {
      Drop("zero_optimization." + k, v,
           "communication and bucketing of multi-GPU ZeRO; offloadd schedules its own transfers",
           Group::kInternal);
    }
  }
  return OkStatus();
}

Status Converter::DeepSpeed(const YAML::Node& root) {
  for (const auto& kv : root) {
    const std::string key = kv.first.Scalar();
    const YAML::Node& v = kv.second;
    if (IsAuto(v)) {
      Note("`" + key + ": auto` (filled from the training arguments): left to them");
    } else if (key == "train_batch_size") {
      RETURN_IF_ERROR(Set("training.train_batch_size", v, key));
    } else if (key == "train_micro_batch_size_per_gpu") {
      RETURN_IF_ERROR(Set("training.per_device_train_batch_size", v, key));
    } else if (key == "gradient_accumulation_steps") {
      RETURN_IF_ERROR(Set("training.gradient_accumulation_steps", v, key));
    } else if (key == "gradient_clipping") {
      RETURN_IF_ERROR(Set("training.max_grad_norm", v, key));
    } else if (key == "optimizer") {
      RETURN_IF_ERROR(DeepSpeedOptimizer(v));
    } else if (key == "scheduler") {
      RETURN_IF_ERROR(DeepSpeedScheduler(v));
    } else if (key == "bf16" || key == "fp16") {
      if (v["enabled"] && !IsAuto(v["enabled"])) RETURN_IF_ERROR(Set("training." + key, v["enabled"], key + ".enabled"));
      // The loss scale's settings change the run only where they differ from offloadd's (2^16
      // to start) and fp16 is on: with "auto" that is the training arguments' call.
      const bool fp16_on = v["enabled"] && !IsAuto(v["enabled"]) && !IsOff(v["enabled"]);
      for (const auto& o : v) {
        const std::string k = o.first.Scalar();
        if (k == "enabled") continue;
        // DeepSpeed's low-precision master weights and optimizer states (bf16 section).
        const bool master = k == "bf16_master_weights_and_grads",
                   states = k == "bf16_optimizer_states";
        if (key == "bf16" && (master || states)) {
          if (IsOff(o.second) || IsAuto(o.second)) {
            ++out_.unset_keys;
          } else {
            RETURN_IF_ERROR(Set(master ? "optimizer.master_dtype" : "optimizer.state_dtype",
                                Str("bf16"), "bf16." + k));
          }
          continue;
        }
        if (k == "initial_scale_power" && o.second.Scalar() == "16") {
          ++out_.unset_keys;
        } else {
          Drop(key + "." + k, o.second,
               "offloadd's dynamic loss scale starts at 2^16 and halves on overflow, doubling after 2000 "
               "clean steps",
               fp16_on ? Group::kTrains : Group::kOperational);
        }
      }
    } else if (key == "zero_optimization") {
      RETURN_IF_ERROR(DeepSpeedZero(v));
    } else if (key == "aio") {
      for (const auto& o : v) {
        const std::string ok = o.first.Scalar();
        if (ok == "block_size" || ok == "queue_depth") {
          RETURN_IF_ERROR(Set("offload.aio." + ok, o.second, "aio." + ok));
        } else {
          Drop("aio." + ok, o.second, "offloadd's store runs liburing with its own submission threads",
               Group::kInternal);
        }
      }
    } else if (key == "activation_checkpointing") {
      if (v["cpu_checkpointing"] && !IsOff(v["cpu_checkpointing"])) {
        RETURN_IF_ERROR(Set("offload.activations.mode", Str("recompute_offload_cpu"),
                            "activation_checkpointing.cpu_checkpointing"));
      }
      for (const auto& o : v) {
        if (o.first.Scalar() != "cpu_checkpointing") Drop("activation_checkpointing." + o.first.Scalar(), o.second);
      }
    } else {
      Drop(key, v);
    }
  }
  return OkStatus();
}

}  // namespace offloadd::client::convert
