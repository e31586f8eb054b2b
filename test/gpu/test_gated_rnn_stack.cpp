// Stacked GRU and LSTM layers (cuda/gated_rnn/gated_rnn_forward_stack.cuh:
// the wavefront at B = 1 in the k-split layout, gated_rnn_forward_stack_blocks.cuh:
// in the block layout elsewhere, and layer by layer where neither fits; the
// backward layer by layer from the top, gated_rnn_backward_stack.cuh, its
// cases at the end)
// against the double reference, run layer by layer: layer 0 on the given wx, layer l > 0 on
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
// Sizes: L 2 to 4; B 1, 2, 3, 4, 33, 40, 64; T 1, 2, 5, 33, 70, 300
// (the k-split rings, 32 slots, wrap at 33 and many times at 300; the block
// layout's, 8 slots, at every eighth step); H 1, 17, 37, 64, 70, 100, 130,
// 255, 256, 257; forced units per block (1, 2, 4 and 65: a group's rows beyond
// a pass of the threads), one batch group forced at B40 (layer by layer),
// the k split and the wavefront turned off; rings of
// 2 slots (a layer waiting for the one above it) and of the planner's
// depth; with and without every optional input and output; f32, bf16
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
#include "exphil/gated_rnn.hpp"
#include "gated_rnn/gated_rnn_launch.h"
#include "gated_rnn_device.hpp"
#include "gated_rnn_reference.hpp"
#include "scan_problems.hpp"

using namespace exphil;
using namespace exphil::test;
using exphil::kernels::GatedRnnDevice;
using exphil::kernels::GatedRnnPlan;
using exphil::kernels::GatedRnnShape;
using exphil::kernels::GatedRnnStackParams;
using exphil::kernels::kGatedRnnMaxStackLayers;
using exphil::reference::GatedRnnKind;
using exphil::reference::GatedRnnStackProblem;

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
  // The backward: the gradients of the lower layers' y and of the final
  // states given; which gradients are asked for (every one, or a subset).
  bool grad_lower = false, grad_finals = false, all_grads = true;
  exphil::kernels::GatedRnnLaunchOptions options{};

  // Every optional input and output, R in the sequence dtype.
  static StackCase everything(GatedRnnKind kind, DType dtype, int layers, int64_t B, int64_t T, int64_t H) {
    StackCase c;
    c.kind = kind;
    c.dtype = c.weight_dtype = dtype;
    c.layers = layers, c.B = B, c.T = T, c.H = H;
    c.bias = c.input_bias = c.h0 = c.c0 = c.finals = c.lower_y = true;
    c.grad_lower = c.grad_finals = true;
    return c;
  }

  std::string describe() const {
    char buf[400];
    std::snprintf(buf, sizeof buf,
                  "%s %s (R %s, states %s) L%d B%lld T%lld H%lld bias=%d input_bias=%d h0=%d "
                  "c0=%d finals=%d lower_y=%d units=%d groups=%d k_split=%d wavefront=%d "
                  "tensor_cores=%d | backward: "
                  "grad_lower=%d grad_finals=%d all_grads=%d",
                  kind == GatedRnnKind::gru ? "GRU" : "LSTM", dtype_name(dtype),
                  dtype_name(weight_dtype), dtype_name(state_dtype), layers,
                  static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
                  bias, input_bias, h0, c0, finals, lower_y, options.units_per_block,
                  options.batch_blocks, options.k_split, options.stack_wavefront,
                  options.tensor_cores, grad_lower, grad_finals, all_grads);
    return buf;
  }
};

using Owned = std::unique_ptr<DeviceTensor>;

