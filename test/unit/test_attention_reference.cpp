// The attention reference: its backward against central finite differences
// of its forward, for every element of q, k and v, under each mask, with
// T < S and T > S (rows that see no key), groups of 1, 2 and 4 query heads
// per key head, T = 1, S = 1, windows of 1 and wider than S; its forward
// against the softmax it defines and a row worked out by hand; rows that see
// no key; and grouped-query heads against the same problem with the key
// heads replicated. This is what makes the reference trustworthy as the
// judge of the GPU kernels.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention_reference.hpp"
#include "finite_difference.hpp"
#include "scan_problems.hpp"

using exphil::DType;
using exphil::reference::AttentionBackwardResult;
using exphil::reference::AttentionForwardResult;
using exphil::reference::AttentionMaskKind;
using exphil::reference::AttentionProblem;

namespace {

using M = AttentionMaskKind;

struct AttentionCase {
  int64_t batch, q_heads, kv_heads, q_len, kv_len, head_dim;
  AttentionMaskKind mask;
  int window;
  double scale;  // 0: attention_default_scale(head_dim)
};

const char* mask_name(AttentionMaskKind mask) {
  switch (mask) {
    case M::none: return "none";
    case M::causal: return "causal";
    case M::window: return "window";
  }
  return "?";
}

std::string describe(const AttentionCase& c) {
  std::ostringstream s;
  s << "B " << c.batch << " Hq " << c.q_heads << " Hkv " << c.kv_heads << " T " << c.q_len
    << " S " << c.kv_len << " d " << c.head_dim << " mask " << mask_name(c.mask);
  if (c.mask == M::window) s << " " << c.window;
  if (c.scale != 0.0) s << " scale " << c.scale;
  return s.str();
}

// Seeds are fixed, so that a failure repeats as it is. EXPHIL_TEST_SEED,
// when set, shifts them all, to sweep others.
uint64_t case_seed(uint64_t fixed) {
  if (std::getenv("EXPHIL_TEST_SEED")) return exphil::test::test_seed() + fixed;
  return fixed;
}

// n values in U(lo, hi) rounded to f32, as a GPU run would see them. A draw
// of all zeros would make a check vacuous: refused.
std::vector<double> random_tensor(std::size_t n, double lo, double hi, std::mt19937_64& rng) {
  std::vector<double> values = exphil::test::random_values(n, lo, hi, DType::f32, rng);
  REQUIRE(std::any_of(values.begin(), values.end(), [](double v) { return v != 0.0; }));
  return values;
}

// q and k in U(-2, 2): with scale 1 / sqrt(d) the scores of a row spread
// over a few units, so the softmax is neither flat nor one-hot. v in U(-1, 1).
AttentionProblem random_problem(const AttentionCase& c, std::mt19937_64& rng) {
  AttentionProblem p;
  p.batch = c.batch;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.q_len = c.q_len;
  p.kv_len = c.kv_len;
  p.head_dim = c.head_dim;
  p.mask = c.mask;
  p.window = c.window;
  p.scale = c.scale != 0.0 ? c.scale : exphil::reference::attention_default_scale(c.head_dim);
  p.q = random_tensor(static_cast<std::size_t>(p.query_size()), -2, 2, rng);
  p.k = random_tensor(static_cast<std::size_t>(p.key_size()), -2, 2, rng);
  p.v = random_tensor(static_cast<std::size_t>(p.key_size()), -1, 1, rng);
  return p;
}

// Calls f(problem, rng) for each case, on a problem drawn from the case's
// own seed (case_seed(seed_base + index)), with the case and the seed named
// in every failure; f draws whatever else it needs from the same rng.
template <std::size_t N, class F>
void for_random_problems(const AttentionCase (&cases)[N], uint64_t seed_base, F&& f) {
  for (std::size_t index = 0; index < N; ++index) {
    const uint64_t seed = case_seed(seed_base + index);
    INFO(describe(cases[index]) << ", seed " << seed);
    std::mt19937_64 rng(seed);
    f(random_problem(cases[index], rng), rng);
  }
}

bool row_sees_a_key(const AttentionProblem& p, int64_t i) {
  for (int64_t j = 0; j < p.kv_len; ++j)
    if (exphil::reference::attention_key_visible(p, i, j)) return true;
  return false;
}

// Each output bounded by the sum of the absolute values of its terms.
void check_terms_bound(const char* name, const std::vector<double>& values,
                       const std::vector<double>& terms) {
  REQUIRE(terms.size() == values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    INFO(name << "[" << i << "] " << values[i] << ", terms " << terms[i]);
    CHECK(std::fabs(values[i]) <= terms[i] * (1 + 1e-12));
  }
}

// The reference backward of one problem against central differences of the
// loss L = sum(w_o * o), with random weights w_o (the grad_o the backward
// gets).
class GradientCheck {
 public:
  GradientCheck(AttentionProblem& p, std::mt19937_64& rng)
      : p_(p),
        w_o_(random_tensor(static_cast<std::size_t>(p.query_size()), -1, 1, rng)),
        analytic_(exphil::reference::attention_backward(p, w_o_)) {}

