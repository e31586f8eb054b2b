// Fused GRU, LSTM and sLSTM sequences (cuda/gated_rnn/) against the double
// reference, forward and backward, through the kernel launchers directly
// and through the public C++ API.
//
// Every case: inputs random in each dtype (rounded before the reference
// sees them), every output and the workspace poisoned (NaN) before each
// call and inside guard zones, the forward's y fed to the backward (as a
// caller would), and every output compared elementwise with
//     |got - ref| <= atol * scale + rtol * |ref|
// where scale is, for y, h_final and the other final states, the largest
// reference magnitude of that state (|y|, |h_final|, |h0|; |c_final|, |c0|
// for c; likewise n and m), and for the gradients the largest reference
// gradient magnitude of the call (grad_wx, grad_rh and the initial states'),
// and for grad_R and grad_bias, sums over batch and time, also the largest
// sum of their terms' magnitudes.
//
// Tolerances (gated_rnn_tolerance, test/support/tolerance.hpp), one line per
// dtype:
//   f32   the state and every sum are f32; products of length up to 4096
//         and T = 300 chained steps: 5e-5 covers f32 rounding with margin.
//   f16   wx, grad_y and the outputs rounded to f16 (2^-11 relative); the
//         backward recomputes the gates from y rounded to f16: 5e-3.
//   bf16  the same with bf16's 2^-8: 4e-2 absolute at the scale, 3e-2 rtol
//         (the project's bf16 tolerance, tolerance.hpp, plus a third for
//         the recompute from rounded y).
// The sLSTM takes the same lines. Its backward recomputes c, n and m from
// rounded y too. With n0 >= 1 (the default, and what chained calls pass)
// and no gradient of c_final, n_final or m_final its gradient is continuous
// (cuda/gated_rnn/slstm_cell.cuh), so the recompute costs only rounding.
// Otherwise the gradient jumps at max()'s ties, and a recompute from
// f16/bf16 y can land on the other side of one near the reference's point,
// an O(1) difference: such calls (n0 < 1; those final-state gradients at
// T > 1) run in f32 only, where the recompute and the reference differ by
// f32 rounding and a flipped tie is rare (a host emulation of the kernels'
// arithmetic ran this file's sLSTM f32 grid and clamp cases 260 times,
// 5,200 calls: worst error/allowed 0.26; its f16/bf16 grid 81 times: 0.21).
// At T = 1 the recompute reads no y, and every dtype takes them. Exact
// ties (built at t = 0, where pre = wx exactly) run in every dtype: the
// kernels split the gradient there as the reference does (Nx's rule, half
// to each side).
//
// Sizes: T in {1, 2, 3, 6, 7, 20, 32, 300}, H in {1, 3, 37, 64, 70, 100,
// 256, 257, 1024}, B in {1, 2, 3, 5, 9, 33, 40} (batch tiles of 32 and a
// remainder); every cell; with and without bias, h0, c0 (and the sLSTM's
// n0, m0) and the final-state gradients; the sLSTM with its clamp active
// and at exact ties; forced units per block (1, 3, 37, and the most
// columns: 85 for the GRU, 64 for the (s)LSTM), forced batch tile 1, forced streamed weights (the tiled path);
// the forward's tensor-core product in bf16 and f16 (H 16 to 1024, against
// the CUDA-core product too); f32 on tensor cores (f32_tensor_cores, its
// own tolerance line); the backward's asynchronous tensor-core
// product against the register-staged one, bitwise (bf16, and f32 on tensor
// cores); bitwise
// determinism of two runs; capture into a CUDA graph and replay. The
// hidden [.timing] case prints device times (bench/RESULTS.md, issue 30).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "compare.hpp"
#include "device_buffer.hpp"
#include "dtype_codec.hpp"
#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn_api_call.hpp"
#include "gated_rnn_device.hpp"
#include "gated_rnn_reference.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;
using exphil::kernels::GatedRnnBackwardParams;
using exphil::kernels::GatedRnnCell;
using exphil::kernels::GatedRnnDevice;
using exphil::kernels::GatedRnnDTypes;
using exphil::kernels::GatedRnnDirection;
using exphil::kernels::GatedRnnForwardParams;
using exphil::kernels::GatedRnnLaunchOptions;
using exphil::kernels::GatedRnnPlan;
using exphil::kernels::GatedRnnShape;
using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnProblem;

namespace {

struct GatedCase {
  GatedRnnKind kind = GatedRnnKind::gru;
  DType dtype = DType::f32;
  DType weight_dtype = DType::f32;
  DType state_dtype = DType::f32;
  int64_t B = 1, T = 1, H = 1;
  bool bias = false, h0 = false, c0 = false, finals = false;
  // sLSTM only: n0 and m0 given; n0 below 1 (the clamp active at first);
  // exact ties of max() built at t = 0 (with h0, bias and m0 absent);
  // with finals, also the gradients of c_final, n_final and m_final (else
  // grad_h_final alone).
  bool n0 = false, m0 = false, clamp = false, ties = false, cell_finals = true;
  GatedRnnLaunchOptions options{};

  // The optional inputs from bits 0 to 5: bias, h0, c0, finals, n0, m0.
  void set_optional(unsigned bits) {
    bias = bits & 1;
    h0 = bits & 2;
    c0 = bits & 4;
    finals = bits & 8;
    n0 = bits & 16;
    m0 = bits & 32;
  }

  // The planner's dtypes, as the API passes them.
  GatedRnnDTypes dtypes() const { return {dtype, weight_dtype}; }

  std::string describe() const {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%s %s (R %s, states %s) B%lld T%lld H%lld bias=%d h0=%d c0=%d finals=%d%s%s "
                  "units=%d groups=%d tile=%d streamed=%d unit_warps=%d k_split=%d "
                  "tensor_cores=%d pairs=%d f32_tensor_cores=%d",
                  kind == GatedRnnKind::gru ? "GRU" : kind == GatedRnnKind::lstm ? "LSTM" : "sLSTM",
                  dtype_name(dtype), dtype_name(weight_dtype), dtype_name(state_dtype),
                  static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H), bias, h0,
                  c0, finals,
                  kind != GatedRnnKind::slstm ? ""
                  : ties                     ? " ties"
                  : clamp                    ? (m0 ? " n0<1 m0" : " n0<1")
                  : n0 && m0                 ? " n0 m0"
                  : n0                       ? " n0"
                  : m0                       ? " m0"
                                             : "",
                  kind == GatedRnnKind::slstm && finals && !cell_finals ? " (h only)" : "",
                  options.units_per_block, options.batch_blocks, options.batch_tile,
                  options.streamed_weights, options.unit_warps, options.k_split,
                  options.tensor_cores, options.pair_exchange, options.f32_tensor_cores);
    return buf;
  }
};

GatedRnnCell cell_of(GatedRnnKind k) {
  return k == GatedRnnKind::gru ? GatedRnnCell::gru
         : k == GatedRnnKind::lstm ? GatedRnnCell::lstm
                                   : GatedRnnCell::slstm;
}

const char* op_of(GatedRnnKind k) {
  return k == GatedRnnKind::gru ? "gru" : k == GatedRnnKind::lstm ? "lstm" : "slstm";
}

