// Selective scan timings: the user's inference shape (B1 T32 D512 N16) and a
// training shape (B32 T256 D512 N16), f32 and bf16, forward, backward and
// both, against the floor (bytes over copy bandwidth, or kernels x launch
// floor) and the one-launch-per-timestep baseline, in the same run. Inputs
// follow the user's model and benchmark: clamp to [0.001, 0.1], no bias,
// softplus, D or z; dt in U(0.01, 2), A in -U(0.01, 2).
#include "bench_selective_scan.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include "bench_kernels.h"
#include "bench_support.hpp"
#include "device_buffer.hpp"
#include "exphil/selective_scan.hpp"
#include "scan_problems.hpp"
#include "selective_scan_harness.hpp"
#include "selective_scan_stepwise.h"
#include "timing.hpp"

namespace exphil::bench {

namespace {

struct Shape {
  int64_t batch, steps, channels, states;
};

std::string shape_name(const Shape& s) {
  return "B" + std::to_string(s.batch) + " T" + std::to_string(s.steps) + " D" +
         std::to_string(s.channels) + " N" + std::to_string(s.states);
}

// The tensors of one forward + backward call.
struct CallSet {
  DeviceTensors memory;
  Tensor x{}, dt{}, A{}, B{}, C{}, y{}, h_final{}, grad_y{};
  Tensor grad_x{}, grad_dt{}, grad_A{}, grad_B{}, grad_C{};
  SelectiveScanForwardArgs fwd;
  SelectiveScanBackwardArgs bwd;
  kernels::SelectiveScanForwardParams fwd_params;  // for the stepwise baseline
  kernels::SelectiveScanBackwardParams bwd_params;
};

SelectiveScanOptions user_options() {
  SelectiveScanOptions o;
  o.clamp = true;
  o.dt_min = 0.001f;
  o.dt_max = 0.1f;
  return o;
}

std::unique_ptr<CallSet> make_call_set(DType dtype, const Shape& s, uint64_t seed,
                                       cudaStream_t stream) {
  auto set = std::make_unique<CallSet>();
  auto make = [&](DType type, std::initializer_list<int64_t> shape, float lo, float hi, uint64_t k) {
    return set->memory.make(type, shape, lo, hi, seed * 16 + k, stream);
  };
  const int64_t B = s.batch, T = s.steps, D = s.channels, N = s.states;
  set->x = make(dtype, {B, T, D}, -1, 1, 0);
  set->dt = make(dtype, {B, T, D}, 0.01f, 2, 1);
  set->A = make(DType::f32, {D, N}, -2, -0.01f, 2);
  set->B = make(dtype, {B, T, N}, -1, 1, 3);
  set->C = make(dtype, {B, T, N}, -1, 1, 4);
  set->grad_y = make(dtype, {B, T, D}, -1, 1, 5);
  set->y = make(dtype, {B, T, D}, 0, 0, 0);
  set->h_final = make(DType::f32, {B, D, N}, 0, 0, 0);
  set->grad_x = make(dtype, {B, T, D}, 0, 0, 0);
  set->grad_dt = make(dtype, {B, T, D}, 0, 0, 0);
  set->grad_A = make(DType::f32, {D, N}, 0, 0, 0);
  set->grad_B = make(dtype, {B, T, N}, 0, 0, 0);
  set->grad_C = make(dtype, {B, T, N}, 0, 0, 0);

  SelectiveScanInputs in;
  in.x = &set->x;
  in.dt = &set->dt;
  in.A = &set->A;
  in.B = &set->B;
  in.C = &set->C;
  set->fwd.in = in;
  set->fwd.options = user_options();
  set->fwd.y = &set->y;
  set->fwd.h_final = &set->h_final;
  set->bwd.in = in;
  set->bwd.options = user_options();
  set->bwd.grad_y = &set->grad_y;
  set->bwd.grad_x = &set->grad_x;
  set->bwd.grad_dt = &set->grad_dt;
  set->bwd.grad_A = &set->grad_A;
  set->bwd.grad_B = &set->grad_B;
  set->bwd.grad_C = &set->grad_C;

  kernels::SelectiveScanForwardParams& p = set->fwd_params;
  p.shape = {B, T, D, N};
  p.dtype = dtype;
  p.delta.clamp = true;
  p.delta.dt_min = 0.001f;
  p.delta.dt_max = 0.1f;
  p.d_x = set->x.data;
  p.d_dt = set->dt.data;
  p.d_A = static_cast<const float*>(set->A.data);
  p.d_B = set->B.data;
  p.d_C = set->C.data;
  p.d_y = set->y.data;
  set->bwd_params.fwd = p;
  set->bwd_params.d_grad_y = set->grad_y.data;
  set->bwd_params.d_grad_x = set->grad_x.data;
  set->bwd_params.d_grad_dt = set->grad_dt.data;
  return set;
}

// Each input read once, each output written once.
double minimum_bytes(DType dtype, const Shape& s, Direction d) {
  const double e = static_cast<double>(dtype_size(dtype));
  const double seq = static_cast<double>(s.batch * s.steps * s.channels) * e;
  const double proj = static_cast<double>(s.batch * s.steps * s.states) * e;
  const double param = static_cast<double>(s.channels * s.states) * 4.0;
  const double state = static_cast<double>(s.batch * s.channels * s.states) * 4.0;
  const double fwd = 3 * seq + 2 * proj + param + state;  // x, dt, y; B, C; A; h_final
  const double bwd = 5 * seq + 4 * proj + 2 * param;      // x, dt, dy, dx, ddt; B, C, dB, dC; A, dA
  return d == Direction::forward ? fwd : d == Direction::backward ? bwd : fwd + bwd;
}

struct Row : Timing {
  std::string layout;
  double stepwise_us = 0;
};

void print_header() {
  std::printf("%-20s %-8s %-22s %10s %10s %7s %9s %8s %12s %9s\n", "shape", "dir", "layout",
              "events_us", "graph_us", "%copy", "floor_us", "host_us", "stepwise_us", "speedup");
}

void print_row(const Shape& s, Direction d, const Row& r) {
  std::printf("%-20s %-8s %-22s %10.2f %10.2f %6.0f%% %9.2f %8.2f %12.1f %8.1fx\n",
              shape_name(s).c_str(), direction_name(d), r.layout.c_str(), r.events_us, r.graph_us,
              100.0 * r.copy_share, r.floor_us, r.host_us, r.stepwise_us,
              r.stepwise_us / r.graph_us);
}

class SelectiveScanBench {
 public:
  explicit SelectiveScanBench(const SectionContext& c) : c_(c) {}

