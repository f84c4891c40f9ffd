#include "engine/mxfp4.h"

#include <cmath>

namespace offloadd::engine {
namespace {

// e2m1 magnitudes by the low three bits; bit 3 is the sign.
constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

std::string Shape(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

std::string Mxfp4BlocksName(const std::string& name) { return name + "_blocks"; }
std::string Mxfp4ScalesName(const std::string& name) { return name + "_scales"; }

StatusOr<Mxfp4Shapes> Mxfp4ShapesFor(const std::string& name, const std::vector<int64_t>& param) {
  if (param.size() != 3 || param[1] % kMxfp4BlockValues != 0) {
    return InvalidArgumentError("MXFP4 tensor \"" + name + "\": the parameter's shape " +
                                Shape(param) + " is not [E, A, B] with A a multiple of 32");
  }
  const int64_t e = param[0], groups = param[1] / kMxfp4BlockValues, b = param[2];
  return Mxfp4Shapes{{e, b, groups, kMxfp4BlockValues / 2}, {e, b, groups}};
}

Status DequantizeMxfp4(const std::string& name, const std::vector<int64_t>& param,
                       const std::byte* blocks, const std::byte* scales, int64_t begin,
                       int64_t count, float* dst) {
  ASSIGN_OR_RETURN(Mxfp4Shapes shapes, Mxfp4ShapesFor(name, param));
  const int64_t a_dim = param[1], b_dim = param[2], groups = shapes.scales[2];
  const int64_t numel = param[0] * a_dim * b_dim;
  if (begin < 0 || count < 0 || begin + count > numel) {
    return InvalidArgumentError("MXFP4 tensor \"" + name + "\": elements [" +
                                std::to_string(begin) + ", " + std::to_string(begin + count) +
                                ") are outside its " + std::to_string(numel));
  }
  for (int64_t i = begin; i < begin + count; ++i) {
    const int64_t b = i % b_dim, a = (i / b_dim) % a_dim, e = i / (a_dim * b_dim);
    const int64_t group = (e * b_dim + b) * groups + a / kMxfp4BlockValues;
    const auto scale = static_cast<uint8_t>(scales[group]);
    if (scale == 0xFF) {
      return InvalidArgumentError("MXFP4 tensor \"" + Mxfp4ScalesName(name) +
                                  "\": scale byte 255 (NaN in the OCP MX format) in block " +
                                  std::to_string(group));
    }
    const int64_t j = a % kMxfp4BlockValues;
    const auto byte = static_cast<uint8_t>(blocks[group * (kMxfp4BlockValues / 2) + j / 2]);
    const uint8_t nibble = (j % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
    const float v = kE2m1[nibble & 7];
    dst[i - begin] = std::ldexp((nibble & 8) ? -v : v, static_cast<int>(scale) - 127);
  }
  return OkStatus();
}

}  // namespace offloadd::engine
