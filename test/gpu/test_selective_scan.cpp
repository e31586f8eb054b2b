// Mamba's selective scan against the double reference, forward and backward
// (test/support/selective_scan_harness.hpp checks every output, poisoned
// before each call, inside guard zones, and every input left untouched).
//
// The grid of the issue: T in {1, 2, 31, 32, 33, 200, 2049}, N in {1, 16,
// 64, 256}, D in {1, 5, 512}, B in {1, 2, 3}. f32 runs the full T x N x D
// product; f16 and bf16 pair every T with every N once and rotate D and B
// through them. The seven options (dt_bias, softplus, clamp, the D skip,
// the z gate, h0 and grad_h_final) rotate across the cases of each grid so
// that each is on and off in many of them, with every shape.
//
// The chunked long-sequence path is forced with chunk_steps and the single
// pass with one chunk spanning T, and the layout the library reports is
// checked, so both paths are covered by construction, not by the planner's
// choice. Reference cost, in state updates B*T*D*N of one forward (the
// double reference takes about 28 ns per update, forward and backward
// together): f32 grid 0.5 G, of which the corner T=2049 D=512 N=256 alone
// is 0.27 G and runs once; bf16 grid 0.13 G; f16 0.03 G; the forced chunks
// 0.14 G; everything else in this file 0.07 G.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dtype_codec.hpp"
#include "scan_problems.hpp"
#include "selective_scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

constexpr int64_t kSteps[] = {1, 2, 31, 32, 33, 200, 2049};
constexpr int64_t kStates[] = {1, 16, 64, 256};
constexpr int64_t kChannels[] = {1, 5, 512};

// The options a grid rotates, one bit each.
enum Option : unsigned {
  kBias = 1u << 0,
  kSoftplus = 1u << 1,
  kClamp = 1u << 2,
  kSkip = 1u << 3,
  kGate = 1u << 4,
  kH0 = 1u << 5,
  kGradHFinal = 1u << 6,
};
constexpr int kOptionCount = 7;
constexpr unsigned kAllOptions = (1u << kOptionCount) - 1;
constexpr const char* kOptionNames[kOptionCount] = {"dt_bias", "softplus", "clamp", "D skip",
                                                    "z gate",  "h0",       "grad_h_final"};

SelectiveScanRun make_run(DType dtype, int64_t batch, int64_t steps, int64_t channels,
                          int64_t states, unsigned options) {
  SelectiveScanRun r = selective_scan_run(dtype, batch, steps, channels, states, false);
  r.problem.dt_bias = options & kBias;
  r.problem.softplus = options & kSoftplus;
  r.problem.clamp = options & kClamp;
  r.problem.skip = options & kSkip;
  r.problem.gate = options & kGate;
  r.problem.h0 = options & kH0;
  r.grad_h_final = options & kGradHFinal;
  // Without softplus, dt in U(0.01, 2) plus a bias in U(-1, 1) can make
  // delta negative; exp(delta A) then grows, and over thousands of steps the
  // state overflows f32 (y overflows f16 much sooner). Mamba never uses a
  // bias without softplus; here such cases clamp, which keeps delta >=
  // dt_min > 0.
  if (r.problem.dt_bias && !r.problem.softplus) r.problem.clamp = true;
  return r;
}

unsigned options_of(const SelectiveScanRun& r) {
  return (r.problem.dt_bias ? kBias : 0u) | (r.problem.softplus ? kSoftplus : 0u) |
         (r.problem.clamp ? kClamp : 0u) | (r.problem.skip ? kSkip : 0u) |
         (r.problem.gate ? kGate : 0u) | (r.problem.h0 ? kH0 : 0u) |
         (r.grad_h_final ? kGradHFinal : 0u);
}

// The options and batch of case `index` of a grid: bits of (37 index + salt)
// mod 256. Multiplying by an odd number permutes 0..255, so over any 256
// consecutive cases each bit is set in exactly half, and consecutive cases
// (which share T and N) differ in about half their options. Bit 7 picks the
// batch, so that it does not follow any one option.
struct Rotation {
  unsigned options;
  int64_t batch;  // 1 or 2
};
Rotation rotation(int index, unsigned salt) {
  const unsigned bits = (37u * static_cast<unsigned>(index) + salt) & 255u;
  return {bits & kAllOptions, 1 + static_cast<int64_t>(bits >> 7)};
}