  const std::vector<double>& grad_o() const { return w_o_; }
  const AttentionBackwardResult& analytic() const { return analytic_; }

  // Every element of `input` (q, k or v of the problem).
  void check(const char* name, std::vector<double>& input, const std::vector<double>& analytic) {
    REQUIRE(analytic.size() == input.size());
    for (std::size_t i = 0; i < input.size(); ++i) {
      const double numeric = exphil::test::central_difference(input[i], [&] { return loss(); });
      INFO(name << "[" << i << "]: analytic " << analytic[i] << ", finite difference " << numeric);
      CHECK(exphil::test::matches_central_difference(analytic[i], numeric));
    }
  }

 private:
  double loss() const {
    const auto r = exphil::reference::attention_forward(p_);
    double l = 0.0;
    for (std::size_t i = 0; i < w_o_.size(); ++i) l += w_o_[i] * r.o[i];
    return l;
  }

  AttentionProblem& p_;
  std::vector<double> w_o_;
  AttentionBackwardResult analytic_;
};

// The problem replicated to one key/value head per query head: query head h
// reads copy h of its key head h / (Hq / Hkv).
AttentionProblem with_replicated_kv_heads(const AttentionProblem& p) {
  AttentionProblem r = p;
  r.kv_heads = p.q_heads;
  const auto row = static_cast<std::ptrdiff_t>(p.kv_len * p.head_dim);
  r.k.clear();
  r.v.clear();
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t g = h / (p.q_heads / p.kv_heads);
      const auto from = static_cast<std::ptrdiff_t>(b * p.kv_heads + g) * row;
      r.k.insert(r.k.end(), p.k.begin() + from, p.k.begin() + from + row);
      r.v.insert(r.v.end(), p.v.begin() + from, p.v.begin() + from + row);
    }
  }
  return r;
}

// [B, Hq, S, d] summed over each group of Hq / Hkv heads into [B, Hkv, S, d].
std::vector<double> sum_over_groups(const std::vector<double>& per_head,
                                    const AttentionProblem& p) {
  const auto row = static_cast<std::size_t>(p.kv_len * p.head_dim);
  std::vector<double> sum(static_cast<std::size_t>(p.key_size()), 0.0);
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t g = h / (p.q_heads / p.kv_heads);
      const auto to = static_cast<std::size_t>(b * p.kv_heads + g) * row;
      const auto from = static_cast<std::size_t>(b * p.q_heads + h) * row;
      for (std::size_t e = 0; e < row; ++e) sum[to + e] += per_head[from + e];
    }
  return sum;
}

