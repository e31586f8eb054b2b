// Stacked GRU and LSTM layers (cuda/gated_rnn/gated_rnn_forward_stack.cuh:
// the wavefront at B = 1, layer by layer elsewhere) against the double
// reference, run layer by layer: layer 0 on the given wx, layer l > 0 on
// wx_l = y_{l-1} W_l + b_l formed in double from the reference's own
// y_{l-1} (the wavefront multiplies the f32 h it exchanges; layer by layer
// the layers above see their input rounded to the dtype, as two calls would,
// which the tolerances below hold too).
//
// Every output (the last layer's y, the lower layers' y where asked, every
// layer's final h and c) and the workspace poisoned before each call, with
// guard zones; compared elementwise with |got - ref| <= atol * scale + rtol
// * |ref|, scale the largest reference magnitude of that state, at the
// one-layer tolerances (gated_rnn_tolerance: f32 5e-5, f16 5e-3, bf16
// 4e-2 / 3e-2): in the wavefront the layers above see their input in f32,
// so a stack adds no rounding to the dtype's beyond the outputs'; layer by
// layer it adds one, of the input, well inside them.
//
// Sizes: L 2 to 4; B 1, 2, 3, 33; T 1, 2, 5, 33, 300 (the exchange rings,
// 32 slots, wrap at 33 and many times at 300); H 1, 37, 64, 100, 130, 255,
// 256, 257; forced units per block (1, 2 and 4) and the k split turned off;
// rings of 2 slots (a layer waiting for the one above it) and of the
// planner's 32; with and without every optional input and output; f32, bf16
// and f16, R in f32 or the dtype, states in f32 or the dtype. Also: two runs
// bitwise equal, graph capture bitwise as a direct call, and the planner's
// refusals.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
#include "gated_rnn_device.hpp"
#include "gated_rnn_reference.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;
using exphil::kernels::GatedRnnCell;
using exphil::kernels::GatedRnnDevice;
using exphil::kernels::GatedRnnLaunchOptions;
using exphil::kernels::GatedRnnPlan;
using exphil::kernels::GatedRnnShape;
using exphil::kernels::GatedRnnStackParams;
using exphil::kernels::kGatedRnnMaxStackLayers;
using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnProblem;

namespace {

struct StackCase {
  GatedRnnKind kind = GatedRnnKind::gru;
  DType dtype = DType::f32, weight_dtype = DType::f32, state_dtype = DType::f32;
  int layers = 2;
  int64_t B = 1, T = 1, H = 1;
  // bias, the input bias of the layers above, h0 and c0, the final states,
  // the lower layers' y.
  bool bias = false, input_bias = false, h0 = false, c0 = false, finals = false,
       lower_y = false;
  GatedRnnLaunchOptions options{};

  std::string describe() const {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%s %s (R %s, states %s) L%d B%lld T%lld H%lld bias=%d input_bias=%d h0=%d "
                  "c0=%d finals=%d lower_y=%d units=%d k_split=%d",
                  kind == GatedRnnKind::gru ? "GRU" : "LSTM", dtype_name(dtype),
                  dtype_name(weight_dtype), dtype_name(state_dtype), layers,
                  static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
                  bias, input_bias, h0, c0, finals, lower_y, options.units_per_block,
                  options.k_split);
    return buf;
  }
};

using Owned = std::unique_ptr<DeviceTensor>;

