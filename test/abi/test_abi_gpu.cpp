// The C ABI of libexphil.so on a GPU: every op through exphil.h against the
// reference (attention in both precisions of f32; GRU and LSTM with every
// optional tensor present, absent, and with only Edifice's gradients asked
// for), and the device-side checks: host, pinned and out-of-allocation
// memory rejected by name, managed memory and caller streams accepted.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "abi_calls.hpp"
#include "attention_harness.hpp"
#include "compare.hpp"
#include "device_buffer.hpp"
#include "exphil/exphil.h"
#include "gated_rnn_reference.hpp"
#include "scan_harness.hpp"
#include "scan_problems.hpp"

using Catch::Matchers::Contains;
using namespace exphil;
using namespace exphil::test;

namespace {

Status from_abi(exphil_status s) {
  return s == EXPHIL_OK ? Status() : Status(static_cast<StatusCode>(s), exphil_last_error());
}

ScanRunner abi_runner(exphil_stream stream) {
  ScanRunner r;
  r.forward = [=](const ScanForwardArgs& a) {
    return from_abi(abi_scan_forward(a.op, a.inputs, a.h0, a.y, a.h_final, stream));
  };
  r.backward = [=](const ScanBackwardArgs& a) {
    return from_abi(abi_scan_backward(a.op, a.inputs, a.h0, a.y, a.grad_y, a.grad_h_final,
                                      a.grad_inputs, a.grad_h0, stream));
  };
  r.synchronize = [=] {
    if (stream) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize");
    } else if (exphil_synchronize(0) != EXPHIL_OK) {
      throw std::runtime_error(std::string("exphil_synchronize: ") + exphil_last_error());
    }
  };
  return r;
}

exphil_tensor tensor(void* data, int32_t dtype, int64_t b, int64_t t, int64_t h) {
  exphil_tensor x{};
  x.data = data;
  x.dtype = dtype;
  x.rank = 3;
  x.shape[0] = b; x.shape[1] = t; x.shape[2] = h;
  return x;
}

}  // namespace

TEST_CASE("every op through the C ABI matches the reference", "[gpu][abi]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  for (ScanOp op : kAbiScanOps) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (exphil_stream s : {static_cast<exphil_stream>(nullptr), stream}) {
        ScanCase c = stateful_case(op, dtype, {2, 300, 33});
        const ScanCheck check = run_scan_case(c, abi_runner(s), test_seed());
        INFO(describe_case(c) << (s ? " on a caller stream" : " on the managed stream") << "\n"
                              << check.describe());
        CHECK(check.ok());
      }
    }
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

// exphil_attention_options.precision reaches the kernels: tf32x3 within f32's
// tolerance and not the exact path's bytes.
TEST_CASE("attention through the C ABI, f32 exact and tf32x3, matches the reference",
          "[gpu][abi]") {
  AttentionRun exact = attention_run(DType::f32, 64, {2, 4, 2, 100, 130}, AttentionMask::causal);
  AttentionRun tf32x3 = exact;
  tf32x3.options.precision = AttentionPrecision::tf32x3;
  const uint64_t seed = test_seed();
  const AttentionCheck e = check_attention(exact, attention_abi_runner(), seed);
  const AttentionCheck t = check_attention(tf32x3, attention_abi_runner(), seed);
  INFO(describe(exact) << " seed=" << seed << "\nexact: " << e.report() << "\ntf32x3: " << t.report());
  CHECK(e.failures.empty());
  CHECK(t.failures.empty());
  CHECK(t.outputs.o != e.outputs.o);
  CHECK(t.outputs.grad_k != e.outputs.grad_k);
}

namespace {

using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnProblem;

// test/gpu/test_gated_rnn.cpp's tolerances of the gated RNNs (its header
// says why): the backward recomputes the gates from y rounded to the dtype.
Tolerance abi_gated_rnn_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {5e-5, 5e-5};
    case DType::f16: return {5e-3, 5e-3};
    case DType::bf16: return {4e-2, 3e-2};
  }
  return {0, 0};
}

const char* abi_dtype_name(DType d) { return d == DType::f32 ? "f32" : d == DType::f16 ? "f16" : "bf16"; }