// One case on the GPU: the problem, its device tensors, the plans, and what
// the runs produced.
class GatedRun {
 public:
  GatedRun(const GatedCase& c, uint64_t seed) : c_(c), rng_(seed) {
    const int64_t G = c.kind == GatedRnnKind::gru ? 3 : 4, GH = G * c.H;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    p_.kind = c.kind;
    p_.batch = c.B;
    p_.steps = c.T;
    p_.hidden = c.H;
    const double r = 1.5 / std::sqrt(static_cast<double>(c.H));
    p_.wx = random_values(n(c.B * c.T * GH), -1.5, 1.5, c.dtype, rng_);
    p_.R = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng_);
    if (c.bias) p_.bias = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng_);
    if (c.h0) p_.h0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
    const bool slstm = c.kind == GatedRnnKind::slstm;
    if (c.c0 && c.kind != GatedRnnKind::gru)
      p_.c0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
    // n0 >= 1 unless the case asks for the clamp: the normaliser as the
    // default and earlier calls leave it.
    if (slstm && (c.n0 || c.clamp))
      p_.n0 = c.clamp ? random_values(n(c.B * c.H), -1.5, 0.9, c.state_dtype, rng_)
                      : random_values(n(c.B * c.H), 1, 2, c.state_dtype, rng_);
    if (slstm && c.m0) p_.m0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
    if (slstm && c.ties) {
      if (c.h0 || c.bias || c.m0) throw std::runtime_error("ties are built with h0, bias and m0 absent");
      build_ties();
    }
    grad_y_ = random_values(n(c.B * c.T * c.H), -1, 1, c.dtype, rng_);
    if (c.finals) {
      grad_hf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
      if (c.kind == GatedRnnKind::lstm || (slstm && c.cell_finals))
        grad_cf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
      if (slstm && c.cell_finals) {
        grad_nf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
        grad_mf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
      }
    }

    wx_ = std::make_unique<DeviceTensor>(p_.wx, c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    R_ = std::make_unique<DeviceTensor>(p_.R, c.weight_dtype, std::vector<int64_t>{c.H, GH});
    if (c.bias) bias_ = std::make_unique<DeviceTensor>(p_.bias, c.weight_dtype, std::vector<int64_t>{GH});
    if (c.h0) h0_ = std::make_unique<DeviceTensor>(p_.h0, c.state_dtype, std::vector<int64_t>{c.B, c.H});
    const std::vector<int64_t> state{c.B, c.H};
    const auto state_input = [&](const std::vector<double>& v) {
      return v.empty() ? nullptr : std::make_unique<DeviceTensor>(v, c.state_dtype, state);
    };
    const auto state_output = [&](bool wanted) {
      return wanted ? std::make_unique<DeviceTensor>(c.state_dtype, state) : nullptr;
    };
    c0_ = state_input(p_.c0);
    n0_ = state_input(p_.n0);
    m0_ = state_input(p_.m0);
    gy_ = std::make_unique<DeviceTensor>(grad_y_, c.dtype, std::vector<int64_t>{c.B, c.T, c.H});
    ghf_ = state_input(grad_hf_);
    gcf_ = state_input(grad_cf_);
    gnf_ = state_input(grad_nf_);
    gmf_ = state_input(grad_mf_);

    y_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, c.H});
    hf_ = state_output(true);
    cf_ = state_output(c.kind != GatedRnnKind::gru);
    nf_ = state_output(slstm);
    mf_ = state_output(slstm);
    gwx_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    grh_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    gR_ = std::make_unique<DeviceTensor>(c.weight_dtype, std::vector<int64_t>{c.H, GH});
    gb_ = std::make_unique<DeviceTensor>(c.weight_dtype, std::vector<int64_t>{GH});
    gh0_ = state_output(true);
    gc0_ = state_output(c.kind != GatedRnnKind::gru);
    gn0_ = state_output(slstm);
    gm0_ = state_output(slstm);

    const GatedRnnShape shape{c.B, c.T, c.H};
    const GatedRnnDevice dev = gated_rnn_device();
    fwd_plan_ = exphil::kernels::plan_gated_rnn(GatedRnnDirection::forward, cell_of(c.kind),
                                                shape, dev, c.options, c.dtypes());
    bwd_plan_ = exphil::kernels::plan_gated_rnn(GatedRnnDirection::backward, cell_of(c.kind),
                                                shape, dev, c.options, c.dtypes());
    const char* why = exphil::kernels::gated_rnn_unsupported(fwd_plan_, cell_of(c.kind), shape, dev);
    if (!why) why = exphil::kernels::gated_rnn_unsupported(bwd_plan_, cell_of(c.kind), shape, dev);
    if (why) throw std::runtime_error(std::string("unsupported: ") + why);
    ws_ = std::make_unique<DeviceScratch>(
        std::max(exphil::kernels::gated_rnn_workspace_bytes(fwd_plan_),
                 exphil::kernels::gated_rnn_workspace_bytes(bwd_plan_)));
  }

  const GatedCase& spec() const { return c_; }
  const GatedRnnPlan& forward_plan() const { return fwd_plan_; }
  const GatedRnnPlan& backward_plan() const { return bwd_plan_; }

  GatedRnnForwardParams forward_params() const {
    GatedRnnForwardParams f;
    f.shape = {c_.B, c_.T, c_.H};
    f.cell = cell_of(c_.kind);
    f.dtype = c_.dtype;
    f.weight_dtype = c_.weight_dtype;
    f.state_dtype = c_.state_dtype;
    f.d_wx = wx_->desc().data;
    f.d_R = R_->desc().data;
    f.d_bias = bias_ ? bias_->desc().data : nullptr;
    f.d_h0 = h0_ ? h0_->desc().data : nullptr;
    f.d_c0 = data(c0_);
    f.d_n0 = data(n0_);
    f.d_m0 = data(m0_);
    f.d_y = y_->desc().data;
    f.d_h_final = hf_->desc().data;
    f.d_c_final = data(cf_);
    f.d_n_final = data(nf_);
    f.d_m_final = data(mf_);
    return f;
  }

  GatedRnnBackwardParams backward_params() const {
    GatedRnnBackwardParams b;
    b.fwd = forward_params();
    b.fwd.d_h_final = b.fwd.d_c_final = b.fwd.d_n_final = b.fwd.d_m_final = nullptr;
    b.d_grad_y = gy_->desc().data;
    b.d_grad_h_final = data(ghf_);
    b.d_grad_c_final = data(gcf_);
    b.d_grad_n_final = data(gnf_);
    b.d_grad_m_final = data(gmf_);
    b.d_grad_wx = gwx_->desc().data;
    b.d_grad_R = gR_->desc().data;
    b.d_grad_bias = gb_->desc().data;
    b.d_grad_h0 = gh0_->desc().data;
    b.d_grad_c0 = data(gc0_);
    b.d_grad_n0 = data(gn0_);
    b.d_grad_m0 = data(gm0_);
    b.d_grad_rh = grh_->desc().data;
    return b;
  }

  float* workspace() const { return static_cast<float*>(ws_->p); }

  void poison_forward() const {
    for (DeviceTensor* t : forward_outputs()) t->poison();
    ws_->poison();
  }
  void poison_backward() const {
    for (DeviceTensor* t : backward_outputs()) t->poison();
    ws_->poison();
  }

  void forward(cudaStream_t stream) const {
    poison_forward();
    const auto r = exphil::kernels::launch_gated_rnn_forward(forward_params(), fwd_plan_,
                                                            workspace(), stream);
    if (!r.ok()) throw std::runtime_error(std::string(r.call) + ": " + cudaGetErrorName(r.error));
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (forward)");
  }
  void backward(cudaStream_t stream) const {
    poison_backward();
    const auto r = exphil::kernels::launch_gated_rnn_backward(backward_params(), bwd_plan_,
                                                             workspace(), stream);
    if (!r.ok()) throw std::runtime_error(std::string(r.call) + ": " + cudaGetErrorName(r.error));
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (backward)");
  }

  // The same two calls through the public C++ API on `stream`, the tensors
  // bound by their description's names; the library plans and takes its
  // own workspace.
  void api_forward(cudaStream_t stream, GatedRnnApiLayout* layout = nullptr) const {
    poison_forward();
    std::map<std::string, const Tensor*> t = inputs();
    t["y"] = &y_->desc();
    t["h_final"] = &hf_->desc();
    if (cf_) t["c_final"] = &cf_->desc();
    if (nf_) t["n_final"] = &nf_->desc();
    if (mf_) t["m_final"] = &mf_->desc();
    api_call("forward", t, stream, layout);
  }
  void api_backward(cudaStream_t stream, GatedRnnApiLayout* layout = nullptr) const {
    poison_backward();
    std::map<std::string, const Tensor*> t = inputs();
    t["y"] = &y_->desc();
    t["grad_y"] = &gy_->desc();
    if (ghf_) t["grad_h_final"] = &ghf_->desc();
    if (gcf_) t["grad_c_final"] = &gcf_->desc();
    if (gnf_) t["grad_n_final"] = &gnf_->desc();
    if (gmf_) t["grad_m_final"] = &gmf_->desc();
    t["grad_wx"] = &gwx_->desc();
    t["grad_R"] = &gR_->desc();
    t["grad_bias"] = &gb_->desc();
    t["grad_h0"] = &gh0_->desc();
    if (gc0_) t["grad_c0"] = &gc0_->desc();
    if (gn0_) t["grad_n0"] = &gn0_->desc();
    if (gm0_) t["grad_m0"] = &gm0_->desc();
    t["grad_rh"] = &grh_->desc();
    api_call("backward", t, stream, layout);
  }

  std::vector<double> y() const { return y_->values(); }

  // The outputs' bytes, for bitwise comparisons.
  std::vector<std::vector<unsigned char>> forward_bytes() const {
    std::vector<std::vector<unsigned char>> v;
    for (DeviceTensor* t : forward_outputs()) v.push_back(t->raw());
    return v;
  }
  std::vector<std::vector<unsigned char>> backward_bytes() const {
    std::vector<std::vector<unsigned char>> v;
    for (DeviceTensor* t : backward_outputs()) v.push_back(t->raw());
    return v;
  }

  // Compares every output with the reference; returns the worst
  // error / allowed over all of them (<= 1 passes).
  double check_against_reference() const {
    // f32 on tensor cores (only where asked: the plans take it with f32
    // weights in a GRU or LSTM) takes its own line for every output.
    const bool f32_tc = c_.options.f32_tensor_cores == 1 && c_.dtype == DType::f32;
    const auto line = [&](DType d) {
      return f32_tc ? gated_rnn_f32_tensor_cores_tolerance() : gated_rnn_tolerance(d);
    };
    const Tolerance tol = line(c_.dtype);
    const Tolerance wtol = line(c_.weight_dtype == DType::f32 ? c_.dtype : c_.weight_dtype);
    const Tolerance stol = line(c_.state_dtype == DType::f32 ? c_.dtype : c_.state_dtype);
    const auto f = exphil::reference::gated_rnn_forward(p_);
    const auto g =
        exphil::reference::gated_rnn_backward(p_, grad_y_, grad_hf_, grad_cf_, grad_nf_, grad_mf_);
    double worst = 0;
    const auto judge = [&](const DeviceTensor& t, const std::vector<double>& ref, Tolerance tl,
                           double scale, const char* name) {
      const Comparison cmp = compare(t.values(), ref, tl, scale);
      INFO(c_.describe() << "\n" << cmp.describe(name));
      CHECK(cmp.ok);
      CHECK(t.guards_intact());
      worst = std::max(worst, cmp.worst_ratio);
    };
    const double hscale = std::max({max_abs(f.y), max_abs(f.h_final), max_abs(p_.h0)});
    judge(*y_, f.y, tol, hscale, "y");
    judge(*hf_, f.h_final, stol, hscale, "h_final");
    if (cf_) judge(*cf_, f.c_final, stol, std::max(max_abs(f.c_final), max_abs(p_.c0)), "c_final");
    // The normaliser starts at 1 when n0 is absent.
    if (nf_) judge(*nf_, f.n_final, stol, std::max({max_abs(f.n_final), max_abs(p_.n0), 1.0}), "n_final");
    if (mf_) judge(*mf_, f.m_final, stol, std::max(max_abs(f.m_final), max_abs(p_.m0)), "m_final");

    const double gscale = std::max({max_abs(g.wx), max_abs(g.rh), max_abs(g.h0), max_abs(g.c0),
                                    max_abs(g.n0), max_abs(g.m0)});
    judge(*gwx_, g.wx, tol, gscale, "grad_wx");
    judge(*grh_, g.rh, tol, gscale, "grad_rh");
    judge(*gR_, g.R, wtol, std::max(gscale, max_abs(g.R_terms)), "grad_R");
    judge(*gb_, g.bias, wtol, std::max(gscale, max_abs(g.bias_terms)), "grad_bias");
    judge(*gh0_, g.h0, stol, gscale, "grad_h0");
    if (gc0_) judge(*gc0_, g.c0, stol, gscale, "grad_c0");
    if (gn0_) judge(*gn0_, g.n0, stol, gscale, "grad_n0");
    if (gm0_) judge(*gm0_, g.m0, stol, gscale, "grad_m0");
    return worst;
  }

 private:
  static void* data(const std::unique_ptr<DeviceTensor>& t) { return t ? t->desc().data : nullptr; }

  std::vector<DeviceTensor*> forward_outputs() const {
    std::vector<DeviceTensor*> v;
    for (DeviceTensor* t : {y_.get(), hf_.get(), cf_.get(), nf_.get(), mf_.get()})
      if (t) v.push_back(t);
    return v;
  }
  std::vector<DeviceTensor*> backward_outputs() const {
    std::vector<DeviceTensor*> v;
    for (DeviceTensor* t : {gwx_.get(), grh_.get(), gR_.get(), gb_.get(), gh0_.get(), gc0_.get(), gn0_.get(),
                            gm0_.get()})
      if (t) v.push_back(t);
    return v;
  }

  // The sLSTM's ties at t = 0, where pre = wx exactly (h0, bias and m0
  // absent, so the backward's recompute meets them too): unit u % 3 == 0
  // has log_f + m0 = log_i and n0 = 0, so n_1 = 1 (both ties at once); 1,
  // m's tie with n0 = -1/2, so |n_1| = 1/2 and the clamp is active; 2, n0 = 0
  // with log_i well above log_f, so i' = 1 and n_1 = 1 exactly. Values
  // exact in every dtype.
  void build_ties() {
    const int64_t H = c_.H, G = 4;
    p_.n0.assign(static_cast<std::size_t>(c_.B * H), 0.0);
    for (int64_t b = 0; b < c_.B; ++b)
      for (int64_t u = 0; u < H; ++u) {
        double* w = &p_.wx[static_cast<std::size_t>(b * c_.T * G * H)];
        switch (u % 3) {
          case 0: w[H + u] = w[u]; break;
          case 1:
            w[H + u] = w[u];
            p_.n0[static_cast<std::size_t>(b * H + u)] = -0.5;
            break;
          default:
            w[u] = 1.75;
            w[H + u] = -1.0;
            break;
        }
      }
  }

  std::map<std::string, const Tensor*> inputs() const {
    std::map<std::string, const Tensor*> t{{"wx", &wx_->desc()}, {"R", &R_->desc()}};
    if (bias_) t["bias"] = &bias_->desc();
    if (h0_) t["h0"] = &h0_->desc();
    if (c0_) t["c0"] = &c0_->desc();
    if (n0_) t["n0"] = &n0_->desc();
    if (m0_) t["m0"] = &m0_->desc();
    return t;
  }
  void api_call(const char* direction, const std::map<std::string, const Tensor*>& t, cudaStream_t stream,
                GatedRnnApiLayout* layout) const {
    const Status s = gated_rnn_api_call(op_of(c_.kind), direction, t, stream, layout);
    if (!s.ok()) throw std::runtime_error(s.message());
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (API call)");
  }

  GatedCase c_;
  std::mt19937_64 rng_;
  GatedRnnProblem p_;
  std::vector<double> grad_y_, grad_hf_, grad_cf_, grad_nf_, grad_mf_;
  std::unique_ptr<DeviceTensor> wx_, R_, bias_, h0_, c0_, n0_, m0_, gy_, ghf_, gcf_, gnf_, gmf_;
  std::unique_ptr<DeviceTensor> y_, hf_, cf_, nf_, mf_, gwx_, grh_, gR_, gb_, gh0_, gc0_, gn0_, gm0_;
  GatedRnnPlan fwd_plan_{}, bwd_plan_{};
  std::unique_ptr<DeviceScratch> ws_;
};

