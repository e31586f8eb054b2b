// The host f16/bf16 codecs the GPU tests rely on to build inputs and read
// results.
#include <catch2/catch.hpp>

#include <cmath>

#include "dtype_codec.hpp"

using namespace exphil::test;

TEST_CASE("bf16 encoding rounds to nearest even", "[codec]") {
  CHECK(f32_to_bf16_bits(1.0f) == 0x3f80);
  CHECK(f32_to_bf16_bits(-2.0f) == 0xc000);
  CHECK(bf16_bits_to_f32(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(f32_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6).
  CHECK(f32_to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);
  CHECK(std::isnan(bf16_bits_to_f32(f32_to_bf16_bits(std::nanf("")))));
}

TEST_CASE("f16 encoding covers normals, subnormals, overflow and ties", "[codec]") {
  CHECK(f32_to_f16_bits(1.0f) == 0x3c00);
  CHECK(f32_to_f16_bits(-2.0f) == 0xc000);
  CHECK(f32_to_f16_bits(65504.0f) == 0x7bff);
  CHECK(f32_to_f16_bits(65520.0f) == 0x7c00);                  // rounds up to inf
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -24)) == 0x0001);     // smallest subnormal
  CHECK(f32_to_f16_bits(std::ldexp(1.0f, -14)) == 0x0400);     // smallest normal
  CHECK(f32_to_f16_bits(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);      // tie to even
  CHECK(f32_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie to even
  for (int bits : {0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0xbc01})
    CHECK(f32_to_f16_bits(f16_bits_to_f32(static_cast<uint16_t>(bits))) == bits);
  CHECK(std::isinf(f16_bits_to_f32(0x7c00)));
}

TEST_CASE("round_to and encode/decode agree", "[codec]") {
  const std::vector<double> values = {0.1, -3.14159, 1e-5, 1234.5678};
  for (exphil::DType d : {exphil::DType::f32, exphil::DType::f16, exphil::DType::bf16}) {
    const auto bytes = encode(values, d);
    const auto back = decode(bytes.data(), values.size(), d);
    for (std::size_t i = 0; i < values.size(); ++i) CHECK(back[i] == round_to(values[i], d));
  }
}
