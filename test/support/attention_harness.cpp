#include "attention_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include <cuda_runtime_api.h>

#include "attention_reference.hpp"
#include "compare.hpp"
#include "device_buffer.hpp"
#include "dtype_codec.hpp"
#include "scan_problems.hpp"

namespace exphil::test {

namespace {

using reference::AttentionProblem;

// Index of element (b, h, l, c) of a [B, H, L, d] tensor stored in `layout`.
int64_t layout_index(AttentionLayout layout, int64_t b, int64_t h, int64_t l, int64_t c,
                     int64_t H, int64_t L, int64_t d) {
  if (layout == AttentionLayout::bhtd) return ((b * H + h) * L + l) * d + c;
  return ((b * L + l) * H + h) * d + c;
}

// BHTD values to the run's layout (to_bhtd false), or the run's layout to
// BHTD (true).
std::vector<double> permute(const std::vector<double>& v, AttentionLayout layout, int64_t B,
                            int64_t H, int64_t L, int64_t d, bool to_bhtd) {
  if (layout == AttentionLayout::bhtd) return v;
  std::vector<double> out(v.size());
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t l = 0; l < L; ++l)
        for (int64_t c = 0; c < d; ++c) {
          const int64_t bhtd = ((b * H + h) * L + l) * d + c;
          const int64_t stored = layout_index(layout, b, h, l, c, H, L, d);
          if (to_bhtd)
            out[bhtd] = v[stored];
          else
            out[stored] = v[bhtd];
        }
  return out;
}
std::vector<double> to_layout(const std::vector<double>& bhtd, AttentionLayout layout, int64_t B,
                              int64_t H, int64_t L, int64_t d) {
  return permute(bhtd, layout, B, H, L, d, false);
}
std::vector<double> from_layout(const std::vector<double>& v, AttentionLayout layout, int64_t B,
                                int64_t H, int64_t L, int64_t d) {
  return permute(v, layout, B, H, L, d, true);
}

std::vector<int64_t> shape_of(AttentionLayout layout, int64_t B, int64_t H, int64_t L, int64_t d) {
  if (layout == AttentionLayout::bhtd) return {B, H, L, d};
  return {B, L, H, d};
}

// Checks `got` against `ref` element by element; appends a line to
// `failures` naming the worst element if any fails.
void judge(const char* what, const std::vector<double>& got, const std::vector<double>& ref,
           const std::vector<double>& terms, const AttentionTolerance& tol,
           std::vector<std::string>& failures) {
  std::size_t bad = 0, worst = 0;
  double worst_ratio = 0.0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    const double allowed = tol.terms_factor * terms[i] + tol.rtol * std::fabs(ref[i]) + tol.floor;
    const double err = std::fabs(got[i] - ref[i]);
    const bool ok = std::isfinite(got[i]) ? err <= allowed : got[i] == ref[i];
    const double ratio = !std::isfinite(got[i]) ? INFINITY : (allowed > 0 ? err / allowed : (err > 0 ? INFINITY : 0));
    if (!ok) ++bad;
    if (!ok && (bad == 1 || ratio > worst_ratio)) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  if (bad == 0) return;
  std::ostringstream s;
  s << what << ": " << bad << " of " << ref.size() << " elements out of tolerance; worst at "
    << worst << ": got " << got[worst] << ", reference " << ref[worst] << ", terms "
    << terms[worst] << " (error " << worst_ratio << "x the allowed)";
  failures.push_back(s.str());
}

void judge_lse(const std::vector<double>& got, const std::vector<double>& ref, double score_bound,
               std::vector<std::string>& failures) {
  std::size_t bad = 0, worst = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    bool ok;
    if (std::isinf(ref[i])) {
      ok = got[i] == ref[i];
    } else {
      ok = std::isfinite(got[i]) && std::fabs(got[i] - ref[i]) <= 1e-5 * (1.0 + score_bound);
    }
    if (!ok && bad++ == 0) worst = i;
  }
  if (bad == 0) return;
  std::ostringstream s;
  s << "lse: " << bad << " of " << ref.size() << " rows out of tolerance; first at " << worst
    << ": got " << got[worst] << ", reference " << ref[worst];
  failures.push_back(s.str());
}

void expect_ok(const Status& s, const char* what, std::vector<std::string>& failures) {
  if (!s.ok()) failures.push_back(std::string(what) + " failed: " + s.message());
}

}  // namespace

AttentionRun attention_run(DType dtype, int head_dim, const AttentionDims& dims,
                           AttentionMask mask) {
  AttentionRun r;
  r.dtype = dtype;
  r.head_dim = head_dim;
  r.batch = dims.batch;
  r.q_heads = dims.q_heads;
  r.kv_heads = dims.kv_heads;
  r.q_len = dims.q_len;
  r.kv_len = dims.kv_len;
  r.options.mask = mask;
  return r;
}

