// exphil_bench: the fused scans against their floors and against one launch
// per timestep, in one run on one GPU.
//
// For every op, dtype and shape it prints, per direction (forward, backward,
// forward + backward): the layout chosen; median device time per call from
// CUDA events around single calls and from CUDA-graph replay of calls
// captured back to back; the bytes the call must move over that time, and
// that rate as a share of this device's copy bandwidth measured in the same
// run; the floor (the larger of bytes / copy bandwidth and kernels x the
// launch floor); the host time to validate and enqueue a call; the
// one-launch-per-timestep baseline under graph replay and the speedup over
// it; and the worst error against the double reference relative to the test
// tolerance (<= 1 passes). Inputs rotate over enough copies to exceed twice
// the L2 cache, so small shapes are timed from device memory, not from L2.
// The selective scan, attention and the GRU/LSTM sequences have their own
// sections (bench_selective_scan.cpp, bench_attention.cpp,
// bench_gated_rnn.cpp), in the same form.
//
// Usage: kUsage below (exphil_bench --help prints it).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_kernels.h"
#include "bench_attention.hpp"
#include "bench_gated_rnn.hpp"
#include "bench_selective_scan.hpp"
#include "bench_support.hpp"
#include "cpp_runner.hpp"
#include "device_buffer.hpp"
#include "exphil/runtime.hpp"
#include "exphil/scan.hpp"
#include "scan_harness.hpp"
#include "timing.hpp"

using namespace exphil;
using exphil::bench::check_cuda;
using exphil::bench::DeviceMemory;
using exphil::bench::require;

namespace {

constexpr const char* kUsage =
    "usage: exphil_bench [--quick] [--op NAME] [--small] [--sweep] [--layouts] [--exact-f32]\n"
    "                    [--f32-tensor-cores] [--selective-scan-shape B T D N]\n"
    "  --quick   fewer repetitions\n"
    "  --op      only this op: linear_scan, min_gru, min_lstm, liquid, selective_scan,\n"
    "            attention or gated_rnn (GRU and LSTM; bench/run_gated_rnn.sh adds cuDNN)\n"
    "  --small   gated_rnn at batch 1 only (B1 T32 H256, B1 T1 H256)\n"
    "  --layouts gated_rnn: instead of the section, one layer's kernels in every layout\n"
    "            (units per block x batch groups) against the automatic plan\n"
    "  --exact-f32 gated_rnn: f32 only, its projections' products as f32 FMAs rather than\n"
    "            TF32 (beside bench/peers/cudnn_rnn.py --exact-f32)\n"
    "  --f32-tensor-cores gated_rnn: f32 only, the kernels at precision tf32 (TF32's\n"
    "            precision or better, beside cudnn_rnn.py's default TF32)\n"
    "  --sweep   also time min_gru over T at B1 H256 with the automatic layout and with a\n"
    "            single segment (evidence for the planner's choice)\n"
    "  --selective-scan-shape B T D N\n"
    "            time the selective scan at this shape only (positive integers)\n"
    "  --help    this text\n"
    "Runs on CUDA device 0; on a machine without one it says so and measures nothing.\n";

// The names --op takes.
constexpr const char* kOps[] = {"linear_scan", "min_gru",   "min_lstm", "liquid",
                                "selective_scan", "attention", "gated_rnn"};

struct Options {
  bool help = false;
  bool quick = false;
  bool sweep = false;
  bool small = false;
  bool layouts = false;
  bool exact_f32 = false;
  bool f32_tensor_cores = false;
  std::string only_op;
  long long selective_scan_shape[4] = {0, 0, 0, 0};
};

struct DeviceInfo {
  cudaDeviceProp prop{};
  double copy_gbps = 0.0;        // device-to-device copy, bytes read + written
  double launch_floor_us = 0.0;  // per launch, graph replay of empty kernels
};

DeviceInfo measure_device(cudaStream_t stream) {
  DeviceInfo d;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaGetDeviceProperties(&d.prop, device), "cudaGetDeviceProperties");
  const std::size_t bytes = std::size_t{1} << 30;
  DeviceMemory src(bytes), dst(bytes);
  check_cuda(cudaMemsetAsync(src.get(), 1, bytes, stream), "cudaMemsetAsync");
  const double copy_us = bench::median_event_us(stream, 2, 10, [&](int) {
    check_cuda(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream),
               "cudaMemcpyAsync");
  });
  d.copy_gbps = 2.0 * static_cast<double>(bytes) / (copy_us * 1e3);
  d.launch_floor_us = bench::median_graph_us(stream, 1, 100, 50, [&](int) {
    check_cuda(bench::launch_empty_kernel(stream), "empty kernel");
  });
  return d;
}