// One case on the GPU: the problem (host, per layer, for the reference),
// its tensors on the device stacked as the API takes them ([L, ...] and
// [L-1, ...]), the plan, and what the runs produced. The kernel layer's
// params point into the stacked tensors.
class StackRun {
 public:
  StackRun(const StackCase& c, uint64_t seed) : c_(c) {
    std::mt19937_64 rng(seed);
    const int64_t L = c.layers, K = L - 1, GH = gates() * c.H;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    const double r = 1.5 / std::sqrt(static_cast<double>(c.H));
    p_.kind = c.kind;
    p_.batch = c.B, p_.steps = c.T, p_.hidden = c.H;
    p_.wx = random_values(n(c.B * c.T * GH), -1.5, 1.5, c.dtype, rng);
    p_.R.resize(n(L)), p_.bias.resize(n(L)), p_.h0.resize(n(L)), p_.c0.resize(n(L));
    p_.W.resize(n(K)), p_.W_bias.resize(n(K));
    for (int64_t l = 0; l < L; ++l) {
      p_.R[n(l)] = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
      if (c.bias) p_.bias[n(l)] = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
      if (l > 0) {
        p_.W[n(l - 1)] = random_values(n(c.H * GH), -r, r, c.weight_dtype, rng);
        if (c.input_bias) p_.W_bias[n(l - 1)] = random_values(n(GH), -0.5, 0.5, c.weight_dtype, rng);
      }
      if (c.h0) p_.h0[n(l)] = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
      if (c.c0 && c.kind == GatedRnnKind::lstm)
        p_.c0[n(l)] = random_values(n(c.B * c.H), -1, 1, c.state_dtype, rng);
    }
    // Stacked: the layers' vectors one after another, or nothing where a
    // layer's is absent (all are, or none).
    const auto stacked = [&](const std::vector<std::vector<double>>& parts, DType dt,
                             std::vector<int64_t> shape) -> Owned {
      if (parts.empty() || parts[0].empty()) return nullptr;
      std::vector<double> all;
      for (const auto& v : parts) all.insert(all.end(), v.begin(), v.end());
      return std::make_unique<DeviceTensor>(all, dt, std::move(shape));
    };
    wx_ = std::make_unique<DeviceTensor>(p_.wx, c.dtype, std::vector<int64_t>{c.B, c.T, GH});
    R_ = stacked(p_.R, c.weight_dtype, {L, c.H, GH});
    W_ = stacked(p_.W, c.weight_dtype, {K, c.H, GH});
    bias_ = stacked(p_.bias, c.weight_dtype, {L, GH});
    W_bias_ = stacked(p_.W_bias, c.weight_dtype, {K, GH});
    h0_ = stacked(p_.h0, c.state_dtype, {L, c.B, c.H});
    c0_ = stacked(p_.c0, c.state_dtype, {L, c.B, c.H});
    y_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{c.B, c.T, c.H});
    if (c.lower_y) y_lower_ = std::make_unique<DeviceTensor>(c.dtype, std::vector<int64_t>{K, c.B, c.T, c.H});
    if (c.finals) {
      hf_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{L, c.B, c.H});
      if (c.kind == GatedRnnKind::lstm)
        cf_ = std::make_unique<DeviceTensor>(c.state_dtype, std::vector<int64_t>{L, c.B, c.H});
    }
    const GatedRnnShape shape{c.B, c.T, c.H};
    const GatedRnnDevice dev = gated_rnn_device();
    plan_ = exphil::kernels::plan_gated_rnn_stack(cell(), shape, c.layers, dev, c.options,
                                                  {c.dtype, c.weight_dtype});
    if (const char* why = exphil::kernels::gated_rnn_stack_unsupported(plan_, cell(), shape, c.layers, dev))
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

  // The kernel layer's params: each layer's slices of the stacked tensors.
  GatedRnnStackParams params() const {
    GatedRnnStackParams p;
    p.layers = c_.layers;
    const int64_t B = c_.B, T = c_.T, H = c_.H, GH = gates() * H;
    for (int l = 0; l < c_.layers; ++l) {
      exphil::kernels::GatedRnnForwardParams& f = p.layer[l];
      f.shape = {B, T, H};
      f.cell = cell();
      f.dtype = c_.dtype;
      f.weight_dtype = c_.weight_dtype;
      f.state_dtype = c_.state_dtype;
      f.d_wx = l == 0 ? wx_->desc().data : nullptr;
      f.d_R = slice(R_, c_.weight_dtype, l * H * GH);
      f.d_bias = slice(bias_, c_.weight_dtype, l * GH);
      f.d_h0 = slice(h0_, c_.state_dtype, l * B * H);
      f.d_c0 = slice(c0_, c_.state_dtype, l * B * H);
      f.d_y = l + 1 == c_.layers ? y_->desc().data : slice(y_lower_, c_.dtype, l * B * T * H);
      f.d_h_final = slice(hf_, c_.state_dtype, l * B * H);
      f.d_c_final = slice(cf_, c_.state_dtype, l * B * H);
      if (l > 0) {
        p.d_W[l] = slice(W_, c_.weight_dtype, (l - 1) * H * GH);
        p.d_W_bias[l] = slice(W_bias_, c_.weight_dtype, (l - 1) * GH);
      }
    }
    return p;
  }

  // The public C++ API's args: the stacked tensors whole.
  exphil::GatedRnnStackForwardArgs api_args() const {
    exphil::GatedRnnStackForwardArgs a;
    a.cell = c_.kind == GatedRnnKind::gru ? exphil::GatedRnnCell::gru : exphil::GatedRnnCell::lstm;
    // The kernels' f32_tensor_cores is the API's precision tf32.
    if (c_.options.f32_tensor_cores == 1) a.options.precision = exphil::GatedRnnPrecision::tf32;
    const auto at = [](const Owned& t) { return t ? &t->desc() : nullptr; };
    a.wx = at(wx_), a.R = at(R_), a.W = at(W_), a.bias = at(bias_), a.W_bias = at(W_bias_);
    a.h0 = at(h0_), a.c0 = at(c0_), a.y = at(y_), a.y_lower = at(y_lower_), a.h_final = at(hf_);
    a.c_final = at(cf_);
    return a;
  }

  std::vector<DeviceTensor*> outputs() const {
    std::vector<DeviceTensor*> v;
    for (const Owned* t : {&y_, &y_lower_, &hf_, &cf_})
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

  // The same through exphil::gated_rnn_stack_forward, which plans and takes
  // its own workspace; `info` receives its layout.
  void run_api(cudaStream_t stream, exphil::GatedRnnLaunchInfo* info) const {
    poison();
    const exphil::GatedRnnLaunchOptions o = api_options(info);
    finish_api(exphil::gated_rnn_stack_forward(api_args(), stream, &o), stream);
  }

  std::vector<std::vector<unsigned char>> bytes() const { return raw(outputs()); }

  // Every output against the reference, layer by layer; the worst
  // error / allowed (<= 1 passes).
  double check_against_reference() const {
    const Tolerance tol = line(c_.dtype), stol = group_tolerance(c_.state_dtype);
    const auto ref = exphil::reference::gated_rnn_stack_forward(p_);
    const std::size_t seq = static_cast<std::size_t>(c_.B * c_.T * c_.H);
    const std::size_t state = static_cast<std::size_t>(c_.B * c_.H);
    double worst = 0;
    for (std::size_t l = 0; l < ref.size(); ++l) {
      const auto& f = ref[l];
      const double hscale = std::max({max_abs(f.y), max_abs(f.h_final), max_abs(p_.h0[l])});
      const auto judge = [&](const std::vector<double>& got, const std::vector<double>& want,
                             Tolerance tl, double scale, const char* name) {
        const Comparison cmp = compare(got, want, tl, scale);
        INFO(c_.describe() << " layer " << l << "\n" << cmp.describe(name));
        CHECK(cmp.ok);
        worst = std::max(worst, cmp.worst_ratio);
      };
      if (l + 1 == ref.size()) judge(y_->values(), f.y, tol, hscale, "y");
      else if (y_lower_) judge(part(y_lower_, l, seq), f.y, tol, hscale, "y_lower");
      if (hf_) judge(part(hf_, l, state), f.h_final, stol, hscale, "h_final");
      if (cf_)
        judge(part(cf_, l, state), f.c_final, stol, std::max(max_abs(f.c_final), max_abs(p_.c0[l])),
              "c_final");
    }
    for (DeviceTensor* t : outputs()) CHECK(t->guards_intact());
    return worst;
  }

  // ---- The backward (after run(): it reads y and y_lower, which the case
  // must keep). Random gradients of the outputs, the gradients asked for
  // (all, or a subset that leaves out grad_wx, grad_R and grad_W_bias and
  // keeps grad_W: its product then starts at row 0 without row H), and
  // the backward's own plan and workspace.
  void prepare_backward(uint64_t seed) {
    if (!y_lower_) throw std::runtime_error("prepare_backward: the case must keep y_lower");
    std::mt19937_64 rng(seed);
    const int64_t L = c_.layers, K = L - 1, GH = gates() * c_.H, B = c_.B, T = c_.T, H = c_.H;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    grad_y_ = random_values(n(B * T * H), -1, 1, c_.dtype, rng);
    gy_ = std::make_unique<DeviceTensor>(grad_y_, c_.dtype, std::vector<int64_t>{B, T, H});
    grad_y_lower_.assign(n(K), {});
    grad_hf_.assign(n(L), {});
    grad_cf_.assign(n(L), {});
    std::vector<double> all;
    if (c_.grad_lower) {
      for (auto& v : grad_y_lower_) {
        v = random_values(n(B * T * H), -1, 1, c_.dtype, rng);
        all.insert(all.end(), v.begin(), v.end());
      }
      gyl_ = std::make_unique<DeviceTensor>(all, c_.dtype, std::vector<int64_t>{K, B, T, H});
    }
    if (c_.grad_finals) {
      const auto states = [&](std::vector<std::vector<double>>& parts) {
        std::vector<double> flat;
        for (auto& v : parts) {
          v = random_values(n(B * H), -1, 1, c_.state_dtype, rng);
          flat.insert(flat.end(), v.begin(), v.end());
        }
        return std::make_unique<DeviceTensor>(flat, c_.state_dtype, std::vector<int64_t>{L, B, H});
      };
      ghf_ = states(grad_hf_);
      if (c_.kind == GatedRnnKind::lstm) gcf_ = states(grad_cf_);
    }
    const bool all_grads = c_.all_grads;
    if (all_grads) gwx_ = std::make_unique<DeviceTensor>(c_.dtype, std::vector<int64_t>{B, T, GH});
    if (all_grads) gR_ = std::make_unique<DeviceTensor>(c_.weight_dtype, std::vector<int64_t>{L, H, GH});
    gW_ = std::make_unique<DeviceTensor>(c_.weight_dtype, std::vector<int64_t>{K, H, GH});
    gb_ = std::make_unique<DeviceTensor>(c_.weight_dtype, std::vector<int64_t>{L, GH});
    if (all_grads) gWb_ = std::make_unique<DeviceTensor>(c_.weight_dtype, std::vector<int64_t>{K, GH});
    gh0_ = std::make_unique<DeviceTensor>(c_.state_dtype, std::vector<int64_t>{L, B, H});
    if (c_.kind == GatedRnnKind::lstm && all_grads)
      gc0_ = std::make_unique<DeviceTensor>(c_.state_dtype, std::vector<int64_t>{L, B, H});
    const GatedRnnShape shape{B, T, H};
    const GatedRnnDevice dev = gated_rnn_device();
    bplan_ = exphil::kernels::plan_gated_rnn_stack_backward(cell(), shape, c_.layers, dev, c_.options,
                                                            {c_.dtype, c_.weight_dtype});
    if (const char* why = exphil::kernels::gated_rnn_stack_unsupported(bplan_, cell(), shape, c_.layers, dev))
      throw std::runtime_error(std::string("backward unsupported: ") + why + " (" + c_.describe() + ")");
    bws_ = std::make_unique<DeviceScratch>(exphil::kernels::gated_rnn_workspace_bytes(bplan_));
  }

  const GatedRnnPlan& backward_plan() const { return bplan_; }
  float* backward_workspace() const { return static_cast<float*>(bws_->p); }

  exphil::kernels::GatedRnnStackBackwardParams backward_params() const {
    exphil::kernels::GatedRnnStackBackwardParams p;
    const GatedRnnStackParams f = params();
    p.layers = c_.layers;
    const int64_t B = c_.B, T = c_.T, H = c_.H, GH = gates() * H;
    for (int l = 0; l < c_.layers; ++l) {
      exphil::kernels::GatedRnnBackwardParams& b = p.layer[l];
      b.fwd = f.layer[l];
      b.fwd.d_h_final = b.fwd.d_c_final = nullptr;
      const bool top = l + 1 == c_.layers;
      b.d_grad_y = top ? gy_->desc().data : slice(gyl_, c_.dtype, l * B * T * H);
      b.d_grad_h_final = slice(ghf_, c_.state_dtype, l * B * H);
      b.d_grad_c_final = slice(gcf_, c_.state_dtype, l * B * H);
      b.d_grad_wx = l == 0 ? slice(gwx_, c_.dtype, 0) : nullptr;
      b.d_grad_R = slice(gR_, c_.weight_dtype, l * H * GH);
      b.d_grad_bias = slice(gb_, c_.weight_dtype, l * GH);
      b.d_grad_h0 = slice(gh0_, c_.state_dtype, l * B * H);
      b.d_grad_c0 = slice(gc0_, c_.state_dtype, l * B * H);
      if (l > 0) {
        p.d_W[l] = f.d_W[l];
        p.d_W_bias[l] = f.d_W_bias[l];
        p.d_grad_W[l] = slice(gW_, c_.weight_dtype, (l - 1) * H * GH);
        p.d_grad_W_bias[l] = slice(gWb_, c_.weight_dtype, (l - 1) * GH);
      }
    }
    return p;
  }

  exphil::GatedRnnStackBackwardArgs backward_api_args() const {
    const exphil::GatedRnnStackForwardArgs f = api_args();
    exphil::GatedRnnStackBackwardArgs a;
    const auto at = [](const Owned& t) { return t ? &t->desc() : nullptr; };
    a.cell = f.cell;
    a.options = f.options;
    a.wx = f.wx, a.R = f.R, a.W = f.W, a.y = f.y, a.y_lower = f.y_lower, a.grad_y = at(gy_);
    a.bias = f.bias, a.W_bias = f.W_bias, a.h0 = f.h0, a.c0 = f.c0;
    a.grad_y_lower = at(gyl_), a.grad_h_final = at(ghf_), a.grad_c_final = at(gcf_);
    a.grad_wx = at(gwx_), a.grad_R = at(gR_), a.grad_W = at(gW_), a.grad_bias = at(gb_);
    a.grad_W_bias = at(gWb_), a.grad_h0 = at(gh0_), a.grad_c0 = at(gc0_);
    return a;
  }

  std::vector<DeviceTensor*> backward_outputs() const {
    std::vector<DeviceTensor*> v;
    for (const Owned* t : {&gwx_, &gR_, &gW_, &gb_, &gWb_, &gh0_, &gc0_})
      if (*t) v.push_back(t->get());
    return v;
  }

  void poison_backward() const {
    for (DeviceTensor* t : backward_outputs()) t->poison();
    bws_->poison();
  }

  void run_backward(cudaStream_t stream) const {
    poison_backward();
    launch_or_throw(exphil::kernels::launch_gated_rnn_stack_backward(backward_params(), bplan_,
                                                                      backward_workspace(), stream));
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (stack backward)");
  }

  void run_backward_api(cudaStream_t stream, exphil::GatedRnnLaunchInfo* info) const {
    poison_backward();
    const exphil::GatedRnnLaunchOptions o = api_options(info);
    finish_api(exphil::gated_rnn_stack_backward(backward_api_args(), stream, &o), stream);
  }

  std::vector<std::vector<unsigned char>> backward_bytes() const { return raw(backward_outputs()); }

  // Every gradient against the reference's (gated_rnn_stack_backward), at
  // the one-layer backward's scales: the sequence's and the initial
  // states' gradients at the largest of them, grad_R, grad_bias, grad_W
  // and grad_W_bias also at the largest sum of their terms.
  double check_backward_against_reference() const {
    const Tolerance tol = line(c_.dtype), wtol = group_tolerance(c_.weight_dtype),
                    stol = group_tolerance(c_.state_dtype);
    const auto g = exphil::reference::gated_rnn_stack_backward(p_, grad_y_, grad_y_lower_, grad_hf_, grad_cf_);
    const int64_t L = c_.layers, B = c_.B, H = c_.H, GH = gates() * H;
    const auto n = [](int64_t v) { return static_cast<std::size_t>(v); };
    double gscale = max_abs(g.wx);
    for (int64_t l = 0; l < L; ++l) gscale = std::max({gscale, max_abs(g.h0[n(l)]), max_abs(g.c0[n(l)])});
    double worst = 0;
    const auto judge = [&](const std::vector<double>& got, const std::vector<double>& want, Tolerance tl,
                           double scale, const char* name, int64_t l) {
      const Comparison cmp = compare(got, want, tl, scale);
      INFO(c_.describe() << " layer " << l << "\n" << cmp.describe(name));
      CHECK(cmp.ok);
      worst = std::max(worst, cmp.worst_ratio);
    };
    if (gwx_) judge(gwx_->values(), g.wx, tol, gscale, "grad_wx", 0);
    for (int64_t l = 0; l < L; ++l) {
      const std::size_t i = n(l);
      if (gR_) judge(part(gR_, i, n(H * GH)), g.R[i], wtol, std::max(gscale, max_abs(g.R_terms[i])), "grad_R", l);
      judge(part(gb_, i, n(GH)), g.bias[i], wtol, std::max(gscale, max_abs(g.bias_terms[i])), "grad_bias", l);
      judge(part(gh0_, i, n(B * H)), g.h0[i], stol, gscale, "grad_h0", l);
      if (gc0_) judge(part(gc0_, i, n(B * H)), g.c0[i], stol, gscale, "grad_c0", l);
      if (l == 0) continue;
      judge(part(gW_, i - 1, n(H * GH)), g.W[i - 1], wtol, std::max(gscale, max_abs(g.W_terms[i - 1])),
            "grad_W", l);
      if (gWb_)
        judge(part(gWb_, i - 1, n(GH)), g.W_bias[i - 1], wtol,
              std::max(gscale, max_abs(g.W_bias_terms[i - 1])), "grad_W_bias", l);
    }
    for (DeviceTensor* t : backward_outputs()) CHECK(t->guards_intact());
    return worst;
  }

 private:
  int64_t gates() const { return c_.kind == GatedRnnKind::gru ? 3 : 4; }
  exphil::kernels::GatedRnnCell cell() const {
    return c_.kind == GatedRnnKind::gru ? exphil::kernels::GatedRnnCell::gru
                                        : exphil::kernels::GatedRnnCell::lstm;
  }
  // The tolerance of a tensor of the weights' or the states' dtype (f32 or
  // the sequence's): its own where that is 16-bit, else the sequence's.
  Tolerance group_tolerance(DType group) const {
    return line(group == DType::f32 ? c_.dtype : group);
  }
  // A dtype's line, or f32 on tensor cores' for every output where the case
  // asks for it (f32_tensor_cores: the plans take it with f32 weights).
  Tolerance line(DType d) const {
    return c_.options.f32_tensor_cores == 1 && c_.dtype == DType::f32
               ? gated_rnn_f32_tensor_cores_tolerance()
               : gated_rnn_tolerance(d);
  }
  // Layer l's part (of `size` elements) of a stacked output's values.
  static std::vector<double> part(const Owned& t, std::size_t l, std::size_t size) {
    const std::vector<double> all = t->values();
    return std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(l * size),
                               all.begin() + static_cast<std::ptrdiff_t>((l + 1) * size));
  }
  static std::vector<std::vector<unsigned char>> raw(const std::vector<DeviceTensor*>& tensors) {
    std::vector<std::vector<unsigned char>> v;
    for (DeviceTensor* t : tensors) v.push_back(t->raw());
    return v;
  }
  // The public API's options for this case; `info` receives the layout.
  exphil::GatedRnnLaunchOptions api_options(exphil::GatedRnnLaunchInfo* info) const {
    exphil::GatedRnnLaunchOptions o;
    o.units_per_block = c_.options.units_per_block;
    o.batch_blocks = c_.options.batch_blocks;
    o.k_split = c_.options.k_split;
    o.stack_wavefront = c_.options.stack_wavefront;
    o.tensor_cores = c_.options.tensor_cores;
    o.chosen = info;
    return o;
  }
  static void finish_api(const Status& s, cudaStream_t stream) {
    if (!s.ok()) throw std::runtime_error(s.message());
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize (stack API)");
  }
  // Element `index` of a stacked tensor, or null where it is absent.
  static void* slice(const Owned& t, DType dtype, int64_t index) {
    if (!t) return nullptr;
    return static_cast<char*>(t->desc().data) + index * static_cast<int64_t>(dtype_size(dtype));
  }

  StackCase c_;
  GatedRnnStackProblem p_;
  Owned wx_, R_, W_, bias_, W_bias_, h0_, c0_, y_, y_lower_, hf_, cf_;
  GatedRnnPlan plan_{};
  std::unique_ptr<DeviceScratch> ws_;
  // The backward's.
  std::vector<double> grad_y_;
  std::vector<std::vector<double>> grad_y_lower_, grad_hf_, grad_cf_;
  Owned gy_, gyl_, ghf_, gcf_, gwx_, gR_, gW_, gb_, gWb_, gh0_, gc0_;
  GatedRnnPlan bplan_{};
  std::unique_ptr<DeviceScratch> bws_;
};

}  // namespace

