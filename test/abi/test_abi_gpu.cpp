// The C ABI of libexphil.so on a GPU: every op through exphil.h against the
// reference (attention in both precisions of f32; GRU, LSTM and sLSTM with
// every optional tensor present, absent, and as Edifice calls them, the
// sLSTM also with its clamp active), and the device-side checks: host,
// pinned and out-of-allocation memory rejected by name, managed memory and
// caller streams accepted.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
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

const char* kind_name(GatedRnnKind kind) {
  return kind == GatedRnnKind::gru ? "GRU" : kind == GatedRnnKind::lstm ? "LSTM" : "sLSTM";
}

// Which of a call's optional tensors are passed (NULL otherwise).
enum class AbiRnnForm {
  everything,  // bias, every initial state (the sLSTM's n0 >= 1), every final state's gradient;
               // every output
  nothing,     // no optional input, no final state; every gradient (at zero bias and default states)
  edifice,     // as Edifice calls it, y alone: the GRU and LSTM with h0 (and c0), grad_wx, grad_rh
               // and the initial states' gradients (no grad_R, grad_bias); the sLSTM (slstm_scan)
               // with wx and R alone, grad_wx and grad_R
  clamp,       // sLSTM only: as everything, with n0 < 1 (the clamp active at first)
};

struct AbiRnnCase {
  GatedRnnKind kind = GatedRnnKind::gru;
  DType dtype = DType::f32, weight_dtype = DType::f32, state_dtype = DType::f32;
  int64_t B = 1, T = 1, H = 1;
  AbiRnnForm form = AbiRnnForm::everything;

  std::string describe() const {
    static const char* const forms[] = {"everything", "nothing", "edifice", "clamp"};
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s %s (R %s, states %s) B%lld T%lld H%lld, optional tensors: %s",
                  kind_name(kind), dtype_name(dtype), dtype_name(weight_dtype), dtype_name(state_dtype),
                  static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
                  forms[static_cast<int>(form)]);
    return buf;
  }
};

