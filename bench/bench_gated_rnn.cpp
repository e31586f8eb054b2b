// GRU and LSTM sequences (issue 30): exphil::gated_rnn_forward / _backward
// at issue 30's shapes (B1 T32 H256, B1 T1 H256, B32 T64 H256, B64 T256
// H512) and B4 T32 H256 (a small batch's stack), f32 and bf16, against the floor and a one-launch-per-step
// baseline in the same run. Its cuDNN peer (torch.nn.GRU / LSTM) runs in
// bench/peers/cudnn_rnn.py; bench/run_gated_rnn.sh runs both and prints the
// ratios against issue 30's targets.
//
// What one row times (the tensors as a PyTorch nn.GRU / nn.LSTM user has
// them: weights and the recurrent bias in the sequence dtype, no h0,
// h_final and c_final written in f32):
//   L      layers: 1, or 2 as two calls back to back (layer 2 after layer 1,
//          not a wavefront).
//   proj   yes: before each layer's call its input projection wx = x W
//          ([B*T, H] x [H, G*H]) through bench_gemm.h (cuBLAS, f32 as TF32
//          as cuDNN under PyTorch's default cudnn.allow_tf32), layer 2's x
//          being layer 1's y; in the backward, after each layer's call,
//          grad_W = x^T grad_wx and grad_x = grad_wx W^T (layer 1's grad_x
//          too, as torch computes x.grad), layer 1's grad_y being layer 2's
//          grad_x. The input bias b_ih and its gradient are left out (an
//          add that a product's epilogue would fuse; for the LSTM and the
//          GRU's r and z its gradient is grad_bias). This is what
//          torch.nn.GRU(H, H, L) computes: cudnn_rnn.py's "yes" rows.
//          no: the kernels alone on a given wx (layer 2's wx is its own
//          input, not layer 1's y projected): cudnn_rnn.py's nearest rows are
//          "in1" (input size 1, one layer).
//   dir    fwd: the forward (y, h_final, c_final); fwd+bwd: the forward
//          then the backward (grad_wx, grad_R, grad_bias; no grad_h0).
//   For B <= 4, one more row, proj "uw": the one-layer forward of "proj no"
//   in the unit-warps layout (GatedRnnLaunchOptions::unit_warps); for B = 1
//   another, proj "blk", in the block layout (GatedRnnLaunchOptions::k_split
//   = 0; the k-split layout is B1's default); for B > 4 in bf16, two, proj
//   "cc", fwd and fwd+bwd on CUDA cores (GatedRnnLaunchOptions::tensor_cores
//   = 0: the forward's product, the backward's two and its walk's): the layouts side
//   by side (compare_gated_rnn.py skips them). For GRU and LSTM, where the
//   stack's forward is one launch (the k-split wavefront at B = 1, the
//   block layout's elsewhere), two rows proj "stk": the two-layer forward
//   of "proj yes" as one call of the stacked op (layer 2 trailing layer 1
//   by a step), and
//   forward + backward with the stacked backward (stacked_row says what
//   each includes), which compare_gated_rnn.py pairs with cuDNN's "yes".
//   --layouts times the stack's backward both ways alone
//   (run_stack_backward_plans).
// Columns: events_us, CUDA events around one call from the host (our
// validation and launch included: eager); graph_us, replay of a CUDA graph
// of 20 calls (1 call at the larger shapes) back to back, per call; the
// floor and which term sets it; graph_us over the floor; host_us, the host
// time to enqueue a call; stepwise_us, the one-launch-per-step baseline
// (gated_rnn_stepwise.h: T launches a layer forward, 2T - 1 launches and
// two matrix products backward, with the same projections), graph replay,
// and its time over ours. Medians; calls rotate over input sets (weights
// included) that exceed twice the L2 cache.
//
// Floor (cuda/gated_rnn/gated_rnn_forward.cuh's header: bytes, FLOPs, or
// the chain of T dependent steps), the largest of:
//   bytes   each tensor the call takes or gives, once (with proj, wx and
//           grad_wx stay on chip), over the copy bandwidth of this run;
//   flops   the recurrent products (2 B T H G H a layer forward, twice that
//           backward) at the f32 FMA rate measured here (CUDA cores, as the
//           f32 kernels run them; in bf16 the forward's product above B4
//           and the backward's two products run on tensor cores, and can
//           go under it), plus the projections at the rate Gemm reached at
//           4096^3;
//   chain   T + L - 1 dependent steps per direction (layer 2 can trail
//           layer 1 by one step), each one handoff between multiprocessors
//           through L2 (a flag passed between two blocks, measured here),
//           plus one launch.
// Each shape is first checked: on one input set (seed printed), one layer,
// both directions, outputs poisoned first, every element finite, batch
// rows 0 and B-1 against the double reference (test/reference), grad_R and
// grad_bias too where those are all the rows; the baseline and the
// projection's products likewise (normwise error).
#include "bench_gated_rnn.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "bench_gemm.h"
#include "bench_kernels.h"
#include "bench_support.hpp"
#include "compare.hpp"
#include "dtype_codec.hpp"
#include "exphil/gated_rnn.hpp"
#include "gated_rnn_reference.hpp"
#include "gated_rnn_stepwise.h"
#include "scan_problems.hpp"
#include "timing.hpp"