// Runs and checks a list of cases; prints the worst margin. Returns how
// many backwards walked on tensor cores (gated_rnn_part_product_tc).
int run_cases(const char* name, const std::vector<GatedCase>& cases) {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  double worst = 0;
  std::string worst_case;
  int resident = 0, streamed = 0, walk_tc = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const GatedCase& c = cases[i];
    GatedRun run(c, seed + i);
    INFO(c.describe() << " | forward: " << run.forward_plan().blocks << " blocks of "
                      << run.forward_plan().units_per_block << " units, tile "
                      << run.forward_plan().batch_tile
                      << (run.forward_plan().tensor_cores       ? ", tensor cores"
                          : run.forward_plan().resident_weights ? ", resident"
                                                                : ", streamed")
                      << "; backward: " << run.backward_plan().blocks << " blocks, "
                      << (run.backward_plan().resident_weights ? "resident" : "streamed")
                      << (run.backward_plan().walk_tensor_cores ? ", walk on tensor cores" : ""));
    run.forward(stream.s);
    run.backward(stream.s);
    const double w = run.check_against_reference();
    (run.forward_plan().resident_weights ? resident : streamed) += 1;
    walk_tc += run.backward_plan().walk_tensor_cores;
    if (w > worst) {
      worst = w;
      worst_case = c.describe();
    }
  }
  std::printf("%s: %zu cases (%d resident, %d streamed forward, %d walks on tensor cores), worst "
              "error/allowed %.3g at %s\n",
              name, cases.size(), resident, streamed, walk_tc, worst, worst_case.c_str());
  return walk_tc;
}