void check_close(const char* name, const std::vector<double>& actual,
                 const std::vector<double>& expected) {
  REQUIRE(actual.size() == expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    INFO(name << "[" << i << "]");
    CHECK(actual[i] == Approx(expected[i]).epsilon(1e-12).margin(1e-13));
  }
}

}  // namespace

TEST_CASE("attention reference backward matches finite differences of its forward",
          "[reference][attention]") {
  // B, Hq, Hkv, T, S, d, mask, window, scale (0: 1 / sqrt(d))
  const AttentionCase cases[] = {
      {2, 2, 2, 5, 5, 4, M::none, 0, 0},     // one query head per key head
      {1, 4, 2, 4, 6, 8, M::none, 0, 0},     // two, T < S
      {1, 4, 1, 6, 3, 3, M::none, 0, 0},     // four, T > S
      {2, 2, 1, 6, 6, 4, M::causal, 0, 0},   // square
      {1, 4, 1, 3, 7, 3, M::causal, 0, 0},   // T < S: every row sees S - T + 1 keys or more
      {1, 2, 1, 7, 3, 8, M::causal, 0, 0},   // T > S: rows 0 to 3 see no key
      {1, 2, 2, 5, 5, 8, M::window, 1, 0},   // the diagonal alone
      {1, 4, 2, 4, 9, 4, M::window, 3, 0},   // T < S
      {1, 4, 1, 8, 4, 3, M::window, 2, 0},   // T > S: rows 0 to 3 see no key
      {1, 2, 1, 5, 5, 3, M::window, 9, 0},   // wider than S: causal
      {2, 4, 1, 1, 6, 8, M::none, 0, 0},     // T = 1
      {1, 2, 1, 1, 6, 4, M::causal, 0, 0},   // T = 1 sees every key
      {1, 2, 2, 1, 6, 4, M::window, 2, 0},   // T = 1 sees the last two
      {1, 4, 2, 5, 1, 4, M::none, 0, 0},     // S = 1: P = 1, so dQ = dK = 0
      {1, 2, 1, 4, 1, 8, M::causal, 0, 0},   // S = 1: the last row alone sees it
      {1, 2, 2, 3, 1, 3, M::window, 1, 0},
      {1, 1, 1, 1, 1, 4, M::none, 0, 0},
      {1, 2, 1, 4, 5, 4, M::causal, 0, 2.5},  // a scale of the caller's
      {1, 2, 2, 4, 5, 3, M::none, 0, -0.7},   // a negative one
  };
  for_random_problems(cases, 1000, [&](AttentionProblem p, std::mt19937_64& rng) {

    // A forward that lost its output would make the finite differences
    // vacuous: o is a convex combination of random v in every row that sees
    // a key.
    const AttentionForwardResult forward = exphil::reference::attention_forward(p);
    for (int64_t r = 0; r < p.row_count(); ++r) {
      const int64_t i = r % p.q_len;
      const auto row = static_cast<std::size_t>(r * p.head_dim);
      const bool nonzero = std::any_of(forward.o.begin() + static_cast<std::ptrdiff_t>(row),
                                       forward.o.begin() + static_cast<std::ptrdiff_t>(row) +
                                           static_cast<std::ptrdiff_t>(p.head_dim),
                                       [](double v) { return v != 0.0; });
      INFO("row " << r);
      CHECK(nonzero == row_sees_a_key(p, i));
    }
    check_terms_bound("o", forward.o, forward.o_terms);

    GradientCheck gradients(p, rng);
    const AttentionBackwardResult& g = gradients.analytic();
    gradients.check("q", p.q, g.grad_q);
    gradients.check("k", p.k, g.grad_k);
    gradients.check("v", p.v, g.grad_v);
    check_terms_bound("grad_q", g.grad_q, g.grad_q_terms);
    check_terms_bound("grad_k", g.grad_k, g.grad_k_terms);
    check_terms_bound("grad_v", g.grad_v, g.grad_v_terms);
  });
}

