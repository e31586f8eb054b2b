// Fused GRU and LSTM sequences (cuda/gated_rnn/) against the double
// reference, forward and backward, through the kernel launchers directly
// (no public API exists for these ops yet).
//
// Every case: inputs random in each dtype (rounded before the reference
// sees them), every output and the workspace poisoned (NaN) before each
// call and inside guard zones, the forward's y fed to the backward (as a
// caller would), and every output compared elementwise with
//     |got - ref| <= atol * scale + rtol * |ref|
// where scale is, for y, h_final and c_final, the largest reference state
// magnitude (|y|, |h_final|, |h0|; |c_final|, |c0| for c), and for the
// gradients the largest reference gradient magnitude of the call (grad_wx,
// grad_rh, grad_h0, grad_c0), and for grad_R and grad_bias, sums over batch
// and time, also the largest sum of their terms' magnitudes.
//
// Tolerances (kTolerances below), one line per dtype:
//   f32   the state and every sum are f32; products of length up to 4096
//         and T = 300 chained steps: 5e-5 covers f32 rounding with margin.
//   f16   wx, grad_y and the outputs rounded to f16 (2^-11 relative); the
//         backward recomputes the gates from y rounded to f16: 5e-3.
//   bf16  the same with bf16's 2^-8: 4e-2 absolute at the scale, 3e-2 rtol
//         (the project's bf16 tolerance, tolerance.hpp, plus a third for
//         the recompute from rounded y).
//
// Sizes: T in {1, 2, 3, 6, 7, 20, 32, 300}, H in {1, 3, 37, 64, 70, 100,
// 256, 257, 1024}, B in {1, 2, 3, 5, 9, 33, 40} (batch tiles of 32 and a
// remainder); both cells; with and without bias, h0, c0
// and the final-state gradients; forced units per block (1, 3, 85),
// forced batch tile 1, forced streamed weights (the tiled path); bitwise
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
#include "gated_rnn_reference.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;
using exphil::kernels::GatedRnnBackwardParams;
using exphil::kernels::GatedRnnCell;
using exphil::kernels::GatedRnnDevice;
using exphil::kernels::GatedRnnDirection;
using exphil::kernels::GatedRnnForwardParams;
using exphil::kernels::GatedRnnLaunchOptions;
using exphil::kernels::GatedRnnPlan;
using exphil::kernels::GatedRnnShape;
using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnProblem;

namespace {

Tolerance gated_rnn_tolerance(DType dtype) {
  switch (dtype) {
    case DType::f32: return {5e-5, 5e-5};
    case DType::f16: return {5e-3, 5e-3};
    case DType::bf16: return {4e-2, 3e-2};
  }
  return {0, 0};
}

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

const char* rnn_dtype_name(DType d) {
  return d == DType::f32 ? "f32" : d == DType::f16 ? "f16" : "bf16";
}

struct GatedCase {
  GatedRnnKind kind = GatedRnnKind::gru;
  DType dtype = DType::f32;
  DType weight_dtype = DType::f32;
  DType state_dtype = DType::f32;
  int64_t B = 1, T = 1, H = 1;
  bool bias = false, h0 = false, c0 = false, finals = false;
  GatedRnnLaunchOptions options{};

  std::string describe() const {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s %s (R %s, states %s) B%lld T%lld H%lld bias=%d h0=%d c0=%d finals=%d "
                  "units=%d tile=%d streamed=%d",
                  kind == GatedRnnKind::gru ? "GRU" : "LSTM", rnn_dtype_name(dtype),
                  rnn_dtype_name(weight_dtype), rnn_dtype_name(state_dtype), static_cast<long long>(B),
                  static_cast<long long>(T), static_cast<long long>(H), bias, h0, c0, finals,
                  options.units_per_block, options.batch_tile, options.streamed_weights);
    return buf;
  }
};

GatedRnnCell cell_of(GatedRnnKind k) {
  return k == GatedRnnKind::gru ? GatedRnnCell::gru : GatedRnnCell::lstm;
}

// Device memory without guards, for the workspace (poisoned before each use).
struct DeviceScratch {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DeviceScratch(std::size_t n) : bytes(n) {
    if (n) check_cuda(cudaMalloc(&p, n), "cudaMalloc (workspace)");
  }
  ~DeviceScratch() { cudaFree(p); }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;
  void poison() const {
    if (bytes) check_cuda(cudaMemset(p, 0xFF, bytes), "cudaMemset (workspace)");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
};

struct RnnStream {
  cudaStream_t s = nullptr;
  RnnStream() { check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~RnnStream() { cudaStreamDestroy(s); }
  RnnStream(const RnnStream&) = delete;
  RnnStream& operator=(const RnnStream&) = delete;
};

GatedRnnDevice device_info() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  GatedRnnDevice d;
  check_cuda(exphil::kernels::query_gated_rnn_device(device, d), "query_gated_rnn_device");
  return d;
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
    if (c.c0 && c.kind == GatedRnnKind::lstm)
      p_.c0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
    grad_y_ = random_values(n(c.B * c.T * c.H), -1, 1, c.dtype, rng_);
    if (c.finals) {
      grad_hf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
      if (c.kind == GatedRnnKind::lstm)
        grad_cf_ = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng_);
    }