  void run(DType dtype, const Shape& s) {
    const double err = validate(dtype, s);
    const std::size_t count = c_.rotation(minimum_bytes(dtype, s, Direction::both));
    std::vector<std::unique_ptr<CallSet>> sets;
    for (std::size_t i = 0; i < count; ++i) sets.push_back(make_call_set(dtype, s, 100 + i, c_.stream));
    const std::size_t history_floats =
        static_cast<std::size_t>(s.batch * (s.steps + 1) * s.channels * s.states);
    DeviceMemory history(history_floats * sizeof(float));
    DeviceMemory grad_state(static_cast<std::size_t>(s.batch * s.channels * s.states) * sizeof(float));
    DeviceMemory dA_parts(static_cast<std::size_t>(s.batch * s.channels * s.states) * sizeof(float));
    DeviceMemory dBC(static_cast<std::size_t>(2 * s.batch * s.steps * s.states) * sizeof(float));
    check_cuda(cudaMemsetAsync(history.get(), 0, history_floats * sizeof(float), c_.stream), "memset");
    check_cuda(cudaStreamSynchronize(c_.stream), "cudaStreamSynchronize");

    Row rows[3];
    for (Direction d : {Direction::forward, Direction::backward, Direction::both}) {
      Row& row = rows[static_cast<int>(d)];
      SelectiveScanLaunchInfo fwd_info, bwd_info;
      SelectiveScanLaunchOptions probe;
      probe.chosen = &fwd_info;
      require(selective_scan_forward(sets[0]->fwd, c_.stream, &probe), "forward");
      probe.chosen = &bwd_info;
      require(selective_scan_backward(sets[0]->bwd, c_.stream, &probe), "backward");
      const SelectiveScanLaunchInfo& info = d == Direction::backward ? bwd_info : fwd_info;
      row.layout = std::to_string(info.state_slices) + "sl " + std::to_string(info.chunks) + "x" +
                   std::to_string(info.chunk_steps) + " k" +
                   std::to_string((d != Direction::backward ? fwd_info.kernels : 0) +
                                  (d != Direction::forward ? bwd_info.kernels : 0));
      const int kernels = (d != Direction::backward ? fwd_info.kernels : 0) +
                          (d != Direction::forward ? bwd_info.kernels : 0);
      auto call = [&](int rep) {
        CallSet& cs = *sets[static_cast<std::size_t>(rep) % sets.size()];
        if (runs_forward(d)) require(selective_scan_forward(cs.fwd, c_.stream), "forward");
        if (runs_backward(d)) require(selective_scan_backward(cs.bwd, c_.stream), "backward");
      };
      static_cast<Timing&>(row) =
          time_calls(c_, sets.size(), kernels, minimum_bytes(dtype, s, d), call);

      auto stepwise = [&](int rep) {
        CallSet& cs = *sets[static_cast<std::size_t>(rep) % sets.size()];
        auto* h = static_cast<float*>(history.get());
        // The backward needs the forward's history, so both always run.
        check_cuda(launch_stepwise_selective_forward(cs.fwd_params, h, c_.stream), "stepwise forward");
        if (d != Direction::forward)
          check_cuda(launch_stepwise_selective_backward(
                         cs.bwd_params, h, static_cast<float*>(grad_state.get()),
                         static_cast<float*>(dA_parts.get()), static_cast<float*>(dBC.get()),
                         c_.stream),
                     "stepwise backward");
      };
      row.stepwise_us = median_graph_us(c_.stream, 2, 1, c_.quick ? 6 : 20, stepwise);
      print_row(s, d, row);
    }
    std::printf("%-20s validation: worst error / tolerance %.3g (%s); stepwise bwd includes its "
                "forward (it needs the states)\n",
                shape_name(s).c_str(), err, err <= 1.0 ? "pass" : "FAIL");

    const std::string name = std::string(dtype_name(dtype)) + " " + shape_name(s);
    if (s.batch == 1 && s.steps == 32 && s.channels == 512 && s.states == 16)
      c_.add_target("selective_scan fwd " + name + " < 8 us (graph)", rows[0].graph_us < 8.0,
                 rows[0].graph_us);
    if (s.batch == 32 && s.steps == 256 && s.channels == 512 && s.states == 16)
      c_.add_target("selective_scan fwd+bwd " + name + " < 250 us (graph)", rows[2].graph_us < 250.0,
                 rows[2].graph_us);
  }