class StackRun {
 public:
  StackRun(const StackCase& c, uint64_t seed) : c_(c) {
    std::mt19937_64 rng(seed);
    const int64_t G = c.kind == GatedRnnKind::gru ? 3 : 4, GH = G * c.H;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    const double r = 1.5 / std::sqrt(static_cast<double>(c.H));
    const std::vector<int64_t> state{c.B, c.H}, seq{c.B, c.T, c.H};
    wx0_ = random_values(n(c.B * c.T * GH), -1.5, 1.5, c.dtype, rng);
    wx_ = std::make_unique<DeviceTensor>(wx0_, c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    for (int l = 0; l < c.layers; ++l) {
      Layer& ly = layers_[l];
      ly.R = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
      if (c.bias) ly.bias = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
      if (l > 0) {
        ly.W = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
        if (c.input_bias) ly.W_bias = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
      }
      if (c.h0) ly.h0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
      if (c.c0 && c.kind == GatedRnnKind::lstm)
        ly.c0 = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
      const auto in = [&](const std::vector<double>& v, DType dt, std::vector<int64_t> shape) {
        return v.empty() ? nullptr : std::make_unique<DeviceTensor>(v, dt, std::move(shape));
      };
      ly.d_R = in(ly.R, c.weight_dtype, {c.H, GH});
      ly.d_bias = in(ly.bias, c.weight_dtype, {GH});
      ly.d_W = in(ly.W, c.weight_dtype, {c.H, GH});
      ly.d_W_bias = in(ly.W_bias, c.weight_dtype, {GH});
      ly.d_h0 = in(ly.h0, c.state_dtype, state);
      ly.d_c0 = in(ly.c0, c.state_dtype, state);
      if (l + 1 == c.layers || c.lower_y) ly.d_y = std::make_unique<DeviceTensor>(c.dtype, seq);
      if (c.finals) {
        ly.d_hf = std::make_unique<DeviceTensor>(c.state_dtype, state);
        if (c.kind == GatedRnnKind::lstm) ly.d_cf = std::make_unique<DeviceTensor>(c.state_dtype, state);
      }
    }
    const GatedRnnShape shape{c.B, c.T, c.H};
    const GatedRnnDevice dev = gated_rnn_device();
    const GatedRnnCell cell = c.kind == GatedRnnKind::gru ? GatedRnnCell::gru : GatedRnnCell::lstm;
    plan_ = exphil::kernels::plan_gated_rnn_stack(cell, shape, c.layers, dev, c.options,
                                                  {c.dtype, c.weight_dtype});
    if (const char* why = exphil::kernels::gated_rnn_stack_unsupported(plan_, cell, shape, c.layers, dev))
      throw std::runtime_error(std::string("unsupported: ") + why + " (" + c.describe() + ")");
    ws_ = std::make_unique<DeviceScratch>(exphil::kernels::gated_rnn_workspace_bytes(plan_));
  }

  const GatedRnnPlan& plan() const { return plan_; }
  // The wavefront's rings at fewer slots than the planner's (whose
  // workspace holds them): 2, the fewest, makes a layer wait for the one
  // above it nearly every step.
  void set_depth(int depth) {
    if (plan_.stack_depth == 0 || depth > plan_.stack_depth)
      throw std::runtime_error("set_depth: a wavefront plan with at least that many slots");
    plan_.stack_depth = depth;
  }
  float* workspace() const { return static_cast<float*>(ws_->p); }

  GatedRnnStackParams params() const {
    GatedRnnStackParams p;
    p.layers = c_.layers;
    const auto at = [](const Owned& t) -> void* { return t ? t->desc().data : nullptr; };
    for (int l = 0; l < c_.layers; ++l) {
      const Layer& ly = layers_[l];
      exphil::kernels::GatedRnnForwardParams& f = p.layer[l];
      f.shape = {c_.B, c_.T, c_.H};
      f.cell = c_.kind == GatedRnnKind::gru ? GatedRnnCell::gru : GatedRnnCell::lstm;
      f.dtype = c_.dtype;
      f.weight_dtype = c_.weight_dtype;
      f.state_dtype = c_.state_dtype;
      f.d_wx = l == 0 ? wx_->desc().data : nullptr;
      f.d_R = at(ly.d_R);
      f.d_bias = at(ly.d_bias);
      f.d_h0 = at(ly.d_h0);
      f.d_c0 = at(ly.d_c0);
      f.d_y = at(ly.d_y);
      f.d_h_final = at(ly.d_hf);
      f.d_c_final = at(ly.d_cf);
      p.d_W[l] = at(ly.d_W);
      p.d_W_bias[l] = at(ly.d_W_bias);
    }
    return p;
  }

  std::vector<DeviceTensor*> outputs() const {
    std::vector<DeviceTensor*> v;
    for (int l = 0; l < c_.layers; ++l)
      for (const Owned* t : {&layers_[l].d_y, &layers_[l].d_hf, &layers_[l].d_cf})
        if (*t) v.push_back(t->get());
    return v;
  }

  void poison() const {
    for (DeviceTensor* t : outputs()) t->poison();
    ws_->poison();
  }

  void run(cudaStream_t stream) const {
    poison();
    launch_or_throw(exphil::kernels::launch_gated_rnn_stack_forward(params(), plan_, workspace(), stream));
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (stack)");
  }

  std::vector<std::vector<unsigned char>> bytes() const {
    std::vector<std::vector<unsigned char>> v;
    for (DeviceTensor* t : outputs()) v.push_back(t->raw());
    return v;
  }

  // Every output against the reference, layer by layer; the worst
  // error / allowed (<= 1 passes).
  double check_against_reference() const {
    const Tolerance tol = gated_rnn_tolerance(c_.dtype);
    const Tolerance stol =
        gated_rnn_tolerance(c_.state_dtype == DType::f32 ? c_.dtype : c_.state_dtype);
    const int64_t G = c_.kind == GatedRnnKind::gru ? 3 : 4, GH = G * c_.H;
    double worst = 0;
    std::vector<double> below;  // the reference's y of the layer below
    for (int l = 0; l < c_.layers; ++l) {
      const Layer& ly = layers_[l];
      GatedRnnProblem p;
      p.kind = c_.kind;
      p.batch = c_.B, p.steps = c_.T, p.hidden = c_.H;
      if (l == 0) {
        p.wx = wx0_;
      } else {
        const int64_t rows = c_.B * c_.T;  // (b, t)
        p.wx.assign(static_cast<std::size_t>(rows * GH), 0.0);
        for (int64_t m = 0; m < rows; ++m)
          for (int64_t j = 0; j < GH; ++j) {
            double s = ly.W_bias.empty() ? 0.0 : ly.W_bias[static_cast<std::size_t>(j)];
            for (int64_t k = 0; k < c_.H; ++k)
              s += below[static_cast<std::size_t>(m * c_.H + k)] *
                   ly.W[static_cast<std::size_t>(k * GH + j)];
            p.wx[static_cast<std::size_t>(m * GH + j)] = s;
          }
      }
      p.R = ly.R, p.bias = ly.bias, p.h0 = ly.h0, p.c0 = ly.c0;
      const auto f = exphil::reference::gated_rnn_forward(p);
      const double hscale = std::max({max_abs(f.y), max_abs(f.h_final), max_abs(p.h0)});
      const auto judge = [&](const Owned& t, const std::vector<double>& ref, Tolerance tl,
                             double scale, const char* name) {
        if (!t) return;
        const Comparison cmp = compare(t->values(), ref, tl, scale);
        INFO(c_.describe() << " layer " << l << "\n" << cmp.describe(name));
        CHECK(cmp.ok);
        CHECK(t->guards_intact());
        worst = std::max(worst, cmp.worst_ratio);
      };
      judge(ly.d_y, f.y, tol, hscale, "y");
      judge(ly.d_hf, f.h_final, stol, hscale, "h_final");
      judge(ly.d_cf, f.c_final, stol, std::max(max_abs(f.c_final), max_abs(p.c0)), "c_final");
      below = f.y;
    }
    return worst;
  }

 private:
  struct Layer {
    std::vector<double> R, bias, W, W_bias, h0, c0;
    Owned d_R, d_bias, d_W, d_W_bias, d_h0, d_c0, d_y, d_hf, d_cf;
  };
  StackCase c_;
  std::vector<double> wx0_;
  Owned wx_;
  Layer layers_[kGatedRnnMaxStackLayers];
  GatedRnnPlan plan_{};
  std::unique_ptr<DeviceScratch> ws_;
};

}  // namespace

