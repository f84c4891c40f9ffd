#pragma once
// MXFP4 (OCP Microscaling Formats v1.0): gpt-oss ships its expert weights as blocks of 32 e2m1
// values sharing one e8m0 scale. An e2m1 value is a nibble: sign bit 3, magnitude
// {0, 0.5, 1, 1.5, 2, 3, 4, 6} by bits 0-2; the scale byte s means 2^(s - 127) (255 is NaN).
// Two values per byte, the element at the even index in the low nibble.
//
// The checkpoint layout (what transformers' integrations/mxfp4.py reads): a parameter
// P [E, A, B] (gpt-oss: gate_up_proj [E, H, 2I], down_proj [E, I, H]) is stored transposed as
// P_blocks uint8 [E, B, A / 32, 16] and P_scales uint8 [E, B, A / 32]:
//   P[e, a, b] = e2m1(nibble a % 32 of blocks[e, b, a / 32]) * 2^(scales[e, b, a / 32] - 127).
// Full fine-tuning trains the dequantised weights (F32 / BF16 / F16); nothing is requantised.
// No LibTorch here; plain functions, thread-safe.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace offloadd::engine {

inline constexpr int64_t kMxfp4BlockValues = 32;

// The stored names of a parameter `name`: name + "_blocks" / name + "_scales".
std::string Mxfp4BlocksName(const std::string& name);
std::string Mxfp4ScalesName(const std::string& name);

// The blocks and scales shapes that hold a parameter of shape `param` ([E, A, B]); INVALID_ARGUMENT
// naming `name` when it is not 3-D or A is not a multiple of 32.
struct Mxfp4Shapes {
  std::vector<int64_t> blocks, scales;
};
StatusOr<Mxfp4Shapes> Mxfp4ShapesFor(const std::string& name, const std::vector<int64_t>& param);

// Writes elements [begin, begin + count) of the dequantised parameter (row-major over `param`,
// [E, A, B]) to `dst` from the raw `blocks` and `scales` bytes (sizes as Mxfp4ShapesFor says).
// INVALID_ARGUMENT naming `name` for a NaN scale (255) met on the way, or a range outside it.
Status DequantizeMxfp4(const std::string& name, const std::vector<int64_t>& param,
                       const std::byte* blocks, const std::byte* scales, int64_t begin,
                       int64_t count, float* dst);

}  // namespace offloadd::engine
