#pragma once
// Peak dense bf16 FLOP/s of known GPUs, for MFU when metrics.peak_flops is not set. Figures are
// the vendors' dense (no sparsity) tensor-core bf16 rates with fp32 accumulation.

#include <string_view>

namespace offloadd::daemon {

// 0 when the name (as the CUDA runtime reports it, e.g. "NVIDIA H100 80GB HBM3") is not known.
double KnownPeakBf16Flops(std::string_view gpu_name);

}  // namespace offloadd::daemon
