#pragma once
// What a mixture-of-experts model costs a step, from its config (engine::ModelConfig::moe): the
// planner's MoE figures, which `offloadd-train --validate-only` prints beside the predicted step.
//
// A sparse layer holds the router and all E experts, so its weights stream in, its gradients
// stream out and its AdamW states sit in the arena for every expert (the host RAM and the
// uploads are priced on the total parameters), while a token computes with the router and top_k
// experts only (the GPU work is priced on the active parameters: engine::MoePart::Flops). Per
// sparse layer and micro-batch of T tokens at most min(E, T x top_k) experts receive a token, and
// the expert GEMMs run one per non-empty expert over T x top_k / (that many) rows on average: the
// shape whose rate the flop count is priced at (trainer_batch.cc SecondsPerFlop).
//
// Torch-free (tests/job/moe_pricing_test.cc).
#include <cstdint>
#include <string>

#include "engine/model_config.h"

namespace offloadd::trainer {

struct MoeStepFigures {
  int64_t num_experts = 0;  // 0: a dense model (every other field 0 too)
  int64_t top_k = 0;
  int64_t sparse_layers = 0;
  int64_t total_params = 0;   // every parameter: what the arena and the uploads hold
  int64_t active_params = 0;  // what one token computes with (engine::ParamCounts::active)
  int64_t expert_params = 0;  // one expert
  int64_t tokens = 0;         // per micro-batch
  // Per sparse layer and micro-batch: at most this many experts receive a token, min(E, T top_k),
  // and their GEMMs average expert_rows = T top_k / routed_experts rows each.
  int64_t routed_experts = 0;
  double expert_rows = 0;
  // Per step: the expert weights' uploads (every expert of every sparse layer, each pass that
  // uploads its layer: the upload precedes the routing), and the part of it that the routed bound
  // leaves (equal once T top_k >= E).
  double expert_upload_bytes = 0;
  double routed_upload_bytes = 0;
  // Per micro-batch, forward, summed over the sparse layers: the router's fp32 GEMM (2 T H E) and
  // the experts' (2 T top_k x one expert's parameters).
  double router_flops = 0;
  double expert_flops = 0;
  // Host RAM of every expert's states in the arena (all experts' master weights and moments).
  double expert_host_bytes = 0;
  bool moe() const { return num_experts > 0; }
};

// uploads_per_step: how often a layer's weights cross per step (2 x accumulation streamed, 1
// resident); upload_bytes: per parameter and upload (4: fp32 masters cast on the GPU, 2: a 16-bit
// copy); host_bytes_per_param: the arena's (ArenaBytesPerParameter). A dense config
// gives figures with num_experts 0.
MoeStepFigures PriceMoeStep(const engine::ModelConfig& c, int64_t micro, int64_t seq,
                            double uploads_per_step, double upload_bytes,
                            double host_bytes_per_param);

// "mixture of experts: 48 sparse layers of 128 experts, top-8: 30532122624 parameters, 3351...
// active per token; per step 216 GiB of expert weights uploaded (all 128 experts of each sparse
// layer: the upload precedes the routing; at most min(128, 8192 x 8) = 128 receive tokens, 216 GiB
// of them, 512.0 rows per expert GEMM on average); per micro-batch forward: router 206.16 GFLOP
// (fp32), experts 11.13 TFLOP; every expert's states 378 GiB of host RAM". Empty for a dense model.
std::string DescribeMoe(const MoeStepFigures& m);

}  // namespace offloadd::trainer