std::vector<GatedCase> shape_grid(GatedRnnKind kind, DType dtype) {
  struct S {
    int64_t B, T, H;
  };
  // H = 1 and 2 at B6 and B9: the forward's pair words (from tiles of 8
  // rows) at their narrowest rows, a unit or two a word row.
  const S shapes[] = {{1, 1, 1},    {1, 1, 37},   {1, 2, 3},   {5, 7, 37},
                      {1, 32, 256},  {2, 20, 257}, {5, 300, 64}, {9, 5, 100},
                      {3, 2, 1024},  {1, 300, 37}, {40, 6, 70},  {33, 3, 257},
                      {6, 4, 1},     {9, 3, 2}};
  std::vector<GatedCase> cases;
  int i = 0;
  for (const S& s : shapes) {
    GatedCase c;
    c.kind = kind;
    c.dtype = dtype;
    c.B = s.B;
    c.T = s.T;
    c.H = s.H;
    // Options rotate: each on in about half the cases, all on in the first
    // and all off in the second (the sLSTM's n0 and m0 with them).
    const unsigned u = static_cast<unsigned>(i);
    const unsigned bits = kind == GatedRnnKind::slstm
                              ? (i == 0 ? 63u : i == 1 ? 0u : (13u * u + 5u) & 63u)
                              : (i == 0 ? 15u : i == 1 ? 0u : (7u * u + 3u) & 15u);
    c.set_optional(bits);
    cases.push_back(c);
    ++i;
  }
  return cases;
}

}  // namespace

TEST_CASE("gated RNN: GRU f32 against the reference", "[gpu][gated_rnn]") {
  run_cases("GRU f32", shape_grid(GatedRnnKind::gru, DType::f32));
}

TEST_CASE("gated RNN: LSTM f32 against the reference", "[gpu][gated_rnn]") {
  run_cases("LSTM f32", shape_grid(GatedRnnKind::lstm, DType::f32));
}

TEST_CASE("gated RNN: sLSTM f32 against the reference", "[gpu][gated_rnn]") {
  run_cases("sLSTM f32", shape_grid(GatedRnnKind::slstm, DType::f32));
}

// n0 < 1: the clamp max(|n|, 1) active in the first steps, where the
// gradient jumps at max()'s ties (f32 only, small: see the top).
TEST_CASE("gated RNN: sLSTM with its clamp active (n0 < 1), f32", "[gpu][gated_rnn]") {
  std::vector<GatedCase> cases;
  const struct {
    int64_t B, T, H;
  } shapes[] = {{1, 1, 37}, {3, 9, 37}, {2, 5, 70}, {4, 3, 33}};
  int i = 0;
  for (const auto& sh : shapes)
    for (bool streamed : {false, true}) {
      GatedCase c;
      c.kind = GatedRnnKind::slstm;
      c.B = sh.B, c.T = sh.T, c.H = sh.H;
      c.clamp = true;
      c.bias = i & 1;
      c.h0 = i & 2;
      c.c0 = c.finals = true;
      c.m0 = i & 4;
      c.options.streamed_weights = streamed;
      cases.push_back(c);
      ++i;
    }
  run_cases("sLSTM clamp active", cases);
}

// Exact ties at t = 0 (GatedRun::build_ties): log_f + m0 = log_i, |n_1| = 1,
// and both at once; the kernels split there as the reference does. T = 1
// in f16 and bf16, where the recompute of later steps from rounded y could
// cross a kink of the clamp that the ties leave active.
TEST_CASE("gated RNN: sLSTM at exact ties of max(), every dtype", "[gpu][gated_rnn]") {
  std::vector<GatedCase> cases;
  for (DType dtype : {DType::f32, DType::f16, DType::bf16})
    for (int variant = 0; variant < 3; ++variant) {
      GatedCase c;
      c.kind = GatedRnnKind::slstm;
      c.dtype = dtype;
      c.state_dtype = variant == 2 ? dtype : DType::f32;
      c.ties = true;
      c.c0 = variant != 1;
      c.finals = variant != 0;
      c.B = variant == 0 ? 1 : 5;
      c.H = variant == 2 ? 257 : 37;
      c.T = dtype == DType::f32 ? 1 + 3 * variant : 1;
      cases.push_back(c);
    }
  run_cases("sLSTM ties", cases);
}

