#pragma once
// The automatic batch size (per_device_train_batch_size: auto, offloadd-train
// --batch-size=auto): which micro-batch and gradient accumulation give the most tokens per second
// under the job's budgets.
//
// The candidates are micro-batches of 1, 2, 4, ... up to a cap (the spec's
// per_device_train_batch_size, 64 when unset), plus the cap itself:
//   - with a global batch G (train_batch_size, DeepSpeed's name: sequences per optimizer step), the
//     micro-batches that divide G, each with accumulation G / micro, so the optimisation is the one
//     the user asked for whatever is picked;
//   - without one, the accumulation is the job's gradient_accumulation_steps and the global batch
//     follows the micro-batch (what transformers' auto_find_batch_size does too).
// The trainer prices each candidate with the step planner (job/step_planner.h) on its own
// inputs: the static memory estimate at that micro-batch (the shape profile where one is cached),
// the GPU time of its work at the GEMM rate measured at that size, and the node profile's rates
// for the update and the copies. The fastest in tokens/s wins; within 2% the smaller micro-batch
// (it leaves more of the budget to the planner and risks less). After the first steps the step
// planner re-solves the placement with measured figures, as for a fixed batch.
//
// Torch-free: the trainer (trainer/trainer_batch.cc) fills the candidates' plan inputs.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "job/step_planner.h"

namespace offloadd::trainer {

struct BatchCandidate {
  int micro = 0;
  int accumulation = 0;
  bool feasible = false;
  std::string why_not;    // infeasible: what does not fit
  PlanChoice plan;        // the step planner's choice for this micro-batch
  double tokens_per_s = 0;
};

inline constexpr int kDefaultAutoBatchCap = 64;

// The (micro, accumulation) pairs to price, smallest micro first. global_batch > 0: the divisors
// of it up to cap; else powers of two up to cap, and cap, each with `accumulation`.
StatusOr<std::vector<BatchCandidate>> BatchCandidates(int cap, int global_batch, int accumulation);

// The expected padded length of a micro-batch of `batch` rows drawn from `lengths` (records of
// varying length, padded to the longest row rounded up to `multiple`, at most `cap`): exactly
// E[round_up(max of batch draws)] over the empirical distribution, whose i-th smallest of N is the
// maximum with probability (i/N)^batch - ((i-1)/N)^batch. 0 when `lengths` is empty.
double ExpectedPaddedLength(std::vector<int64_t> lengths, int batch, int64_t multiple, int64_t cap);

// The padded length of a micro-batch whose longest row has `longest` tokens, at most
// max(cap, longest): rounded up to a multiple of 8, or with `buckets` to one of a few lengths per
// octave (multiples of 16 up to 64, then quarter octaves: 80, 96, 112, 128, 160, ..., 768, 896,
// 1024, ...; at most 25% padding). On CUDA each length a job meets costs a kernel warm-up inside
// its step (cuDNN builds a graph per length: 0.25-0.40 s at 1.1B for a 0.29 s
// step), and Alpaca records padded to multiples of 8 met a new length most steps: buckets bound
// the lengths to a few, which the planner warms before they are met.
int64_t PaddedLength(int64_t longest, int64_t cap, bool buckets);

// The distribution of a micro-batch's padded length when its `batch` rows are drawn from
// `lengths` (the i-th smallest of N is the longest with probability (i/N)^batch -
// ((i-1)/N)^batch): (padded length, probability) pairs, ascending. Empty when `lengths` is.
std::vector<std::pair<int64_t, double>> PaddedLengthDistribution(std::vector<int64_t> lengths, int batch,
                                                                  int64_t cap, bool buckets);
double ExpectedLength(const std::vector<std::pair<int64_t, double>>& distribution);

// Tokens per second of a priced candidate (micro x accumulation x seq tokens per predicted step).
double CandidateTokensPerSecond(const BatchCandidate& c, int64_t seq);

// The index of the chosen candidate: the most tokens/s among the feasible ones, the smaller
// micro-batch within 2%. An error naming the smallest candidate's reason when none is feasible.
StatusOr<int> ChooseBatch(const std::vector<BatchCandidate>& candidates);

// "micro-batch 8 x 1 accumulation (8 sequences per step): predicted 4.1k tokens/s (held updates),
// the most of 1: 0.9k, 2: 1.7k, 4: 2.9k, 8: 4.1k, 16: does not fit (...)".
std::string DescribeBatchChoice(const std::vector<BatchCandidate>& candidates, int chosen, int64_t seq);

}  // namespace offloadd::trainer