std::string describe(const AttentionRun& r) {
  std::ostringstream s;
  s << dtype_name(r.dtype) << " B" << r.batch << " Hq" << r.q_heads << " Hkv" << r.kv_heads << " T"
    << r.q_len << " S" << r.kv_len << " d" << r.head_dim << " mask="
    << (r.options.mask == AttentionMask::none     ? "none"
        : r.options.mask == AttentionMask::causal ? "causal"
                                                  : "window")
    << (r.options.mask == AttentionMask::window ? "(" + std::to_string(r.options.window) + ")"
                                                : "")
    << (r.options.layout == AttentionLayout::bthd ? " layout=BTHD" : " layout=BHTD");
  if (r.options.scale != 0.0f) s << " scale=" << r.options.scale;
  if (r.options.precision == AttentionPrecision::tf32x3) s << " precision=tf32x3";
  if (r.warps) s << " warps=" << r.warps;
  if (!r.write_lse) s << " no-lse";
  if (!r.grad_q || !r.grad_k || !r.grad_v)
    s << " grads=" << (r.grad_q ? "q" : "") << (r.grad_k ? "k" : "") << (r.grad_v ? "v" : "");
  return s.str();
}

bool within_test_size(const AttentionRun& r) {
  const int64_t scores = r.batch * r.q_heads * r.q_len * r.kv_len;
  if (scores <= max_test_elements()) return true;
  std::printf("skipped (B*Hq*T*S = %lld over EXPHIL_TEST_MAX_ELEMENTS): %s\n",
              static_cast<long long>(scores), describe(r).c_str());
  return false;
}

std::string AttentionCheck::report() const {
  std::string s;
  for (const std::string& f : failures) s += f + "\n";
  return s;
}

AttentionRunner attention_cpp_runner(Stream stream) {
  AttentionRunner r;
  r.name = stream ? "C++ API on a caller stream" : "C++ API on the managed stream";
  r.forward = [=](const AttentionForwardArgs& a, const AttentionLaunchOptions* o) {
    return attention_forward(a, stream, o);
  };
  r.backward = [=](const AttentionBackwardArgs& a, const AttentionLaunchOptions* o) {
    return attention_backward(a, stream, o);
  };
  r.synchronize = [=] {
    const cudaError_t e = stream ? cudaStreamSynchronize(stream) : cudaDeviceSynchronize();
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("synchronize: ") + cudaGetErrorString(e));
  };
  return r;
}