TEST_CASE("gated RNN stack: GRU and LSTM layers against the reference", "[gpu][gated_rnn]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  struct Shape {
    int layers;
    int64_t B, T, H;
    int units, k_split;
  };
  // B = 1 in the wavefront (forced units among them; where they need more
  // blocks than the device holds, layer by layer), then layer by layer: B
  // above 1, H above 256, the k split turned off.
  const Shape shapes[] = {{2, 1, 1, 1, 0, -1},    {2, 1, 32, 256, 0, -1}, {3, 1, 5, 37, 0, -1},
                          {2, 1, 300, 64, 0, -1}, {4, 1, 33, 64, 0, -1},  {2, 1, 2, 255, 0, -1},
                          {3, 1, 20, 100, 4, -1}, {2, 1, 33, 130, 2, -1}, {4, 1, 7, 30, 1, -1},
                          {3, 1, 300, 100, 0, -1}, {2, 3, 20, 64, 0, -1}, {3, 33, 7, 100, 0, -1},
                          {4, 2, 6, 37, 0, -1},   {2, 1, 5, 257, 0, -1},  {2, 1, 9, 64, 0, 0}};
  struct DTypes {
    DType dtype, weight, state;
  };
  const DTypes dtypes[] = {{DType::f32, DType::f32, DType::f32},
                           {DType::bf16, DType::bf16, DType::f32},
                           {DType::f16, DType::f32, DType::f16}};
  double worst = 0;
  int cases = 0, wavefront = 0, i = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (const DTypes& d : dtypes)
      for (const Shape& s : shapes) {
        StackCase c;
        c.kind = kind;
        c.dtype = d.dtype, c.weight_dtype = d.weight, c.state_dtype = d.state;
        c.layers = s.layers, c.B = s.B, c.T = s.T, c.H = s.H;
        c.options.units_per_block = s.units;
        c.options.k_split = s.k_split;
        // Every optional input and output on in the first case, off in the
        // second, then each in about half.
        const unsigned bits = i == 0 ? 63u : i == 1 ? 0u : (11u * static_cast<unsigned>(i) + 5u) & 63u;
        c.bias = bits & 1, c.input_bias = bits & 2, c.h0 = bits & 4, c.c0 = bits & 8,
        c.finals = bits & 16, c.lower_y = bits & 32;
        StackRun run(c, seed + static_cast<uint64_t>(i));
        // Every third wavefront case with the shallowest rings.
        if (i % 3 == 2 && run.plan().stack_depth > 0) run.set_depth(2);
        ++i;
        const bool layered = s.B > 1 || s.H > 256 || s.k_split == 0;
        INFO(c.describe() << " | " << (run.plan().stack_depth > 0 ? "wavefront, " : "layer by layer, ")
                          << run.plan().blocks << " blocks of " << run.plan().units_per_block
                          << " units, ring " << run.plan().stack_depth);
        if (layered) CHECK(run.plan().stack_depth == 0);
        if (!layered && s.units == 0) CHECK(run.plan().stack_depth > 0);
        wavefront += run.plan().stack_depth > 0;
        run.run(stream.s);
        worst = std::max(worst, run.check_against_reference());
        ++cases;
      }
  std::printf("gated RNN stack: %d cases (%d in the wavefront), worst error/allowed %.3g\n", cases,
              wavefront, worst);
}