// Which of a call's optional tensors are passed (NULL otherwise).
enum class AbiRnnForm {
  everything,  // bias, h0, c0, grad_h_final, grad_c_final; every output
  nothing,     // no optional input, no final state; every gradient (at zero bias and states)
  edifice,     // h0 and c0; y alone; grad_wx, grad_rh, grad_h0, grad_c0 (no grad_R, grad_bias)
};

struct AbiRnnCase {
  GatedRnnKind kind = GatedRnnKind::gru;
  DType dtype = DType::f32, weight_dtype = DType::f32, state_dtype = DType::f32;
  int64_t B = 1, T = 1, H = 1;
  AbiRnnForm form = AbiRnnForm::everything;

  std::string describe() const {
    static const char* const forms[] = {"everything", "nothing", "edifice"};
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %s (R %s, states %s) B%lld T%lld H%lld, optional tensors: %s",
                  kind == GatedRnnKind::gru ? "GRU" : "LSTM", abi_dtype_name(dtype),
                  abi_dtype_name(weight_dtype), abi_dtype_name(state_dtype), static_cast<long long>(B),
                  static_cast<long long>(T), static_cast<long long>(H), forms[static_cast<int>(form)]);
    return buf;
  }
};

// One case through exphil_{gru,lstm}_{forward,backward} on `stream` (NULL:
// the library's managed stream): inputs random and rounded to their dtypes,
// every output poisoned, the forward's y fed to the backward, and every
// output written compared with the double reference (and its guard zones
// intact). Returns the worst error / allowed.
double run_abi_gated_rnn(const AbiRnnCase& c, exphil_stream stream, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool lstm = c.kind == GatedRnnKind::lstm;
  const bool all = c.form == AbiRnnForm::everything;
  const bool states = c.form != AbiRnnForm::nothing;
  const int64_t GH = (lstm ? 4 : 3) * c.H;
  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  using Shape = std::vector<int64_t>;
  const Shape seq{c.B, c.T, c.H}, gates{c.B, c.T, GH}, weights{c.H, GH}, bias_shape{GH}, state{c.B, c.H};

  GatedRnnProblem p;
  p.kind = c.kind;
  p.batch = c.B;
  p.steps = c.T;
  p.hidden = c.H;
  const double r = 1.5 / std::sqrt(static_cast<double>(c.H));
  p.wx = random_values(n(c.B * c.T * GH), -1.5, 1.5, c.dtype, rng);
  p.R = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
  if (all) p.bias = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
  if (states) p.h0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
  if (states && lstm) p.c0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
  const std::vector<double> grad_y = random_values(n(c.B * c.T * c.H), -1, 1, c.dtype, rng);
  std::vector<double> grad_hf, grad_cf;
  if (all) grad_hf = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
  if (all && lstm) grad_cf = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);

  using Owned = std::unique_ptr<DeviceTensor>;
  const auto input = [](const std::vector<double>& v, DType d, const Shape& s) {
    return v.empty() ? Owned() : std::make_unique<DeviceTensor>(v, d, s);
  };
  const auto output = [](bool wanted, DType d, const Shape& s) {
    return wanted ? std::make_unique<DeviceTensor>(d, s) : Owned();
  };
  const auto ptr = [](const Owned& t) { return t ? t->ptr() : nullptr; };
  const Owned wx = input(p.wx, c.dtype, gates), R = input(p.R, c.weight_dtype, weights),
              bias = input(p.bias, c.weight_dtype, bias_shape), h0 = input(p.h0, c.state_dtype, state),
              c0 = input(p.c0, c.state_dtype, state), gy = input(grad_y, c.dtype, seq),
              ghf = input(grad_hf, c.state_dtype, state), gcf = input(grad_cf, c.state_dtype, state);
  const Owned y = output(true, c.dtype, seq), hf = output(all, c.state_dtype, state),
              cf = output(all && lstm, c.state_dtype, state), gwx = output(true, c.dtype, gates),
              gR = output(c.form != AbiRnnForm::edifice, c.weight_dtype, weights),
              gb = output(c.form != AbiRnnForm::edifice, c.weight_dtype, bias_shape),
              gh0 = output(true, c.state_dtype, state), gc0 = output(lstm, c.state_dtype, state),
              grh = output(true, c.dtype, gates);
  // The uploads and poison are on the legacy stream, which the library's
  // own stream does not wait for.
  device_synchronize();

  const auto sync = [&](exphil_status s, const char* what) {
    INFO(c.describe() << ": " << what);
    REQUIRE(s == EXPHIL_OK);
    if (stream)
      REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess);
    else
      REQUIRE(exphil_synchronize(0) == EXPHIL_OK);
  };
  if (lstm) {
    const exphil_status s = exphil_lstm_forward(ptr(wx), ptr(R), ptr(bias), ptr(h0), ptr(c0), ptr(y), ptr(hf),
                                                ptr(cf), stream);
    INFO(exphil_last_error());
    sync(s, "exphil_lstm_forward");
    const exphil_status b = exphil_lstm_backward(ptr(wx), ptr(R), ptr(y), ptr(gy), ptr(bias), ptr(h0), ptr(c0),
                                                 ptr(ghf), ptr(gcf), ptr(gwx), ptr(gR), ptr(gb), ptr(gh0),
                                                 ptr(gc0), ptr(grh), stream);
    INFO(exphil_last_error());
    sync(b, "exphil_lstm_backward");
  } else {
    const exphil_status s = exphil_gru_forward(ptr(wx), ptr(R), ptr(bias), ptr(h0), ptr(y), ptr(hf), stream);
    INFO(exphil_last_error());
    sync(s, "exphil_gru_forward");
    const exphil_status b = exphil_gru_backward(ptr(wx), ptr(R), ptr(y), ptr(gy), ptr(bias), ptr(h0), ptr(ghf),
                                                ptr(gwx), ptr(gR), ptr(gb), ptr(gh0), ptr(grh), stream);
    INFO(exphil_last_error());
    sync(b, "exphil_gru_backward");
  }

  const Tolerance tol = abi_gated_rnn_tolerance(c.dtype);
  const Tolerance wtol = abi_gated_rnn_tolerance(c.weight_dtype == DType::f32 ? c.dtype : c.weight_dtype);
  const Tolerance stol = abi_gated_rnn_tolerance(c.state_dtype == DType::f32 ? c.dtype : c.state_dtype);
  const auto f = exphil::reference::gated_rnn_forward(p);
  const auto g = exphil::reference::gated_rnn_backward(p, grad_y, grad_hf, grad_cf);
  double worst = 0;
  int judged = 0;
  const auto judge = [&](const Owned& t, const std::vector<double>& ref, Tolerance tl, double scale,
                         const char* name) {
    if (!t) return;
    const Comparison cmp = compare(t->values(), ref, tl, scale);
    INFO(c.describe() << (stream ? " on a caller stream" : " on the managed stream") << ", seed " << seed
                      << "\n" << cmp.describe(name));
    CHECK(cmp.ok);
    CHECK(t->guards_intact());
    worst = std::max(worst, cmp.worst_ratio);
    ++judged;
  };
  const double hscale = std::max({max_abs(f.y), max_abs(f.h_final), max_abs(p.h0)});
  judge(y, f.y, tol, hscale, "y");
  judge(hf, f.h_final, stol, hscale, "h_final");
  judge(cf, f.c_final, stol, std::max(max_abs(f.c_final), max_abs(p.c0)), "c_final");
  const double gscale = std::max({max_abs(g.wx), max_abs(g.rh), max_abs(g.h0), max_abs(g.c0)});
  judge(gwx, g.wx, tol, gscale, "grad_wx");
  judge(grh, g.rh, tol, gscale, "grad_rh");
  judge(gR, g.R, wtol, std::max(gscale, max_abs(g.R_terms)), "grad_R");
  judge(gb, g.bias, wtol, std::max(gscale, max_abs(g.bias_terms)), "grad_bias");
  judge(gh0, g.h0, stol, gscale, "grad_h0");
  judge(gc0, g.c0, stol, gscale, "grad_c0");
  // y, the gradients always asked for, and the form's others.
  const int expected = 4 + (lstm ? 1 : 0) + (all ? 1 + (lstm ? 1 : 0) : 0) +
                       (c.form != AbiRnnForm::edifice ? 2 : 0);
  CHECK(judged == expected);
  return worst;
}

}  // namespace