TEST_CASE("gated RNN stack: GRU and LSTM layers against the reference", "[gpu][gated_rnn]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  struct Shape {
    int layers;
    int64_t B, T, H;
    int units, k_split, wavefront, groups;
    // The layout the planner gives: the k-split wavefront, the block
    // layout's, or layer by layer.
    enum class Want { k_split, blocks, layered } want;
    bool gru_units_only = false;  // the LSTM's units chosen by the planner
  };
  using W = Shape::Want;
  // B = 1 in the k-split wavefront (forced units among them), then the
  // block layout's wavefront (B 2 to 4, H above 256, the k split turned
  // off; a group's rows beyond one pass of the threads, the GRU's: the
  // LSTM's 4 x 65 columns would exceed a block's), then layer by layer
  // (above B = 4, or turned off).
  const Shape shapes[] = {{2, 1, 1, 1, 0, -1, -1, 0, W::k_split},
                          {2, 1, 32, 256, 0, -1, -1, 0, W::k_split},
                          {3, 1, 5, 37, 0, -1, -1, 0, W::k_split},
                          {2, 1, 300, 64, 0, -1, -1, 0, W::k_split},
                          {4, 1, 33, 64, 0, -1, -1, 0, W::k_split},
                          {2, 1, 2, 255, 0, -1, -1, 0, W::k_split},
                          {3, 1, 20, 100, 4, -1, -1, 0, W::k_split},
                          {2, 1, 33, 130, 2, -1, -1, 0, W::k_split},
                          {4, 1, 7, 30, 1, -1, -1, 0, W::k_split},
                          {3, 1, 300, 100, 0, -1, -1, 0, W::k_split},
                          {2, 3, 20, 64, 0, -1, -1, 0, W::blocks},
                          {3, 33, 7, 100, 0, -1, -1, 0, W::layered},
                          {4, 2, 6, 37, 0, -1, -1, 0, W::blocks},
                          {2, 1, 5, 257, 0, -1, -1, 0, W::blocks},
                          {2, 1, 9, 64, 0, 0, -1, 0, W::blocks},
                          {2, 4, 70, 256, 0, -1, -1, 0, W::blocks},
                          {2, 4, 20, 70, 65, -1, -1, 0, W::blocks, true},
                          {3, 64, 33, 17, 0, -1, -1, 0, W::layered},
                          {2, 3, 20, 64, 0, -1, 0, 0, W::layered},
                          {3, 33, 7, 100, 0, -1, 0, 0, W::layered},
                          {2, 40, 9, 64, 0, -1, -1, 1, W::layered}};
  struct DTypes {
    DType dtype, weight, state;
  };
  const DTypes dtypes[] = {{DType::f32, DType::f32, DType::f32},
                           {DType::bf16, DType::bf16, DType::f32},
                           {DType::f16, DType::f32, DType::f16}};
  double worst = 0;
  int cases = 0, wavefront = 0, blocks = 0, i = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (const DTypes& d : dtypes)
      for (const Shape& s : shapes) {
        StackCase c;
        c.kind = kind;
        c.dtype = d.dtype, c.weight_dtype = d.weight, c.state_dtype = d.state;
        c.layers = s.layers, c.B = s.B, c.T = s.T, c.H = s.H;
        c.options.units_per_block = kind == GatedRnnKind::lstm && s.gru_units_only ? 0 : s.units;
        c.options.k_split = s.k_split;
        c.options.stack_wavefront = s.wavefront;
        c.options.batch_blocks = s.groups;
        // Every optional input and output on in the first case, off in the
        // second, then each in about half.
        const unsigned bits = i == 0 ? 63u : i == 1 ? 0u : (11u * static_cast<unsigned>(i) + 5u) & 63u;
        c.bias = bits & 1, c.input_bias = bits & 2, c.h0 = bits & 4, c.c0 = bits & 8,
        c.finals = bits & 16, c.lower_y = bits & 32;
        StackRun run(c, seed + static_cast<uint64_t>(i));
        // Every third wavefront case with the shallowest rings.
        if (i % 3 == 2 && run.plan().stack_depth > 0) run.set_depth(2);
        ++i;
        const GatedRnnPlan& plan = run.plan();
        INFO(c.describe() << " | "
                          << (plan.stack_depth == 0 ? "layer by layer, "
                              : plan.k_split        ? "k-split wavefront, "
                                                    : "block wavefront, ")
                          << plan.blocks << " blocks of " << plan.units_per_block << " units, "
                          << plan.batch_blocks << " groups of " << plan.batch_rows << " rows, ring "
                          << plan.stack_depth);
        CHECK((plan.stack_depth > 0 && plan.k_split) == (s.want == W::k_split));
        CHECK((plan.stack_depth > 0 && !plan.k_split) == (s.want == W::blocks));
        if (c.options.units_per_block > 64) CHECK(plan.batch_rows * plan.units_per_block > 256);
        wavefront += plan.stack_depth > 0;
        blocks += plan.stack_depth > 0 && !plan.k_split;
        run.run(stream.s);
        worst = std::max(worst, run.check_against_reference());
        ++cases;
      }
  std::printf("gated RNN stack: %d cases (%d in a wavefront, %d of them in the block layout), worst "
              "error/allowed %.3g\n",
              cases, wavefront, blocks, worst);
}

