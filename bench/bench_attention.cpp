// Attention timings: the user's inference shape (B1 h8 T32 d32) and a
// training shape (B32 h8 T256 d64), causal, T = S, Hq = Hkv, layout BHTD, as
// issue 5 and bench/peers/attention_sdpa.py (whose cuDNN and PyTorch peers
// run in Python) measure them; bf16 and f32; forward (o and lse),
// backward (dq, dk, dv from the forward's lse) and both. Each shape is
// first checked against the double reference (test/support's harness).
//
// Floor: bytes over copy bandwidth (forward: q, k, v read, o and lse
// written; backward: q, k, v, o, lse, dO read, dq, dk, dv written), or the
// kernels times the launch floor. For f32 at the training shape the FMAs
// are the real floor (issue 5's entry in bench/RESULTS.md), not the bytes.
#include "bench_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "attention_harness.hpp"
#include "bench_kernels.h"
#include "bench_support.hpp"
#include "exphil/attention.hpp"
#include "scan_problems.hpp"
#include "timing.hpp"

namespace exphil::bench {

namespace {

struct Shape {
  int64_t batch, heads, steps, head_dim;
};

std::string shape_name(const Shape& s) {
  return "B" + std::to_string(s.batch) + " h" + std::to_string(s.heads) + " T" +
         std::to_string(s.steps) + " d" + std::to_string(s.head_dim);
}

// The tensors of one forward + backward call.
struct CallSet {
  DeviceTensors memory;
  Tensor q{}, k{}, v{}, o{}, lse{}, grad_o{}, grad_q{}, grad_k{}, grad_v{};
  AttentionForwardArgs fwd;
  AttentionBackwardArgs bwd;
};

std::unique_ptr<CallSet> make_call_set(DType dtype, const Shape& s, uint64_t seed,
                                       cudaStream_t stream) {
  auto set = std::make_unique<CallSet>();
  // q in [-2, 2]: peaked, not uniform, softmax rows
  auto input = [&](float amplitude, uint64_t k, std::initializer_list<int64_t> shape) {
    return set->memory.make(dtype, shape, -amplitude, amplitude, seed * 16 + k, stream);
  };
  auto output = [&](DType type, std::initializer_list<int64_t> shape) {
    return set->memory.make(type, shape, 0, 0, 0, stream);
  };
  const int64_t B = s.batch, H = s.heads, T = s.steps, d = s.head_dim;
  set->q = input(2.0f, 0, {B, H, T, d});
  set->k = input(1.0f, 1, {B, H, T, d});
  set->v = input(1.0f, 2, {B, H, T, d});
  set->grad_o = input(1.0f, 3, {B, H, T, d});
  set->o = output(dtype, {B, H, T, d});
  set->lse = output(DType::f32, {B, H, T});
  set->grad_q = output(dtype, {B, H, T, d});
  set->grad_k = output(dtype, {B, H, T, d});
  set->grad_v = output(dtype, {B, H, T, d});

  AttentionInputs in;
  in.q = &set->q;
  in.k = &set->k;
  in.v = &set->v;
  AttentionOptions options;
  options.mask = AttentionMask::causal;
  set->fwd.in = in;
  set->fwd.options = options;
  set->fwd.o = &set->o;
  set->fwd.lse = &set->lse;
  set->bwd.in = in;
  set->bwd.options = options;
  set->bwd.o = &set->o;
  set->bwd.lse = &set->lse;
  set->bwd.grad_o = &set->grad_o;
  set->bwd.grad_q = &set->grad_q;
  set->bwd.grad_k = &set->grad_k;
  set->bwd.grad_v = &set->grad_v;
  return set;
}

// Each input read once, each output written once.
double minimum_bytes(DType dtype, const Shape& s, Direction d) {
  const double rows = static_cast<double>(s.batch * s.heads * s.steps);
  const double tensor = rows * static_cast<double>(s.head_dim) * static_cast<double>(dtype_size(dtype));
  const double lse = rows * 4.0;
  const double fwd = 4 * tensor + lse;  // q, k, v; o, lse
  const double bwd = 8 * tensor + lse;  // q, k, v, o, dO, lse; dq, dk, dv
  return d == Direction::forward ? fwd : d == Direction::backward ? bwd : fwd + bwd;
}

struct Row : Timing {
  std::string layout;
};

void print_header() {
  std::printf("%-20s %-8s %-24s %10s %10s %7s %9s %8s\n", "shape", "dir", "layout", "events_us",
              "graph_us", "%copy", "floor_us", "host_us");
}

void print_row(const Shape& s, Direction d, const Row& r) {
  std::printf("%-20s %-8s %-24s %10.2f %10.2f %6.0f%% %9.2f %8.2f\n", shape_name(s).c_str(),
              direction_name(d), r.layout.c_str(), r.events_us, r.graph_us, 100.0 * r.copy_share,
              r.floor_us, r.host_us);
}

// "4w 64k wg k1": query rows per block as warps, key tile, warpgroup kernels, kernels.
std::string layout_name(const AttentionLaunchInfo& info, bool forward) {
  std::string name = std::to_string(info.query_rows_per_block) + "q " +
                     std::to_string(info.key_tile) + "kt";
  if (forward ? info.warpgroup_forward : (info.warpgroup_dkdv || info.warpgroup_dq)) name += " wg";
  if (!forward && info.fused_backward) name += " fused";
  return name;
}

class AttentionBench {
 public:
  explicit AttentionBench(const SectionContext& c) : c_(c) {}