// f32: the full T x N x D product.
std::vector<SelectiveScanRun> f32_grid() {
  std::vector<SelectiveScanRun> runs;
  int index = 0;
  for (int64_t steps : kSteps)
    for (int64_t states : kStates)
      for (int64_t channels : kChannels) {
        const Rotation r = rotation(index++, 11);
        // The corner T=2049 D=512 N=256 costs the reference 0.27 G state
        // updates at batch 1: it runs once, at batch 1.
        const bool corner = steps == 2049 && channels == 512 && states == 256;
        runs.push_back(
            make_run(DType::f32, corner ? 1 : r.batch, steps, channels, states, r.options));
      }
  return runs;
}

// f16 and bf16: 28 cases. T = kSteps[i % 7] and N = kStates[i % 4] give
// every (T, N) pair exactly once (7 and 4 are coprime); D rotates every
// four cases (each value 8 to 12 times), starting at a different value per
// dtype so the two grids differ; B = 1 + i % 3.
std::vector<SelectiveScanRun> half_grid(DType dtype) {
  const int d_offset = dtype == DType::f16 ? 0 : 1;
  const unsigned salt = dtype == DType::f16 ? 53 : 97;
  std::vector<SelectiveScanRun> runs;
  for (int i = 0; i < 28; ++i) {
    const int64_t steps = kSteps[i % 7];
    const int64_t states = kStates[i % 4];
    const int64_t channels = kChannels[(i / 4 + d_offset) % 3];
    runs.push_back(make_run(dtype, 1 + i % 3, steps, channels, states, rotation(i, salt).options));
  }
  return runs;
}

// The grid's own coverage: each option on in at least `min_each` cases and
// off in as many, and every value of T, N and D present `min_each_value`
// times. Checked on the full grid before anything runs, so a rotation that
// stops covering something fails here rather than testing less in silence.
void check_grid_coverage(const std::vector<SelectiveScanRun>& grid, int min_each,
                         int min_each_value) {
  for (int k = 0; k < kOptionCount; ++k) {
    int on = 0;
    for (const SelectiveScanRun& r : grid) on += (options_of(r) >> k) & 1u;
    INFO("option " << kOptionNames[k] << " on in " << on << " of " << grid.size() << " cases");
    CHECK(on >= min_each);
    CHECK(static_cast<int>(grid.size()) - on >= min_each);
  }
  const auto count = [&](const std::function<int64_t(const SelectiveScanRun&)>& field, int64_t v) {
    int n = 0;
    for (const SelectiveScanRun& r : grid) n += field(r) == v ? 1 : 0;
    return n;
  };
  for (int64_t t : kSteps) {
    INFO("T=" << t);
    CHECK(count([](const SelectiveScanRun& r) { return r.problem.steps; }, t) >= min_each_value);
  }
  for (int64_t n : kStates) {
    INFO("N=" << n);
    CHECK(count([](const SelectiveScanRun& r) { return r.problem.states; }, n) >= min_each_value);
  }
  for (int64_t d : kChannels) {
    INFO("D=" << d);
    CHECK(count([](const SelectiveScanRun& r) { return r.problem.channels; }, d) >= min_each_value);
  }
}

// Runs cases and keeps what the summary line reports.
class Sweep {
 public:
  explicit Sweep(std::string name) : name_(std::move(name)) {}

  // Runs `r` and returns its check, or nothing if the size cap leaves it out.
  std::optional<SelectiveScanCheck> run(const SelectiveScanRun& r) {
    if (!within_test_size(r)) {
      ++left_out_;
      return std::nullopt;
    }
    SelectiveScanCheck check = run_selective_scan_case(r, selective_scan_cpp_runner(), test_seed());
    INFO(check.describe());
    CHECK(check.ok());
    ++cases_;
    if (check.forward_layout.chunks > 1) ++chunked_forward_;
    if (check.backward_layout.chunks > 1) ++chunked_backward_;
    if (check.worst_ratio() > worst_) {
      worst_ = check.worst_ratio();
      worst_case_ = check.description;
    }
    return check;
  }

  // Margin report (error / allowed, 1 = at the tolerance), the planner's
  // choices and what the size cap left out.
  ~Sweep() {
    std::printf("%s: %d cases (%d left out by EXPHIL_TEST_MAX_ELEMENTS), chunked forward %d, "
                "chunked backward %d, worst error/allowed %.3g at %s\n",
                name_.c_str(), cases_, left_out_, chunked_forward_, chunked_backward_, worst_,
                worst_case_.c_str());
  }
  Sweep(const Sweep&) = delete;
  Sweep& operator=(const Sweep&) = delete;