namespace exphil::bench {

namespace {

// The cells timed, with their gate counts: a new cell of exphil/gated_rnn.hpp
// is one line here (the baseline and the reference check say "n/a" for a
// cell they do not know).
struct CellSpec {
  GatedRnnCell cell;
  int gates;
};
constexpr CellSpec kCells[] = {
    {GatedRnnCell::gru, 3},
    {GatedRnnCell::lstm, 4},
};

struct Shape {
  int64_t batch, steps, hidden;
};
constexpr Shape kShapes[] = {{1, 32, 256}, {1, 1, 256}, {4, 32, 256}, {32, 64, 256}, {64, 256, 512}};

std::string shape_name(const Shape& s) {
  return "B" + std::to_string(s.batch) + " T" + std::to_string(s.steps) + " H" +
         std::to_string(s.hidden);
}

// Calls this small are timed 20 to a graph (the gaps between launches
// matter), larger ones 1 to a graph; cudnn_rnn.py uses the same rule.
bool small_call(const Shape& s) { return s.batch * s.steps * s.hidden <= 65536; }

struct Rates {
  double fma_flops = 0;                 // f32 FMAs on CUDA cores, FLOP/s
  double gemm_flops[2] = {0, 0};        // Gemm at 4096^3: f32, bf16
  double handoff_us = 0;                // one pass of a flag between two SMs through L2
  std::string handoff_note;
};

int dtype_index(DType d) { return d == DType::f32 ? 0 : 1; }

struct Problem {
  CellSpec cell;
  DType dtype;
  Shape s;
  bool has_c;  // the cell has a c_final (tensor_slot knows)
  // f32 rows at GatedRnnPrecision::tf32 (--f32-tensor-cores).
  bool f32_tensor_cores = false;
  int64_t gh() const { return cell.gates * s.hidden; }
  GatedRnnPrecision precision() const {
    return f32_tensor_cores ? GatedRnnPrecision::tf32 : GatedRnnPrecision::exact;
  }
};

// One layer's tensors in one input set. Layer 2's x is layer 1's y.
struct Layer {
  Tensor x{}, W{}, wx{}, wxp{}, R{}, RT{}, bias{}, y{}, h_final{}, c_final{}, grad_y{};
  Tensor grad_wx{}, grad_R{}, grad_bias{}, grad_W{}, grad_x{};
};

struct CallSet {
  DeviceTensors memory;
  Layer layer[2];
};

std::unique_ptr<CallSet> make_call_set(const Problem& p, uint64_t seed, cudaStream_t stream,
                                       double* bytes) {
  auto set = std::make_unique<CallSet>();
  const int64_t B = p.s.batch, T = p.s.steps, H = p.s.hidden, GH = p.gh();
  const DType dt = p.dtype;
  const float w = 1.0f / std::sqrt(static_cast<float>(H));  // torch's RNN init range
  uint64_t k = 0;
  auto make = [&](DType type, std::initializer_list<int64_t> shape, float lo, float hi) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    *bytes += n * static_cast<double>(dtype_size(type));
    return set->memory.make(type, shape, lo, hi, seed * 64 + k++, stream);
  };
  for (int l = 0; l < 2; ++l) {
    Layer& ly = set->layer[l];
    ly.x = l == 0 ? make(dt, {B, T, H}, -1, 1) : set->layer[0].y;
    ly.W = make(dt, {H, GH}, -w, w);
    ly.wx = make(dt, {B, T, GH}, -1.5f, 1.5f);
    ly.wxp = make(dt, {B, T, GH}, 0, 0);
    ly.R = make(dt, {H, GH}, -w, w);
    ly.RT = make(dt, {GH, H}, 0, 0);  // the baseline's copy of R, transposed
    check_cuda(launch_transpose(ly.R.data, ly.RT.data, H, GH, dt, stream), "transpose");
    ly.bias = make(dt, {GH}, -w, w);
    ly.y = make(dt, {B, T, H}, 0, 0);
    ly.h_final = make(DType::f32, {B, H}, 0, 0);
    ly.c_final = make(DType::f32, {B, H}, 0, 0);
    ly.grad_y = make(dt, {B, T, H}, -1, 1);
    ly.grad_wx = make(dt, {B, T, GH}, 0, 0);
    ly.grad_R = make(dt, {H, GH}, 0, 0);
    ly.grad_bias = make(dt, {GH}, 0, 0);
    ly.grad_W = make(dt, {H, GH}, 0, 0);
    ly.grad_x = make(dt, {B, T, H}, 0, 0);
  }
  return set;
}

GatedRnnForwardArgs forward_args(const Problem& p, const Layer& ly, bool proj) {
  GatedRnnForwardArgs a;
  a.cell = p.cell.cell;
  a.options.precision = p.precision();
  a.wx = proj ? &ly.wxp : &ly.wx;
  a.R = &ly.R;
  a.bias = &ly.bias;
  a.y = &ly.y;
  a.h_final = &ly.h_final;
  if (const Tensor** slot = tensor_slot(a, "c_final")) *slot = &ly.c_final;
  return a;
}

// Layer l's backward in a stack of `layers`: with proj, a lower layer's
// grad_y is the grad_x of the layer above.
GatedRnnBackwardArgs backward_args(const Problem& p, const CallSet& set, int l, int layers,
                                   bool proj) {
  const Layer& ly = set.layer[l];
  GatedRnnBackwardArgs a;
  a.cell = p.cell.cell;
  a.options.precision = p.precision();
  a.wx = proj ? &ly.wxp : &ly.wx;
  a.R = &ly.R;
  a.bias = &ly.bias;
  a.y = &ly.y;
  a.grad_y = proj && l + 1 < layers ? &set.layer[l + 1].grad_x : &ly.grad_y;
  a.grad_wx = &ly.grad_wx;
  a.grad_R = &ly.grad_R;
  a.grad_bias = &ly.grad_bias;
  return a;
}

// The projection's products of layer `ly` (forward: wxp = x W; backward:
// grad_W, grad_x).
void project_forward(const Problem& p, const Layer& ly, const Gemm& gemm) {
  const int64_t BT = p.s.batch * p.s.steps, H = p.s.hidden;
  gemm.run(BT, p.gh(), H, ly.x.data, false, ly.W.data, false, p.dtype, ly.wxp.data, p.dtype);
}
void project_backward(const Problem& p, const Layer& ly, const Gemm& gemm) {
  const int64_t BT = p.s.batch * p.s.steps, H = p.s.hidden;
  gemm.run(H, p.gh(), BT, ly.x.data, true, ly.grad_wx.data, false, p.dtype, ly.grad_W.data, p.dtype);
  gemm.run(BT, H, p.gh(), ly.grad_wx.data, false, ly.W.data, true, p.dtype, ly.grad_x.data, p.dtype);
}

void enqueue_ours(const Problem& p, const CallSet& set, int layers, bool proj, bool both,
                  const Gemm& gemm, cudaStream_t stream) {
  for (int l = 0; l < layers; ++l) {
    if (proj) project_forward(p, set.layer[l], gemm);
    require(gated_rnn_forward(forward_args(p, set.layer[l], proj), stream), "gated_rnn_forward");
  }
  if (!both) return;
  for (int l = layers - 1; l >= 0; --l) {
    require(gated_rnn_backward(backward_args(p, set, l, layers, proj), stream), "gated_rnn_backward");
    if (proj) project_backward(p, set.layer[l], gemm);
  }
}

// The baseline's scratch for one layer (f32), and grad_R / grad_bias.
struct StepScratch {
  float *h = nullptr, *c = nullptr, *hist = nullptr, *saved = nullptr, *grad_rh = nullptr;
  float *dh = nullptr, *dh_direct = nullptr, *dc = nullptr, *grad_R = nullptr, *grad_bias = nullptr;
};

struct Stepwise {
  DeviceTensors memory;
  StepScratch layer[2];
  float* ones = nullptr;  // [B * T], for grad_bias as a product
};

std::unique_ptr<Stepwise> make_stepwise(const Problem& p, cudaStream_t stream) {
  auto sw = std::make_unique<Stepwise>();
  const int64_t B = p.s.batch, T = p.s.steps, H = p.s.hidden, GH = p.gh();
  auto make = [&](int64_t n) {
    return static_cast<float*>(sw->memory.make(DType::f32, {n}, 0, 0, 0, stream).data);
  };
  for (StepScratch& sc : sw->layer) {
    sc.h = make(2 * B * H);
    sc.c = make(B * H);
    sc.hist = make(B * T * H);
    sc.saved = make(B * T * kStepwiseSavedSlots * H);
    sc.grad_rh = make(B * T * GH);
    sc.dh = make(B * H);
    sc.dh_direct = make(B * H);
    sc.dc = make(B * H);
    sc.grad_R = make(H * GH);
    sc.grad_bias = make(GH);
  }
  sw->ones = make(B * T);
  check_cuda(fill_uniform(sw->ones, DType::f32, static_cast<std::size_t>(B * T), 1.0f, 1.0f, 0, stream),
             "fill");
  return sw;
}

GatedRnnStepwiseParams stepwise_params(const Problem& p, const CallSet& set, const StepScratch& sc,
                                       int l, int layers, bool proj) {
  const Layer& ly = set.layer[l];
  GatedRnnStepwiseParams q;
  q.cell = p.cell.cell;
  q.dtype = p.dtype;
  q.batch = p.s.batch;
  q.steps = p.s.steps;
  q.hidden = p.s.hidden;
  q.wx = (proj ? ly.wxp : ly.wx).data;
  q.R = ly.R.data;
  q.RT = ly.RT.data;
  q.bias = ly.bias.data;
  q.y = ly.y.data;
  q.h_final = static_cast<float*>(ly.h_final.data);
  q.c_final = p.has_c ? static_cast<float*>(ly.c_final.data) : nullptr;
  q.h = sc.h;
  q.c = sc.c;
  q.hist = sc.hist;
  q.saved = sc.saved;
  q.grad_y = (proj && l + 1 < layers ? set.layer[l + 1].grad_x : ly.grad_y).data;
  q.grad_wx = ly.grad_wx.data;
  q.grad_rh = sc.grad_rh;
  q.dh = sc.dh;
  q.dh_direct = sc.dh_direct;
  q.dc = sc.dc;
  return q;
}

void enqueue_stepwise(const Problem& p, const CallSet& set, const Stepwise& sw, int layers,
                      bool proj, bool both, const Gemm& gemm, cudaStream_t stream) {
  const int64_t BT = p.s.batch * p.s.steps, H = p.s.hidden, GH = p.gh();
  for (int l = 0; l < layers; ++l) {
    if (proj) project_forward(p, set.layer[l], gemm);
    check_cuda(launch_stepwise_rnn_forward(stepwise_params(p, set, sw.layer[l], l, layers, proj), both,
                                           stream),
               "stepwise forward");
  }
  if (!both) return;
  for (int l = layers - 1; l >= 0; --l) {
    const StepScratch& sc = sw.layer[l];
    check_cuda(launch_stepwise_rnn_backward(stepwise_params(p, set, sc, l, layers, proj), stream),
               "stepwise backward");
    gemm.run(H, GH, BT, sc.hist, true, sc.grad_rh, false, DType::f32, sc.grad_R, DType::f32);
    gemm.run(1, GH, BT, sw.ones, false, sc.grad_rh, false, DType::f32, sc.grad_bias, DType::f32);
    if (proj) project_backward(p, set.layer[l], gemm);
  }
}

// ---------------------------------------------------------------------------
// Floors.

struct Floor {
  double us = 0;
  const char* bound = "";
};

Floor floor_of(const Problem& p, const Rates& rates, const SectionContext& c, int layers, bool proj,
               bool both) {
  const double B = static_cast<double>(p.s.batch), T = static_cast<double>(p.s.steps),
               H = static_cast<double>(p.s.hidden), GH = static_cast<double>(p.gh());
  const double e = static_cast<double>(dtype_size(p.dtype));
  const double seq = B * T * H * e, gates = B * T * GH * e, w = H * GH * e, b = GH * e;
  const double finals = (p.has_c ? 2.0 : 1.0) * B * H * 4.0;
  double bytes = proj ? seq : 0.0;  // x
  for (int l = 0; l < layers; ++l) {
    bytes += w + b + finals + seq;             // R, bias; h_final (c_final); y
    bytes += proj ? w : gates;                 // W, or the given wx
    if (!both) continue;
    bytes += 2 * (w + b) + 2 * seq;            // R, bias, grad_R, grad_bias; y, grad_y
    bytes += proj ? seq + 2 * w + seq : 2 * gates;  // x, W, grad_W, grad_x; or wx, grad_wx
  }
  const double L = layers;
  const double recurrent = 2.0 * B * T * H * GH * L * (both ? 3.0 : 1.0);
  const double projection = proj ? 2.0 * B * T * H * GH * L * (both ? 3.0 : 1.0) : 0.0;
  const double bytes_us = bytes / (c.copy_gbps * 1e3);
  const double flops_us = 1e6 * (recurrent / rates.fma_flops +
                                 projection / rates.gemm_flops[dtype_index(p.dtype)]);
  const double chain_us = (both ? 2.0 : 1.0) * (T + L - 1.0) * rates.handoff_us + c.launch_floor_us;
  Floor f{bytes_us, "bytes"};
  if (flops_us > f.us) f = {flops_us, "flops"};
  if (chain_us > f.us) f = {chain_us, "chain"};
  return f;
}

// ---------------------------------------------------------------------------
// Validation.

std::size_t elements(const Tensor& t) {
  std::size_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= static_cast<std::size_t>(t.shape[i]);
  return n;
}

void poison(const Tensor& t, cudaStream_t stream) {
  check_cuda(cudaMemsetAsync(t.data, 0xFF, elements(t) * dtype_size(static_cast<DType>(t.dtype)), stream),
             "cudaMemsetAsync (poison)");
}

std::vector<unsigned char> download_bytes(const void* d, std::size_t bytes) {
  std::vector<unsigned char> h(bytes);
  check_cuda(cudaMemcpy(h.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return h;
}

// count elements of t (of dtype `dtype`, f32 for raw scratch) from element `first`.
std::vector<double> download(const void* data, DType dtype, std::size_t first, std::size_t count) {
  const std::size_t e = dtype_size(dtype);
  const auto bytes = download_bytes(static_cast<const char*>(data) + first * e, count * e);
  return test::decode(bytes.data(), count, dtype);
}
std::vector<double> download(const Tensor& t, std::size_t first, std::size_t count) {
  return download(t.data, static_cast<DType>(t.dtype), first, count);
}

std::size_t count_nonfinite(const void* data, DType dtype, std::size_t count) {
  const auto bytes = download_bytes(data, count * dtype_size(dtype));
  std::size_t bad = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (dtype == DType::f32) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      bad += (v & 0x7f800000u) == 0x7f800000u;
    } else {
      uint16_t v;
      std::memcpy(&v, bytes.data() + 2 * i, 2);
      bad += (v & 0x7f80u) == 0x7f80u;  // bf16 (f16 is not benchmarked)
    }
  }
  return bad;
}
std::size_t count_nonfinite(const Tensor& t) {
  return count_nonfinite(t.data, static_cast<DType>(t.dtype), elements(t));
}

// ||got - ref|| / ||ref|| (infinite where got has a NaN).
double normwise(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  if (got.size() != ref.size() || std::isnan(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

test::Tolerance rnn_tolerance(const Problem& p) {  // test/gpu/test_gated_rnn.cpp's
  return p.f32_tensor_cores ? test::gated_rnn_f32_tensor_cores_tolerance()
                            : test::gated_rnn_tolerance(p.dtype);
}

bool reference_kind(GatedRnnCell cell, reference::GatedRnnKind* kind) {
  if (cell == GatedRnnCell::gru) *kind = reference::GatedRnnKind::gru;
  else if (cell == GatedRnnCell::lstm) *kind = reference::GatedRnnKind::lstm;
  else return false;
  return true;
}

// The normwise limit of a check through the projection products: f32's
// run as TF32 in cuBLAS (their own check allows 2e-3), 16-bit's round their
// operands.
double product_limit(const Problem& p) { return p.dtype == DType::f32 ? 5e-3 : 2e-2; }

// One line: ours (worst error / tolerance, elementwise), the baseline and
// the projection's products (normwise), on set 0's layer 1.
std::string validate(const Problem& p, const CallSet& set, const Stepwise& sw, const Gemm& gemm,
                     uint64_t seed, cudaStream_t stream, bool* ok) {
  *ok = true;
  const Layer& ly = set.layer[0];
  const int64_t B = p.s.batch, T = p.s.steps, H = p.s.hidden, GH = p.gh();
  const auto sz = [](int64_t v) { return static_cast<std::size_t>(v); };
  std::vector<int64_t> rows;
  for (int64_t b = 0; b < B; ++b)
    if (B <= 2 || b == 0 || b == B - 1) rows.push_back(b);
  const bool all_rows = sz(B) == rows.size();
  auto rows_of = [&](const Tensor& t, int64_t per_row, int64_t count) {
    std::vector<double> out;
    for (int64_t b : rows) {
      const auto part = download(t, sz(b * per_row), sz(count));
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  };
  char buf[512];
  std::string line = "seed " + std::to_string(seed) + ", rows";
  for (int64_t b : rows) line += " " + std::to_string(b);
  line += all_rows ? " (all; grad_R, grad_bias included)" : " of " + std::to_string(B);

  // Ours, the forward then the backward, one layer, no projection.
  for (const Tensor* t : {&ly.y, &ly.h_final, &ly.c_final, &ly.grad_wx, &ly.grad_R, &ly.grad_bias})
    poison(*t, stream);
  require(gated_rnn_forward(forward_args(p, ly, false), stream), "gated_rnn_forward");
  require(gated_rnn_backward(backward_args(p, set, 0, 1, false), stream), "gated_rnn_backward");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::size_t unwritten = count_nonfinite(ly.y) + count_nonfinite(ly.h_final) +
                          count_nonfinite(ly.grad_wx) + count_nonfinite(ly.grad_R) +
                          count_nonfinite(ly.grad_bias) + (p.has_c ? count_nonfinite(ly.c_final) : 0);

  reference::GatedRnnKind kind{};
  if (!reference_kind(p.cell.cell, &kind)) {
    *ok = unwritten == 0;
    return line + ": no reference for this cell; " + std::to_string(unwritten) + " outputs not finite";
  }
  reference::GatedRnnProblem rp;
  rp.kind = kind;
  rp.batch = static_cast<int64_t>(rows.size());
  rp.steps = T;
  rp.hidden = H;
  rp.wx = rows_of(ly.wx, T * GH, T * GH);
  rp.R = download(ly.R, 0, sz(H * GH));
  rp.bias = download(ly.bias, 0, sz(GH));
  const std::vector<double> grad_y = rows_of(ly.grad_y, T * H, T * H);
  const auto f = reference::gated_rnn_forward(rp);
  const auto g = reference::gated_rnn_backward(rp, grad_y, {}, {});

  const test::Tolerance tol = rnn_tolerance(p);
  const double hscale = std::max(test::max_abs(f.y), test::max_abs(f.h_final));
  const double gscale = std::max({test::max_abs(g.wx), test::max_abs(g.rh), test::max_abs(g.h0),
                                  test::max_abs(g.c0)});
  double worst = 0;
  std::string failed;
  auto judge = [&](const std::vector<double>& got, const std::vector<double>& ref, double scale,
                   const char* name) {
    const test::Comparison cmp = test::compare(got, ref, tol, scale);
    worst = std::max(worst, cmp.worst_ratio);
    if (!cmp.ok) failed += "\n    " + cmp.describe(name);
  };
  judge(rows_of(ly.y, T * H, T * H), f.y, hscale, "y");
  judge(rows_of(ly.h_final, H, H), f.h_final, hscale, "h_final");
  if (p.has_c) judge(rows_of(ly.c_final, H, H), f.c_final, test::max_abs(f.c_final), "c_final");
  judge(rows_of(ly.grad_wx, T * GH, T * GH), g.wx, gscale, "grad_wx");
  if (all_rows) {
    judge(download(ly.grad_R, 0, sz(H * GH)), g.R, std::max(gscale, test::max_abs(g.R_terms)), "grad_R");
    judge(download(ly.grad_bias, 0, sz(GH)), g.bias, std::max(gscale, test::max_abs(g.bias_terms)),
          "grad_bias");
  }
  const bool ours_ok = failed.empty() && unwritten == 0;
  std::snprintf(buf, sizeof buf, "; ours: worst error / tolerance %.3g (%s)", worst,
                ours_ok ? "pass" : "FAIL");
  line += buf;
  if (unwritten) line += ", " + std::to_string(unwritten) + " outputs not finite";
  line += failed;
  *ok = ours_ok;

  // The baseline: normwise error of y, grad_wx (grad_R and grad_bias, whose
  // products run as TF32 in f32, where all rows are checked).
  if (stepwise_supports(p.cell.cell, p.dtype)) {
    const StepScratch& sc = sw.layer[0];
    for (const Tensor* t : {&ly.y, &ly.grad_wx}) poison(*t, stream);
    enqueue_stepwise(p, set, sw, 1, false, true, gemm, stream);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const std::size_t bad = count_nonfinite(ly.y) + count_nonfinite(ly.grad_wx);
    double err = std::max(normwise(rows_of(ly.y, T * H, T * H), f.y),
                          normwise(rows_of(ly.grad_wx, T * GH, T * GH), g.wx));
    double err_products = 0;
    if (all_rows)
      err_products = std::max(normwise(download(sc.grad_R, DType::f32, 0, sz(H * GH)), g.R),
                              normwise(download(sc.grad_bias, DType::f32, 0, sz(GH)), g.bias));
    const double limit = p.dtype == DType::f32 ? 1e-4 : 2e-2;
    const double limit_products = product_limit(p);
    const bool sw_ok = bad == 0 && err <= limit && err_products <= limit_products;
    std::snprintf(buf, sizeof buf, "; per-step: |err|/|ref| %.2g (y, grad_wx; <= %.0e)", err, limit);
    line += buf;
    if (all_rows) {
      std::snprintf(buf, sizeof buf, ", %.2g (grad_R, grad_bias; <= %.0e)", err_products, limit_products);
      line += buf;
    }
    line += sw_ok ? " pass" : " FAIL";
    if (bad) line += " (" + std::to_string(bad) + " not finite)";
    *ok = *ok && sw_ok;
  } else {
    line += "; per-step: n/a";
  }

  // The projection's products, on the first steps of the checked rows (and
  // grad_W where the rows are all of B * T).
  {
    const int64_t steps = std::min<int64_t>(T, 32);
    for (const Tensor* t : {&ly.wxp, &ly.grad_x, &ly.grad_W}) poison(*t, stream);
    project_forward(p, ly, gemm);
    project_backward(p, ly, gemm);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const std::size_t bad = count_nonfinite(ly.wxp) + count_nonfinite(ly.grad_x) + count_nonfinite(ly.grad_W);
    const auto x = rows_of(ly.x, T * H, steps * H);
    const auto W = download(ly.W, 0, sz(H * GH));
    const auto gwx = rows_of(ly.grad_wx, T * GH, steps * GH);
    const std::size_t n = rows.size() * sz(steps);
    std::vector<double> wx_ref(n * sz(GH), 0.0), gx_ref(n * sz(H), 0.0);
    for (std::size_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < H; ++k)
        for (int64_t j = 0; j < GH; ++j) {
          wx_ref[i * sz(GH) + sz(j)] += x[i * sz(H) + sz(k)] * W[sz(k * GH + j)];
          gx_ref[i * sz(H) + sz(k)] += gwx[i * sz(GH) + sz(j)] * W[sz(k * GH + j)];
        }
    double err = std::max(normwise(rows_of(ly.wxp, T * GH, steps * GH), wx_ref),
                          normwise(rows_of(ly.grad_x, T * H, steps * H), gx_ref));
    if (all_rows && steps == T) {
      std::vector<double> gW_ref(sz(H * GH), 0.0);
      for (std::size_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < H; ++k)
          for (int64_t j = 0; j < GH; ++j) gW_ref[sz(k * GH + j)] += x[i * sz(H) + sz(k)] * gwx[i * sz(GH) + sz(j)];
      err = std::max(err, normwise(download(ly.grad_W, 0, sz(H * GH)), gW_ref));
    }
    const double limit = p.dtype == DType::f32 ? 2e-3 : 1e-2;
    const bool gemm_ok = bad == 0 && err <= limit;
    std::snprintf(buf, sizeof buf, "; projection products: |err|/|ref| %.2g (<= %.0e) %s", err, limit,
                  gemm_ok ? "pass" : "FAIL");
    line += buf;
    if (bad) line += " (" + std::to_string(bad) + " not finite)";
    *ok = *ok && gemm_ok;
  }
  return line;
}

// ---------------------------------------------------------------------------
// Timing.

struct Times {
  double events_us = 0, graph_us = 0, host_us = 0;
};

// Each measurement is given about `budget` of device time: at least 5
// repetitions, at most 200 (30 with --quick).
struct Budget {
  double us;
  int cap;
  int reps(double call_us) const {
    return std::clamp(static_cast<int>(us / std::max(call_us, 1.0)), 5, cap);
  }
};

Times time_ours(cudaStream_t stream, const Budget& budget, std::size_t sets, bool small,
                const Enqueue& call) {
  Times t;
  const double estimate = median_event_us(stream, 2, 3, call);
  const int reps = budget.reps(estimate);
  t.events_us = median_event_us(stream, std::min(10, reps / 4 + 1), reps, call);
  const int per_graph = small ? 20 : 1;
  const int graphs = std::max<int>(1, static_cast<int>((sets + per_graph - 1) / per_graph));
  t.graph_us = median_graph_us(stream, graphs, per_graph,
                               std::max(budget.reps(estimate * per_graph), 2 * graphs), call);
  t.host_us = median_host_us(stream, reps, call);
  return t;
}

double time_stepwise(cudaStream_t stream, const Budget& budget, std::size_t sets, const Enqueue& call) {
  const double estimate = median_event_us(stream, 1, 2, call);
  const int graphs = static_cast<int>(std::min<std::size_t>(sets, 4));
  const Budget b{budget.us, std::min(budget.cap, 30)};
  return median_graph_us(stream, graphs, 1, std::max(b.reps(estimate), 2 * graphs), call);
}

void print_header() {
  std::printf("%-5s %-5s %-14s %2s %-4s %-8s %-22s %10s %10s %9s %-6s %7s %8s %12s %8s\n", "cell",
              "dtype", "shape", "L", "proj", "dir", "layout", "events_us", "graph_us", "floor_us",
              "bound", "x_floor", "host_us", "stepwise_us", "speedup");
}

// "u2x128/t1/res/k3": units per block x blocks, batch tile, R resident in
// shared memory or streamed, kernel launches of the whole timed call; "w"
// for "u" in the forward's unit-warps layout (a warp per unit), "s" in its
// k-split layout (B = 1), "t" with its product on tensor cores.
const char* layout_letter(const GatedRnnLaunchInfo& info) {
  return info.unit_warps ? "w" : info.k_split ? "s" : info.tensor_cores ? "t" : "u";
}
std::string layout_name(const GatedRnnLaunchInfo& info, int kernels) {
  return layout_letter(info) + std::to_string(info.units_per_block) + "x" +
         std::to_string(info.blocks) + "/t" +
         std::to_string(info.batch_tile) + (info.resident_weights ? "/res" : "/str") + "/k" +
         std::to_string(kernels);
}

// One input set's two layers as the stacked op takes them: R and bias
// stacked [2, ...] (copies of the layers'), W [1, H, G*H] and y_lower [1,
// B, T, H] views of layer 2's W and layer 1's y, the final states [2, B, H].
struct StackedSet {
  DeviceTensors memory;
  Tensor R{}, bias{}, W{}, y_lower{}, h_final{}, c_final{};
  GatedRnnStackForwardArgs args;
  // The backward: grad_R and grad_bias [2, ...] of its own, grad_W a view of
  // layer 2's, grad_wx layer 1's.
  Tensor grad_R{}, grad_bias{}, grad_W{};
  GatedRnnStackBackwardArgs backward;
};

Tensor view(const Tensor& t, std::initializer_list<int64_t> shape) {
  Tensor v = t;
  v.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t d : shape) v.shape[i++] = d;
  return v;
}

std::unique_ptr<StackedSet> make_stacked_set(const Problem& p, const CallSet& set, cudaStream_t stream) {
  auto st = std::make_unique<StackedSet>();
  const int64_t B = p.s.batch, T = p.s.steps, H = p.s.hidden, GH = p.gh();
  const std::size_t esize = dtype_size(p.dtype);
  st->R = st->memory.make(p.dtype, {2, H, GH}, 0, 0, 0, stream);
  st->bias = st->memory.make(p.dtype, {2, GH}, 0, 0, 0, stream);
  for (int l = 0; l < 2; ++l) {
    check_cuda(cudaMemcpyAsync(static_cast<char*>(st->R.data) + l * H * GH * esize, set.layer[l].R.data,
                               H * GH * esize, cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync (stacked R)");
    check_cuda(cudaMemcpyAsync(static_cast<char*>(st->bias.data) + l * GH * esize, set.layer[l].bias.data,
                               GH * esize, cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync (stacked bias)");
  }
  st->W = view(set.layer[1].W, {1, H, GH});
  st->y_lower = view(set.layer[0].y, {1, B, T, H});
  st->h_final = st->memory.make(DType::f32, {2, B, H}, 0, 0, 0, stream);
  st->c_final = st->memory.make(DType::f32, {2, B, H}, 0, 0, 0, stream);
  GatedRnnStackForwardArgs& a = st->args;
  a.cell = p.cell.cell;
  a.options.precision = p.precision();
  a.wx = &set.layer[0].wxp;
  a.R = &st->R, a.W = &st->W, a.bias = &st->bias;
  a.y = &set.layer[1].y, a.y_lower = &st->y_lower, a.h_final = &st->h_final;
  if (p.has_c) a.c_final = &st->c_final;
  st->grad_R = st->memory.make(p.dtype, {2, H, GH}, 0, 0, 0, stream);
  st->grad_bias = st->memory.make(p.dtype, {2, GH}, 0, 0, 0, stream);
  st->grad_W = view(set.layer[1].grad_W, {1, H, GH});
  GatedRnnStackBackwardArgs& b = st->backward;
  b.cell = a.cell;
  b.options = a.options;
  b.wx = a.wx, b.R = a.R, b.W = a.W, b.bias = a.bias, b.y = a.y, b.y_lower = a.y_lower;
  b.grad_y = &set.layer[1].grad_y;
  b.grad_wx = &set.layer[0].grad_wx, b.grad_R = &st->grad_R, b.grad_W = &st->grad_W;
  b.grad_bias = &st->grad_bias;
  return st;
}

// The stacked backward's check: its gradients (grad_wx of layer 1, grad_R
// and grad_bias of both layers, grad_W of layer 2) against those of the two
// one-layer backwards of the "yes" rows on set 0 (whose own check is the
// row's validation), normwise: the same layers' products, apart from y_1
// (the stacked forward fed layer 2 f32 h) and the order of the projection's
// sums.
std::string validate_stack_backward(const Problem& p, const CallSet& set, const StackedSet& st,
                                    const Gemm& gemm, cudaStream_t stream,
                                    const GatedRnnLaunchOptions* options = nullptr) {
  const int64_t H = p.s.hidden, GH = p.gh(), BT = p.s.batch * p.s.steps;
  const auto sz = [](int64_t v) { return static_cast<std::size_t>(v); };
  enqueue_ours(p, set, 2, true, true, gemm, stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::vector<std::vector<double>> want = {download(set.layer[0].grad_wx, 0, sz(BT * GH)),
                                           download(set.layer[0].grad_R, 0, sz(H * GH)),
                                           download(set.layer[1].grad_R, 0, sz(H * GH)),
                                           download(set.layer[0].grad_bias, 0, sz(GH)),
                                           download(set.layer[1].grad_bias, 0, sz(GH)),
                                           download(set.layer[1].grad_W, 0, sz(H * GH))};
  for (const Tensor* t : {&set.layer[0].grad_wx, &st.grad_R, &st.grad_bias, &set.layer[1].grad_W})
    poison(*t, stream);
  project_forward(p, set.layer[0], gemm);
  require(gated_rnn_stack_forward(st.args, stream), "gated_rnn_stack_forward");
  require(gated_rnn_stack_backward(st.backward, stream, options), "gated_rnn_stack_backward");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const std::vector<std::vector<double>> got = {download(set.layer[0].grad_wx, 0, sz(BT * GH)),
                                                download(st.grad_R, 0, sz(H * GH)),
                                                download(st.grad_R, sz(H * GH), sz(H * GH)),
                                                download(st.grad_bias, 0, sz(GH)),
                                                download(st.grad_bias, sz(GH), sz(GH)),
                                                download(set.layer[1].grad_W, 0, sz(H * GH))};
  double err = 0;
  std::size_t unwritten = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, normwise(got[i], want[i]));
    for (double v : got[i]) unwritten += !std::isfinite(v);
  }
  const double limit = product_limit(p);
  const bool ok = unwritten == 0 && err <= limit;
  char buf[220];
  std::snprintf(buf, sizeof buf,
                "backward validation %s: grad_wx, both layers' grad_R and grad_bias, grad_W against "
                "the two one-layer backwards, |err|/|ref| %.2g (<= %.0e)%s",
                ok ? "pass" : "FAILED", err, limit, unwritten ? ", outputs not finite" : "");
  return buf;
}

// The stacked call's check: one call (run(0): set 0) with every output
// poisoned, every element finite, and both layers' y, h_final and c_final
// against the double reference of the two layers (layer 1 on x W_1, layer
// 2 on y_1 W_2), normwise: layer 1's projection runs as TF32 in f32 (the
// projection products' own check allows 2e-3), and it feeds both layers.
template <class Run>
std::string validate_stack(const Problem& p, const CallSet& set, const StackedSet& st, const Run& run,
                           cudaStream_t stream) {
  const int64_t B = p.s.batch, T = p.s.steps, H = p.s.hidden, GH = p.gh();
  const int64_t BT = B * T;
  const auto sz = [](int64_t v) { return static_cast<std::size_t>(v); };
  std::vector<const Tensor*> outputs = {&set.layer[0].y, &set.layer[1].y, &st.h_final};
  if (p.has_c) outputs.push_back(&st.c_final);
  for (const Tensor* t : outputs) poison(*t, stream);
  run(0);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::size_t unwritten = 0;
  for (const Tensor* t : outputs) unwritten += count_nonfinite(*t);

  reference::GatedRnnKind kind{};
  if (!reference_kind(p.cell.cell, &kind)) return "validation FAILED: no reference for this cell";
  reference::GatedRnnStackProblem rp;
  rp.kind = kind;
  rp.batch = B, rp.steps = T, rp.hidden = H;
  // Layer 1's wx = x W_1, in double (the call's own came from cuBLAS).
  const std::vector<double> x = download(set.layer[0].x, 0, sz(BT * H));
  const std::vector<double> W1 = download(set.layer[0].W, 0, sz(H * GH));
  rp.wx.assign(sz(BT * GH), 0.0);
  for (int64_t m = 0; m < BT; ++m)
    for (int64_t kk = 0; kk < H; ++kk)
      for (int64_t j = 0; j < GH; ++j) rp.wx[sz(m * GH + j)] += x[sz(m * H + kk)] * W1[sz(kk * GH + j)];
  for (const Layer& ly : set.layer) {
    rp.R.push_back(download(ly.R, 0, sz(H * GH)));
    rp.bias.push_back(download(ly.bias, 0, sz(GH)));
    rp.h0.emplace_back();
    rp.c0.emplace_back();
  }
  rp.W.push_back(download(set.layer[1].W, 0, sz(H * GH)));
  rp.W_bias.emplace_back();
  const auto ref = reference::gated_rnn_stack_forward(rp);
  double err = 0;
  for (std::size_t l = 0; l < 2; ++l) {
    err = std::max({err, normwise(download(set.layer[l].y, 0, sz(BT * H)), ref[l].y),
                    normwise(download(st.h_final, l * sz(B * H), sz(B * H)), ref[l].h_final)});
    if (p.has_c)
      err = std::max(err, normwise(download(st.c_final, l * sz(B * H), sz(B * H)), ref[l].c_final));
  }
  const double limit = product_limit(p);
  const bool ok = unwritten == 0 && err <= limit;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                "validation %s: both layers' y, h_final%s against the double reference, "
                "|err|/|ref| %.2g (<= %.0e)",
                ok ? "pass" : "FAILED", p.has_c ? ", c_final" : "", err, limit);
  std::string line = buf;
  if (unwritten) line += ", " + std::to_string(unwritten) + " outputs not finite";
  return line;
}

// Two layers as one launch (exphil::gated_rnn_stack_forward, the op
// gru_stack / lstm_stack; cuda/gated_rnn/gated_rnn_forward_stack.cuh at B =
// 1, gated_rnn_forward_stack_blocks.cuh elsewhere),
// proj "stk": layer 1's projection x W through bench_gemm.h, then the
// stacked call, layer 2's projection y_1 W_2 inside the kernel; the tensors
// of the "yes" rows, R and bias stacked. Checked first (validate_stack).
void stacked_row(const SectionContext& c, const Rates& rates, const Gemm& gemm, const Problem& p,
                 const std::vector<std::unique_ptr<CallSet>>& sets, const Budget& budget) {
  std::vector<std::unique_ptr<StackedSet>> stacked;
  for (const auto& set : sets) stacked.push_back(make_stacked_set(p, *set, c.stream));
  GatedRnnLaunchInfo info;
  GatedRnnLaunchOptions probe;
  probe.chosen = &info;
  const Status s = gated_rnn_stack_forward(stacked[0]->args, c.stream, &probe);
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
  if (!s.ok() || !info.stacked) {
    std::printf("%-5s %-5s %-14s stacked forward not run in one launch: %s\n",
                gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), shape_name(p.s).c_str(),
                s.ok() ? "the library ran it layer by layer" : s.message().c_str());
    return;
  }
  auto run = [&](int rep) {
    const std::size_t i = static_cast<std::size_t>(rep) % sets.size();
    project_forward(p, sets[i]->layer[0], gemm);
    require(gated_rnn_stack_forward(stacked[i]->args, c.stream), "gated_rnn_stack_forward");
  };
  const std::string validation = validate_stack(p, *sets[0], *stacked[0], run, c.stream);
  const Times t = time_ours(c.stream, budget, sets.size(), small_call(p.s), run);
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
  const Floor fl = floor_of(p, rates, c, 2, true, false);
  std::printf("%-5s %-5s %-14s %2d %-4s %-8s %-22s %10.2f %10.2f %9.2f %-6s %6.1fx %8.2f %21s\n",
              gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), shape_name(p.s).c_str(), 2, "stk",
              "fwd", layout_name(info, info.kernels + 1).c_str(), t.events_us, t.graph_us, fl.us, fl.bound,
              t.graph_us / fl.us, t.host_us, "(stacked, 1 launch)");
  std::printf("%-5s %-5s %-14s stacked %s\n", gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype),
              shape_name(p.s).c_str(), validation.c_str());

  // Forward + backward: the stacked forward, its backward (both layers'
  // backwards, layer 2's projection's gradients), then layer 1's
  // projection's gradients, as the "yes" rows.
  GatedRnnLaunchInfo binfo;
  GatedRnnLaunchOptions bprobe;
  bprobe.chosen = &binfo;
  require(gated_rnn_stack_backward(stacked[0]->backward, c.stream, &bprobe), "gated_rnn_stack_backward");
  const std::string bvalidation = validate_stack_backward(p, *sets[0], *stacked[0], gemm, c.stream);
  auto both = [&](int rep) {
    const std::size_t i = static_cast<std::size_t>(rep) % sets.size();
    run(rep);
    require(gated_rnn_stack_backward(stacked[i]->backward, c.stream), "gated_rnn_stack_backward");
    project_backward(p, sets[i]->layer[0], gemm);
  };
  const Times tb = time_ours(c.stream, budget, sets.size(), small_call(p.s), both);
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
  const Floor fb = floor_of(p, rates, c, 2, true, true);
  std::printf("%-5s %-5s %-14s %2d %-4s %-8s %-22s %10.2f %10.2f %9.2f %-6s %6.1fx %8.2f %21s\n",
              gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), shape_name(p.s).c_str(), 2, "stk",
              "fwd+bwd", layout_name(info, info.kernels + binfo.kernels + 3).c_str(), tb.events_us,
              tb.graph_us, fb.us, fb.bound, tb.graph_us / fb.us, tb.host_us,
              binfo.stacked ? "(stacked, 1 launch each way)" : "(stacked, 1 launch fwd)");
  std::printf("%-5s %-5s %-14s stacked %s\n", gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype),
              shape_name(p.s).c_str(), bvalidation.c_str());
}

void run_shape(const SectionContext& c, const Rates& rates, const Gemm& gemm, const Problem& p,
               uint64_t seed) {
  const std::string name = shape_name(p.s);
  double set_bytes = 0;
  auto first = make_call_set(p, seed, c.stream, &set_bytes);
  const std::size_t count = c.rotation(set_bytes);
  std::vector<std::unique_ptr<CallSet>> sets;
  sets.push_back(std::move(first));
  for (std::size_t i = 1; i < count; ++i) {
    double ignored = 0;
    sets.push_back(make_call_set(p, seed + 7919 * i, c.stream, &ignored));
  }
  const auto sw = make_stepwise(p, c.stream);
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");

  bool valid = true;
  const std::string validation = validate(p, *sets[0], *sw, gemm, seed, c.stream, &valid);

  GatedRnnLaunchInfo fwd_info, bwd_info;
  GatedRnnLaunchOptions probe;
  probe.chosen = &fwd_info;
  require(gated_rnn_forward(forward_args(p, sets[0]->layer[0], false), c.stream, &probe), "gated_rnn_forward");
  probe.chosen = &bwd_info;
  require(gated_rnn_backward(backward_args(p, *sets[0], 0, 1, false), c.stream, &probe),
          "gated_rnn_backward");
  check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");

  const Budget budget{c.quick ? 5e4 : 2e5, c.quick ? 30 : 200};
  const bool small = small_call(p.s);
  const bool has_stepwise = stepwise_supports(p.cell.cell, p.dtype);
  for (int layers : {1, 2})
    for (bool proj : {false, true})
      for (bool both : {false, true}) {
        auto ours = [&](int rep) {
          enqueue_ours(p, *sets[static_cast<std::size_t>(rep) % sets.size()], layers, proj, both, gemm,
                       c.stream);
        };
        const Times t = time_ours(c.stream, budget, sets.size(), small, ours);
        double stepwise_us = 0;
        if (has_stepwise) {
          auto step = [&](int rep) {
            enqueue_stepwise(p, *sets[static_cast<std::size_t>(rep) % sets.size()], *sw, layers, proj,
                             both, gemm, c.stream);
          };
          stepwise_us = time_stepwise(c.stream, budget, sets.size(), step);
        }
        const Floor fl = floor_of(p, rates, c, layers, proj, both);
        const int kernels = layers * (fwd_info.kernels + (both ? bwd_info.kernels : 0)) +
                            (proj ? layers * (both ? 3 : 1) : 0);
        std::printf("%-5s %-5s %-14s %2d %-4s %-8s %-22s %10.2f %10.2f %9.2f %-6s %6.1fx %8.2f ",
                    gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), name.c_str(), layers,
                    proj ? "yes" : "no", both ? "fwd+bwd" : "fwd", layout_name(fwd_info, kernels).c_str(),
                    t.events_us, t.graph_us, fl.us, fl.bound, t.graph_us / fl.us, t.host_us);
        if (stepwise_us > 0)
          std::printf("%12.1f %7.1fx\n", stepwise_us, stepwise_us / t.graph_us);
        else
          std::printf("%12s %8s\n", "n/a", "");
        std::fflush(stdout);
      }
  // The same one-layer forward in the other layouts the options can ask
  // for, each against the automatic plan in one run: the unit-warps layout
  // at B <= 4 ("uw"), the block layout at B = 1, where the k-split layout
  // is the default ("blk"), the product on CUDA cores above B = 4 in bf16,
  // where tensor cores are the default ("cc").
  auto other_layout = [&](const char* label, const char* note, GatedRnnLaunchOptions o, bool both) {
    GatedRnnLaunchInfo info, back;
    o.chosen = &info;
    require(gated_rnn_forward(forward_args(p, sets[0]->layer[0], false), c.stream, &o), "gated_rnn_forward");
    o.chosen = &back;
    if (both)
      require(gated_rnn_backward(backward_args(p, *sets[0], 0, 1, false), c.stream, &o),
              "gated_rnn_backward");
    o.chosen = nullptr;
    auto run = [&](int rep) {
      const CallSet& set = *sets[static_cast<std::size_t>(rep) % sets.size()];
      require(gated_rnn_forward(forward_args(p, set.layer[0], false), c.stream, &o), "gated_rnn_forward");
      if (both)
        require(gated_rnn_backward(backward_args(p, set, 0, 1, false), c.stream, &o),
                "gated_rnn_backward");
    };
    const Times t = time_ours(c.stream, budget, sets.size(), small, run);
    const Floor fl = floor_of(p, rates, c, 1, false, both);
    std::printf("%-5s %-5s %-14s %2d %-4s %-8s %-22s %10.2f %10.2f %9.2f %-6s %6.1fx %8.2f %21s\n",
                gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), name.c_str(), 1, label,
                both ? "fwd+bwd" : "fwd", layout_name(info, info.kernels + (both ? back.kernels : 0)).c_str(),
                t.events_us, t.graph_us, fl.us, fl.bound, t.graph_us / fl.us, t.host_us, note);
  };
  if (p.s.batch <= 4) {
    GatedRnnLaunchOptions o;
    o.unit_warps = 1;
    other_layout("uw", "(unit warps)", o, false);
  }
  if (p.s.batch == 1) {
    GatedRnnLaunchOptions o;
    o.k_split = 0;
    other_layout("blk", "(block layout)", o, false);
  }
  if (p.s.batch > 4 && p.dtype != DType::f32) {
    GatedRnnLaunchOptions o;
    o.tensor_cores = 0;
    other_layout("cc", "(CUDA cores)", o, false);
    other_layout("cc", "(CUDA cores)", o, true);
  }
  if (p.cell.cell != GatedRnnCell::slstm) stacked_row(c, rates, gemm, p, sets, budget);
  std::printf("%-5s %-5s %-14s validation %s: %s; %zu input sets\n", gated_rnn_cell_name(p.cell.cell),
              dtype_name(p.dtype), name.c_str(), valid ? "pass" : "FAILED", validation.c_str(),
              sets.size());
}