 private:
  // Worst error / tolerance of a fresh problem of this shape and the user's
  // options against the double reference.
  double validate(DType dtype, const Shape& s) {
    test::SelectiveScanRun run;
    run.problem.batch = s.batch;
    run.problem.steps = s.steps;
    run.problem.channels = s.channels;
    run.problem.states = s.states;
    run.problem.clamp = true;
    run.dtype = dtype;
    run.label = "user model";
    run.adjust = [](reference::SelectiveScanProblem& p) {
      p.dt_min = 0.001;
      p.dt_max = 0.1;
    };
    const test::SelectiveScanCheck check =
        test::run_selective_scan_case(run, test::selective_scan_cpp_runner(c_.stream), test::test_seed());
    if (!check.ok()) std::printf("VALIDATION FAILED:\n%s", check.describe().c_str());
    return check.ok() ? check.worst_ratio() : INFINITY;
  }

  SectionContext c_;
};

}  // namespace

void bench_selective_scan(const SectionContext& context, const long long only_shape[4]) {
  SelectiveScanBench bench(context);
  std::vector<Shape> shapes = {{1, 32, 512, 16}, {32, 256, 512, 16}};
  if (only_shape[0] > 0) shapes = {{only_shape[0], only_shape[1], only_shape[2], only_shape[3]}};
  for (DType dtype : {DType::f32, DType::bf16}) {
    std::printf("\n== selective_scan, %s (clamp [0.001, 0.1]) ==\n", dtype_name(dtype));
    print_header();
    for (const Shape& s : shapes) bench.run(dtype, s);
  }
}

}  // namespace exphil::bench