 private:
  std::string name_;
  int cases_ = 0, left_out_ = 0, chunked_forward_ = 0, chunked_backward_ = 0;
  double worst_ = 0.0;
  std::string worst_case_;
};

void run_grid(const char* name, const std::vector<SelectiveScanRun>& grid,
              const std::function<bool(const SelectiveScanRun&)>& select) {
  Sweep sweep(name);
  for (const SelectiveScanRun& r : grid)
    if (select(r)) sweep.run(r);
}

// Test cases that exist for one large shape keep their width under
// EXPHIL_TEST_MAX_ELEMENTS (sanitizer runs) and lose length instead, rather
// than leaving the test case empty (which fails it: test_main.cpp). What the
// sanitizers watch, the blocks and their shared memory, depends on B, D and
// N more than on T.
SelectiveScanRun fit_to_test_size(SelectiveScanRun r) {
  const int64_t per_step = r.problem.batch * r.problem.channels * r.problem.states;
  const int64_t steps = std::max<int64_t>(1, max_test_elements() / per_step);
  if (steps < r.problem.steps) {
    std::printf("shortened to T=%lld for EXPHIL_TEST_MAX_ELEMENTS=%lld: %s\n",
                static_cast<long long>(steps), static_cast<long long>(max_test_elements()),
                describe(r).c_str());
    r.problem.steps = steps;
  }
  return r;
}

// The first user's settings (Edifice's Mamba): A[d, n] = -(n + 1)
// (S4D-real) and dt clamped to [0.001, 0.1].
void use_s4d_real_and_clamp(SelectiveScanRun& r) {
  r.label = "A = -(n+1), clamp [0.001, 0.1]";
  r.adjust = [](reference::SelectiveScanProblem& p) {
    p.dt_min = 0.001;
    p.dt_max = 0.1;
    for (int64_t d = 0; d < p.channels; ++d)
      for (int64_t n = 0; n < p.states; ++n)
        p.A[static_cast<std::size_t>(d * p.states + n)] = -static_cast<double>(n + 1);
  };
}

bool is_corner(const SelectiveScanRun& r) {
  return r.problem.steps == 2049 && r.problem.channels == 512 && r.problem.states == 256;
}

}  // namespace

// --- The grid ------------------------------------------------------------
// f32 is split by T so that CTest runs the parts side by side.

TEST_CASE("selective_scan f32 grid: T up to 33 with every N and D", "[gpu][selective_scan]") {
  check_grid_coverage(f32_grid(), 30, 12);
  run_grid("selective_scan f32 T<=33", f32_grid(),
           [](const SelectiveScanRun& r) { return r.problem.steps <= 33; });
}

TEST_CASE("selective_scan f32 grid: T=200 with every N and D", "[gpu][selective_scan]") {
  run_grid("selective_scan f32 T=200", f32_grid(),
           [](const SelectiveScanRun& r) { return r.problem.steps == 200; });
}

TEST_CASE("selective_scan f32 grid: T=2049 with every N and D but the widest corner",
          "[gpu][selective_scan]") {
  run_grid("selective_scan f32 T=2049", f32_grid(), [](const SelectiveScanRun& r) {
    return r.problem.steps == 2049 && !is_corner(r);
  });
}

TEST_CASE("selective_scan f32 grid: the corner T=2049 D=512 N=256", "[gpu][selective_scan]") {
  Sweep sweep("selective_scan f32 corner");
  for (const SelectiveScanRun& r : f32_grid())
    if (is_corner(r)) sweep.run(fit_to_test_size(r));
}

TEST_CASE("selective_scan f16 grid: every T with every N", "[gpu][selective_scan]") {
  check_grid_coverage(half_grid(DType::f16), 10, 4);
  run_grid("selective_scan f16", half_grid(DType::f16),
           [](const SelectiveScanRun&) { return true; });
}

TEST_CASE("selective_scan bf16 grid: every T with every N", "[gpu][selective_scan]") {
  check_grid_coverage(half_grid(DType::bf16), 10, 4);
  run_grid("selective_scan bf16", half_grid(DType::bf16),
           [](const SelectiveScanRun&) { return true; });
}

// --- Both paths by construction -------------------------------------------