TEST_CASE("gated RNN: bf16 and f16 against the reference", "[gpu][gated_rnn]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm}) {
      std::vector<GatedCase> cases = shape_grid(kind, dtype);
      // Weights and states in the sequence dtype in every other case. The
      // sLSTM's final c, n, m take gradients at T = 1 only (see the top).
      for (std::size_t i = 0; i < cases.size(); ++i) {
        if (i % 2) cases[i].weight_dtype = cases[i].state_dtype = dtype;
        cases[i].cell_finals = cases[i].T == 1;
      }
      const std::string name = std::string(op_of(kind)) + (dtype == DType::bf16 ? " bf16" : " f16");
      run_cases(name.c_str(), cases);
    }
  }
}

TEST_CASE("gated RNN: forced layouts (units per block, batch tile, streamed weights)",
          "[gpu][gated_rnn]") {
  std::vector<GatedCase> cases;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm}) {
    GatedCase c;
    c.kind = kind;
    c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = true;
    c.B = 5, c.T = 9, c.H = 37;
    for (int units : {1, 3, 37}) {
      c.options = {};
      c.options.units_per_block = units;
      cases.push_back(c);
    }
    // Batch groups: one (every row in every block), two, a row each.
    for (int groups : {1, 2, 5}) {
      c.options = {};
      c.options.batch_blocks = groups;
      cases.push_back(c);
    }
    c.options = {};
    c.options.batch_tile = 1;
    cases.push_back(c);
    // The forward's exchange in pair words (automatic from tiles of 8 rows:
    // here B5's one tile of 8) turned off, and forced on tiles of a row (the
    // odd row of every pair dead) and of 2 rows in 3 groups (2, 2 and 1).
    c.options = {};
    c.options.pair_exchange = 0;
    cases.push_back(c);
    c.options.pair_exchange = 1;
    c.options.batch_tile = 1;
    cases.push_back(c);
    c.options.batch_tile = 2;
    c.options.batch_blocks = 3;
    cases.push_back(c);
    // Pair words at H = 1 and 2: a word row of a unit or two.
    GatedCase narrow = c;
    narrow.options = {};
    narrow.options.pair_exchange = 1;
    narrow.B = 6, narrow.T = 4, narrow.H = 1;
    cases.push_back(narrow);
    narrow.B = 9, narrow.T = 3, narrow.H = 2;
    cases.push_back(narrow);
    c.options = {};
    c.options.streamed_weights = true;
    cases.push_back(c);
    c.B = 3, c.T = 6, c.H = 257;
    cases.push_back(c);
    c.B = 2, c.T = 4, c.H = 1024;
    cases.push_back(c);
    c.options.batch_blocks = 3;  // streamed, in groups
    c.B = 7, c.T = 5, c.H = 70;
    cases.push_back(c);
    // Groups of 10 rows in passes of 4 (the last short), 8 units a slice.
    c.options = {};
    c.options.units_per_block = 8;
    c.options.batch_blocks = 4;
    c.options.batch_tile = 4;
    c.B = 40, c.T = 6, c.H = 100;
    cases.push_back(c);
    // The automatic plan's groups at larger batches.
    c.options = {};
    c.B = 33, c.T = 10, c.H = 257;
    cases.push_back(c);
    c.B = 64, c.T = 3, c.H = 512;
    cases.push_back(c);
    c.options = {};
    c.B = 3, c.T = 5, c.H = 255;
    c.options.units_per_block = kind == GatedRnnKind::gru ? 85 : 64;  // the most columns
    cases.push_back(c);
    // One tile with more (row, unit) items than threads: two a thread, and
    // the barrier at the end of each step.
    c.options = {};
    c.B = 6, c.T = 5, c.H = 130;
    c.options.units_per_block = 64;
    c.options.batch_blocks = 1;
    cases.push_back(c);
  }
  run_cases("forced layouts", cases);
}

// The forward's layouts at B <= 4 (the k-split layout is the default at
// B = 1, the block layout above; here each forced or left to the plan over
// units per block and sizes), each checked to be the layout it claims
// before the reference judges it.
TEST_CASE("gated RNN: k-split, unit-warps and block layouts at small batches", "[gpu][gated_rnn]") {
  exphil::kernels::GatedRnnDevice device;
  int current = 0;
  REQUIRE(cudaGetDevice(&current) == cudaSuccess);
  REQUIRE(exphil::kernels::query_gated_rnn_device(current, device) == cudaSuccess);
  std::vector<GatedCase> cases;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    for (DType dtype : {DType::f32, DType::bf16}) {
      GatedCase c;
      c.kind = kind;
      c.dtype = dtype;
      c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = true;
      c.cell_finals = dtype == DType::f32;  // (see the top)
      enum class Want { block, unit_warps, k_split };
      struct Layout {
        int64_t B, T, H;
        int unit_warps, units, k_split;
        Want want;
      };
      const int G = kind == GatedRnnKind::gru ? 3 : 4;
      // The block layout's product at B <= 2 takes 1, 2 or 4 columns a warp
      // as the block's columns need (4, 8 and 16 units: 12 to 64 columns,
      // the last in two passes). The k-split layout's two instances (8 and
      // 16 columns), and the block layout where H is above 256 at B = 1.
      for (const Layout& l :
           {Layout{1, 33, 256, 0, 0, 0, Want::block}, Layout{1, 33, 256, 1, 0, -1, Want::unit_warps},
            Layout{4, 9, 37, 0, 0, -1, Want::block}, Layout{4, 9, 37, 1, 1, -1, Want::unit_warps},
            Layout{3, 1, 37, 1, 3, -1, Want::unit_warps}, Layout{2, 17, 257, 1, 8, -1, Want::unit_warps},
            Layout{1, 5, 1024, 1, 0, -1, Want::unit_warps}, Layout{3, 12, 70, 1, 5, -1, Want::unit_warps},
            Layout{1, 33, 256, 0, 4, 0, Want::block}, Layout{2, 17, 257, 0, 8, -1, Want::block},
            Layout{1, 9, 300, 0, 16, -1, Want::block}, Layout{1, 33, 256, -1, 0, -1, Want::k_split},
            Layout{1, 33, 256, -1, 4, 1, Want::k_split}, Layout{1, 17, 130, -1, 0, -1, Want::k_split},
            Layout{1, 1, 37, -1, 0, -1, Want::k_split}, Layout{1, 40, 255, -1, 0, -1, Want::k_split},
            Layout{1, 17, 257, -1, 0, -1, Want::block}}) {
        c.B = l.B, c.T = l.T, c.H = l.H;
        c.options = {};
        c.options.unit_warps = l.unit_warps;
        c.options.units_per_block = l.units;
        c.options.k_split = l.k_split;
        const auto plan = exphil::kernels::plan_gated_rnn(GatedRnnDirection::forward, cell_of(kind),
                                                          {c.B, c.T, c.H}, device, c.options);
        INFO(c.describe());
        // (Where the device's multiprocessors give more units a block than
        // an instance holds, the block layout.)
        const int columns = exphil::kernels::gated_rnn_k_split_columns(G * plan.units_per_block, l.H);
        CHECK(plan.unit_warps == (l.want == Want::unit_warps));
        CHECK(plan.k_split == (l.want == Want::k_split && columns > 0));
        if (plan.k_split) CHECK(plan.stored_columns == columns);
        cases.push_back(c);
      }
    }
  run_cases("k-split, unit-warps and block layouts", cases);
}