TEST_CASE("gated RNN stack: two runs and a graph replay are bitwise equal", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t B : {1, 9}) {  // the wavefront; layer by layer
        StackCase c;
        c.kind = kind;
        c.dtype = c.weight_dtype = dtype;
        c.layers = 2, c.B = B, c.T = 40, c.H = 255;
        c.bias = c.input_bias = c.h0 = c.c0 = c.finals = c.lower_y = true;
        StackRun run(c, test_seed());
        INFO(c.describe());
        run.run(stream.s);
        const auto first = run.bytes();
        run.run(stream.s);
        CHECK(run.bytes() == first);

        run.poison();
        cudaGraphExec_t exec = capture(stream.s, [&] {
          launch_or_throw(exphil::kernels::launch_gated_rnn_stack_forward(run.params(), run.plan(),
                                                                          run.workspace(), stream.s));
        });
        for (int k = 0; k < 3; ++k) check_cuda(cudaGraphLaunch(exec, stream.s), "cudaGraphLaunch");
        check_cuda(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
        cudaGraphExecDestroy(exec);
        CHECK(run.bytes() == first);
      }
}

// Small enough for compute-sanitizer's memcheck and racecheck (test/sanitize.sh).
TEST_CASE("gated RNN stack: small cases (for compute-sanitizer)", "[gpu][gated_rnn][sanitize]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    StackCase c;
    c.kind = kind;
    c.dtype = c.weight_dtype = kind == GatedRnnKind::gru ? DType::f32 : DType::bf16;
    c.layers = 3, c.T = 9, c.H = 37;
    c.bias = c.input_bias = c.h0 = c.c0 = c.finals = c.lower_y = true;
    {
      StackRun run(c, test_seed());
      if (kind == GatedRnnKind::gru) run.set_depth(2);  // the wait for the layer above, and none
      INFO(c.describe());
      run.run(stream.s);
      CHECK(run.check_against_reference() <= 1.0);
    }
    // Layer by layer (B = 3), the lower layers' y in the workspace.
    c.B = 3, c.T = 5, c.lower_y = false;
    StackRun run(c, test_seed());
    INFO(c.describe());
    CHECK(run.plan().stack_depth == 0);
    run.run(stream.s);
    CHECK(run.check_against_reference() <= 1.0);
  }
}