Rates measure_rates(const SectionContext& c, const Gemm& gemm) {
  Rates r;
  check_cuda(measure_fma_rate(c.stream, &r.fma_flops), "FMA rate kernel");
  const int64_t n = 4096;
  for (DType dt : {DType::f32, DType::bf16}) {
    DeviceTensors m;
    const Tensor a = m.make(dt, {n, n}, -1, 1, 11, c.stream);
    const Tensor b = m.make(dt, {n, n}, -1, 1, 12, c.stream);
    const Tensor out = m.make(dt, {n, n}, 0, 0, 0, c.stream);
    const double us = median_event_us(c.stream, 2, 5, [&](int) {
      gemm.run(n, n, n, a.data, false, b.data, false, dt, out.data, dt);
    });
    r.gemm_flops[dtype_index(dt)] = 2.0 * static_cast<double>(n * n * n) / (us * 1e-6);
  }
  const int trips = 20000;
  double us = 0;
  const cudaError_t e = measure_flag_trips(trips, c.stream, &us);
  if (e == cudaSuccess) {
    r.handoff_us = std::max(0.0, us - c.launch_floor_us) / trips;
    r.handoff_note = "measured: " + std::to_string(trips) + " passes of a flag between two SMs";
  } else {
    (void)cudaGetLastError();
    r.handoff_us = 1.0;
    r.handoff_note = std::string("not measured (") + cudaGetErrorName(e) + "): gated_rnn_forward.cuh's 1 us";
  }
  return r;
}