TEST_CASE("GRU and LSTM through the C ABI match the reference", "[gpu][abi]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  const uint64_t seed = test_seed();
  uint64_t i = 0;
  double worst = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (AbiRnnForm form : {AbiRnnForm::everything, AbiRnnForm::nothing, AbiRnnForm::edifice}) {
        AbiRnnCase c;
        c.kind = kind;
        c.dtype = dtype;
        c.form = form;
        // Weights and states in f32 or the sequence dtype, by turns.
        c.weight_dtype = form == AbiRnnForm::nothing ? DType::f32 : dtype;
        c.state_dtype = form == AbiRnnForm::everything ? DType::f32 : dtype;
        // B above one batch tile of 32 once; H beyond one block's 256 columns.
        c.B = form == AbiRnnForm::nothing ? 33 : 3;
        c.T = form == AbiRnnForm::edifice ? 40 : 9;
        c.H = form == AbiRnnForm::everything ? 130 : 37;
        for (exphil_stream s : {static_cast<exphil_stream>(nullptr), static_cast<exphil_stream>(stream)})
          worst = std::max(worst, run_abi_gated_rnn(c, s, seed + i++));
      }
    }
  }
  std::printf("GRU and LSTM through the C ABI: %llu calls of each direction, worst error/allowed %.3g "
              "(EXPHIL_TEST_SEED=%llu)\n",
              static_cast<unsigned long long>(i), worst, static_cast<unsigned long long>(seed));
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("memory that is not on the device is rejected by name", "[gpu][abi]") {
  const std::size_t bytes = 2 * 5 * 4 * sizeof(float);
  void* device = nullptr;
  void* device_out = nullptr;
  REQUIRE(cudaMalloc(&device, bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&device_out, bytes) == cudaSuccess);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, bytes) == cudaSuccess);
  void* pageable = std::malloc(bytes);
  REQUIRE(pageable);

  const exphil_tensor gate = tensor(device, EXPHIL_F32, 2, 5, 4);
  const exphil_tensor y = tensor(device_out, EXPHIL_F32, 2, 5, 4);

  SECTION("pageable host memory") {
    const exphil_tensor candidate = tensor(pageable, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected device memory, got not CUDA memory"));
  }
  SECTION("pinned host memory") {
    const exphil_tensor candidate = tensor(pinned, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected device memory, got pinned host memory"));
  }
  SECTION("a tensor running past the end of its allocation") {
    const exphil_tensor candidate = tensor(static_cast<char*>(device) + 16, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected 160 bytes"));
    CHECK_THAT(exphil_last_error(), Contains("its allocation ends 144 bytes after that address"));
  }
  SECTION("managed memory is accepted") {
    void* managed = nullptr;
    REQUIRE(cudaMallocManaged(&managed, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(managed, 0, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(device, 0, bytes) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the library's stream does not wait for the legacy one
    const exphil_tensor candidate = tensor(managed, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) == EXPHIL_OK);
    CHECK(exphil_synchronize(0) == EXPHIL_OK);
    CHECK(cudaFree(managed) == cudaSuccess);
  }

  std::free(pageable);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaFree(device_out) == cudaSuccess);
}

TEST_CASE("device memory from the library is usable and freed only whole", "[gpu][abi]") {
  void* p = nullptr;
  REQUIRE(exphil_device_alloc(0, 1000, &p) == EXPHIL_OK);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);
  CHECK(attr.device == 0);
  REQUIRE(cudaMemset(p, 0x5a, 1000) == cudaSuccess);
  unsigned char back[1000];
  REQUIRE(cudaMemcpy(back, p, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[0] == 0x5a);
  CHECK(back[999] == 0x5a);

  CHECK(exphil_device_free(static_cast<char*>(p) + 16) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("not the start of its allocation"));
  int on_host = 0;
  CHECK(exphil_device_free(&on_host) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument 'ptr'"));

  CHECK(exphil_device_free(p) == EXPHIL_OK);
}