// One case through exphil_{gru,lstm,slstm}_{forward,backward} on `stream`
// (NULL: the library's managed stream): inputs random and rounded to their
// dtypes, every output poisoned, the forward's y fed to the backward, and
// every output written compared with the double reference (and its guard
// zones intact). Returns the worst error / allowed.
double run_abi_gated_rnn(const AbiRnnCase& c, exphil_stream stream, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const bool lstm = c.kind == GatedRnnKind::lstm, slstm = c.kind == GatedRnnKind::slstm;
  const bool cell = lstm || slstm;  // c0 and c_final
  const bool all = c.form == AbiRnnForm::everything || c.form == AbiRnnForm::clamp;
  const bool edifice = c.form == AbiRnnForm::edifice;
  const bool states = all || (edifice && !slstm);
  const bool grad_R = !edifice || slstm;
  const bool grad_states = !edifice || !slstm;  // grad_rh and the initial states'
  const int64_t GH = (c.kind == GatedRnnKind::gru ? 3 : 4) * c.H;
  const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
  using Shape = std::vector<int64_t>;
  const Shape seq{c.B, c.T, c.H}, gates{c.B, c.T, GH}, weights{c.H, GH}, bias_shape{GH}, state{c.B, c.H};

  GatedRnnProblem p;
  p.kind = c.kind;
  p.batch = c.B;
  p.steps = c.T;
  p.hidden = c.H;
  const double r = 1.5 / std::sqrt(static_cast<double>(c.H));
  const auto state_values = [&](double lo, double hi) {
    return random_values(n(c.B * c.H), lo, hi, c.state_dtype, rng);
  };
  p.wx = random_values(n(c.B * c.T * GH), -1.5, 1.5, c.dtype, rng);
  p.R = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
  if (all) p.bias = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
  if (states) p.h0 = state_values(-1, 1);
  if (states && cell) p.c0 = state_values(-1, 1);
  if (all && slstm) {
    p.n0 = c.form == AbiRnnForm::clamp ? state_values(-1.5, 0.9) : state_values(1, 2);
    p.m0 = state_values(-1, 1);
  }
  const std::vector<double> grad_y = random_values(n(c.B * c.T * c.H), -1, 1, c.dtype, rng);
  std::vector<double> grad_hf, grad_cf, grad_nf, grad_mf;
  if (all) grad_hf = state_values(-1, 1);
  if (all && cell) grad_cf = state_values(-1, 1);
  if (all && slstm) {
    grad_nf = state_values(-1, 1);
    grad_mf = state_values(-1, 1);
  }

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
              c0 = input(p.c0, c.state_dtype, state), n0 = input(p.n0, c.state_dtype, state),
              m0 = input(p.m0, c.state_dtype, state), gy = input(grad_y, c.dtype, seq),
              ghf = input(grad_hf, c.state_dtype, state), gcf = input(grad_cf, c.state_dtype, state),
              gnf = input(grad_nf, c.state_dtype, state), gmf = input(grad_mf, c.state_dtype, state);
  const Owned y = output(true, c.dtype, seq), hf = output(all, c.state_dtype, state),
              cf = output(all && cell, c.state_dtype, state), nf = output(all && slstm, c.state_dtype, state),
              mf = output(all && slstm, c.state_dtype, state), gwx = output(true, c.dtype, gates),
              gR = output(grad_R, c.weight_dtype, weights), gb = output(!edifice, c.weight_dtype, bias_shape),
              gh0 = output(grad_states, c.state_dtype, state),
              gc0 = output(grad_states && cell, c.state_dtype, state),
              gn0 = output(grad_states && slstm, c.state_dtype, state),
              gm0 = output(grad_states && slstm, c.state_dtype, state),
              grh = output(grad_states, c.dtype, gates);
  // The uploads and poison are on the legacy stream, which the library's
  // own stream does not wait for.
  device_synchronize();

  const auto sync = [&](exphil_status s, const char* what) {
    INFO(c.describe() << ": " << what << ": " << exphil_last_error());
    REQUIRE(s == EXPHIL_OK);
    if (stream)
      REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess);
    else
      REQUIRE(exphil_synchronize(0) == EXPHIL_OK);
  };
  if (slstm) {
    sync(exphil_slstm_forward(ptr(wx), ptr(R), ptr(bias), ptr(h0), ptr(c0), ptr(n0), ptr(m0), ptr(y), ptr(hf),
                              ptr(cf), ptr(nf), ptr(mf), stream),
         "exphil_slstm_forward");
    sync(exphil_slstm_backward(ptr(wx), ptr(R), ptr(y), ptr(gy), ptr(bias), ptr(h0), ptr(c0), ptr(n0), ptr(m0),
                               ptr(ghf), ptr(gcf), ptr(gnf), ptr(gmf), ptr(gwx), ptr(gR), ptr(gb), ptr(gh0),
                               ptr(gc0), ptr(gn0), ptr(gm0), ptr(grh), stream),
         "exphil_slstm_backward");
  } else if (lstm) {
    sync(exphil_lstm_forward(ptr(wx), ptr(R), ptr(bias), ptr(h0), ptr(c0), ptr(y), ptr(hf), ptr(cf), nullptr,
                             stream),
         "exphil_lstm_forward");
    sync(exphil_lstm_backward(ptr(wx), ptr(R), ptr(y), ptr(gy), ptr(bias), ptr(h0), ptr(c0), ptr(ghf), ptr(gcf),
                              ptr(gwx), ptr(gR), ptr(gb), ptr(gh0), ptr(gc0), ptr(grh), nullptr, stream),
         "exphil_lstm_backward");
  } else {
    sync(exphil_gru_forward(ptr(wx), ptr(R), ptr(bias), ptr(h0), ptr(y), ptr(hf), nullptr, stream),
         "exphil_gru_forward");
    sync(exphil_gru_backward(ptr(wx), ptr(R), ptr(y), ptr(gy), ptr(bias), ptr(h0), ptr(ghf), ptr(gwx), ptr(gR),
                             ptr(gb), ptr(gh0), ptr(grh), nullptr, stream),
         "exphil_gru_backward");
  }

  const Tolerance tol = gated_rnn_tolerance(c.dtype);
  const Tolerance wtol = gated_rnn_tolerance(c.weight_dtype == DType::f32 ? c.dtype : c.weight_dtype);
  const Tolerance stol = gated_rnn_tolerance(c.state_dtype == DType::f32 ? c.dtype : c.state_dtype);
  const auto f = exphil::reference::gated_rnn_forward(p);
  const auto g = exphil::reference::gated_rnn_backward(p, grad_y, grad_hf, grad_cf, grad_nf, grad_mf);
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
  judge(nf, f.n_final, stol, std::max({max_abs(f.n_final), max_abs(p.n0), 1.0}), "n_final");
  judge(mf, f.m_final, stol, std::max(max_abs(f.m_final), max_abs(p.m0)), "m_final");
  // The reference leaves the gradients of states a cell lacks empty (0 here).
  const double gscale = std::max(
      {max_abs(g.wx), max_abs(g.rh), max_abs(g.h0), max_abs(g.c0), max_abs(g.n0), max_abs(g.m0)});
  judge(gwx, g.wx, tol, gscale, "grad_wx");
  judge(grh, g.rh, tol, gscale, "grad_rh");
  judge(gR, g.R, wtol, std::max(gscale, max_abs(g.R_terms)), "grad_R");
  judge(gb, g.bias, wtol, std::max(gscale, max_abs(g.bias_terms)), "grad_bias");
  judge(gh0, g.h0, stol, gscale, "grad_h0");
  judge(gc0, g.c0, stol, gscale, "grad_c0");
  judge(gn0, g.n0, stol, gscale, "grad_n0");
  judge(gm0, g.m0, stol, gscale, "grad_m0");
  // Counted per cell from exphil.h's parameters, apart from the flags above.
  // GRU and LSTM: y, grad_wx, grad_rh, grad_h0 (and grad_c0) always; the
  // final states with every optional tensor; grad_R and grad_bias unless
  // Edifice's form. sLSTM: y, grad_wx and grad_R always; the four final
  // states with every optional tensor; the other six gradients unless
  // Edifice's form.
  const int expected = slstm ? 3 + (all ? 4 : 0) + (edifice ? 0 : 6)
                             : 4 + (lstm ? 1 : 0) + (all ? 1 + (lstm ? 1 : 0) : 0) + (edifice ? 0 : 2);
  CHECK(judged == expected);
  return worst;
}

