// Tolerances of GPU results against the double reference, per dtype, in one
// place. An element passes when
//
//     |got - ref| <= atol * scale + rtol * |ref|
//
// rtol covers rounding the result itself to the dtype (half an ulp: 2^-24
// f32, 2^-11 f16, 2^-8 bf16) with margin. atol is relative to `scale`, the
// largest reference magnitude of the quantities the result is computed
// from: for y and h_final the states (max |y|, |h_final|, |h0| and the
// values a step moves the state toward), for the gradients all gradients of
// the call. Rounding errors scale with those magnitudes,
// not with the result's own value, which may cancel to almost nothing: h_final
// of one channel can be 1e-4 while the states around it are of order 1; a
// gradient like g * h_prev, built from y rounded to the dtype, carries an
// error of about ulp(|g| |h|). f32 also absorbs the different summation order
// of a chunked scan over long T.
#pragma once

#include "exphil/tensor.hpp"

namespace exphil::test {

struct Tolerance {
  double atol;  // relative to the tensor's max |ref|
  double rtol;
};

constexpr Tolerance tolerance_for(DType dtype) {
  switch (dtype) {
    case DType::f32: return {2e-5, 2e-5};
    case DType::f16: return {4e-3, 4e-3};
    case DType::bf16: return {3e-2, 2e-2};
  }
  return {0.0, 0.0};
}

// The fused GRU, LSTM and sLSTM sequences' (the C++ API, the C ABI and the
// kernels alike): wider than tolerance_for because their backward recomputes
// the gates from y rounded to the dtype, and f32 chains up to 300 steps of
// length-4096 products; test/gpu/test_gated_rnn.cpp's header gives each line.
constexpr Tolerance gated_rnn_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {5e-5, 5e-5};
    case DType::f16: return {5e-3, 5e-3};
    case DType::bf16: return {4e-2, 3e-2};
  }
  return {0.0, 0.0};
}

// f32 with GatedRnnLaunchOptions::f32_tensor_cores: the forward's R rounded
// to f16 (2^-11 relative, TF32's), the walk's R and grad_rh to about 16
// bits; the products of h and R, h and grad_rh, and every state stay f32.
// Each pre-activation then carries up to 2^-11 of its terms' magnitudes,
// TF32's error, against f32's 2^-24: the f16 line's 5e-3 would pass a
// coarser product (bf16's 2^-8 on R), so this line is 1e-3
// (test/gpu/test_gated_rnn.cpp, "f32 on tensor cores", records the worst).
constexpr Tolerance gated_rnn_f32_tensor_cores_tolerance() { return {1e-3, 1e-3}; }

}  // namespace exphil::test