TEST_CASE("selective_scan forced chunks take the chunked path and match the reference",
          "[gpu][selective_scan]") {
  struct Forced {
    int64_t batch, steps, channels, states;
    long long chunk_steps;
  };
  // Requested chunk lengths of 8, 16 and 64 steps (the library rounds them
  // up to its tile, 16 steps today), at T where the last chunk is full (32),
  // partial (200) or a single step (33, 2049).
  const Forced forced[] = {
      {2, 32, 64, 16, 16},     {1, 33, 512, 16, 8},  {3, 33, 5, 64, 16},
      {2, 200, 64, 16, 8},     {1, 200, 5, 256, 64}, {2, 2049, 64, 16, 16},
      {1, 2049, 512, 16, 64},  {1, 2049, 7, 64, 8},
  };
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Sweep sweep(std::string("selective_scan forced chunks ") + dtype_name(dtype));
    for (const Forced& f : forced) {
      // Everything on (state carried in and gradient carried out across
      // every chunk boundary), and everything off.
      for (unsigned options : {kAllOptions, 0u}) {
        SelectiveScanRun r = make_run(dtype, f.batch, f.steps, f.channels, f.states, options);
        r.chunk_steps = f.chunk_steps;
        const std::optional<SelectiveScanCheck> check = sweep.run(r);
        if (!check) continue;
        INFO(check->describe());
        CHECK(check->forward_layout.chunks > 1);
        CHECK(check->backward_layout.chunks > 1);
      }
    }
  }
}

TEST_CASE("selective_scan long memory across forced chunks matches the reference",
          "[gpu][selective_scan]") {
  // A scaled to -U(1e-4, 0.02): the state decays by less than 2% a step, so
  // it and its gradient carry across every chunk boundary (17 and 129
  // chunks), and an error in how chunks are stitched together cannot decay
  // away before the end.
  Sweep sweep("selective_scan long memory");
  struct Shape {
    int64_t batch, channels;
  };
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (long long chunk_steps : {16LL, 128LL}) {
      for (const Shape shape : {Shape{2, 64}, Shape{1, 7}}) {
        SelectiveScanRun r = make_run(dtype, shape.batch, 2049, shape.channels, 16, kAllOptions);
        r.chunk_steps = chunk_steps;
        r.label = "A / 100";
        r.adjust = [](reference::SelectiveScanProblem& p) {
          for (double& a : p.A) a = round_to(a / 100, DType::f32);
        };
        const std::optional<SelectiveScanCheck> check = sweep.run(r);
        if (!check) continue;
        INFO(check->describe());
        CHECK(check->forward_layout.chunks > 1);
        CHECK(check->backward_layout.chunks > 1);
      }
    }
  }
}

TEST_CASE("selective_scan one chunk spanning T takes the single-pass path",
          "[gpu][selective_scan]") {
  // chunk_steps = T (rounded up by the library) makes the forward one chunk
  // at any T. The backward also bounds its chunks by the state checkpoints
  // it keeps (exphil.h: one per chunk of at least 128 steps), so at long T
  // it may stay chunked; its single pass is checked at T = 33 with N = 16.
  Sweep sweep("selective_scan one chunk");
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int64_t steps : {int64_t{33}, int64_t{200}, int64_t{2049}}) {
      SelectiveScanRun r = make_run(dtype, 2, steps, 64, 16, kAllOptions);
      r.chunk_steps = steps;
      const std::optional<SelectiveScanCheck> check = sweep.run(r);
      if (!check) continue;
      INFO(check->describe());
      CHECK(check->forward_layout.chunks == 1);
      if (steps <= 128) CHECK(check->backward_layout.chunks == 1);
    }
  }
}

// --- Configurations from use ----------------------------------------------

TEST_CASE("selective_scan the user's model configuration", "[gpu][selective_scan]") {
  // No dt_bias, no softplus, clamp to [0.001, 0.1], no D skip, no z gate,
  // A[d, n] = -(n + 1) (S4D-real), B1 T32 D512 N16: the benchmark of the
  // issue. With dt in U(0.01, 2) most steps clamp at 0.1 and pass no
  // gradient to dt; those that do not must.
  Sweep sweep("selective_scan user model");
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (bool with_state : {false, true}) {
      SelectiveScanRun r =
          make_run(dtype, 1, 32, 512, 16, kClamp | (with_state ? kH0 | kGradHFinal : 0u));
      use_s4d_real_and_clamp(r);
      sweep.run(r);
    }
  }
}