TEST_CASE("gated RNN stack: two runs and a graph replay are bitwise equal", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t B : {1, 3, -9}) {  // the two wavefronts; layer by layer (-9)
        StackCase c = StackCase::everything(kind, dtype, 2, B < 0 ? -B : B, 40, 255);
        if (B < 0) c.options.stack_wavefront = 0;
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
    StackCase c = StackCase::everything(kind, kind == GatedRnnKind::gru ? DType::f32 : DType::bf16, 3, 1, 9, 37);
    {
      StackRun run(c, test_seed());
      if (kind == GatedRnnKind::gru) run.set_depth(2);  // the wait for the layer above, and none
      INFO(c.describe());
      run.run(stream.s);
      CHECK(run.check_against_reference() <= 1.0);
    }
    // B = 3: the block layout's wavefront (rings of 2 slots for the GRU),
    // then layer by layer, the lower layers' y in the workspace.
    for (int wavefront : {-1, 0}) {
      StackCase d = c;
      d.B = 3, d.T = 5, d.lower_y = false;
      d.options.stack_wavefront = wavefront;
      StackRun run(d, test_seed());
      INFO(d.describe());
      CHECK((run.plan().stack_depth > 0) == (wavefront != 0));
      CHECK_FALSE(run.plan().k_split);
      if (wavefront != 0 && kind == GatedRnnKind::gru) run.set_depth(2);
      run.run(stream.s);
      CHECK(run.check_against_reference() <= 1.0);
    }
    // The backward, a subset of the gradients asked for, in the reverse
    // wavefront at B2.
    c.B = 2, c.T = 6, c.all_grads = kind == GatedRnnKind::lstm;
    StackRun run(c, test_seed());
    INFO(c.describe());
    run.run(stream.s);
    run.prepare_backward(test_seed() + 1);
    REQUIRE(run.backward_plan().stack_depth > 0);
    run.run_backward(stream.s);
    CHECK(run.check_backward_against_reference() <= 1.0);
  }
}