TEST_CASE("gated RNN: small cases (for compute-sanitizer)", "[gpu][gated_rnn][sanitize]") {
  std::vector<GatedCase> cases;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    // resident, streamed, unit warps, batch groups, k split, bf16, tensor
    // cores (bf16 at H48: 3 or 4 m-tiles of 16 columns, 3 k-steps), and the
    // backward's walk on tensor cores (bf16, one group of 9 rows in tiles
    // of 8: a whole tile and one of a row; H37: a partial k tile of 16),
    // and f32 on tensor cores (f32_tensor_cores: the forward's product and
    // the walk's split slice, the same 9 rows at H48; the sLSTM ignores it)
    for (int layout : {0, 1, 2, 3, 4, 5, 6, 7, 8}) {
      GatedCase c;
      c.kind = kind;
      if (layout >= 5 && layout <= 7) c.dtype = c.weight_dtype = DType::bf16;
      c.cell_finals = c.dtype == DType::f32;  // (see the top)
      c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = true;
      // (k split at H64: the backward's recompute product split in two.)
      c.B = layout == 3 || layout == 6 ? 6 : layout == 4 ? 1 : layout >= 7 ? 9 : 3, c.T = 4;
      c.H = layout == 4 ? 64 : layout == 6 || layout == 8 ? 48 : 37;
      c.options.streamed_weights = layout == 1;
      c.options.unit_warps = layout == 2 ? 1 : -1;
      c.options.units_per_block = layout == 4 ? 2 : 8;
      c.options.batch_blocks = layout == 3 || layout == 6 ? 3 : layout >= 7 ? 1 : 0;
      c.options.batch_tile = layout >= 7 ? 8 : 0;
      c.options.tensor_cores = layout == 6 || layout == 8 ? 1 : layout == 7 ? -1 : 0;
      c.options.f32_tensor_cores = layout == 8 ? 1 : 0;
      cases.push_back(c);
    }
  CHECK(run_cases("sanitizer cases", cases) == 5);
}

// The forward's tensor-core product (gated_rnn_forward_tensor_cores.cuh):
// bf16 and f16 with R in the same dtype, every cell; one k part and
// several (H16 to H1024), one or two 8-row tiles of a batch group, whole
// or not (B9, B17, B33), more rows than a tile (forced tile 8), at B <= 4,
// long T; asked for (tensor_cores = 1) except at B64 H512 and B17 H1024,
// where the planner takes it itself, and where every warp has all its
// k-steps (the product without guards, its warps with one live m-tile and
// with two, over one row tile at B64 and one and two at B17). Each case
// also runs on CUDA cores (tensor_cores = 0), both checked against the
// reference; the two forwards' y agree within what splitting h into two
// 16-bit halves allows (2^-14 relative to the largest |h| there can be, 1,
// in bf16; 2^-20 in f16: far below y's own rounding, so a difference shows
// only as a change of y's last bit, at |y| < 1, or its relative size
// above).
// The bf16 cases' backwards with tiles of 8 rows or more (all but B2) walk
// with their part product on tensor cores (gated_rnn_part_product_tc), the
// f16 ones (f16 weights) on CUDA cores; both against the reference.
struct TensorCoreShape {
  int64_t B, T, H;
  int tensor_cores, tile;
};
constexpr TensorCoreShape kTensorCoreShapes[] = {
    {9, 7, 64, 1, 0},   {33, 5, 256, 1, 0}, {64, 3, 512, -1, 0}, {17, 4, 1024, -1, 0},
    {40, 200, 16, 1, 0}, {2, 9, 32, 1, 0},  {24, 6, 48, 1, 8}};

// Case i of a tensor-core test at `sh`: its optional inputs by i, R in the
// sequence's dtype.
GatedCase tensor_core_case(GatedRnnKind kind, DType dtype, const TensorCoreShape& sh, int i) {
  GatedCase c;
  c.kind = kind;
  c.dtype = c.weight_dtype = dtype;
  c.B = sh.B, c.T = sh.T, c.H = sh.H;
  c.set_optional(static_cast<unsigned>(i == 0 ? 63 : (13 * i + 5) & 63));
  c.options.tensor_cores = sh.tensor_cores;
  c.options.batch_tile = sh.tile;
  return c;
}

TEST_CASE("gated RNN: the tensor-core product", "[gpu][gated_rnn]") {
  const GatedRnnDevice device = gated_rnn_device();
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  std::vector<GatedCase> cases;
  int i = 0;
  for (DType dtype : {DType::bf16, DType::f16})
    for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
      for (const TensorCoreShape& sh : kTensorCoreShapes) {
        GatedCase c = tensor_core_case(kind, dtype, sh, i);
        c.state_dtype = i % 2 ? dtype : DType::f32;
        c.cell_finals = false;  // (see the top)
        ++i;
        const auto plan = exphil::kernels::plan_gated_rnn(GatedRnnDirection::forward, cell_of(kind),
                                                          {c.B, c.T, c.H}, device, c.options,
                                                          c.dtypes());
        INFO(c.describe() << " | " << plan.blocks << " blocks of " << plan.units_per_block
                          << " units, tile " << plan.batch_tile << ", " << plan.k_parts
                          << " k parts");
        CHECK(plan.tensor_cores);
        cases.push_back(c);

        // The same inputs (one seed) through both products.
        GatedRun tc(c, seed + i);
        GatedCase cuda_cores = c;
        cuda_cores.options.tensor_cores = 0;
        GatedRun cc(cuda_cores, seed + i);
        CHECK_FALSE(cc.forward_plan().tensor_cores);
        tc.forward(stream.s);
        cc.forward(stream.s);
        const std::vector<double> y_tc = tc.y(), y_cc = cc.y();
        REQUIRE(y_tc.size() == y_cc.size());
        const double ulp = dtype == DType::bf16 ? 0x1p-8 : 0x1p-11;  // y's last bit at |y| < 1
        double worst = 0;
        for (std::size_t k = 0; k < y_tc.size(); ++k)
          worst = std::max(worst, std::abs(y_tc[k] - y_cc[k]) / std::max(1.0, std::abs(y_cc[k])));
        CHECK(worst <= ulp);
      }
  // The backward's walk on tensor cores too wherever the weights are bf16
  // and a tile has 8 rows or more: 18 of the 21 bf16 cases (not B2).
  CHECK(run_cases("tensor-core product", cases) == 18);
}

