#include "selective_scan_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>

#include <cuda_runtime_api.h>

#include "device_buffer.hpp"
#include "dtype_codec.hpp"
#include "exphil/runtime.hpp"
#include "scan_problems.hpp"
#include "selective_scan_reference.hpp"
#include "tolerance.hpp"

namespace exphil::test {

namespace {

using Owned = std::unique_ptr<DeviceTensor>;

// The clamp's derivative jumps from 1 to 0 at each edge. Where u (dt + bias,
// after softplus) lies within f32 rounding of an edge, the kernels (f32) and
// the reference (double) can fall on opposite sides, and grad_dt of that
// element is grad_delta on one and 0 on the other: no tolerance absorbs
// that. Such elements are moved clear by a margin about 100 times the f32
// error of u, stepping dt by a few of its dtype's ulps. A few elements in
// 10^5 move, so the inputs keep their distribution.
void keep_clear_of_clamp_edges(reference::SelectiveScanProblem& p, DType dtype) {
  if (!p.clamp) return;
  constexpr double kMargin = 1e-5;
  constexpr double kStep = 1.0 / 64;  // moves u by >= 2e-4 even where softplus is flat
  const auto u_of = [&](double dt, int64_t channel) {
    double u = dt + (p.dt_bias.empty() ? 0.0 : p.dt_bias[channel]);
    if (p.softplus) u = u > 0 ? u + std::log1p(std::exp(-u)) : std::log1p(std::exp(u));
    return u;
  };
  const auto near_edge = [&](double u) {
    return std::fabs(u - p.dt_min) < kMargin || std::fabs(u - p.dt_max) < kMargin;
  };
  for (int64_t i = 0; i < p.sequence_size(); ++i) {
    const int64_t channel = i % p.channels;
    for (int tries = 0; near_edge(u_of(p.dt[i], channel)); ++tries) {
      if (tries == 16) throw std::logic_error("keep_clear_of_clamp_edges: dt does not move");
      p.dt[i] = round_to(p.dt[i] + kStep, dtype);
    }
  }
}

// Where an output's values come from, and how they are checked.
struct Output {
  std::string name;
  Owned tensor;
  DType dtype;
  std::size_t count;
  const std::vector<double>* reference;
  double scale = -1.0;  // what atol is relative to; < 0: max |reference|
};

// An uploaded input and the values it must still hold after every call.
struct Input {
  std::string name;
  Owned tensor;
  const std::vector<double>* values;
};

std::size_t element_count(const std::vector<int64_t>& shape) {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

}  // namespace

const char* selective_scan_grad_name(SelectiveScanGrad g) {
  switch (g) {
    case SelectiveScanGrad::x: return "grad_x";
    case SelectiveScanGrad::dt: return "grad_dt";
    case SelectiveScanGrad::A: return "grad_A";
    case SelectiveScanGrad::B: return "grad_B";
    case SelectiveScanGrad::C: return "grad_C";
    case SelectiveScanGrad::dt_bias: return "grad_dt_bias";
    case SelectiveScanGrad::D: return "grad_D";
    case SelectiveScanGrad::z: return "grad_z";
    case SelectiveScanGrad::h0: return "grad_h0";
  }
  return "grad_unknown";
}

bool selective_scan_grad_applies(const SelectiveScanCase& c, SelectiveScanGrad g) {
  switch (g) {
    case SelectiveScanGrad::dt_bias: return c.dt_bias;
    case SelectiveScanGrad::D: return c.skip;
    case SelectiveScanGrad::z: return c.gate;
    case SelectiveScanGrad::h0: return c.h0;
    default: return true;
  }
}

SelectiveScanRun selective_scan_run(DType dtype, int64_t batch, int64_t steps, int64_t channels,
                                    int64_t states, bool every_option) {
  SelectiveScanRun r;
  r.dtype = dtype;
  r.problem.batch = batch;
  r.problem.steps = steps;
  r.problem.channels = channels;
  r.problem.states = states;
  r.problem.dt_bias = r.problem.softplus = r.problem.clamp = every_option;
  r.problem.skip = r.problem.gate = r.problem.h0 = every_option;
  r.grad_h_final = every_option;
  return r;
}

std::string describe(const SelectiveScanRun& run) {
  std::ostringstream out;
  out << dtype_name(run.dtype) << " " << describe(run.problem);
  if (run.grad_h_final) out << " +grad_h_final";
  if (!run.write_h_final) out << " no-h_final";
  for (SelectiveScanGrad g : kAllSelectiveScanGrads)
    if ((run.omitted_grads & grad_bit(g)) && selective_scan_grad_applies(run.problem, g))
      out << " no-" << selective_scan_grad_name(g);
  if (run.chunk_steps) out << " chunk_steps=" << run.chunk_steps;
  if (run.calls > 1) out << " calls=" << run.calls;
  if (run.misalign_elements) out << " misaligned by " << run.misalign_elements << " elements";
  if (run.channel_mean_input_scale) out << " channel-mean input scale (forward only)";
  if (!run.label.empty()) out << " [" << run.label << "]";
  return out.str();
}

std::string describe(const SelectiveScanLaunchInfo& l) {
  std::ostringstream out;
  out << l.channels_per_block << " channels/block, " << l.state_slices << " state slices, "
      << l.chunks << " chunks of " << l.chunk_steps << " steps, " << l.kernels << " kernels";
  return out.str();
}

int64_t state_updates(const SelectiveScanCase& c) {
  return c.batch * c.steps * c.channels * c.states;
}

bool within_test_size(const SelectiveScanRun& run) {
  const int64_t size = state_updates(run.problem);
  if (size <= max_test_elements()) return true;
  std::printf("left out (EXPHIL_TEST_MAX_ELEMENTS=%lld, B*T*D*N=%lld): %s\n",
              static_cast<long long>(max_test_elements()), static_cast<long long>(size),
              describe(run).c_str());
  return false;
}

int current_device() {
  int device = 0;
  const cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cudaGetDevice: ") + cudaGetErrorName(e));
  return device;
}

void wait_for_stream(Stream stream) {
  const cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cudaStreamSynchronize: ") + cudaGetErrorName(e) + " (" +
                             cudaGetErrorString(e) + ")");
}

SelectiveScanRunner selective_scan_cpp_runner(Stream stream) {
  SelectiveScanRunner r;
  r.name = stream ? "C++ API on a caller stream" : "C++ API on the managed stream";
  r.forward = [stream](const SelectiveScanForwardArgs& a, const SelectiveScanLaunchOptions* o) {
    return exphil::selective_scan_forward(a, stream, o);
  };
  r.backward = [stream](const SelectiveScanBackwardArgs& a, const SelectiveScanLaunchOptions* o) {
    return exphil::selective_scan_backward(a, stream, o);
  };
  r.synchronize = [stream] {
    if (stream) return wait_for_stream(stream);
    const Status s = exphil::synchronize(current_device());
    if (!s.ok()) throw std::runtime_error("exphil::synchronize: " + s.message());
  };
  r.takes_launch_options = true;
  return r;
}

bool SelectiveScanCheck::ok() const {
  for (const TensorCheck& t : tensors)
    if (!t.comparison.ok || !t.guards_intact) return false;
  return !tensors.empty() && unstable_outputs.empty();
}

double SelectiveScanCheck::worst_ratio() const {
  double w = 0.0;
  for (const TensorCheck& t : tensors) w = std::fmax(w, t.comparison.worst_ratio);
  return w;
}

std::string SelectiveScanCheck::describe() const {
  std::ostringstream out;
  out << description << "\nseed " << seed << " (rerun with EXPHIL_TEST_SEED=" << seed << ")\n";
  if (forward_layout.kernels)
    out << "forward layout: " << test::describe(forward_layout) << "\n";
  if (backward_layout.kernels)
    out << "backward layout: " << test::describe(backward_layout) << "\n";
  for (const TensorCheck& t : tensors) {
    out << "  " << t.comparison.describe(t.name);
    if (!t.guards_intact) out << " -- GUARD ZONE OVERWRITTEN";
    out << "\n";
  }
  for (const std::string& name : unstable_outputs)
    out << "  " << name << ": bytes differ from the first call on the same inputs\n";
  return out.str();
}

std::vector<std::string> differing_outputs(const SelectiveScanCheck& a,
                                           const SelectiveScanCheck& b) {
  std::vector<std::string> differ;
  const auto find = [](const SelectiveScanCheck& c, const std::string& name) {
    for (const SelectiveScanOutput& o : c.outputs)
      if (o.name == name) return &o;
    return static_cast<const SelectiveScanOutput*>(nullptr);
  };
  for (const SelectiveScanOutput& o : a.outputs) {
    const SelectiveScanOutput* other = find(b, o.name);
    if (!other || other->bytes != o.bytes) differ.push_back(o.name);
  }
  for (const SelectiveScanOutput& o : b.outputs)
    if (!find(a, o.name)) differ.push_back(o.name);
  return differ;
}

SelectiveScanCheck run_selective_scan_case(const SelectiveScanRun& run,
                                           const SelectiveScanRunner& runner, uint64_t seed) {
  if (run.chunk_steps != 0 && !runner.takes_launch_options)
    throw std::invalid_argument("chunk_steps cannot be forced through " + runner.name);
  if (run.calls < 1) throw std::invalid_argument("calls must be >= 1");

  SelectiveScanCheck check;
  check.seed = seed;
  check.description = describe(run) + " via " + runner.name;

  std::mt19937_64 rng(seed);
  reference::SelectiveScanProblem p = random_selective_scan_problem(run.problem, run.dtype, rng);
  if (run.adjust) run.adjust(p);
  p.channel_mean_input_scale = run.channel_mean_input_scale;
  // The kernels receive the clamp edges as f32: the reference uses the same.
  p.dt_min = static_cast<float>(p.dt_min);
  p.dt_max = static_cast<float>(p.dt_max);
  keep_clear_of_clamp_edges(p, run.dtype);

  const auto seq_count = static_cast<std::size_t>(p.sequence_size());
  const auto state_count = static_cast<std::size_t>(p.state_size());
  const std::vector<double> grad_y = random_values(seq_count, -1, 1, run.dtype, rng);
  const std::vector<double> grad_h_final =
      run.grad_h_final ? random_values(state_count, -1, 1, DType::f32, rng) : std::vector<double>{};
  const reference::SelectiveScanForwardResult ref_fwd = reference::selective_scan_forward(p);
  const bool backward = !run.channel_mean_input_scale;
  const reference::SelectiveScanBackwardResult ref_bwd =
      backward ? reference::selective_scan_backward(p, grad_y, grad_h_final)
               : reference::SelectiveScanBackwardResult{};

  const std::vector<int64_t> seq = {p.batch, p.steps, p.channels};
  const std::vector<int64_t> proj = {p.batch, p.steps, p.states};
  const std::vector<int64_t> state = {p.batch, p.channels, p.states};
  const std::vector<int64_t> a_shape = {p.channels, p.states};
  const std::vector<int64_t> per_channel = {p.channels};

  // The tensors in the sequence dtype, which misalign_elements shifts, and
  // the f32 ones (A, dt_bias, D and the states), which stay aligned.
  struct Kind {
    DType dtype;
    std::size_t misalign_bytes;
  };
  const Kind sequence{run.dtype, run.misalign_elements * dtype_size(run.dtype)};
  const Kind f32{DType::f32, 0};

  std::vector<Input> inputs;
  const auto upload = [&](const char* name, const std::vector<double>& values, Kind kind,
                          const std::vector<int64_t>& shape) -> const Tensor* {
    if (values.empty()) return nullptr;  // an absent optional input
    auto tensor = std::make_unique<DeviceTensor>(values, kind.dtype, shape, kind.misalign_bytes);
    inputs.push_back({name, std::move(tensor), &values});
    return inputs.back().tensor->ptr();
  };
  SelectiveScanInputs in;
  in.x = upload("x", p.x, sequence, seq);
  in.dt = upload("dt", p.dt, sequence, seq);
  in.A = upload("A", p.A, f32, a_shape);
  in.B = upload("B", p.B, sequence, proj);
  in.C = upload("C", p.C, sequence, proj);
  in.dt_bias = upload("dt_bias", p.dt_bias, f32, per_channel);
  in.D = upload("D", p.D, f32, per_channel);
  in.z = upload("z", p.z, sequence, seq);
  in.h0 = upload("h0", p.h0, f32, state);
  const Tensor* d_grad_y = upload("grad_y", grad_y, sequence, seq);
  const Tensor* d_grad_h_final = upload("grad_h_final", grad_h_final, f32, state);

  SelectiveScanOptions options;
  options.softplus = p.softplus;
  options.clamp = p.clamp;
  options.dt_min = static_cast<float>(p.dt_min);
  options.dt_max = static_cast<float>(p.dt_max);
  if (run.channel_mean_input_scale) options.input_scale = SelectiveScanInputScale::channel_mean;

  const auto output = [](std::vector<Output>& outputs, const char* name, Kind kind,
                         const std::vector<int64_t>& shape,
                         const std::vector<double>& ref) -> const Tensor* {
    outputs.push_back({name, std::make_unique<DeviceTensor>(kind.dtype, shape, kind.misalign_bytes),
                       kind.dtype, element_count(shape), &ref});
    return outputs.back().tensor->ptr();
  };

  std::vector<Output> fwd_outputs;
  SelectiveScanForwardArgs fwd;
  fwd.in = in;
  fwd.options = options;
  fwd.y = output(fwd_outputs, "y", sequence, seq, ref_fwd.y);
  if (run.write_h_final)
    fwd.h_final = output(fwd_outputs, "h_final", f32, state, ref_fwd.h_final);

  std::vector<Output> bwd_outputs;
  SelectiveScanBackwardArgs bwd;
  bwd.in = in;
  bwd.options = options;
  bwd.grad_y = d_grad_y;
  bwd.grad_h_final = d_grad_h_final;
  const auto grad = [&](SelectiveScanGrad g, Kind kind, const std::vector<int64_t>& shape,
                        const std::vector<double>& ref) -> const Tensor* {
    if (!backward || !selective_scan_grad_applies(run.problem, g) ||
        (run.omitted_grads & grad_bit(g)))
      return nullptr;
    return output(bwd_outputs, selective_scan_grad_name(g), kind, shape, ref);
  };
  // A gradient whose terms can cancel (grad_x and grad_dt over the N
  // states; grad_A, grad_dt_bias, grad_D over batch and time) is judged at
  // the scale of the largest sum |term| the reference reports: rounding a
  // sum costs about eps * sum |term|, which can exceed eps * |sum| by any
  // factor when the terms cancel (a d dt_bias of 1e-3 from 400 terms of
  // 0.4; a grad_dt of 2e-4 at most over one call of T1 D5 N64, 2.8 times
  // over the tolerance of its own max |ref| on an H200; a grad_x of 6.4e-3,
  // the one element of a T1 D1 N256 call, 1.14 times over, H200,
  // 2026-11-26, EXPHIL_TEST_SEED=9096706903149887185).
  bwd.grad_x = grad(SelectiveScanGrad::x, sequence, seq, ref_bwd.x);
  if (bwd.grad_x) bwd_outputs.back().scale = max_abs(ref_bwd.x_terms);
  bwd.grad_dt = grad(SelectiveScanGrad::dt, sequence, seq, ref_bwd.dt);
  if (bwd.grad_dt) bwd_outputs.back().scale = max_abs(ref_bwd.dt_terms);
  bwd.grad_A = grad(SelectiveScanGrad::A, f32, a_shape, ref_bwd.A);
  if (bwd.grad_A) bwd_outputs.back().scale = max_abs(ref_bwd.A_terms);
  bwd.grad_B = grad(SelectiveScanGrad::B, sequence, proj, ref_bwd.B);
  bwd.grad_C = grad(SelectiveScanGrad::C, sequence, proj, ref_bwd.C);
  bwd.grad_dt_bias = grad(SelectiveScanGrad::dt_bias, f32, per_channel, ref_bwd.dt_bias);
  if (bwd.grad_dt_bias) bwd_outputs.back().scale = max_abs(ref_bwd.dt_bias_terms);
  bwd.grad_D = grad(SelectiveScanGrad::D, f32, per_channel, ref_bwd.D);
  if (bwd.grad_D) bwd_outputs.back().scale = max_abs(ref_bwd.D_terms);
  bwd.grad_z = grad(SelectiveScanGrad::z, sequence, seq, ref_bwd.z);
  bwd.grad_h0 = grad(SelectiveScanGrad::h0, f32, state, ref_bwd.h0);

  SelectiveScanLaunchOptions fwd_launch, bwd_launch;
  fwd_launch.chunk_steps = bwd_launch.chunk_steps = run.chunk_steps;
  fwd_launch.chosen = &check.forward_layout;
  bwd_launch.chosen = &check.backward_layout;
  const SelectiveScanLaunchOptions* fwd_opts = runner.takes_launch_options ? &fwd_launch : nullptr;
  const SelectiveScanLaunchOptions* bwd_opts = runner.takes_launch_options ? &bwd_launch : nullptr;

  // Each call starts from poisoned outputs, so every call must write every
  // element. The first call is checked against the reference; later calls on
  // the same buffers must reproduce its bytes.
  const auto run_calls = [&](const char* direction, std::vector<Output>& outputs,
                             const std::function<Status()>& call) {
    const std::size_t first = check.outputs.size();
    for (int k = 0; k < run.calls; ++k) {
      for (Output& o : outputs) o.tensor->poison();
      const auto fail = [&](const std::string& why) {
        throw std::runtime_error(std::string(direction) + " failed: " + why + "\n" +
                                 check.description + ", seed " + std::to_string(seed));
      };
      const Status s = call();
      if (!s.ok()) fail(s.message());
      try {
        runner.synchronize();  // reports what failed in the kernels
      } catch (const std::exception& e) {
        fail(e.what());
      }
      for (std::size_t i = 0; i < outputs.size(); ++i) {
        const Output& o = outputs[i];
        std::vector<unsigned char> bytes = o.tensor->raw();
        const bool guards = o.tensor->guards_intact();
        if (k == 0) {
          // Tolerance by the output's own dtype: every output is computed in
          // f32 from inputs the reference shares exactly (the backward
          // rebuilds its states from the inputs, never from a rounded y), so
          // an f32 output of a bf16 call owes f32 accuracy. The scale is the
          // output's own max |ref|: the outputs differ by orders of magnitude
          // (grad_A and grad_D sum over B * T, grad_x does not), and a scale
          // shared across them would leave the small ones unchecked. Sums
          // over batch and time take the scale of their terms.
          // f16 values below 2^-14 are subnormal, spaced 2^-24 apart whatever
          // their size: the scale never goes below what makes atol cover
          // that spacing.
          const Tolerance tol = tolerance_for(o.dtype);
          double scale = o.scale >= 0 ? o.scale : max_abs(*o.reference);
          if (o.dtype == DType::f16) scale = std::max(scale, std::ldexp(1.0, -24) / tol.atol);
          const std::vector<double> got = decode(bytes.data(), o.count, o.dtype);
          const Comparison c = compare(got, *o.reference, tol, scale);
          check.tensors.push_back({o.name, c, guards});
          check.outputs.push_back({o.name, std::move(bytes)});
        } else {
          TensorCheck& t = check.tensors[first + i];
          t.guards_intact = t.guards_intact && guards;
          if (bytes != check.outputs[first + i].bytes)
            check.unstable_outputs.push_back(o.name + " (call " + std::to_string(k + 1) + ")");
        }
      }
    }
  };
  run_calls("forward", fwd_outputs, [&] { return runner.forward(fwd, fwd_opts); });
  if (backward) run_calls("backward", bwd_outputs, [&] { return runner.backward(bwd, bwd_opts); });

  // Inputs must come back untouched, guard zones included.
  for (const Input& i : inputs) {
    const Comparison exact = compare(i.tensor->values(), *i.values, Tolerance{0, 0});
    check.tensors.push_back({i.name, exact, i.tensor->guards_intact()});
  }
  return check;
}

}  // namespace exphil::test