    wx_ = std::make_unique<DeviceTensor>(p_.wx, c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    R_ = std::make_unique<DeviceTensor>(p_.R, c.weight_dtype, std::vector<int64_t>{c.H, GH});
    if (c.bias) bias_ = std::make_unique<DeviceTensor>(p_.bias, c.weight_dtype, std::vector<int64_t>{GH});
    if (c.h0) h0_ = std::make_unique<DeviceTensor>(p_.h0, c.state_dtype, std::vector<int64_t>{c.B, c.H});
    if (!p_.c0.empty())
      c0_ = std::make_unique<DeviceTensor>(p_.c0, c.state_dtype, std::vector<int64_t>{c.B, c.H});
    gy_ = std::make_unique<DeviceTensor>(grad_y_, c.dtype, std::vector<int64_t>{c.B, c.T, c.H});
    if (!grad_hf_.empty())
      ghf_ = std::make_unique<DeviceTensor>(grad_hf_, c.state_dtype, std::vector<int64_t>{c.B, c.H});
    if (!grad_cf_.empty())
      gcf_ = std::make_unique<DeviceTensor>(grad_cf_, c.state_dtype, std::vector<int64_t>{c.B, c.H});

    y_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, c.H});
    hf_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{c.B, c.H});
    if (c.kind == GatedRnnKind::lstm)
      cf_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{c.B, c.H});
    gwx_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    grh_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    gR_ = std::make_unique<DeviceTensor>(c.weight_dtype, std::vector<int64_t>{c.H, GH});
    gb_ = std::make_unique<DeviceTensor>(c.weight_dtype, std::vector<int64_t>{GH});
    gh0_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{c.B, c.H});
    if (c.kind == GatedRnnKind::lstm)
      gc0_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{c.B, c.H});

    const GatedRnnShape shape{c.B, c.T, c.H};
    const GatedRnnDevice dev = device_info();
    fwd_plan_ = exphil::kernels::plan_gated_rnn(GatedRnnDirection::forward, cell_of(c.kind),
                                                shape, dev, c.options);
    bwd_plan_ = exphil::kernels::plan_gated_rnn(GatedRnnDirection::backward, cell_of(c.kind),
                                                shape, dev, c.options);
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
    f.d_c0 = c0_ ? c0_->desc().data : nullptr;
    f.d_y = y_->desc().data;
    f.d_h_final = hf_->desc().data;
    f.d_c_final = cf_ ? cf_->desc().data : nullptr;
    return f;
  }

  GatedRnnBackwardParams backward_params() const {
    GatedRnnBackwardParams b;
    b.fwd = forward_params();
    b.fwd.d_h_final = b.fwd.d_c_final = nullptr;
    b.d_grad_y = gy_->desc().data;
    b.d_grad_h_final = ghf_ ? ghf_->desc().data : nullptr;
    b.d_grad_c_final = gcf_ ? gcf_->desc().data : nullptr;
    b.d_grad_wx = gwx_->desc().data;
    b.d_grad_R = gR_->desc().data;
    b.d_grad_bias = gb_->desc().data;
    b.d_grad_h0 = gh0_->desc().data;
    b.d_grad_c0 = gc0_ ? gc0_->desc().data : nullptr;
    b.d_grad_rh = grh_->desc().data;
    return b;
  }

  float* workspace() const { return static_cast<float*>(ws_->p); }

  void poison_forward() const {
    y_->poison();
    hf_->poison();
    if (cf_) cf_->poison();
    ws_->poison();
  }
  void poison_backward() const {
    for (DeviceTensor* t : {gwx_.get(), grh_.get(), gR_.get(), gb_.get(), gh0_.get(), gc0_.get()})
      if (t) t->poison();
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
    api_call("forward", t, stream, layout);
  }
  void api_backward(cudaStream_t stream, GatedRnnApiLayout* layout = nullptr) const {
    poison_backward();
    std::map<std::string, const Tensor*> t = inputs();
    t["y"] = &y_->desc();
    t["grad_y"] = &gy_->desc();
    if (ghf_) t["grad_h_final"] = &ghf_->desc();
    if (gcf_) t["grad_c_final"] = &gcf_->desc();
    t["grad_wx"] = &gwx_->desc();
    t["grad_R"] = &gR_->desc();
    t["grad_bias"] = &gb_->desc();
    t["grad_h0"] = &gh0_->desc();
    if (gc0_) t["grad_c0"] = &gc0_->desc();
    t["grad_rh"] = &grh_->desc();
    api_call("backward", t, stream, layout);
  }

  // The outputs' bytes, for bitwise comparisons.
  std::vector<std::vector<unsigned char>> forward_bytes() const {
    std::vector<std::vector<unsigned char>> v{y_->raw(), hf_->raw()};
    if (cf_) v.push_back(cf_->raw());
    return v;
  }
  std::vector<std::vector<unsigned char>> backward_bytes() const {
    std::vector<std::vector<unsigned char>> v;
    for (DeviceTensor* t : {gwx_.get(), grh_.get(), gR_.get(), gb_.get(), gh0_.get(), gc0_.get()})
      if (t) v.push_back(t->raw());
    return v;
  }

  // Compares every output with the reference; returns the worst
  // error / allowed over all of them (<= 1 passes).
  double check_against_reference() const {
    const Tolerance tol = gated_rnn_tolerance(c_.dtype);
    const Tolerance wtol = gated_rnn_tolerance(c_.weight_dtype == DType::f32 ? c_.dtype
                                                                              : c_.weight_dtype);
    const Tolerance stol = gated_rnn_tolerance(c_.state_dtype == DType::f32 ? c_.dtype
                                                                             : c_.state_dtype);
    const auto f = exphil::reference::gated_rnn_forward(p_);
    const auto g = exphil::reference::gated_rnn_backward(p_, grad_y_, grad_hf_, grad_cf_);
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

    const double gscale = std::max({max_abs(g.wx), max_abs(g.rh), max_abs(g.h0), max_abs(g.c0)});
    judge(*gwx_, g.wx, tol, gscale, "grad_wx");
    judge(*grh_, g.rh, tol, gscale, "grad_rh");
    judge(*gR_, g.R, wtol, std::max(gscale, max_abs(g.R_terms)), "grad_R");
    judge(*gb_, g.bias, wtol, std::max(gscale, max_abs(g.bias_terms)), "grad_bias");
    judge(*gh0_, g.h0, stol, gscale, "grad_h0");
    if (gc0_) judge(*gc0_, g.c0, stol, gscale, "grad_c0");
    return worst;
  }

 private:
  std::map<std::string, const Tensor*> inputs() const {
    std::map<std::string, const Tensor*> t{{"wx", &wx_->desc()}, {"R", &R_->desc()}};
    if (bias_) t["bias"] = &bias_->desc();
    if (h0_) t["h0"] = &h0_->desc();
    if (c0_) t["c0"] = &c0_->desc();
    return t;
  }
  void api_call(const char* direction, const std::map<std::string, const Tensor*>& t, cudaStream_t stream,
                GatedRnnApiLayout* layout) const {
    const Status s =
        gated_rnn_api_call(c_.kind == GatedRnnKind::gru ? "gru" : "lstm", direction, t, stream, layout);
    if (!s.ok()) throw std::runtime_error(s.message());
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (API call)");
  }

  GatedCase c_;
  std::mt19937_64 rng_;
  GatedRnnProblem p_;
  std::vector<double> grad_y_, grad_hf_, grad_cf_;
  std::unique_ptr<DeviceTensor> wx_, R_, bias_, h0_, c0_, gy_, ghf_, gcf_;
  std::unique_ptr<DeviceTensor> y_, hf_, cf_, gwx_, grh_, gR_, gb_, gh0_, gc0_;
  GatedRnnPlan fwd_plan_{}, bwd_plan_{};
  std::unique_ptr<DeviceScratch> ws_;
};

