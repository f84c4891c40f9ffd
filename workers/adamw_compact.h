#pragma once
// Compact optimizer modes: the fused CPU AdamW step (adamw_kernel.h) over master weights and Adam
// states held in fewer bytes than fp32. Named, opt-in and not exact; exact AdamW (fp32 master,
// fp32 states) is the default and stays FusedAdamW. docs/optimizer-modes.md has the formats, the
// choices and their measured cost.
//
// Each block of kInt8BlockSize elements is decoded into fp32, stepped with exact AdamW's fp32
// arithmetic (FusedAdamW's operations) and encoded back in one fused pass (int8 states: a second
// pass over the block's L1 buffer), so memory is read and written once per step in the compact
// format:
//   state_dtype bf16: m and v in bf16, stochastically rounded (a counter-based hash of the
//     element's index, the step and the span's seed: deterministic, the same on every flavour).
//     Round-to-nearest would freeze v: beta2's decay per step (0.1% at 0.999) is below half a
//     bf16 ulp (0.2%).
//   state_dtype int8: blockwise (256) linear quantisation with a dynamic per-block scale
//     (8-bit Adam, Dettmers et al. 2022, with a linear map instead of the dynamic tree): m signed,
//     q = rne(127 m / absmax(m)); v unsigned through its square root, q = rne(255 sqrt(v) /
//     max(sqrt(v))), never 0 for v > 0 (a state that decodes to 0 would make the next step's
//     denominator eps). The scale of a block follows its largest element exactly, so a block
//     decays with beta1/beta2 as its elements do.
//   master_dtype bf16: a bf16 master plus a bf16 compensation that holds the master's rounding
//     error (Kahan): the fp32 value the step starts from is master + compensation, and an update
//     below half a bf16 ulp accumulates in the compensation instead of being lost. 4 bytes per
//     parameter like an fp32 master (about 17 significant bits instead of 24); its gain is that
//     the bf16 master is the device's bf16 weight copy.
//
// Thread-safe: pure functions over caller-owned memory; callers split shards between threads, at
// multiples of kInt8BlockSize for int8 states.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"
#include "workers/adamw_kernel.h"

namespace offloadd::workers {

enum class StateDtype : uint8_t { kFp32 = 0, kBf16 = 1, kInt8 = 2 };
enum class MasterDtype : uint8_t { kFp32 = 0, kBf16 = 1 };

struct OptimizerMode {
  StateDtype state = StateDtype::kFp32;
  MasterDtype master = MasterDtype::kFp32;
  bool Exact() const { return state == StateDtype::kFp32 && master == MasterDtype::kFp32; }
  // "exact (fp32 master, fp32 states)" or "not exact: fp32 master, int8 states".
  std::string Describe() const;
  bool operator==(const OptimizerMode&) const = default;
};
std::string_view StateDtypeName(StateDtype d);    // "fp32", "bf16", "int8"
std::string_view MasterDtypeName(MasterDtype d);  // "fp32", "bf16"
// The job spec's names ("" is fp32); INVALID_ARGUMENT naming the setting and its choices.
StatusOr<OptimizerMode> ParseOptimizerMode(std::string_view state_dtype,
                                           std::string_view master_dtype);

inline constexpr size_t kInt8BlockSize = 256;
inline size_t Int8Blocks(size_t n) { return (n + kInt8BlockSize - 1) / kInt8BlockSize; }

// Host bytes per parameter of the master weights and both states (the int8 scales included,
// counted for whole blocks): 12 for exact, 8 with bf16 states, 6.03 with int8 states.
double StateBytesPerParam(OptimizerMode mode);
// Bytes one step reads and writes per parameter: the gradient, the master and both states read
// and written (scales included), and the 16-bit weight copy written (none for kNone). 28 for
// exact with bf16 gradients and weights, 16.06 with int8 states.
double StepTrafficBytesPerParam(OptimizerMode mode, GradDtype grad, WeightDtype weights);

// The arena region of a shard's master weights and of each Adam state in `mode`, for n elements.
// A region holds everything the mode keeps for that tensor, so it can be copied, checkpointed and
// staged as one blob: fp32: float[n]; bf16 master: bf16[n], then its compensation bf16[n] at
// MasterCompOffset(n); bf16 states: bf16[n]; int8 states: the codes [n], then one fp32 scale per
// block of kInt8BlockSize at Int8ScalesOffset(n).
uint64_t MasterRegionBytes(MasterDtype d, uint64_t n);
uint64_t StateRegionBytes(StateDtype d, uint64_t n);
inline uint64_t MasterCompOffset(uint64_t n) { return (2 * n + 63) / 64 * 64; }
inline uint64_t Int8ScalesOffset(uint64_t n) { return (n + 63) / 64 * 64; }

// A bf16 master as CompactAdamW reads and writes it (the same bits): Decode gives the fp32 value a
// step starts from, fl(master + compensation), which is exact; Encode rounds p to the bf16 master
// (nearest even) and its error to the bf16 compensation. Decode(Encode(p)) is p to about 17
// significant bits, so a master restored from fp32 values is not bit for bit the one saved: a
// checkpoint keeps the region itself (MasterRegionBytes).
void DecodeBf16Master(const uint16_t* master, const uint16_t* comp, uint64_t n, float* out);
void EncodeBf16Master(const float* p, uint64_t n, uint16_t* master, uint16_t* comp);

struct CompactSpan {
  const void* grad = nullptr;
  GradDtype grad_dtype = GradDtype::kBf16;
  void* master = nullptr;             // float[n], or uint16_t[n] bf16 for a bf16 master
  uint16_t* master_comp = nullptr;    // bf16 master: its compensation (bf16[n])
  void* exp_avg = nullptr;            // float[n], uint16_t[n] bf16, or int8_t[n]
  void* exp_avg_sq = nullptr;         // float[n], uint16_t[n] bf16, or uint8_t[n] (sqrt(v))
  float* exp_avg_scale = nullptr;     // int8: absmax(m) of each block (Int8Blocks(n))
  float* exp_avg_sq_scale = nullptr;  // int8: max(sqrt(v)) of each block
  void* weights = nullptr;            // may be null when weight_dtype is kNone
  WeightDtype weight_dtype = WeightDtype::kBf16;
  size_t n = 0;
  // The parameter's index of element 0 in its tensor (stochastic rounding's counter, so a split
  // into shards rounds as the whole does) and the tensor's seed.
  uint64_t first_index = 0;
  uint64_t seed = 0;
};

// One AdamW step in `mode` (hyper as FusedAdamW). Returns sum(grad^2) of the unscaled gradients,
// summed per block of kInt8BlockSize (each block in FusedAdamW's lane order, the blocks in double):
// the same on every flavour. INVALID_ARGUMENT for a span missing a buffer the mode needs.
StatusOr<double> CompactAdamW(const CompactSpan& span, OptimizerMode mode, const AdamWHyper& hyper,
                              KernelPath path);
Status ValidateCompactSpan(const CompactSpan& span, OptimizerMode mode);

// The span of elements [begin, begin + count) of a tensor of n elements whose regions (laid out as
// MasterRegionBytes/StateRegionBytes say) start at master/exp_avg/exp_avg_sq; begin is a multiple
// of kInt8BlockSize. grad, weights and the seed are the caller's.
CompactSpan CompactSpanAt(OptimizerMode mode, uint8_t* master, uint8_t* exp_avg,
                          uint8_t* exp_avg_sq, uint64_t n, uint64_t begin, uint64_t count);

}  // namespace offloadd::workers