// Every dtype and form of `kinds` on the library's managed stream and on a
// caller's; prints the worst error / allowed under `label`.
void check_abi_gated_rnns(std::initializer_list<GatedRnnKind> kinds, const char* label) {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  const uint64_t seed = test_seed();
  uint64_t i = 0;
  double worst = 0;
  for (GatedRnnKind kind : kinds) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (AbiRnnForm form :
           {AbiRnnForm::everything, AbiRnnForm::nothing, AbiRnnForm::edifice, AbiRnnForm::clamp}) {
        // The sLSTM's gradients of c_final, n_final and m_final, and its
        // n0 < 1, make the gradient jump at max()'s ties, where a recompute
        // from f16/bf16 y may take the other side (test/gpu/test_gated_rnn.cpp's
        // header): with them, f16 and bf16 run T = 1, where the backward
        // reads no y, and the clamp (n0 < 1 at every T) runs in f32 alone.
        const bool slstm = kind == GatedRnnKind::slstm;
        if (form == AbiRnnForm::clamp && (!slstm || dtype != DType::f32)) continue;
        AbiRnnCase c;
        c.kind = kind;
        c.dtype = dtype;
        c.form = form;
        // Weights and states in f32 or the sequence dtype, by turns.
        c.weight_dtype = form == AbiRnnForm::nothing ? DType::f32 : dtype;
        c.state_dtype = form == AbiRnnForm::everything ? DType::f32 : dtype;
        // B above one batch tile of 32 once; H beyond one block's 256 columns.
        c.B = form == AbiRnnForm::nothing ? 33 : 3;
        c.T = form == AbiRnnForm::edifice                                      ? 40
              : slstm && form == AbiRnnForm::everything && dtype != DType::f32 ? 1
                                                                               : 9;
        c.H = form == AbiRnnForm::everything ? 130 : 37;
        for (exphil_stream s : {static_cast<exphil_stream>(nullptr), static_cast<exphil_stream>(stream)})
          worst = std::max(worst, run_abi_gated_rnn(c, s, seed + i++));
      }
    }
  }
  std::printf("%s through the C ABI: %llu calls of each direction, worst error/allowed %.3g "
              "(EXPHIL_TEST_SEED=%llu)\n",
              label, static_cast<unsigned long long>(i), worst, static_cast<unsigned long long>(seed));
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

}  // namespace