TEST_CASE("attention reference forward and backward of a row worked out by hand",
          "[reference][attention]") {
  // One query, two keys, d = 1, scale 1: scores 0 and ln 2, so P = (1/3, 2/3).
  AttentionProblem p;
  p.batch = p.q_heads = p.kv_heads = p.q_len = p.head_dim = 1;
  p.kv_len = 2;
  p.scale = 1.0;
  p.q = {1.0};
  p.k = {0.0, std::log(2.0)};
  p.v = {3.0, -3.0};

  const auto r = exphil::reference::attention_forward(p);
  CHECK(r.lse[0] == Approx(std::log(3.0)));
  CHECK(r.o[0] == Approx(1.0 / 3 * 3.0 + 2.0 / 3 * -3.0));  // -1
  CHECK(r.o_terms[0] == Approx(1.0 / 3 * 3.0 + 2.0 / 3 * 3.0));

  // grad_o = 1: D = dO O = -1, dP = V = (3, -3), dS = P (dP - D) = (4/3, -4/3).
  const auto g = exphil::reference::attention_backward(p, {1.0});
  CHECK(g.grad_q[0] == Approx(4.0 / 3 * 0.0 + -4.0 / 3 * std::log(2.0)));
  CHECK(g.grad_k[0] == Approx(4.0 / 3));
  CHECK(g.grad_k[1] == Approx(-4.0 / 3));
  CHECK(g.grad_v[0] == Approx(1.0 / 3));
  CHECK(g.grad_v[1] == Approx(2.0 / 3));
  // dS_terms = P (|dO V_j| + |dO O|) = (1/3 (3 + 1), 2/3 (3 + 1)).
  CHECK(g.grad_q_terms[0] == Approx(8.0 / 3 * std::log(2.0)));
  CHECK(g.grad_k_terms[0] == Approx(4.0 / 3));
  CHECK(g.grad_k_terms[1] == Approx(8.0 / 3));
  CHECK(g.grad_v_terms[0] == Approx(1.0 / 3));
  CHECK(g.grad_v_terms[1] == Approx(2.0 / 3));

  // One key: P = 1 and dS = dP - D = 0 exactly, all rounding in a float
  // kernel. The terms of grad_q and grad_k stay those of dP and D.
  AttentionProblem one = p;
  one.kv_len = 1;
  one.head_dim = 2;
  one.scale = 0.5;
  one.q = {1.0, -2.0};
  one.k = {0.5, 3.0};
  one.v = {2.0, -1.0};
  const auto r1 = exphil::reference::attention_forward(one);
  CHECK(r1.o == one.v);
  const auto g1 = exphil::reference::attention_backward(one, {1.0, 4.0});
  CHECK(g1.grad_q == std::vector<double>{0.0, 0.0});
  CHECK(g1.grad_k == std::vector<double>{0.0, 0.0});
  CHECK(g1.grad_v == std::vector<double>{1.0, 4.0});
  const double dS_terms = (2.0 + 4.0) + (2.0 + 4.0);  // sum |dO V| + sum |dO O|
  CHECK(g1.grad_q_terms[0] == Approx(0.5 * dS_terms * 0.5));
  CHECK(g1.grad_q_terms[1] == Approx(0.5 * dS_terms * 3.0));
  CHECK(g1.grad_k_terms[0] == Approx(0.5 * dS_terms * 1.0));
  CHECK(g1.grad_k_terms[1] == Approx(0.5 * dS_terms * 2.0));
}

