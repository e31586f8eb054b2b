#include "dtype_codec.hpp"

#include <cmath>
#include <cstring>

namespace exphil::test {

namespace {
uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
}  // namespace

uint16_t f32_to_bf16_bits(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_f32(uint16_t bits) { return float_of(static_cast<uint32_t>(bits) << 16); }

uint16_t f32_to_f16_bits(float x) {
  const uint32_t u = bits_of(x);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (mag < 0x38800000u) {  // below 2^-14: subnormal in f16, in units of 2^-24
    const float scaled = float_of(mag) * 16777216.0f;  // exact
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  uint32_t h = ((((mag >> 23) & 0xffu) - 127u + 15u) << 10) | ((mag >> 13) & 0x3ffu);
  const uint32_t rest = mag & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach the exponent
  return static_cast<uint16_t>(sign | h);
}

float f16_bits_to_f32(uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa ? std::nanf("") : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
}

double round_to(double x, DType dtype) {
  const auto f = static_cast<float>(x);
  switch (dtype) {
    case DType::f32: return f;
    case DType::f16: return f16_bits_to_f32(f32_to_f16_bits(f));
    case DType::bf16: return bf16_bits_to_f32(f32_to_bf16_bits(f));
  }
  return f;
}

std::vector<unsigned char> encode(const std::vector<double>& values, DType dtype) {
  std::vector<unsigned char> bytes(values.size() * dtype_size(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto f = static_cast<float>(values[i]);
    if (dtype == DType::f32) {
      std::memcpy(&bytes[i * 4], &f, 4);
    } else {
      const uint16_t h = dtype == DType::f16 ? f32_to_f16_bits(f) : f32_to_bf16_bits(f);
      std::memcpy(&bytes[i * 2], &h, 2);
    }
  }
  return bytes;
}

std::vector<double> decode(const unsigned char* bytes, std::size_t count, DType dtype) {
  std::vector<double> values(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      float f;
      std::memcpy(&f, bytes + i * 4, 4);
      values[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, bytes + i * 2, 2);
      values[i] = dtype == DType::f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
    }
  }
  return values;
}

}  // namespace exphil::test