TEST_CASE("GRU and LSTM through the C ABI match the reference", "[gpu][abi]") {
  check_abi_gated_rnns({GatedRnnKind::gru, GatedRnnKind::lstm}, "GRU and LSTM");
}

TEST_CASE("sLSTM through the C ABI matches the reference", "[gpu][abi]") {
  check_abi_gated_rnns({GatedRnnKind::slstm}, "sLSTM");
}

// exphil_gru_stack_forward and exphil_lstm_stack_forward against the double
// reference of their layers (gated_rnn_stack_forward), then
// exphil_{gru,lstm}_stack_backward on the forward's y and y_lower against
// gated_rnn_stack_backward: at B1 and B3 (the two wavefronts, each one
// launch forward), every dtype, with every optional tensor and with none (the
// backward then asked for grad_wx and grad_W only), on the managed stream
// and on a caller's.
TEST_CASE("GRU and LSTM stacks through the C ABI match the reference", "[gpu][abi]") {
  cudaStream_t caller = nullptr;
  REQUIRE(cudaStreamCreate(&caller) == cudaSuccess);
  const uint64_t seed = test_seed();
  uint64_t i = 0, calls = 0;
  double worst = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::f16, DType::bf16})
      for (int64_t B : {1, 3})
        for (bool all : {true, false})
          for (exphil_stream stream : {static_cast<exphil_stream>(nullptr), static_cast<exphil_stream>(caller)}) {
            std::mt19937_64 rng(seed + i++);
            const bool lstm = kind == GatedRnnKind::lstm;
            const int64_t L = 3, K = L - 1, T = 9, H = 37, GH = (lstm ? 4 : 3) * H;
            const DType wdt = all ? DType::f32 : dtype, sdt = all ? dtype : DType::f32;
            const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
            const double r = 1.5 / std::sqrt(static_cast<double>(H));
            exphil::reference::GatedRnnStackProblem p;
            p.kind = kind;
            p.batch = B, p.steps = T, p.hidden = H;
            p.wx = random_values(n(B * T * GH), -1.5, 1.5, dtype, rng);
            p.R.resize(n(L)), p.bias.resize(n(L)), p.h0.resize(n(L)), p.c0.resize(n(L));
            p.W.resize(n(K)), p.W_bias.resize(n(K));
            std::vector<double> R, W, bias, W_bias, h0, c0;  // stacked
            const auto add = [](std::vector<double>& to, const std::vector<double>& v) {
              to.insert(to.end(), v.begin(), v.end());
            };
            for (int64_t l = 0; l < L; ++l) {
              add(R, p.R[n(l)] = random_values(n(H * GH), -r, r, wdt, rng));
              if (all) add(bias, p.bias[n(l)] = random_values(n(GH), -0.5, 0.5, wdt, rng));
              if (all) add(h0, p.h0[n(l)] = random_values(n(B * H), -1, 1, sdt, rng));
              if (all && lstm) add(c0, p.c0[n(l)] = random_values(n(B * H), -1, 1, sdt, rng));
              if (l == 0) continue;
              add(W, p.W[n(l - 1)] = random_values(n(H * GH), -r, r, wdt, rng));
              if (all) add(W_bias, p.W_bias[n(l - 1)] = random_values(n(GH), -0.5, 0.5, wdt, rng));
            }
            using Owned = std::unique_ptr<DeviceTensor>;
            using Shape = std::vector<int64_t>;
            const auto input = [](const std::vector<double>& v, DType d, const Shape& s) {
              return v.empty() ? Owned() : std::make_unique<DeviceTensor>(v, d, s);
            };
            const auto output = [](bool wanted, DType d, const Shape& s) {
              return wanted ? std::make_unique<DeviceTensor>(d, s) : Owned();
            };
            const auto ptr = [](const Owned& t) { return t ? t->ptr() : nullptr; };
            const Owned d_wx = input(p.wx, dtype, {B, T, GH}), d_R = input(R, wdt, {L, H, GH}),
                        d_W = input(W, wdt, {K, H, GH}), d_bias = input(bias, wdt, {L, GH}),
                        d_W_bias = input(W_bias, wdt, {K, GH}), d_h0 = input(h0, sdt, {L, B, H}),
                        d_c0 = input(c0, sdt, {L, B, H}), y = output(true, dtype, {B, T, H}),
                        y_lower = output(true, dtype, {K, B, T, H}), hf = output(all, sdt, {L, B, H}),
                        cf = output(all && lstm, sdt, {L, B, H});
            device_synchronize();
            const char* name = lstm ? "exphil_lstm_stack_forward" : "exphil_gru_stack_forward";
            // (y_lower: asked for with every optional tensor; the backward's
            // input, so then from a second call.)
            const auto forward = [&](const exphil_tensor* lower) {
              return lstm ? exphil_lstm_stack_forward(ptr(d_wx), ptr(d_R), ptr(d_W), ptr(d_bias), ptr(d_W_bias),
                                                      ptr(d_h0), ptr(d_c0), ptr(y), lower, ptr(hf), ptr(cf),
                                                      nullptr, stream)
                          : exphil_gru_stack_forward(ptr(d_wx), ptr(d_R), ptr(d_W), ptr(d_bias), ptr(d_W_bias),
                                                     ptr(d_h0), ptr(y), lower, ptr(hf), nullptr, stream);
            };
            const auto synchronize = [&] {
              if (stream)
                REQUIRE(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)) == cudaSuccess);
              else
                REQUIRE(exphil_synchronize(0) == EXPHIL_OK);
            };
            const exphil_status st = forward(all ? ptr(y_lower) : nullptr);
            INFO(name << " " << dtype_name(dtype) << " B" << B << (all ? " every optional tensor" : " none")
                      << (stream ? " on a caller stream" : " on the managed stream") << ": "
                      << exphil_last_error());
            REQUIRE(st == EXPHIL_OK);
            synchronize();

            const auto ref = exphil::reference::gated_rnn_stack_forward(p);
            const Tolerance tol = gated_rnn_tolerance(dtype);
            const Tolerance stol = gated_rnn_tolerance(sdt == DType::f32 ? dtype : sdt);
            const auto part = [](const Owned& t, int64_t l, int64_t size) {
              const std::vector<double> v = t->values();
              return std::vector<double>(v.begin() + l * size, v.begin() + (l + 1) * size);
            };
            for (int64_t l = 0; l < L; ++l) {
              const auto& f = ref[n(l)];
              const double hscale = std::max({max_abs(f.y), max_abs(f.h_final), max_abs(p.h0[n(l)])});
              const auto judge = [&](const std::vector<double>& got, const std::vector<double>& want,
                                     Tolerance tl, double scale, const char* what) {
                const Comparison cmp = compare(got, want, tl, scale);
                INFO("layer " << l << "\n" << cmp.describe(what));
                CHECK(cmp.ok);
                worst = std::max(worst, cmp.worst_ratio);
              };
              if (l + 1 == L) judge(y->values(), f.y, tol, hscale, "y");
              if (all && l + 1 < L) judge(part(y_lower, l, B * T * H), f.y, tol, hscale, "y_lower");
              if (hf) judge(part(hf, l, B * H), f.h_final, stol, hscale, "h_final");
              if (cf)
                judge(part(cf, l, B * H), f.c_final, stol, std::max(max_abs(f.c_final), max_abs(p.c0[n(l)])),
                      "c_final");
            }
            for (const Owned* t : {&y, &y_lower, &hf, &cf})
              if (*t) CHECK((*t)->guards_intact());

            // The backward.
            if (!all) {
              REQUIRE(forward(ptr(y_lower)) == EXPHIL_OK);
              synchronize();
            }
            std::vector<double> grad_y = random_values(n(B * T * H), -1, 1, dtype, rng), gyl, ghf, gcf;
            std::vector<std::vector<double>> grad_lower(n(K)), grad_hf(n(L)), grad_cf(n(L));
            if (all)
              for (int64_t l = 0; l < L; ++l) {
                if (l < K) add(gyl, grad_lower[n(l)] = random_values(n(B * T * H), -1, 1, dtype, rng));
                add(ghf, grad_hf[n(l)] = random_values(n(B * H), -1, 1, sdt, rng));
                if (lstm) add(gcf, grad_cf[n(l)] = random_values(n(B * H), -1, 1, sdt, rng));
              }
            const Owned d_gy = input(grad_y, dtype, {B, T, H}), d_gyl = input(gyl, dtype, {K, B, T, H}),
                        d_ghf = input(ghf, sdt, {L, B, H}), d_gcf = input(gcf, sdt, {L, B, H}),
                        g_wx = output(true, dtype, {B, T, GH}), g_R = output(all, wdt, {L, H, GH}),
                        g_W = output(true, wdt, {K, H, GH}), g_bias = output(all, wdt, {L, GH}),
                        g_W_bias = output(all, wdt, {K, GH}), g_h0 = output(all, sdt, {L, B, H}),
                        g_c0 = output(all && lstm, sdt, {L, B, H});
            device_synchronize();
            const exphil_status bst =
                lstm ? exphil_lstm_stack_backward(ptr(d_wx), ptr(d_R), ptr(d_W), ptr(y), ptr(y_lower), ptr(d_gy),
                                                  ptr(d_bias), ptr(d_W_bias), ptr(d_h0), ptr(d_c0), ptr(d_gyl),
                                                  ptr(d_ghf), ptr(d_gcf), ptr(g_wx), ptr(g_R), ptr(g_W),
                                                  ptr(g_bias), ptr(g_W_bias), ptr(g_h0), ptr(g_c0), nullptr,
                                                  stream)
                     : exphil_gru_stack_backward(ptr(d_wx), ptr(d_R), ptr(d_W), ptr(y), ptr(y_lower), ptr(d_gy),
                                                 ptr(d_bias), ptr(d_W_bias), ptr(d_h0), ptr(d_gyl), ptr(d_ghf),
                                                 ptr(g_wx), ptr(g_R), ptr(g_W), ptr(g_bias), ptr(g_W_bias),
                                                 ptr(g_h0), nullptr, stream);
            INFO("the backward: " << exphil_last_error());
            REQUIRE(bst == EXPHIL_OK);
            synchronize();
            ++calls;
            const auto g = exphil::reference::gated_rnn_stack_backward(p, grad_y, grad_lower, grad_hf, grad_cf);
            const Tolerance wtol = gated_rnn_tolerance(wdt == DType::f32 ? dtype : wdt);
            double gscale = max_abs(g.wx);
            for (int64_t l = 0; l < L; ++l) gscale = std::max({gscale, max_abs(g.h0[n(l)]), max_abs(g.c0[n(l)])});
            const auto judge = [&](const Owned& t, int64_t l, int64_t size, const std::vector<double>& want,
                                   Tolerance tl, double scale, const char* what) {
              if (!t) return;
              const Comparison cmp = compare(part(t, l, size), want, tl, scale);
              INFO("layer " << l << "\n" << cmp.describe(what));
              CHECK(cmp.ok);
              CHECK(t->guards_intact());
              worst = std::max(worst, cmp.worst_ratio);
            };
            judge(g_wx, 0, B * T * GH, g.wx, tol, gscale, "grad_wx");
            for (int64_t l = 0; l < L; ++l) {
              const std::size_t i_l = n(l);
              judge(g_R, l, H * GH, g.R[i_l], wtol, std::max(gscale, max_abs(g.R_terms[i_l])), "grad_R");
              judge(g_bias, l, GH, g.bias[i_l], wtol, std::max(gscale, max_abs(g.bias_terms[i_l])), "grad_bias");
              judge(g_h0, l, B * H, g.h0[i_l], stol, gscale, "grad_h0");
              judge(g_c0, l, B * H, g.c0[i_l], stol, gscale, "grad_c0");
              if (l == 0) continue;
              judge(g_W, l - 1, H * GH, g.W[i_l - 1], wtol, std::max(gscale, max_abs(g.W_terms[i_l - 1])), "grad_W");
              judge(g_W_bias, l - 1, GH, g.W_bias[i_l - 1], wtol,
                    std::max(gscale, max_abs(g.W_bias_terms[i_l - 1])), "grad_W_bias");
            }
          }
  std::printf("GRU and LSTM stacks through the C ABI: %llu forward and %llu backward calls, worst "
              "error/allowed %.3g (EXPHIL_TEST_SEED=%llu)\n",
              static_cast<unsigned long long>(i), static_cast<unsigned long long>(calls), worst,
              static_cast<unsigned long long>(seed));
  CHECK(cudaStreamDestroy(caller) == cudaSuccess);
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