TEST_CASE("attention reference forward: each row's softmax sums to 1 and weighs o",
          "[reference][attention]") {
  // Scale 1000 gives scores in the thousands: without the maximum taken out
  // of the exponent the sums would overflow.
  const AttentionCase cases[] = {
      {2, 4, 2, 5, 7, 4, M::none, 0, 0},
      {1, 4, 1, 7, 4, 8, M::causal, 0, 0},
      {1, 2, 2, 6, 6, 3, M::window, 2, 0},
      {1, 2, 1, 4, 6, 4, M::none, 0, 1000.0},
      {1, 2, 1, 6, 6, 4, M::causal, 0, -1000.0},
  };
  uint64_t index = 0;
  for (const AttentionCase& shape : cases) {
    const uint64_t seed = case_seed(2000 + index++);
    INFO(describe(shape) << ", seed " << seed);
    std::mt19937_64 rng(seed);
    const AttentionProblem p = random_problem(shape, rng);
    const auto r = exphil::reference::attention_forward(p);
    const int64_t group = p.q_heads / p.kv_heads;
    const auto d = static_cast<std::size_t>(p.head_dim);
    for (int64_t b = 0; b < p.batch; ++b) {
      for (int64_t h = 0; h < p.q_heads; ++h) {
        for (int64_t i = 0; i < p.q_len; ++i) {
          const auto row = static_cast<std::size_t>((b * p.q_heads + h) * p.q_len + i);
          INFO("b " << b << " h " << h << " i " << i << ", lse " << r.lse[row]);
          if (!row_sees_a_key(p, i)) continue;  // the next test case's
          REQUIRE(std::isfinite(r.lse[row]));
          // P_j = exp(s_j - lse), straight from the definition.
          double total = 0.0;
          std::vector<double> o(d, 0.0), o_terms(d, 0.0);
          for (int64_t j = 0; j < p.kv_len; ++j) {
            if (!exphil::reference::attention_key_visible(p, i, j)) continue;
            const auto key =
                static_cast<std::size_t>((b * p.kv_heads + h / group) * p.kv_len + j) * d;
            double dot = 0.0;
            for (std::size_t c = 0; c < d; ++c) dot += p.q[row * d + c] * p.k[key + c];
            const double pj = std::exp(p.scale * dot - r.lse[row]);
            total += pj;
            for (std::size_t c = 0; c < d; ++c) {
              o[c] += pj * p.v[key + c];
              o_terms[c] += pj * std::fabs(p.v[key + c]);
            }
          }
          CHECK(total == Approx(1.0).epsilon(1e-12));
          for (std::size_t c = 0; c < d; ++c) {
            INFO("c " << c);
            CHECK(r.o[row * d + c] == Approx(o[c]).epsilon(1e-12).margin(1e-14));
            CHECK(r.o_terms[row * d + c] == Approx(o_terms[c]).epsilon(1e-12).margin(1e-14));
          }
        }
      }
    }
  }
}

TEST_CASE("attention reference: rows that see no key get o = 0, lse = -inf and pass nothing",
          "[reference][attention]") {
  // Causal and window with T > S: the first T - S rows see no key. Those
  // rows are the only difference from the problem of the last S queries.
  const AttentionCase cases[] = {
      {2, 2, 1, 7, 3, 4, M::causal, 0, 0},
      {1, 4, 2, 6, 2, 3, M::window, 1, 0},
      {1, 2, 2, 5, 1, 8, M::window, 4, 0},
  };
  for_random_problems(cases, 3000, [&](const AttentionProblem& p, std::mt19937_64& rng) {
    const auto grad_o = random_tensor(static_cast<std::size_t>(p.query_size()), -1, 1, rng);
    const auto r = exphil::reference::attention_forward(p);
    const auto g = exphil::reference::attention_backward(p, grad_o);
    const int64_t blind = p.q_len - p.kv_len;  // rows 0 .. blind - 1 see no key
    const auto d = static_cast<std::size_t>(p.head_dim);

    AttentionProblem tail = p;  // the last S queries, grad_o likewise
    tail.q_len = p.kv_len;
    tail.q.clear();
    std::vector<double> tail_grad_o;
    for (int64_t row = 0; row < p.row_count(); ++row) {
      const int64_t i = row % p.q_len;
      const auto at = static_cast<std::size_t>(row) * d;
      INFO("row " << row << " (query " << i << ")");
      CHECK(row_sees_a_key(p, i) == (i >= blind));
      if (i >= blind) {
        CHECK(std::isfinite(r.lse[static_cast<std::size_t>(row)]));
        tail.q.insert(tail.q.end(), p.q.begin() + static_cast<std::ptrdiff_t>(at),
                      p.q.begin() + static_cast<std::ptrdiff_t>(at + d));
        tail_grad_o.insert(tail_grad_o.end(), grad_o.begin() + static_cast<std::ptrdiff_t>(at),
                           grad_o.begin() + static_cast<std::ptrdiff_t>(at + d));
        continue;
      }
      const double lse = r.lse[static_cast<std::size_t>(row)];
      CHECK(std::isinf(lse));
      CHECK(lse < 0);
      for (std::size_t e = at; e < at + d; ++e) {
        CHECK(r.o[e] == 0.0);
        CHECK(r.o_terms[e] == 0.0);
        CHECK(g.grad_q[e] == 0.0);
        CHECK(g.grad_q_terms[e] == 0.0);
      }
    }

    // The blind rows' grad_o reaches neither grad_k nor grad_v.
    const auto tail_g = exphil::reference::attention_backward(tail, tail_grad_o);
    CHECK(g.grad_k == tail_g.grad_k);
    CHECK(g.grad_v == tail_g.grad_v);
    CHECK(g.grad_k_terms == tail_g.grad_k_terms);
    CHECK(g.grad_v_terms == tail_g.grad_v_terms);
  });
}