// --layouts: one layer's kernels alone (no projection) in each layout the
// options can ask for, units per block x batch groups (at B = 1 also the
// block layout where the k-split one is taken, "s" for "u"), against the
// automatic plan, in one run: the evidence for the planner's choice
// (gated_rnn_plan.cpp). Each layout's y and grad_wx are compared with the
// automatic plan's (results do not depend on the layout beyond f32
// rounding; the tests check each against the double reference).
void run_layouts(const SectionContext& c, const Problem& p, uint64_t seed) {
  double set_bytes = 0;
  std::vector<std::unique_ptr<CallSet>> sets;
  sets.push_back(make_call_set(p, seed, c.stream, &set_bytes));
  const std::size_t count = c.rotation(set_bytes);
  for (std::size_t i = 1; i < count; ++i) {
    double ignored = 0;
    sets.push_back(make_call_set(p, seed + 7919 * i, c.stream, &ignored));
  }
  const int64_t B = p.s.batch, H = p.s.hidden;
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  std::vector<GatedRnnLaunchOptions> layouts(1);  // the automatic plan first
  // At B = 1 the k-split layout where it fits, then the block layout; in
  // bf16 above B = 4 tensor cores where they fit, then CUDA cores.
  const bool tc_choice = B > 4 && p.dtype != DType::f32;
  for (int k_split : {-1, 0})
    for (int tensor_cores : {-1, 0})
      for (int units : {1, static_cast<int>((H + sms - 1) / sms), 4, 8, 16, 32, 64})
        for (int groups : {1, 2, 4, 8, 16, 32}) {
          const int64_t slices = (H + units - 1) / units;
          // The k-split layout also at two blocks a multiprocessor (as the
          // stacked kernel runs), the others at one.
          const int64_t room = B == 1 && k_split != 0 ? 2 * sms : sms;
          if (units > H || groups > B || slices * groups > room || p.cell.gates * units > 256 ||
              (k_split == 0 && B > 1) || (tensor_cores == 0 && !tc_choice))
            continue;
          GatedRnnLaunchOptions o;
          o.units_per_block = units;
          o.batch_blocks = groups;
          o.k_split = k_split;
          o.tensor_cores = tensor_cores;
          if (std::none_of(layouts.begin() + 1, layouts.end(), [&](const GatedRnnLaunchOptions& q) {
                return q.units_per_block == units && q.batch_blocks == groups && q.k_split == k_split &&
                       q.tensor_cores == tensor_cores;
              }))
            layouts.push_back(o);
        }
  const Budget budget{c.quick ? 2e4 : 1e5, c.quick ? 20 : 100};
  const bool small = small_call(p.s);
  const Layer& first = sets[0]->layer[0];
  std::vector<double> y_auto, gwx_auto;
  for (std::size_t li = 0; li < layouts.size(); ++li) {
    GatedRnnLaunchOptions o = layouts[li];
    GatedRnnLaunchInfo info;
    o.chosen = &info;
    poison(first.y, c.stream);
    poison(first.grad_wx, c.stream);
    const Status fs = gated_rnn_forward(forward_args(p, first, false), c.stream, &o);
    if (!fs.ok()) {
      std::printf("  layout u%d/g%d: not run (%s)\n", layouts[li].units_per_block,
                  layouts[li].batch_blocks, fs.message().c_str());
      continue;
    }
    // `info` keeps the forward's layout (the k split is the forward's alone);
    // `walk` the backward's, for where its walk's product ran.
    GatedRnnLaunchInfo walk;
    o.chosen = &walk;
    // The backward in the same layout where it can run (not at two blocks
    // a multiprocessor, whose blocks do not all fit): else the forward alone.
    const Status bs = gated_rnn_backward(backward_args(p, *sets[0], 0, 1, false), c.stream, &o);
    o.chosen = nullptr;
    if (!bs.ok()) (void)cudaGetLastError();
    check_cuda(cudaStreamSynchronize(c.stream), "cudaStreamSynchronize");
    const auto y = download(first.y, 0, elements(first.y));
    const auto gwx = download(first.grad_wx, 0, elements(first.grad_wx));
    if (li == 0) {
      y_auto = y;
      gwx_auto = gwx;
    }
    auto fwd = [&](int rep) {
      require(gated_rnn_forward(forward_args(p, sets[static_cast<std::size_t>(rep) % sets.size()]->layer[0],
                                              false),
                                c.stream, &o),
              "gated_rnn_forward");
    };
    auto bwd = [&](int rep) {
      require(gated_rnn_backward(backward_args(p, *sets[static_cast<std::size_t>(rep) % sets.size()], 0, 1,
                                               false),
                                 c.stream, &o),
              "gated_rnn_backward");
    };
    const Times tf = time_ours(c.stream, budget, sets.size(), small, fwd);
    const Times tb = bs.ok() ? time_ours(c.stream, budget, sets.size(), small, bwd) : Times{};
    std::printf("%-5s %-5s %-14s %-4s %s%-3d x %3d slices, %2d groups of %3d rows, tile %2d, %s: fwd %9.2f "
                "bwd %9.2f us (graph%s); vs auto |dy| %.2g |dgrad_wx|/|ref| %.2g; finite %s\n",
                gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), shape_name(p.s).c_str(),
                li == 0 ? "auto" : "", layout_letter(info), info.units_per_block,
                info.blocks / std::max(info.batch_blocks, 1),
                info.batch_blocks, static_cast<int>((B + info.batch_blocks - 1) / info.batch_blocks),
                info.batch_tile, info.resident_weights ? "res" : "str", tf.graph_us, tb.graph_us,
                bs.ok() && walk.walk_tensor_cores ? ", walk on tensor cores" : "", normwise(y, y_auto),
                bs.ok() ? normwise(gwx, gwx_auto) : 0.0,
                count_nonfinite(first.y) + (bs.ok() ? count_nonfinite(first.grad_wx) : 0) == 0 ? "yes"
                                                                                               : "NO");
    if (!bs.ok()) std::printf("      (backward not run in this layout: %s)\n", bs.message().c_str());
    std::fflush(stdout);
  }
}