// The tensors of one call: inputs, y, grad_y, input gradients, h0, h_final,
// grad_h0 (state in f32).
struct CallSet {
  std::vector<std::unique_ptr<DeviceMemory>> memory;
  Tensor x[kMaxScanInputs]{}, grad_x[kMaxScanInputs]{}, y{}, grad_y{}, h0{}, h_final{}, grad_h0{};
  ScanForwardArgs fwd;
  ScanBackwardArgs bwd;
  kernels::ScanForwardParams fwd_params;   // for the stepwise baseline
  kernels::ScanBackwardParams bwd_params;
};

struct Shape {
  int64_t batch, steps, width;
};

std::string shape_name(const Shape& s) {
  return "B" + std::to_string(s.batch) + " T" + std::to_string(s.steps) + " H" + std::to_string(s.width);
}

void input_range(ScanOp op, int k, float& lo, float& hi) {
  lo = -2.0f;
  hi = 2.0f;
  if (op == ScanOp::linear_scan) lo = -1.0f, hi = 1.0f;
  if ((op == ScanOp::min_gru && k == 0) || (op == ScanOp::min_lstm && k < 2)) lo = -4.0f, hi = 4.0f;
  if (op == ScanOp::liquid && k == 0) lo = 0.5f, hi = 8.0f;
}

std::unique_ptr<CallSet> make_call_set(ScanOp op, DType dtype, const Shape& s, uint64_t seed,
                                       cudaStream_t stream) {
  auto set = std::make_unique<CallSet>();
  const int n = scan_input_count(op);
  const std::size_t seq = static_cast<std::size_t>(s.batch * s.steps * s.width);
  const std::size_t state = static_cast<std::size_t>(s.batch * s.width);
  auto alloc = [&](Tensor& t, DType dt, bool sequence) {
    const std::size_t count = sequence ? seq : state;
    set->memory.push_back(std::make_unique<DeviceMemory>(count * dtype_size(dt)));
    t = sequence ? make_tensor(set->memory.back()->get(), dt, {s.batch, s.steps, s.width})
                 : make_tensor(set->memory.back()->get(), dt, {s.batch, s.width});
  };
  for (int k = 0; k < n; ++k) {
    alloc(set->x[k], dtype, true);
    alloc(set->grad_x[k], dtype, true);
    float lo, hi;
    input_range(op, k, lo, hi);
    check_cuda(bench::fill_uniform(set->x[k].data, dtype, seq, lo, hi, seed * 8 + static_cast<uint64_t>(k), stream),
               "fill");
  }
  alloc(set->y, dtype, true);
  alloc(set->grad_y, dtype, true);
  alloc(set->h0, DType::f32, false);
  alloc(set->h_final, DType::f32, false);
  alloc(set->grad_h0, DType::f32, false);
  check_cuda(bench::fill_uniform(set->grad_y.data, dtype, seq, -1, 1, seed * 8 + 5, stream), "fill");
  check_cuda(bench::fill_uniform(set->h0.data, DType::f32, state, -1, 1, seed * 8 + 6, stream), "fill");

  ScanForwardArgs& f = set->fwd;
  f.op = op;
  for (int k = 0; k < n; ++k) f.inputs[k] = &set->x[k];
  f.h0 = &set->h0;
  f.y = &set->y;
  f.h_final = &set->h_final;
  ScanBackwardArgs& b = set->bwd;
  b.op = op;
  for (int k = 0; k < n; ++k) {
    b.inputs[k] = &set->x[k];
    b.grad_inputs[k] = &set->grad_x[k];
  }
  b.h0 = &set->h0;
  b.y = &set->y;
  b.grad_y = &set->grad_y;
  b.grad_h0 = &set->grad_h0;

  kernels::ScanForwardParams& fp = set->fwd_params;
  fp.shape = {s.batch, s.steps, s.width};
  fp.dtype = dtype;
  for (int k = 0; k < n; ++k) fp.d_inputs[k] = set->x[k].data;
  fp.d_h0 = set->h0.data;
  fp.d_y = set->y.data;
  fp.d_h_final = set->h_final.data;
  kernels::ScanBackwardParams& bp = set->bwd_params;
  bp.shape = fp.shape;
  bp.dtype = dtype;
  for (int k = 0; k < n; ++k) {
    bp.d_inputs[k] = set->x[k].data;
    bp.d_grad_inputs[k] = set->grad_x[k].data;
  }
  bp.d_h0 = set->h0.data;
  bp.d_y = set->y.data;
  bp.d_grad_y = set->grad_y.data;
  bp.d_grad_h0 = set->grad_h0.data;

  require(scan_forward(f, stream), "forward (to fill y)");
  return set;
}