AttentionCheck check_attention(const AttentionRun& run, const AttentionRunner& runner,
                               uint64_t seed) {
  std::mt19937_64 rng(seed);
  const DType dt = run.dtype;
  const AttentionLayout layout = run.options.layout;
  const int64_t B = run.batch, Hq = run.q_heads, Hkv = run.kv_heads, T = run.q_len,
                S = run.kv_len, d = run.head_dim;

  AttentionProblem p;
  p.batch = B;
  p.q_heads = Hq;
  p.kv_heads = Hkv;
  p.q_len = T;
  p.kv_len = S;
  p.head_dim = d;
  p.mask = static_cast<reference::AttentionMaskKind>(static_cast<int32_t>(run.options.mask));
  p.window = run.options.window;
  p.scale = run.options.scale != 0.0f ? static_cast<double>(run.options.scale)
                                      : static_cast<double>(static_cast<float>(
                                            reference::attention_default_scale(d)));
  const auto q_count = static_cast<std::size_t>(p.query_size());
  const auto k_count = static_cast<std::size_t>(p.key_size());
  p.q = random_values(q_count, -run.q_amplitude, run.q_amplitude, dt, rng);
  p.k = random_values(k_count, -1, 1, dt, rng);
  p.v = random_values(k_count, -1, 1, dt, rng);
  const std::vector<double> grad_o = random_values(q_count, -1, 1, dt, rng);

  const reference::AttentionForwardResult fwd = reference::attention_forward(p);

  const auto q_shape = shape_of(layout, B, Hq, T, d);
  const auto k_shape = shape_of(layout, B, Hkv, S, d);
  DeviceTensor q(to_layout(p.q, layout, B, Hq, T, d), dt, q_shape);
  DeviceTensor k(to_layout(p.k, layout, B, Hkv, S, d), dt, k_shape);
  DeviceTensor v(to_layout(p.v, layout, B, Hkv, S, d), dt, k_shape);
  DeviceTensor o(dt, q_shape);
  DeviceTensor lse(DType::f32, {B, Hq, T});
  const auto q_in = q.raw(), k_in = k.raw(), v_in = v.raw();

  AttentionCheck result;
  auto& failures = result.failures;
  AttentionLaunchOptions launch;
  launch.warps_per_block = run.warps;
  launch.sm80_kernels = run.sm80_kernels;

  double score_bound = 0.0;  // max over rows of scale * sum_c |q_c| max|k|
  {
    const double kmax = max_abs(p.k);
    for (int64_t r = 0; r < p.row_count(); ++r) {
      double s = 0;
      for (int64_t c = 0; c < d; ++c) s += std::fabs(p.q[r * d + c]);
      score_bound = std::max(score_bound, std::fabs(p.scale) * s * kmax);
    }
  }
  const AttentionTolerance tol = attention_tolerance(dt);

  for (int call = 0; call < run.calls; ++call) {
    o.poison();
    lse.poison();
    AttentionForwardArgs fa;
    fa.in = {q.ptr(), k.ptr(), v.ptr()};
    fa.options = run.options;
    fa.o = o.ptr();
    fa.lse = run.write_lse || run.backward ? lse.ptr() : nullptr;
    launch.chosen = &result.forward_layout;
    expect_ok(runner.forward(fa, &launch), "forward", failures);
    runner.synchronize();
  }
  if (!failures.empty()) return result;
  judge("o", from_layout(o.values(), layout, B, Hq, T, d), fwd.o, fwd.o_terms, tol, failures);
  if (run.write_lse || run.backward) judge_lse(lse.values(), fwd.lse, score_bound, failures);
  result.outputs.o = o.raw();
  result.outputs.lse = lse.raw();

  if (run.backward) {
    // The backward takes the forward's o (as the GPU rounded it) and lse.
    const reference::AttentionBackwardResult bwd = reference::attention_backward(p, grad_o);
    DeviceTensor g_o(to_layout(grad_o, layout, B, Hq, T, d), dt, q_shape);
    DeviceTensor gq(dt, q_shape), gk(dt, k_shape), gv(dt, k_shape);
    for (int call = 0; call < run.calls; ++call) {
      gq.poison();
      gk.poison();
      gv.poison();
      AttentionBackwardArgs ba;
      ba.in = {q.ptr(), k.ptr(), v.ptr()};
      ba.options = run.options;
      ba.o = o.ptr();
      ba.lse = lse.ptr();
      ba.grad_o = g_o.ptr();
      ba.grad_q = run.grad_q ? gq.ptr() : nullptr;
      ba.grad_k = run.grad_k ? gk.ptr() : nullptr;
      ba.grad_v = run.grad_v ? gv.ptr() : nullptr;
      launch.chosen = &result.backward_layout;
      expect_ok(runner.backward(ba, &launch), "backward", failures);
      runner.synchronize();
    }
    if (!failures.empty()) return result;
    if (run.grad_q)
      judge("grad_q", from_layout(gq.values(), layout, B, Hq, T, d), bwd.grad_q, bwd.grad_q_terms,
            tol, failures);
    if (run.grad_k)
      judge("grad_k", from_layout(gk.values(), layout, B, Hkv, S, d), bwd.grad_k,
            bwd.grad_k_terms, tol, failures);
    if (run.grad_v)
      judge("grad_v", from_layout(gv.values(), layout, B, Hkv, S, d), bwd.grad_v,
            bwd.grad_v_terms, tol, failures);
    // Outputs not asked for stay poisoned: nothing was written there.
    auto untouched = [&](const DeviceTensor& t, const char* name) {
      const auto bytes = t.raw();
      if (std::any_of(bytes.begin(), bytes.end(), [](unsigned char c) { return c != 0xFF; }))
        failures.push_back(std::string(name) + " was passed as NULL but its buffer changed");
    };
    if (!run.grad_q) untouched(gq, "grad_q");
    if (!run.grad_k) untouched(gk, "grad_k");
    if (!run.grad_v) untouched(gv, "grad_v");
    for (const auto* t : {&g_o, &gq, &gk, &gv})
      if (!t->guards_intact()) failures.push_back("a backward tensor's guard zone was written");
    result.outputs.grad_q = gq.raw();
    result.outputs.grad_k = gk.raw();
    result.outputs.grad_v = gv.raw();
    if (g_o.raw() != encode(to_layout(grad_o, layout, B, Hq, T, d), dt))
      failures.push_back("grad_o changed");
  }
  if (q.raw() != q_in || k.raw() != k_in || v.raw() != v_in)
    failures.push_back("an input (q, k or v) changed");
  for (const auto* t : {&q, &k, &v, &o, &lse})
    if (!t->guards_intact()) failures.push_back("a forward tensor's guard zone was written");
  return result;
}

}  // namespace exphil::test