// --layouts, the stack's backward: two layers (the tensors of the "stk"
// rows), its reverse wavefront (GatedRnnLaunchOptions::stack_wavefront = 1)
// against the layers one after another (0), the backward alone, graph
// replay of one input set, the automatic plan named: the evidence for
// kGatedRnnStackBackwardMinSteps. Each plan is first checked against the two
// one-layer calls (validate_stack_backward).
void run_stack_backward_plans(const SectionContext& c, const Gemm& gemm, const Problem& p,
                              uint64_t seed) {
  double ignored = 0;
  const auto set = make_call_set(p, seed, c.stream, &ignored);
  const auto st = make_stacked_set(p, *set, c.stream);
  GatedRnnLaunchInfo automatic;
  GatedRnnLaunchOptions probe;
  probe.chosen = &automatic;
  project_forward(p, set->layer[0], gemm);
  require(gated_rnn_stack_forward(st->args, c.stream), "gated_rnn_stack_forward");
  require(gated_rnn_stack_backward(st->backward, c.stream, &probe), "gated_rnn_stack_backward");
  const Budget budget{c.quick ? 2e4 : 1e5, c.quick ? 20 : 100};
  double us[2] = {0, 0};
  std::string checked[2];
  for (int wavefront : {1, 0}) {
    GatedRnnLaunchInfo info;
    GatedRnnLaunchOptions o;
    o.stack_wavefront = wavefront;
    o.chosen = &info;
    require(gated_rnn_stack_backward(st->backward, c.stream, &o), "gated_rnn_stack_backward");
    o.chosen = nullptr;
    if (wavefront == 1 && !info.stacked) {
      checked[1] = "the wavefront does not fit";
      continue;
    }
    // (The check leaves the stacked forward's outputs, which the timed
    // backward reads.)
    checked[wavefront] = validate_stack_backward(p, *set, *st, gemm, c.stream, &o);
    us[wavefront] = time_ours(c.stream, budget, 1, small_call(p.s), [&](int) {
                      require(gated_rnn_stack_backward(st->backward, c.stream, &o),
                              "gated_rnn_stack_backward");
                    }).graph_us;
  }
  std::printf("%-5s %-5s %-14s L2 stack backward (graph us): wavefront %9.2f  layer by layer %9.2f  "
              "ratio %5.2fx  automatic: %s\n      wavefront: %s\n      layer by layer: %s\n",
              gated_rnn_cell_name(p.cell.cell), dtype_name(p.dtype), shape_name(p.s).c_str(), us[1],
              us[0], us[1] > 0 ? us[0] / us[1] : 0.0,
              automatic.stacked ? "the wavefront" : "layer by layer", checked[1].c_str(),
              checked[0].c_str());
  std::fflush(stdout);
}

}  // namespace