enum class Direction { forward, backward, both };
const char* direction_name(Direction d) {
  return d == Direction::forward ? "fwd" : d == Direction::backward ? "bwd" : "fwd+bwd";
}

// Bytes a call must move at the least: each input read once, each output
// written once (the backward's reads of y at tile boundaries are not counted).
double minimum_bytes(ScanOp op, DType dtype, const Shape& s, Direction d) {
  const double seq = static_cast<double>(s.batch * s.steps * s.width) * static_cast<double>(dtype_size(dtype));
  const double state = static_cast<double>(s.batch * s.width) * 4.0;
  const int n = scan_input_count(op);
  const double fwd = (n + 1) * seq + 2 * state;           // inputs, y; h0, h_final
  const double bwd = (2 * n + 1) * seq + 2 * state;       // inputs, grad_y, grads; h0, grad_h0
  return d == Direction::forward ? fwd : d == Direction::backward ? bwd : fwd + bwd;
}

struct Row {
  std::string layout;
  double events_us = 0, graph_us = 0, host_us = 0, stepwise_us = 0, floor_us = 0, gbps = 0, copy_share = 0;
};

void print_header() {
  std::printf("%-16s %-8s %-18s %10s %10s %9s %7s %9s %8s %12s %9s\n", "shape", "dir", "layout",
              "events_us", "graph_us", "GB/s", "%copy", "floor_us", "host_us", "stepwise_us",
              "speedup");
}

void print_row(const Shape& s, Direction d, const Row& r) {
  if (r.stepwise_us == 0) {
    std::printf("%-16s %-8s %-18s %10.2f %10.2f %9.0f %6.0f%% %9.2f %8.2f\n", shape_name(s).c_str(),
                direction_name(d), r.layout.c_str(), r.events_us, r.graph_us, r.gbps,
                100.0 * r.copy_share, r.floor_us, r.host_us);
    return;
  }
  std::printf("%-16s %-8s %-18s %10.2f %10.2f %9.0f %6.0f%% %9.2f %8.2f %12.1f %8.1fx\n",
              shape_name(s).c_str(), direction_name(d), r.layout.c_str(), r.events_us, r.graph_us,
              r.gbps, 100.0 * r.copy_share, r.floor_us, r.host_us, r.stepwise_us,
              r.stepwise_us / r.graph_us);
}

