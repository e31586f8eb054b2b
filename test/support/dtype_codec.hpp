// Host-side encoding of values in f32, f16 and bf16 (round to nearest even),
// for building GPU inputs and reading GPU outputs back as double.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "exphil/tensor.hpp"

namespace exphil::test {

uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(uint16_t bits);
uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(uint16_t bits);

// The value x takes once stored in `dtype`.
double round_to(double x, DType dtype);

// Packs values into the bytes of a `dtype` tensor, and back.
std::vector<unsigned char> encode(const std::vector<double>& values, DType dtype);
std::vector<double> decode(const unsigned char* bytes, std::size_t count, DType dtype);

}  // namespace exphil::test
