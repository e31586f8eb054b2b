// Runs one attention case on the GPU, forward and backward, through the C++
// API or the C ABI, and checks every output against the double reference
// (attention_reference.hpp): outputs are poisoned (NaN) before every call,
// so an element the kernels never write fails; guard zones around every
// tensor must stay untouched; inputs must come back bit for bit.
//
// Tolerances. Each output element is judged against the sum of the absolute
// values of its terms, which the reference reports:
//     |got - ref| <= terms_factor * terms + rtol * |ref| + floor
// f16/bf16 round P and dS to the dtype before their products (relative
// error 2^-11 / 2^-8 of every term); f32 carries the relative error of the
// scores' f32 dot products through exp. lse comes from f32 scores for every
// dtype and is judged absolutely, against the largest score magnitude.
// f32 with precision tf32x3 is held to f32's tolerances: its products are
// within about 2^-21 of exact, and the terms factor allows 1e-4.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "exphil/attention.hpp"
#include "exphil/exphil.h"

namespace exphil::test {

struct AttentionTolerance {
  double terms_factor;
  double rtol;
  double floor;  // absolute: f16's subnormal spacing where it matters
};

constexpr AttentionTolerance attention_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {1e-4, 1e-5, 0.0};
    case DType::f16: return {4e-3, 2e-3, 1e-7};
    case DType::bf16: return {3e-2, 1e-2, 0.0};
  }
  return {0.0, 0.0, 0.0};
}

struct AttentionRun {
  DType dtype = DType::f32;
  int64_t batch = 1, q_heads = 1, kv_heads = 1, q_len = 1, kv_len = 1;
  int head_dim = 32;
  AttentionOptions options;
  bool write_lse = true;     // the forward's lse output (else NULL; the backward still gets one)
  bool backward = true;
  bool grad_q = true, grad_k = true, grad_v = true;  // NULL when false
  int warps = 0;             // forced warps per block (C++ API only)
  bool sm80_kernels = false; // no Hopper kernels even where they would run (C++ API only)
  int calls = 1;             // each direction runs this often on the same buffers
  double q_amplitude = 2.0;  // q in [-a, a]: peaked, not uniform, softmax rows
};

// [B, Hq, Hkv, T, S]: the extents of a case.
struct AttentionDims {
  int64_t batch, q_heads, kv_heads, q_len, kv_len;
};

// A case of this dtype, head width, extents and mask, every other field at
// its default.
AttentionRun attention_run(DType dtype, int head_dim, const AttentionDims& dims,
                           AttentionMask mask);

std::string describe(const AttentionRun& run);

// False, after printing the case, if its scores (B * Hq * T * S) exceed
// EXPHIL_TEST_MAX_ELEMENTS (max_test_elements() of scan_problems.hpp): how
// the sanitizer runs keep racecheck, which instruments every shared-memory
// access, to the sizes it can finish.
bool within_test_size(const AttentionRun& run);

// How the harness reaches the library.
struct AttentionRunner {
  std::string name;
  std::function<Status(const AttentionForwardArgs&, const AttentionLaunchOptions*)> forward;
  std::function<Status(const AttentionBackwardArgs&, const AttentionLaunchOptions*)> backward;
  std::function<void()> synchronize;
};

AttentionRunner attention_cpp_runner(Stream stream = nullptr);

// exphil_attention_forward/backward of libexphil.so on the managed stream.
// Inline, so that only binaries that call it need libexphil.so.
inline AttentionRunner attention_abi_runner() {
  auto status = [](exphil_status s) {
    return s == EXPHIL_OK ? Status() : Status(static_cast<StatusCode>(s), exphil_last_error());
  };
  auto c_options = [](const AttentionOptions& o) {
    exphil_attention_options c{};
    c.mask = static_cast<int32_t>(o.mask);
    c.window = o.window;
    c.layout = static_cast<int32_t>(o.layout);
    c.scale = o.scale;
    c.precision = static_cast<int32_t>(o.precision);
    return c;
  };
  AttentionRunner r;
  r.name = "C ABI on the managed stream";
  r.forward = [=](const AttentionForwardArgs& a, const AttentionLaunchOptions*) {
    const exphil_attention_options o = c_options(a.options);
    return status(exphil_attention_forward(a.in.q, a.in.k, a.in.v, &o, a.o, a.lse, nullptr));
  };
  r.backward = [=](const AttentionBackwardArgs& a, const AttentionLaunchOptions*) {
    const exphil_attention_options o = c_options(a.options);
    return status(exphil_attention_backward(a.in.q, a.in.k, a.in.v, a.o, a.lse, a.grad_o, &o,
                                            a.grad_q, a.grad_k, a.grad_v, nullptr));
  };
  r.synchronize = [] {
    int device = 0;
    if (exphil_synchronize(device) != EXPHIL_OK)
      throw std::runtime_error(std::string("exphil_synchronize: ") + exphil_last_error());
  };
  return r;
}

// The raw output bytes of one run, for determinism checks.
struct AttentionOutputs {
  std::vector<unsigned char> o, lse, grad_q, grad_k, grad_v;
};

// What one run found: a line per failed check (empty: all passed), and the
// raw outputs.
struct AttentionCheck {
  std::vector<std::string> failures;
  AttentionOutputs outputs;
  // What the library chose (C++ runner only; the C ABI does not report it).
  AttentionLaunchInfo forward_layout, backward_layout;
  std::string report() const;  // the failures, one per line
};

// Runs the case with inputs drawn from `seed` and checks every output.
// Throws std::runtime_error on CUDA failures outside the library.
AttentionCheck check_attention(const AttentionRun& run, const AttentionRunner& runner,
                               uint64_t seed);

}  // namespace exphil::test