std::string layout_name(const ScanLaunchInfo& f) {
  return "v" + std::to_string(f.vector_width) + " " + std::to_string(f.lanes) + "x" +
         std::to_string(f.time_chunks) + " seg" + std::to_string(f.segments);
}

struct Bench {
  Options options;
  DeviceInfo device;
  cudaStream_t stream = nullptr;
  std::vector<std::string> target_lines;

  int reps() const { return options.quick ? 30 : 200; }
  int replays() const { return options.quick ? 20 : 100; }

  Row measure(ScanOp op, DType dtype, const Shape& s, Direction d,
              const std::vector<std::unique_ptr<CallSet>>& sets, ScanLaunchOptions launch,
              bool with_baseline = true) {
    Row row;
    ScanLaunchInfo chosen_fwd, chosen_bwd;
    launch.chosen = nullptr;
    auto call = [&](int rep) {
      CallSet& c = *sets[static_cast<std::size_t>(rep) % sets.size()];
      if (d != Direction::backward) require(scan_forward(c.fwd, stream, &launch), "forward");
      if (d != Direction::forward) require(scan_backward(c.bwd, stream, &launch), "backward");
    };
    {
      ScanLaunchOptions probe = launch;
      probe.chosen = &chosen_fwd;
      require(scan_forward(sets[0]->fwd, stream, &probe), "forward");
      probe.chosen = &chosen_bwd;
      require(scan_backward(sets[0]->bwd, stream, &probe), "backward");
    }
    row.layout = d == Direction::backward ? layout_name(chosen_bwd) : layout_name(chosen_fwd);
    const int kernels = (d != Direction::backward ? chosen_fwd.kernels : 0) +
                        (d != Direction::forward ? chosen_bwd.kernels : 0);

    const int per_graph = 20;
    const int graphs = std::max<int>(1, static_cast<int>((sets.size() + per_graph - 1) / per_graph));
    row.events_us = bench::median_event_us(stream, 10, reps(), call);
    row.graph_us = bench::median_graph_us(stream, graphs, per_graph, std::max(replays(), 2 * graphs), call);
    row.host_us = bench::median_host_us(stream, reps(), call);

    const double bytes = minimum_bytes(op, dtype, s, d);
    row.gbps = bytes / (row.graph_us * 1e3);
    row.copy_share = row.gbps / device.copy_gbps;
    row.floor_us = std::max(bytes / (device.copy_gbps * 1e3), kernels * device.launch_floor_us);

    if (!with_baseline) return row;
    // One launch per timestep, from the same inputs.
    DeviceMemory scratch(static_cast<std::size_t>(s.batch * s.width) * sizeof(float));
    auto stepwise = [&](int rep) {
      CallSet& c = *sets[static_cast<std::size_t>(rep) % sets.size()];
      auto* carry = static_cast<float*>(scratch.get());
      if (d != Direction::backward)
        check_cuda(bench::launch_stepwise_forward(op, c.fwd_params, carry, stream), "stepwise forward");
      if (d != Direction::forward)
        check_cuda(bench::launch_stepwise_backward(op, c.bwd_params, carry, stream), "stepwise backward");
    };
    const int step_graphs = static_cast<int>(std::min<std::size_t>(sets.size(), 8));
    row.stepwise_us = bench::median_graph_us(stream, step_graphs, 1, options.quick ? 10 : 30, stepwise);
    return row;
  }

  // Worst error / tolerance of one fresh random problem against the reference.
  double validate(ScanOp op, DType dtype, const Shape& s) {
    const test::ScanCase c = test::stateful_case(op, dtype, {s.batch, s.steps, s.width});
    const test::ScanCheck check = test::run_scan_case(c, test::cpp_runner(stream), test::test_seed());
    if (!check.ok()) std::printf("VALIDATION FAILED for %s:\n%s", test::describe_case(c).c_str(), check.describe().c_str());
    return check.ok() ? check.worst_ratio() : INFINITY;
  }