// f32 on tensor cores where asked (f32_tensor_cores = 1): GRU and LSTM with
// f32 weights, the forward's product with R rounded to f16, the walk's
// with R and grad_rh in two bf16 halves each, the backward's two products
// with both operands so (gated_rnn_forward_tensor_cores.cuh,
// gated_rnn_walk_tensor_cores.cuh, gated_rnn_gemm.cuh), every output
// against the reference on its own tolerance line (tolerance.hpp), the
// shapes of the 16-bit test above with B2 at tensor_cores = 1 (the forward
// on tensor cores, the walk, at 2 rows a tile, on CUDA cores). The same
// inputs without the option run f32's multiply-adds and pass the f32 line:
// the option is what moved the results. The sLSTM ignores it. Two runs
// give the same bytes.
TEST_CASE("gated RNN: f32 on tensor cores (f32_tensor_cores)", "[gpu][gated_rnn]") {
  const GatedRnnDevice device = gated_rnn_device();
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  std::vector<GatedCase> cases;
  int i = 0;
  double worst_exact = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    for (const TensorCoreShape& sh : kTensorCoreShapes) {
      GatedCase c = tensor_core_case(kind, DType::f32, sh, i);
      c.state_dtype = DType::f32;
      c.cell_finals = true;  // f32 (see the top)
      c.options.f32_tensor_cores = 1;
      ++i;
      const auto dtypes = c.dtypes();
      const auto fwd = exphil::kernels::plan_gated_rnn(GatedRnnDirection::forward, cell_of(kind),
                                                       {c.B, c.T, c.H}, device, c.options, dtypes);
      const auto bwd = exphil::kernels::plan_gated_rnn(GatedRnnDirection::backward, cell_of(kind),
                                                       {c.B, c.T, c.H}, device, c.options, dtypes);
      INFO(c.describe() << " | forward " << fwd.blocks << " blocks of " << fwd.units_per_block
                        << " units, tile " << fwd.batch_tile << ", " << fwd.k_parts
                        << " k parts; backward tile " << bwd.batch_tile);
      const bool taken = kind != GatedRnnKind::slstm;
      CHECK(fwd.tensor_cores == taken);
      CHECK(bwd.walk_tensor_cores == (taken && sh.B > 2));
      CHECK(bwd.walk_split_weights == bwd.walk_tensor_cores);
      CHECK(bwd.gemm_tensor_cores == taken);
      cases.push_back(c);

      // The same inputs on f32's multiply-adds, on the f32 line.
      GatedCase exact = c;
      exact.options.f32_tensor_cores = 0;
      GatedRun run(exact, seed + 1000 + i);
      run.forward(stream.s);
      run.backward(stream.s);
      worst_exact = std::max(worst_exact, run.check_against_reference());
    }
  std::printf("f32 on tensor cores: the same inputs without it, worst error/allowed %.3g\n",
              worst_exact);
  // Walks on tensor cores: GRU and LSTM at every shape but B2.
  CHECK(run_cases("f32 on tensor cores", cases) == 12);
  for (const GatedCase& c : {cases[2], cases[9]}) {  // B64 H512, GRU and LSTM
    GatedRun a(c, seed), b(c, seed);
    a.forward(stream.s);
    a.backward(stream.s);
    b.forward(stream.s);
    b.backward(stream.s);
    INFO(c.describe());
    CHECK(a.forward_bytes() == b.forward_bytes());
    CHECK(a.backward_bytes() == b.backward_bytes());
    // The C++ API at precision tf32 (GatedRnnPrecision::tf32) gives the
    // same bytes, on tensor cores.
    GatedRnnApiLayout forward_layout, backward_layout;
    forward_layout.tf32 = backward_layout.tf32 = true;
    b.api_forward(stream.s, &forward_layout);
    b.api_backward(stream.s, &backward_layout);
    CHECK(b.forward_bytes() == a.forward_bytes());
    CHECK(b.backward_bytes() == a.backward_bytes());
    CHECK(forward_layout.tensor_cores);
    CHECK(backward_layout.tensor_cores);
  }
}

// The backward's products on tensor cores, h_{t-1} R and [h_{t-1}; 1]^T
// grad_rh: with y and R bf16 at 16-byte aligned rows of a multiple of 8
// they run gated_rnn_gemm_async_kernel (grad_rh's f32 split at the
// fragment), and so do f32 y and R under f32_tensor_cores (GRU and LSTM,
// both operands split at the fragment); with y moved by one element (2 or
// 4 bytes) the register-staged gated_rnn_gemm_tc_kernel. The two take each
// sum in the same order (gated_rnn_gemm.cuh), so every gradient has the
// same bytes. B*T = 660: six tiles along the recompute's M, the last one
// partial, and grad_R's k not a multiple of the 32 of a step.
TEST_CASE("gated RNN: the backward's asynchronous product gives the register-staged one's sums, bitwise",
          "[gpu][gated_rnn]") {
  RnnStream stream;
  for (DType dtype : {DType::bf16, DType::f32})
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    for (bool h0 : {false, true}) {
      if (dtype == DType::f32 && kind == GatedRnnKind::slstm) continue;  // (f32 on CUDA cores)
      GatedCase c;
      c.kind = kind;
      c.dtype = c.weight_dtype = c.state_dtype = dtype;
      c.options.f32_tensor_cores = dtype == DType::f32 ? 1 : 0;
      c.bias = true, c.h0 = h0;
      c.cell_finals = dtype == DType::f32;  // (see the top)
      c.B = 33, c.T = 20, c.H = 64;
      GatedRun run(c, test_seed());
      INFO(c.describe());
      REQUIRE(run.backward_plan().gemm_tensor_cores);
      run.forward(stream.s);
      run.backward(stream.s);
      CHECK(run.check_against_reference() <= 1.0);
      const auto aligned = run.backward_bytes();

      const std::size_t elem = dtype == DType::f32 ? 4 : 2;
      const std::size_t y_bytes = static_cast<std::size_t>(c.B * c.T * c.H) * elem;
      DeviceScratch moved(y_bytes + 16);
      void* const y = static_cast<char*>(moved.p) + elem;
      check_cuda(cudaMemcpy(y, run.forward_params().d_y, y_bytes, cudaMemcpyDeviceToDevice),
                 "cudaMemcpy (y)");
      GatedRnnBackwardParams b = run.backward_params();
      b.fwd.d_y = y;
      run.poison_backward();
      launch_or_throw(exphil::kernels::launch_gated_rnn_backward(b, run.backward_plan(),
                                                                 run.workspace(), stream.s));
      check_cuda(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
      CHECK(run.backward_bytes() == aligned);
    }
}

TEST_CASE("gated RNN: two runs are bitwise equal", "[gpu][gated_rnn]") {
  RnnStream stream;
  struct Shape {
    int64_t B, T, H;
    DType dtype;
  };
  // The block layout in batch groups, the k-split layout (B = 1), and the
  // tensor-core product (bf16, in k parts).
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    for (const Shape& shape : {Shape{9, 40, 257, DType::f32}, Shape{1, 40, 255, DType::f32},
                               Shape{9, 40, 512, DType::bf16}}) {
      GatedCase c;
      c.kind = kind;
      c.dtype = c.weight_dtype = shape.dtype;
      c.cell_finals = c.dtype == DType::f32;  // (see the top)
      c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = true;
      c.B = shape.B, c.T = shape.T, c.H = shape.H;
      c.options.tensor_cores = shape.dtype == DType::bf16 ? 1 : -1;
      GatedRun run(c, test_seed());
      run.forward(stream.s);
      const auto f1 = run.forward_bytes();
      run.backward(stream.s);
      const auto b1 = run.backward_bytes();
      run.forward(stream.s);
      const auto f2 = run.forward_bytes();
      run.backward(stream.s);
      const auto b2 = run.backward_bytes();
      INFO(c.describe());
      CHECK(run.forward_plan().tensor_cores == (shape.dtype == DType::bf16));
      CHECK(f1 == f2);
      CHECK(b1 == b2);
    }
}

// The public C++ API (exphil::gated_rnn_forward / _backward, its tensors
// bound by name as the bindings do) runs the same kernels: the same bytes as
// the launchers, on a caller's stream, both cells, with and without the
// optional inputs; and with R's slices streamed when its launch options ask
// (which it reports).
TEST_CASE("gated RNN: the C++ API gives the launchers' results, bitwise", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int variant : {0, 1, 2}) {
        const bool optional_inputs = variant > 0, streamed = variant == 2;
        GatedCase c;
        c.kind = kind;
        c.dtype = dtype;
        c.weight_dtype = optional_inputs ? dtype : DType::f32;
        c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = optional_inputs;
        c.cell_finals = dtype == DType::f32;  // (see the top)
        c.B = optional_inputs ? 3 : 1, c.T = 33, c.H = 70;
        c.options.streamed_weights = streamed;
        GatedRun run(c, test_seed());
        INFO(c.describe());
        run.forward(stream.s);
        run.backward(stream.s);
        const auto f1 = run.forward_bytes();
        const auto b1 = run.backward_bytes();
        GatedRnnApiLayout forward_layout, backward_layout;
        forward_layout.streamed_weights = backward_layout.streamed_weights = streamed;
        run.api_forward(stream.s, &forward_layout);
        run.api_backward(stream.s, &backward_layout);
        CHECK(run.forward_bytes() == f1);
        CHECK(run.backward_bytes() == b1);
        CHECK(forward_layout.resident_weights == !streamed);
        CHECK(backward_layout.resident_weights == !streamed);
        // The backward's products on tensor cores in bf16 (reported).
        CHECK(backward_layout.tensor_cores == (dtype == DType::bf16));
        CHECK(forward_layout.kernels == 1);
        // The recompute product split in two (B*T <= 99 rows: 2 tiles, H70)
        // and its reduction, gates, the walk, grad_R and grad_bias.
        CHECK(backward_layout.kernels == 5);
        CHECK(run.check_against_reference() <= 1.0);
      }
}