// Runs and checks a list of cases; prints the worst margin.
void run_cases(const char* name, const std::vector<GatedCase>& cases) {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  double worst = 0;
  std::string worst_case;
  int resident = 0, streamed = 0;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const GatedCase& c = cases[i];
    GatedRun run(c, seed + i);
    INFO(c.describe() << " | forward: " << run.forward_plan().blocks << " blocks of "
                      << run.forward_plan().units_per_block << " units, tile "
                      << run.forward_plan().batch_tile << (run.forward_plan().resident_weights
                                                               ? ", resident"
                                                               : ", streamed")
                      << "; backward: " << run.backward_plan().blocks << " blocks, "
                      << (run.backward_plan().resident_weights ? "resident" : "streamed"));
    run.forward(stream.s);
    run.backward(stream.s);
    const double w = run.check_against_reference();
    (run.forward_plan().resident_weights ? resident : streamed) += 1;
    if (w > worst) {
      worst = w;
      worst_case = c.describe();
    }
  }
  std::printf("%s: %zu cases (%d resident, %d streamed forward), worst error/allowed %.3g at %s\n",
              name, cases.size(), resident, streamed, worst, worst_case.c_str());
}

std::vector<GatedCase> shape_grid(GatedRnnKind kind, DType dtype) {
  struct S {
    int64_t B, T, H;
  };
  const S shapes[] = {{1, 1, 1},    {1, 1, 37},   {1, 2, 3},   {5, 7, 37},
                      {1, 32, 256},  {2, 20, 257}, {5, 300, 64}, {9, 5, 100},
                      {3, 2, 1024},  {1, 300, 37}, {40, 6, 70},  {33, 3, 257}};
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
    // and all off in the second.
    const unsigned bits = i == 0 ? 15u : i == 1 ? 0u : (7u * static_cast<unsigned>(i) + 3u) & 15u;
    c.bias = bits & 1;
    c.h0 = bits & 2;
    c.c0 = bits & 4;
    c.finals = bits & 8;
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

TEST_CASE("gated RNN: bf16 and f16 against the reference", "[gpu][gated_rnn]") {
  for (DType dtype : {DType::bf16, DType::f16}) {
    for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
      std::vector<GatedCase> cases = shape_grid(kind, dtype);
      // Weights and states in the sequence dtype in every other case.
      for (std::size_t i = 0; i < cases.size(); ++i)
        if (i % 2) cases[i].weight_dtype = cases[i].state_dtype = dtype;
      run_cases(kind == GatedRnnKind::gru ? (dtype == DType::bf16 ? "GRU bf16" : "GRU f16")
                                          : (dtype == DType::bf16 ? "LSTM bf16" : "LSTM f16"),
                cases);
    }
  }
}