  void run(DType dtype, const Shape& s) {
    const char* validation = validate(dtype, s);
    const std::size_t count = c_.rotation(minimum_bytes(dtype, s, Direction::both));
    std::vector<std::unique_ptr<CallSet>> sets;
    for (std::size_t i = 0; i < count; ++i) sets.push_back(make_call_set(dtype, s, 100 + i, c_.stream));
    // Every set's o and lse from a forward first: the backward reads them.
    for (auto& set : sets) require(attention_forward(set->fwd, c_.stream), "forward");
    check_cuda(cudaStreamSynchronize(c_.stream), "cudaStreamSynchronize");

    AttentionLaunchInfo fwd_info, bwd_info;
    AttentionLaunchOptions probe;
    probe.chosen = &fwd_info;
    require(attention_forward(sets[0]->fwd, c_.stream, &probe), "forward");
    probe.chosen = &bwd_info;
    require(attention_backward(sets[0]->bwd, c_.stream, &probe), "backward");

    Row rows[3];
    for (Direction d : {Direction::forward, Direction::backward, Direction::both}) {
      Row& row = rows[static_cast<int>(d)];
      const int kernels = (runs_forward(d) ? fwd_info.kernels : 0) +
                          (runs_backward(d) ? bwd_info.kernels : 0);
      row.layout = (d == Direction::backward ? layout_name(bwd_info, false)
                                             : layout_name(fwd_info, true)) +
                   " k" + std::to_string(kernels);
      auto call = [&](int rep) {
        CallSet& cs = *sets[static_cast<std::size_t>(rep) % sets.size()];
        if (runs_forward(d)) require(attention_forward(cs.fwd, c_.stream), "forward");
        if (runs_backward(d)) require(attention_backward(cs.bwd, c_.stream), "backward");
      };
      static_cast<Timing&>(row) =
          time_calls(c_, sets.size(), kernels, minimum_bytes(dtype, s, d), call);
      print_row(s, d, row);
    }
    std::printf("%-20s validation: %s\n", shape_name(s).c_str(), validation);

    const std::string name = std::string(dtype_name(dtype)) + " " + shape_name(s);
    if (s.batch == 1 && s.heads == 8 && s.steps == 32 && s.head_dim == 32) {
      c_.add_target("attention fwd " + name + " < 8 us (graph)", rows[0].graph_us < 8.0,
                 rows[0].graph_us);
      c_.add_target("attention fwd+bwd " + name + " < 40 us (graph)", rows[2].graph_us < 40.0,
                 rows[2].graph_us);
    }
  }

 private:
  // "pass" or what failed: a fresh problem of this shape, causal, against
  // the double reference (outputs poisoned, guard zones, inputs unchanged).
  const char* validate(DType dtype, const Shape& s) {
    test::AttentionRun run = test::attention_run(
        dtype, static_cast<int>(s.head_dim), {s.batch, s.heads, s.heads, s.steps, s.steps},
        AttentionMask::causal);
    const test::AttentionCheck check =
        test::check_attention(run, test::attention_cpp_runner(c_.stream), test::test_seed());
    if (check.failures.empty()) return "pass";
    std::printf("VALIDATION FAILED (%s):\n%s", test::describe(run).c_str(), check.report().c_str());
    return "FAIL";
  }

  SectionContext c_;
};

}  // namespace

void bench_attention(const SectionContext& context) {
  AttentionBench bench(context);
  const Shape shapes[] = {{1, 8, 32, 32}, {32, 8, 256, 64}};
  for (DType dtype : {DType::bf16, DType::f32}) {
    std::printf("\n== attention, %s (causal, BHTD, T = S, Hq = Hkv) ==\n", dtype_name(dtype));
    print_header();
    for (const Shape& s : shapes) bench.run(dtype, s);
  }
}

}  // namespace exphil::bench