TEST_CASE("attention reference masks: which keys each query sees", "[reference][attention]") {
  const auto visibility = [](AttentionMaskKind mask, int64_t q_len, int64_t kv_len, int window) {
    AttentionProblem p;
    p.mask = mask;
    p.q_len = q_len;
    p.kv_len = kv_len;
    p.window = window;
    std::string rows;
    for (int64_t i = 0; i < q_len; ++i) {
      for (int64_t j = 0; j < kv_len; ++j)
        rows += exphil::reference::attention_key_visible(p, i, j) ? 'x' : '.';
      rows += i + 1 < q_len ? " " : "";
    }
    return rows;
  };
  CHECK(visibility(M::none, 2, 3, 0) == "xxx xxx");
  // The diagonal aligned to the bottom right.
  CHECK(visibility(M::causal, 3, 3, 0) == "x.. xx. xxx");
  CHECK(visibility(M::causal, 2, 4, 0) == "xxx. xxxx");
  CHECK(visibility(M::causal, 4, 2, 0) == ".. .. x. xx");
  CHECK(visibility(M::window, 3, 3, 1) == "x.. .x. ..x");
  CHECK(visibility(M::window, 3, 5, 2) == ".xx.. ..xx. ...xx");
  CHECK(visibility(M::window, 4, 2, 2) == ".. .. x. xx");
  CHECK(visibility(M::window, 3, 3, 3) == "x.. xx. xxx");
  CHECK(visibility(M::window, 3, 3, 7) == "x.. xx. xxx");
}

TEST_CASE("attention reference: a window of S keys or more is the causal mask",
          "[reference][attention]") {
  for (const int extra : {0, 1, 5}) {
    const AttentionCase c{1, 4, 2, 6, 4, 4, M::causal, 0, 0};
    const uint64_t seed = case_seed(4000 + static_cast<uint64_t>(extra));
    INFO(describe(c) << ", window S + " << extra << ", seed " << seed);
    std::mt19937_64 rng(seed);
    const AttentionProblem causal = random_problem(c, rng);
    const auto grad_o = random_tensor(static_cast<std::size_t>(causal.query_size()), -1, 1, rng);
    AttentionProblem window = causal;
    window.mask = M::window;
    window.window = static_cast<int>(causal.kv_len) + extra;
    const auto rc = exphil::reference::attention_forward(causal);
    const auto rw = exphil::reference::attention_forward(window);
    CHECK(rw.o == rc.o);
    CHECK(rw.lse == rc.lse);
    const auto gc = exphil::reference::attention_backward(causal, grad_o);
    const auto gw = exphil::reference::attention_backward(window, grad_o);
    CHECK(gw.grad_q == gc.grad_q);
    CHECK(gw.grad_k == gc.grad_k);
    CHECK(gw.grad_v == gc.grad_v);
  }
  // One key fewer than S drops key 0 from the last row.
  AttentionProblem p;
  p.mask = M::window;
  p.q_len = 3;
  p.kv_len = 4;
  p.window = 3;
  CHECK_FALSE(exphil::reference::attention_key_visible(p, 2, 0));
  p.mask = M::causal;
  CHECK(exphil::reference::attention_key_visible(p, 2, 0));
}