// exphil::gated_rnn_stack_forward (the stacked tensors whole, as bindings
// pass them) runs the same kernels as the kernel layer: the same bytes, in
// the k-split wavefront (B1), the block layout's (B3) and layer by layer
// (B3, the wavefront turned off), and says which it took.
TEST_CASE("gated RNN stack: the C++ API gives the kernel layer's results, bitwise", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t B : {1, 3, -3}) {  // -3: B3 layer by layer
        StackCase c = StackCase::everything(kind, dtype, 3, B < 0 ? -B : B, 33, 100);
        if (B < 0) c.options.stack_wavefront = 0;
        StackRun run(c, test_seed());
        INFO(c.describe());
        run.run(stream.s);
        const auto direct = run.bytes();
        exphil::GatedRnnLaunchInfo info;
        run.run_api(stream.s, &info);
        CHECK(run.bytes() == direct);
        CHECK(info.stacked == (B > 0));
        CHECK(info.k_split == (B == 1));
        CHECK(info.kernels == (B > 0 ? 1 : 2 * c.layers - 1));
        CHECK(info.blocks == run.plan().blocks);
        CHECK(run.check_against_reference() <= 1.0);
      }
}

// The stack's backward (run_gated_rnn_stack_backward) after the forward,
// against the reference's gated_rnn_stack_backward: L 2 to 4, B 1 to 5
// and 33 (the forward in a wavefront up to B4, so the backward's
// recomputed inputs differ from what the forward fed the layers above by
// the dtype's rounding of y; the backward's reverse wavefront up to B4 but
// B3 T1), T 1 to 300, H 1 to 257; with and without every optional input,
// the gradients of the lower layers' y and of the final states; every
// gradient asked for or a subset; f32, bf16 and f16 with the forward's
// weight and state dtypes; the products on CUDA cores and tensor cores.
TEST_CASE("gated RNN stack backward: GRU and LSTM layers against the reference", "[gpu][gated_rnn]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  struct Shape {
    int layers;
    int64_t B, T, H;
  };
  const Shape shapes[] = {{2, 1, 1, 1},   {2, 1, 32, 256}, {3, 1, 5, 37},  {2, 1, 300, 64},
                          {4, 1, 33, 64}, {2, 3, 20, 64},  {3, 33, 7, 100}, {4, 2, 6, 37},
                          {2, 1, 5, 257}, {2, 5, 9, 130}, {3, 3, 1, 37}};
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
        const unsigned bits = i == 0 ? 255u : i == 1 ? 0u : (13u * static_cast<unsigned>(i) + 7u) & 255u;
        c.bias = bits & 1, c.input_bias = bits & 2, c.h0 = bits & 4, c.c0 = bits & 8;
        c.grad_lower = bits & 16, c.grad_finals = bits & 32, c.all_grads = (bits & 64) || i == 1;
        c.options.tensor_cores = (bits & 128) ? 0 : -1;
        c.finals = true, c.lower_y = true;
        StackRun run(c, seed + static_cast<uint64_t>(i));
        ++i;
        run.run(stream.s);
        REQUIRE(run.check_against_reference() <= 1.0);
        run.prepare_backward(seed + 1000 + static_cast<uint64_t>(i));
        INFO(c.describe() << " | backward plan: " << run.backward_plan().blocks << " blocks, "
                          << (run.backward_plan().stack_depth > 0 ? "the reverse wavefront"
                                                                  : "layer by layer")
                          << ", products on "
                          << (run.backward_plan().gemm_tensor_cores ? "tensor cores" : "CUDA cores"));
        CHECK(run.backward_plan().gemm_tensor_cores ==
              (d.dtype != DType::f32 && c.options.tensor_cores != 0));
        // The reverse wavefront up to B4, above B1 from two steps.
        CHECK((run.backward_plan().stack_depth > 0) == (s.B <= 4 && (s.B == 1 || s.T >= 2)));
        wavefront += run.backward_plan().stack_depth > 0;
        run.run_backward(stream.s);
        worst = std::max(worst, run.check_backward_against_reference());
        ++cases;
      }
  std::printf("gated RNN stack backward: %d cases (%d in the reverse wavefront), worst error/allowed %.3g\n",
              cases, wavefront, worst);
}