  void run_config(ScanOp op, DType dtype, const Shape& s) {
    const double err = validate(op, dtype, s);
    // Enough copies of the tensors to exceed twice the L2 cache.
    const double set_bytes = minimum_bytes(op, dtype, s, Direction::both);
    const auto count = static_cast<std::size_t>(
        std::clamp(std::ceil(2.0 * device.prop.l2CacheSize / set_bytes), 1.0, 256.0));
    std::vector<std::unique_ptr<CallSet>> sets;
    for (std::size_t i = 0; i < count; ++i) sets.push_back(make_call_set(op, dtype, s, 1000 + i, stream));
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

    Row rows[3];
    for (Direction d : {Direction::forward, Direction::backward, Direction::both}) {
      rows[static_cast<int>(d)] = measure(op, dtype, s, d, sets, {});
      print_row(s, d, rows[static_cast<int>(d)]);
    }
    std::printf("%-16s validation: worst error / tolerance %.3g (%s), %zu input sets\n",
                shape_name(s).c_str(), err, err <= 1.0 ? "pass" : "FAIL", count);

    if (op == ScanOp::min_gru && s.batch == 1 && s.steps == 32 && s.width == 256) {
      const double us = rows[0].graph_us;
      add_target("min_gru fwd " + std::string(dtype_name(dtype)) + " B1 T32 H256 kernel time (graph) < 5 us",
                 us < 5.0, std::to_string(us) + " us");
    }
    if (op == ScanOp::min_gru && dtype == DType::f32 && s.batch == 64 && s.steps == 256 && s.width == 512) {
      add_target("min_gru fwd f32 B64 T256 H512 >= 75% of copy bandwidth", rows[0].copy_share >= 0.75,
                 std::to_string(100.0 * rows[0].copy_share) + " %");
      add_target("min_gru fwd+bwd f32 B64 T256 H512 < 100 us", rows[2].graph_us < 100.0,
                 std::to_string(rows[2].graph_us) + " us");
    }
  }

  void add_target(const std::string& what, bool met, const std::string& value) {
    target_lines.push_back((met ? "MET    " : "MISSED ") + what + ": " + value);
  }

  void sweep() {
    std::printf("\n== sweep: min_gru f32, B1 H256, automatic layout vs one segment ==\n");
    print_header();
    for (int64_t t : {64, 256, 1024, 4096, 16384, 65536}) {
      const Shape s{1, t, 256};
      std::vector<std::unique_ptr<CallSet>> sets;
      sets.push_back(make_call_set(ScanOp::min_gru, DType::f32, s, 7, stream));
      sets.push_back(make_call_set(ScanOp::min_gru, DType::f32, s, 8, stream));
      for (int forced : {0, 1}) {
        ScanLaunchOptions launch;
        launch.segments = forced;
        for (Direction d : {Direction::forward, Direction::backward})
          print_row(s, d, measure(ScanOp::min_gru, DType::f32, s, d, sets, launch, false));
      }
    }
  }
};