void bench_gated_rnn(const SectionContext& context, bool small, bool layouts, bool exact_f32,
                     bool f32_tensor_cores) {
  const Gemm gemm(context.stream, exact_f32);
  const Rates rates = measure_rates(context, gemm);
  std::printf("\n== gated_rnn (issue 30): GRU and LSTM, exphil::gated_rnn_forward / _backward ==\n");
  std::printf("f32 FMA rate %.1f TFLOP/s (CUDA cores); products by %s: 4096^3 f32 %.0f, bf16 %.0f "
              "TFLOP/s; handoff between SMs %.3f us (%s)\n",
              rates.fma_flops / 1e12, gemm.engine(), rates.gemm_flops[0] / 1e12,
              rates.gemm_flops[1] / 1e12, rates.handoff_us, rates.handoff_note.c_str());
  std::printf("L: layers (2 = two calls back to back; proj stk: both as one launch of a stacked "
              "kernel, B <= 4, layer 1's projection included). proj yes: each layer's x W before its call and "
              "grad_W, grad_x after its backward (no input bias), as torch.nn.GRU/LSTM(H, H, L); "
              "no: the kernels alone on a given wx.\n"
              "graph_us: replay of 20 calls back to back where B*T*H <= 65536, of 1 call above. "
              "floor_us: max(bytes / copy bandwidth, recurrent FLOPs / FMA rate + projection FLOPs / "
              "product rate, (T + L - 1) steps per direction x handoff + a launch); x_floor = graph_us "
              "/ floor_us; stepwise: one launch per step (bench/gated_rnn_stepwise.h), graph replay; "
              "speedup = stepwise_us / graph_us\n");
  const uint64_t seed = test::test_seed();
  // (exact_f32 changes only f32's projections, f32_tensor_cores only f32's
  // kernels.)
  const std::vector<DType> dtypes = exact_f32 || f32_tensor_cores
                                        ? std::vector<DType>{DType::f32}
                                        : std::vector<DType>{DType::f32, DType::bf16};
  if (f32_tensor_cores)
    std::printf("f32 rows at GatedRnnPrecision::tf32 (the forward's product, the walk's and the "
                "backward's two on tensor cores, TF32's precision or better)\n");
  if (layouts) {
    // f32 at every shape of T > 1; bf16 where the forward's product may
    // run on tensor cores (B > 4), with and without them.
    std::printf("\n== gated_rnn layouts: one layer, the kernels alone, f32; bf16 above B4 ==\n");
    uint64_t k = 0;
    for (DType dtype : dtypes)
      for (const CellSpec& cell : kCells) {
        GatedRnnForwardArgs probe;
        probe.cell = cell.cell;
        const bool has_c = tensor_slot(probe, "c_final") != nullptr;
        for (const Shape& s : kShapes)
          if (s.steps > 1 && (dtype == DType::f32 || s.batch > 4) && !(small && s.batch > 1))
            run_layouts(context, Problem{cell, dtype, s, has_c}, seed + 31 * ++k);
      }
    std::printf("\n== gated_rnn layouts: the stack's backward, two layers, H256 ==\n");
    for (DType dtype : dtypes)
      for (const CellSpec& cell : kCells) {
        GatedRnnForwardArgs probe;
        probe.cell = cell.cell;
        const bool has_c = tensor_slot(probe, "c_final") != nullptr;
        for (int64_t B : {1, 2, 4})
          for (int64_t T : {1, 2, 4, 8, 16, 32, 64})
            run_stack_backward_plans(context, gemm, Problem{cell, dtype, Shape{B, T, 256}, has_c},
                                     seed + 31 * ++k);
      }
    return;
  }
  uint64_t k = 0;
  for (const CellSpec& cell : kCells) {
    GatedRnnForwardArgs probe;
    probe.cell = cell.cell;
    const bool has_c = tensor_slot(probe, "c_final") != nullptr;
    for (DType dtype : dtypes) {
      std::printf("\n== gated_rnn: %s, %s ==\n", gated_rnn_cell_name(cell.cell), dtype_name(dtype));
      print_header();
      for (const Shape& s : kShapes) {
        ++k;
        if (small && s.batch > 1) continue;
        run_shape(context, rates, gemm, Problem{cell, dtype, s, has_c, f32_tensor_cores},
                  seed + 1000003 * k);
      }
    }
  }
}

}  // namespace exphil::bench