TEST_CASE("selective_scan channel-mean input scale (Edifice's forward) matches the reference",
          "[gpu][selective_scan]") {
  // The forward alone (the mode has no backward). Edifice's settings (no
  // dt_bias, softplus, skip, gate or h0; clamp [0.001, 0.1]; A = -(n+1);
  // dt in U(0.01, 2), so some channels clamp at 0.1 and some do not and
  // their means differ by step) and every option on; one pass and forced
  // chunks, whose aggregate pass scales the input term too; N = 256 takes
  // several state groups; D = 1 makes the mean each channel's own delta.
  struct Shape {
    int64_t batch, steps, channels, states;
    long long chunk_steps;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 0},      {2, 33, 5, 16, 0},   {1, 32, 512, 16, 0},
                          {3, 200, 64, 64, 16}, {1, 2049, 7, 16, 64}, {2, 200, 5, 256, 0},
                          {1, 2049, 512, 16, 0}, {2, 257, 33, 16, 32}};
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    Sweep sweep(std::string("selective_scan channel-mean input scale ") + dtype_name(dtype));
    for (const Shape& shape : shapes) {
      for (bool edifice : {true, false}) {
        SelectiveScanRun r = make_run(dtype, shape.batch, shape.steps, shape.channels,
                                      shape.states, edifice ? kClamp : kAllOptions);
        r.channel_mean_input_scale = true;
        r.grad_h_final = false;
        r.chunk_steps = shape.chunk_steps;
        if (edifice) use_s4d_real_and_clamp(r);
        const std::optional<SelectiveScanCheck> check = sweep.run(r);
        if (!check) continue;
        INFO(check->describe());
        // The channel means are one kernel more than the usual forward.
        const int base = 1 + (check->forward_layout.chunks > 1 ? 2 : 0);
        CHECK(check->forward_layout.kernels >= base + 1);
        if (shape.chunk_steps > 0) CHECK(check->forward_layout.chunks > 1);
        CHECK(check->backward_layout.kernels == 0);  // no backward ran
      }
    }
  }
}

TEST_CASE("selective_scan training shape B4 T256 D512 N16", "[gpu][selective_scan]") {
  // Mamba's options (dt_bias, softplus, D skip, z gate), as in training;
  // then with a clamp and state carried in and out too.
  Sweep sweep("selective_scan training shape");
  const unsigned mamba = kBias | kSoftplus | kSkip | kGate;
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    sweep.run(fit_to_test_size(make_run(dtype, 4, 256, 512, 16, mamba)));
  sweep.run(fit_to_test_size(make_run(DType::bf16, 4, 256, 512, 16, kAllOptions)));
}

// --- Optional outputs and layouts -----------------------------------------

TEST_CASE("selective_scan gradient outputs left NULL do not disturb the others",
          "[gpu][selective_scan]") {
  Sweep sweep("selective_scan partial outputs");
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (long long chunk_steps : {0LL, 16LL}) {
      const SelectiveScanRun base = make_run(dtype, 2, 100, 24, 16, kAllOptions);
      for (SelectiveScanGrad g : kAllSelectiveScanGrads) {
        SelectiveScanRun without = base;  // every gradient but g
        without.chunk_steps = chunk_steps;
        without.omitted_grads = grad_bit(g);
        sweep.run(without);
        SelectiveScanRun only = without;  // g alone
        only.omitted_grads = ~grad_bit(g);
        only.write_h_final = false;
        sweep.run(only);
      }
      // No gradient output at all: a valid call that writes nothing (the
      // harness still checks y, and that every input is left untouched).
      SelectiveScanRun none = base;
      none.chunk_steps = chunk_steps;
      none.omitted_grads = ~0u;
      none.write_h_final = false;
      sweep.run(none);
    }
  }
}

TEST_CASE("selective_scan misaligned and odd-width tensors give the reference results",
          "[gpu][selective_scan]") {
  // Sequence tensors one element off 16-byte alignment, and widths that are
  // not multiples of 4, must take a path with the same results.
  Sweep sweep("selective_scan misaligned");
  for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
    for (int64_t channels : {int64_t{64}, int64_t{7}}) {
      for (long long chunk_steps : {0LL, 16LL}) {
        SelectiveScanRun r = make_run(dtype, 2, 100, channels, 16, kAllOptions);
        r.misalign_elements = 1;
        r.chunk_steps = chunk_steps;
        sweep.run(r);
      }
    }
  }
}