TEST_CASE("gated RNN: captured into a CUDA graph and replayed, bitwise as direct calls",
          "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm, GatedRnnKind::slstm}) {
    GatedCase c;
    c.kind = kind;
    c.bias = c.h0 = c.c0 = c.finals = c.n0 = c.m0 = true;
    c.B = 2, c.T = 32, c.H = 256;
    GatedRun run(c, test_seed());
    run.forward(stream.s);
    run.backward(stream.s);
    const auto f1 = run.forward_bytes();
    const auto b1 = run.backward_bytes();
    run.poison_forward();
    run.poison_backward();
    cudaGraphExec_t exec = capture(stream.s, [&] {
      launch_or_throw(exphil::kernels::launch_gated_rnn_forward(
          run.forward_params(), run.forward_plan(), run.workspace(), stream.s));
      launch_or_throw(exphil::kernels::launch_gated_rnn_backward(
          run.backward_params(), run.backward_plan(), run.workspace(), stream.s));
    });
    for (int i = 0; i < 3; ++i) check_cuda(cudaGraphLaunch(exec, stream.s), "cudaGraphLaunch");
    check_cuda(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
    cudaGraphExecDestroy(exec);
    INFO(c.describe());
    CHECK(run.forward_bytes() == f1);
    CHECK(run.backward_bytes() == b1);
  }
}

// Device times (not a test of correctness; hidden, run by name). Median of
// many replays of a graph of one call, and of 20 calls back to back.
TEST_CASE("gated RNN: timing", "[.timing][gated_rnn]") {
  RnnStream stream;
  struct Shape {
    int64_t B, T, H;
  };
  const Shape shapes[] = {{1, 32, 256}, {1, 1, 256}, {32, 64, 256}, {64, 256, 512}};
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  // Median device time per call of `body` (which enqueues `calls` calls):
  // replays of its graph, or, where capture fails, direct calls.
  bool graphs = true;
  const auto median_us = [&](const std::function<void()>& body, int calls, int reps) {
    cudaGraphExec_t exec = nullptr;
    if (graphs) {
      try {
        exec = capture(stream.s, body);
      } catch (const std::exception& e) {
        std::printf("capture failed (%s): timing direct calls from here on\n", e.what());
        graphs = false;
      }
    }
    const auto once = [&] {
      if (exec) check_cuda(cudaGraphLaunch(exec, stream.s), "cudaGraphLaunch");
      else body();
    };
    std::vector<float> ms;
    for (int i = 0; i < 5; ++i) once();
    for (int i = 0; i < reps; ++i) {
      check_cuda(cudaEventRecord(e0, stream.s), "cudaEventRecord");
      once();
      check_cuda(cudaEventRecord(e1, stream.s), "cudaEventRecord");
      check_cuda(cudaEventSynchronize(e1), "cudaEventSynchronize");
      float t = 0;
      check_cuda(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
      ms.push_back(t);
    }
    if (exec) cudaGraphExecDestroy(exec);
    std::sort(ms.begin(), ms.end());
    return 1000.0 * ms[ms.size() / 2] / calls;
  };
  std::vector<int> unit_choices = {0};
  if (const char* s = std::getenv("EXPHIL_GATED_RNN_UNITS")) {
    unit_choices.clear();
    for (const char* q = s; *q;) {
      unit_choices.push_back(std::atoi(q));
      while (*q && *q != ',') ++q;
      if (*q == ',') ++q;
    }
  }
  std::printf("%-6s %-5s %-16s %6s %7s %9s %9s %9s %9s\n", "cell", "dtype", "shape", "units",
              "blocks", "fwd_us", "fwd20_us", "fwdbwd_us", "bwd_only");
  std::fflush(stdout);
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (const Shape& s : shapes)
        for (int units : unit_choices) {
          if (units > 0 && !(s.B == 1 && s.T == 32)) continue;
          // EXPHIL_GATED_RNN_SHAPES=small: batch 1 only.
          if (const char* only = std::getenv("EXPHIL_GATED_RNN_SHAPES");
              only && std::strcmp(only, "small") == 0 && s.B > 1)
            continue;
          GatedCase c;
          c.kind = kind;
          c.dtype = dtype;
          c.B = s.B, c.T = s.T, c.H = s.H;
          c.options.units_per_block = units;
          try {
          GatedRun run(c, 1234);
          const int reps = s.B * s.T * s.H > 1000000 ? 20 : 200;
          const auto fwd = [&] {
            launch_or_throw(exphil::kernels::launch_gated_rnn_forward(
                run.forward_params(), run.forward_plan(), run.workspace(), stream.s));
          };
          const auto bwd = [&] {
            launch_or_throw(exphil::kernels::launch_gated_rnn_backward(
                run.backward_params(), run.backward_plan(), run.workspace(), stream.s));
          };
          const double f1 = median_us(fwd, 1, reps);
          const double f20 = median_us(
              [&] {
                for (int i = 0; i < 20; ++i) fwd();
              },
              20, std::max(reps / 10, 5));
          const double fb = median_us(
              [&] {
                fwd();
                bwd();
              },
              1, reps);
          char shape[32];
          std::snprintf(shape, sizeof shape, "B%lld T%lld H%lld", static_cast<long long>(s.B),
                        static_cast<long long>(s.T), static_cast<long long>(s.H));
          std::printf("%-6s %-5s %-16s %6d %7d %9.2f %9.2f %9.2f %9.2f\n",
                      kind == GatedRnnKind::gru ? "GRU" : "LSTM", dtype_name(dtype), shape,
                      run.forward_plan().units_per_block, run.forward_plan().blocks, f1, f20, fb,
                      fb - f1);
          std::fflush(stdout);
          } catch (const std::exception& e) {
            std::printf("%s: %s\n", c.describe().c_str(), e.what());
            (void)cudaGetLastError();
          }
        }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  CHECK(true);
}