// Throws std::invalid_argument naming the argument, what was expected and
// what came.
Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
    } else if (arg == "--quick") {
      o.quick = true;
    } else if (arg == "--sweep") {
      o.sweep = true;
    } else if (arg == "--small") {
      o.small = true;
    } else if (arg == "--layouts") {
      o.layouts = true;
    } else if (arg == "--exact-f32") {
      o.exact_f32 = true;
    } else if (arg == "--f32-tensor-cores") {
      o.f32_tensor_cores = true;
    } else if (arg == "--op") {
      if (i + 1 >= argc) throw std::invalid_argument("--op: expected an op name, got nothing");
      o.only_op = argv[++i];
      if (std::none_of(std::begin(kOps), std::end(kOps),
                       [&](const char* name) { return o.only_op == name; }))
        throw std::invalid_argument("--op: expected linear_scan, min_gru, min_lstm, liquid, "
                                    "selective_scan, attention or gated_rnn, got '" +
                                    o.only_op + "'");
    } else if (arg == "--selective-scan-shape") {
      if (i + 4 >= argc)
        throw std::invalid_argument("--selective-scan-shape: expected 4 integers B T D N");
      for (long long& d : o.selective_scan_shape) {
        const std::string value = argv[++i];
        char* end = nullptr;
        d = std::strtoll(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || d < 1)
          throw std::invalid_argument("--selective-scan-shape: expected positive integers B T D N, "
                                      "got '" + value + "'");
      }
    } else {
      throw std::invalid_argument("unknown argument '" + arg + "'");
    }
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Bench bench;
    try {
      bench.options = parse(argc, argv);
    } catch (const std::invalid_argument& e) {
      std::fprintf(stderr, "exphil_bench: %s\n%s", e.what(), kUsage);
      return 2;
    }
    if (bench.options.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    std::string why;
    if (!test::gpu_available(&why)) {
      std::printf("exphil_bench: %s.\n"
                  "Nothing was measured: the benchmark needs an NVIDIA GPU (sm_80 or newer).\n",
                  why.c_str());
      return 0;
    }
    check_cuda(cudaStreamCreateWithFlags(&bench.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    bench.device = measure_device(bench.stream);
    const cudaDeviceProp& p = bench.device.prop;
    std::printf("exphil_bench %s on %s (sm_%d%d, %d SMs, %.0f MB L2)\n", version(), p.name, p.major,
                p.minor, p.multiProcessorCount, p.l2CacheSize / 1e6);
    std::printf("copy bandwidth %.0f GB/s (1 GiB device-to-device, read + write); launch floor %.2f us "
                "per kernel (graph replay of empty kernels)\n",
                bench.device.copy_gbps, bench.device.launch_floor_us);
    std::printf("times are medians per call; graph_us: replay of 20 calls captured back to back\n");

    const Shape shapes[] = {{1, 32, 256}, {1, 1, 256}, {64, 256, 512}};
    for (ScanOp op : kAbiScanOps) {
      if (!bench.options.only_op.empty() && bench.options.only_op != scan_op_name(op)) continue;
      for (DType dtype : {DType::f32, DType::bf16}) {
        std::printf("\n== %s, %s ==\n", scan_op_name(op), dtype_name(dtype));
        print_header();
        for (const Shape& s : shapes) bench.run_config(op, dtype, s);
      }
    }
    bench::SectionContext section;
    section.stream = bench.stream;
    section.copy_gbps = bench.device.copy_gbps;
    section.launch_floor_us = bench.device.launch_floor_us;
    section.l2_bytes = static_cast<std::size_t>(p.l2CacheSize);
    section.quick = bench.options.quick;
    section.targets = &bench.target_lines;
    if (bench.options.only_op.empty() || bench.options.only_op == "selective_scan")
      bench::bench_selective_scan(section, bench.options.selective_scan_shape);
    if (bench.options.only_op.empty() || bench.options.only_op == "attention")
      bench::bench_attention(section);
    if (bench.options.only_op.empty() || bench.options.only_op == "gated_rnn")
      bench::bench_gated_rnn(section, bench.options.small, bench.options.layouts,
                             bench.options.exact_f32, bench.options.f32_tensor_cores);
    if (bench.options.sweep) bench.sweep();

    std::printf("\n== targets (issues 2, 4 and 5; issue 30's compare with cuDNN: "
                "bench/run_gated_rnn.sh) ==\n");
    for (const std::string& line : bench.target_lines) std::printf("%s\n", line.c_str());
    cudaStreamDestroy(bench.stream);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exphil_bench: %s\n", e.what());
    return 1;
  }
}