TEST_CASE("attention reference: grouped-query heads are the sum over replicated key heads",
          "[reference][attention]") {
  const AttentionCase cases[] = {
      {2, 2, 1, 4, 5, 4, M::none, 0, 0},
      {1, 4, 2, 5, 5, 3, M::causal, 0, 0},
      {2, 4, 1, 6, 4, 8, M::window, 2, 0},
      {1, 8, 2, 3, 6, 4, M::causal, 0, 0},
  };
  for_random_problems(cases, 5000, [&](const AttentionProblem& grouped, std::mt19937_64& rng) {
    const auto grad_o = random_tensor(static_cast<std::size_t>(grouped.query_size()), -1, 1, rng);
    const AttentionProblem replicated = with_replicated_kv_heads(grouped);

    // Per query head the two problems are the same arithmetic.
    const auto rg = exphil::reference::attention_forward(grouped);
    const auto rr = exphil::reference::attention_forward(replicated);
    CHECK(rg.o == rr.o);
    CHECK(rg.lse == rr.lse);
    CHECK(rg.o_terms == rr.o_terms);

    const auto gg = exphil::reference::attention_backward(grouped, grad_o);
    const auto gr = exphil::reference::attention_backward(replicated, grad_o);
    CHECK(gg.grad_q == gr.grad_q);
    CHECK(gg.grad_q_terms == gr.grad_q_terms);
    // The group's sums, in another order.
    check_close("grad_k", gg.grad_k, sum_over_groups(gr.grad_k, grouped));
    check_close("grad_v", gg.grad_v, sum_over_groups(gr.grad_v, grouped));
    check_close("grad_k_terms", gg.grad_k_terms, sum_over_groups(gr.grad_k_terms, grouped));
    check_close("grad_v_terms", gg.grad_v_terms, sum_over_groups(gr.grad_v_terms, grouped));
  });
}

TEST_CASE("attention reference refuses problems whose shapes do not hold together",
          "[reference][attention]") {
  std::mt19937_64 rng(case_seed(6000));
  const AttentionProblem good = random_problem({1, 4, 2, 3, 5, 4, M::window, 2, 0}, rng);
  const std::vector<double> grad_o(static_cast<std::size_t>(good.query_size()), 1.0);
  CHECK_NOTHROW(exphil::reference::attention_forward(good));
  CHECK_NOTHROW(exphil::reference::attention_backward(good, grad_o));

  AttentionProblem p = good;
  p.kv_heads = 3;  // 4 query heads in groups of 3
  CHECK_THROWS_AS(exphil::reference::attention_forward(p), std::invalid_argument);
  p = good;
  p.q.pop_back();
  CHECK_THROWS_AS(exphil::reference::attention_forward(p), std::invalid_argument);
  p = good;
  p.v.push_back(0.0);
  CHECK_THROWS_AS(exphil::reference::attention_backward(p, grad_o), std::invalid_argument);
  p = good;
  p.window = 0;
  CHECK_THROWS_AS(exphil::reference::attention_forward(p), std::invalid_argument);
  CHECK_THROWS_AS(exphil::reference::attention_backward(good, {1.0}), std::invalid_argument);
}