// f32 at precision tf32 (f32_tensor_cores), GRU and LSTM stacks: layer by
// layer from B > 4 (each layer's forward, walk and products on tensor
// cores, the projections on CUDA cores), and in the wavefronts up to B4
// (whose one-launch forward and walks stay exact; the backward's per-layer
// products take the tensor cores), forward and backward against the
// reference on the tf32 line; the C++ API at precision tf32 gives the
// kernel layer's bytes.
TEST_CASE("gated RNN stack: f32 at precision tf32", "[gpu][gated_rnn]") {
  const uint64_t seed = test_seed();
  INFO("seed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")");
  RnnStream stream;
  struct Shape {
    int layers;
    int64_t B, T, H;
  };
  double worst = 0;
  int i = 0;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (const Shape& s : {Shape{2, 9, 7, 64}, Shape{3, 33, 4, 48}, Shape{2, 3, 5, 64}}) {
      StackCase c = StackCase::everything(kind, DType::f32, s.layers, s.B, s.T, s.H);
      c.weight_dtype = c.state_dtype = DType::f32;
      c.options.f32_tensor_cores = 1;
      StackRun run(c, seed + static_cast<uint64_t>(i++));
      INFO(c.describe());
      run.run(stream.s);
      worst = std::max(worst, run.check_against_reference());
      const auto forward = run.bytes();
      exphil::GatedRnnLaunchInfo info;
      run.run_api(stream.s, &info);
      CHECK(run.bytes() == forward);
      CHECK(info.stacked == (s.B <= 4));
      run.prepare_backward(seed + 1000 + static_cast<uint64_t>(i));
      CHECK(run.backward_plan().gemm_tensor_cores);
      run.run_backward(stream.s);
      worst = std::max(worst, run.check_backward_against_reference());
      const auto backward = run.backward_bytes();
      run.run_backward_api(stream.s, nullptr);
      CHECK(run.backward_bytes() == backward);
    }
  std::printf("gated RNN stack at precision tf32: %d cases, worst error/allowed %.3g\n", i, worst);
  CHECK(worst <= 1.0);
}