TEST_CASE("gated RNN: forced layouts (units per block, batch tile, streamed weights)",
          "[gpu][gated_rnn]") {
  std::vector<GatedCase> cases;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    GatedCase c;
    c.kind = kind;
    c.bias = c.h0 = c.c0 = c.finals = true;
    c.B = 5, c.T = 9, c.H = 37;
    for (int units : {1, 3, 37}) {
      c.options = {};
      c.options.units_per_block = units;
      cases.push_back(c);
    }
    c.options = {};
    c.options.batch_tile = 1;
    cases.push_back(c);
    c.options = {};
    c.options.streamed_weights = true;
    cases.push_back(c);
    c.B = 3, c.T = 6, c.H = 257;
    cases.push_back(c);
    c.B = 2, c.T = 4, c.H = 1024;
    cases.push_back(c);
    c.options = {};
    c.B = 3, c.T = 5, c.H = 255;
    c.options.units_per_block = kind == GatedRnnKind::gru ? 85 : 64;  // the most columns
    cases.push_back(c);
  }
  run_cases("forced layouts", cases);
}

TEST_CASE("gated RNN: small cases (for compute-sanitizer)", "[gpu][gated_rnn][sanitize]") {
  std::vector<GatedCase> cases;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (bool streamed : {false, true}) {
      GatedCase c;
      c.kind = kind;
      c.bias = c.h0 = c.c0 = c.finals = true;
      c.B = 3, c.T = 4, c.H = 37;
      c.options.streamed_weights = streamed;
      c.options.units_per_block = 8;
      cases.push_back(c);
    }
  run_cases("sanitizer cases", cases);
}

TEST_CASE("gated RNN: two runs are bitwise equal", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    GatedCase c;
    c.kind = kind;
    c.bias = c.h0 = c.c0 = c.finals = true;
    c.B = 9, c.T = 40, c.H = 257;
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
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int variant : {0, 1, 2}) {
        const bool optional_inputs = variant > 0, streamed = variant == 2;
        GatedCase c;
        c.kind = kind;
        c.dtype = dtype;
        c.weight_dtype = optional_inputs ? dtype : DType::f32;
        c.bias = c.h0 = c.c0 = c.finals = optional_inputs;
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
        CHECK(forward_layout.kernels == 1);
        CHECK(backward_layout.kernels == 4);  // grad_R and grad_bias asked for
        CHECK(run.check_against_reference() <= 1.0);
      }
}

namespace {

// Captures `body` on `stream` into a graph and instantiates it.
cudaGraphExec_t capture(cudaStream_t stream, const std::function<void()>& body) {
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    (void)cudaStreamEndCapture(stream, &graph);
    if (graph) cudaGraphDestroy(graph);
    (void)cudaGetLastError();
    throw;
  }
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cudaGraphDestroy(graph);
  return exec;
}

void launch_or_throw(const exphil::kernels::LaunchResult& r) {
  if (!r.ok()) throw std::runtime_error(std::string(r.call) + ": " + cudaGetErrorName(r.error));
}

}  // namespace

TEST_CASE("gated RNN: captured into a CUDA graph and replayed, bitwise as direct calls",
          "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    GatedCase c;
    c.kind = kind;
    c.bias = c.h0 = c.c0 = c.finals = true;
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
                      kind == GatedRnnKind::gru ? "GRU" : "LSTM", rnn_dtype_name(dtype), shape,
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