// Two runs, a graph replay and the C++ API give the same bytes; the API
// reports its kernels.
TEST_CASE("gated RNN stack backward: bitwise deterministic, captured, and through the C++ API",
          "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm})
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t B : {1, 9, -1}) {  // the reverse wavefront; layer by layer (9, and -1: B1 turned off)
        StackCase c = StackCase::everything(kind, dtype, 3, B < 0 ? -B : B, 40, 100);
        if (B < 0) c.options.stack_wavefront = 0;
        StackRun run(c, test_seed());
        INFO(c.describe());
        run.run(stream.s);
        run.prepare_backward(test_seed() + 1);
        run.run_backward(stream.s);
        const auto first = run.backward_bytes();
        CHECK(run.check_backward_against_reference() <= 1.0);
        run.run_backward(stream.s);
        CHECK(run.backward_bytes() == first);

        run.poison_backward();
        cudaGraphExec_t exec = capture(stream.s, [&] {
          launch_or_throw(exphil::kernels::launch_gated_rnn_stack_backward(
              run.backward_params(), run.backward_plan(), run.backward_workspace(), stream.s));
        });
        for (int k = 0; k < 2; ++k) check_cuda(cudaGraphLaunch(exec, stream.s), "cudaGraphLaunch");
        check_cuda(cudaStreamSynchronize(stream.s), "cudaStreamSynchronize");
        cudaGraphExecDestroy(exec);
        CHECK(run.backward_bytes() == first);

        exphil::GatedRnnLaunchInfo info;
        run.run_backward_api(stream.s, &info);
        CHECK(run.backward_bytes() == first);
        CHECK(info.stacked == (B == 1));
        CHECK(info.stacked == (run.backward_plan().stack_depth > 0));
        CHECK(info.kernels == exphil::kernels::gated_rnn_stack_backward_kernel_count(run.backward_params(),
                                                                                     run.backward_plan()));
        // Layer by layer each layer's 3 or more and 4 per layer above; the
        // wavefront's one walk, each layer's 2 or more and 1 per layer above.
        CHECK(info.kernels >= (info.stacked ? 1 + 2 * c.layers + (c.layers - 1)
                                            : 3 * c.layers + 4 * (c.layers - 1)));
      }
}

// A 16-bit stack layer by layer with tensor_cores = 0: the projections on
// CUDA cores, forward and backward.
TEST_CASE("gated RNN stack: 16-bit layers with the products on CUDA cores", "[gpu][gated_rnn]") {
  RnnStream stream;
  for (GatedRnnKind kind : {GatedRnnKind::gru, GatedRnnKind::lstm}) {
    StackCase c = StackCase::everything(kind, DType::bf16, 2, 3, 17, 64);
    c.options.tensor_cores = 0;
    c.options.stack_wavefront = 0;
    StackRun run(c, test_seed());
    INFO(c.describe());
    REQUIRE(run.plan().stack_depth == 0);
    CHECK_FALSE(run.plan().gemm_tensor_cores);
    run.run(stream.s);
    CHECK(run.check_against_reference() <= 1.0);
    run.prepare_backward(test_seed() + 1);
    CHECK_FALSE(run.backward_plan().gemm_tensor_cores);
    run.run_backward(stream.s);
    CHECK(run.check_backward_against_reference() <= 1.0);
  }
}
