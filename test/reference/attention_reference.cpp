#include "attention_reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <stdexcept>
#include <string>

namespace exphil::reference {

namespace {

void check_problem(const AttentionProblem& p) {
  const auto fail = [](const std::string& why) {
    throw std::invalid_argument("attention reference: " + why);
  };
  if (p.batch < 0 || p.q_heads < 0 || p.kv_heads < 0 || p.q_len < 0 || p.kv_len < 0 ||
      p.head_dim < 0)
    fail("negative dimension");
  if (p.kv_heads == 0 ? p.q_heads != 0 : p.q_heads % p.kv_heads != 0)
    fail("q_heads is not a multiple of kv_heads");
  if (p.q.size() != static_cast<std::size_t>(p.query_size())) fail("q is not [B, Hq, T, d]");
  if (p.k.size() != static_cast<std::size_t>(p.key_size())) fail("k is not [B, Hkv, S, d]");
  if (p.v.size() != static_cast<std::size_t>(p.key_size())) fail("v is not [B, Hkv, S, d]");
  if (p.mask != AttentionMaskKind::none && p.mask != AttentionMaskKind::causal &&
      p.mask != AttentionMaskKind::window)
    fail("unknown mask");
  if (p.mask == AttentionMaskKind::window && p.window < 1) fail("window mask with window < 1");
}

// Flat offsets into the row-major tensors of one problem.
struct Layout {
  int64_t q_heads, kv_heads, q_len, kv_len, head_dim;

  explicit Layout(const AttentionProblem& p)
      : q_heads(p.q_heads),
        kv_heads(p.kv_heads),
        q_len(p.q_len),
        kv_len(p.kv_len),
        head_dim(p.head_dim) {}

  int64_t kv_head(int64_t h) const { return h / (q_heads / kv_heads); }

  std::size_t row(int64_t b, int64_t h, int64_t i) const {  // lse
    return static_cast<std::size_t>((b * q_heads + h) * q_len + i);
  }
  std::size_t query(int64_t b, int64_t h, int64_t i) const {  // first of q, o, grad_o's row
    return row(b, h, i) * static_cast<std::size_t>(head_dim);
  }
  std::size_t key(int64_t b, int64_t g, int64_t j) const {  // first of k, v's row
    return static_cast<std::size_t>(((b * kv_heads + g) * kv_len + j) * head_dim);
  }
};

// The softmax of one query row (b, h, i) over the keys it sees:
// p[j] = exp(s_j - lse), s_j = scale q_i . k_j, 0 for keys it does not see.
struct RowSoftmax {
  std::vector<double> p;  // [S]
  double lse = -std::numeric_limits<double>::infinity();
  bool sees_a_key = false;
};

RowSoftmax row_softmax(const AttentionProblem& p, const Layout& at, int64_t b, int64_t h,
                       int64_t i) {
  RowSoftmax row;
  row.p.assign(static_cast<std::size_t>(p.kv_len), 0.0);
  const double* q = &p.q[at.query(b, h, i)];
  const int64_t g = at.kv_head(h);
  double max_score = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < p.kv_len; ++j) {
    if (!attention_key_visible(p, i, j)) continue;
    const double* k = &p.k[at.key(b, g, j)];
    double dot = 0.0;
    for (int64_t c = 0; c < p.head_dim; ++c) dot += q[c] * k[c];
    const double score = p.scale * dot;
    row.p[static_cast<std::size_t>(j)] = score;  // the score until normalised below
    max_score = row.sees_a_key ? std::fmax(max_score, score) : score;
    row.sees_a_key = true;
  }
  if (!row.sees_a_key) return row;

  // Subtracting the maximum keeps every exp in (0, 1], one of them 1.
  double sum = 0.0;
  for (int64_t j = 0; j < p.kv_len; ++j)
    if (attention_key_visible(p, i, j))
      sum += std::exp(row.p[static_cast<std::size_t>(j)] - max_score);
  row.lse = max_score + std::log(sum);
  for (int64_t j = 0; j < p.kv_len; ++j) {
    double& pj = row.p[static_cast<std::size_t>(j)];
    pj = attention_key_visible(p, i, j) ? std::exp(pj - max_score) / sum : 0.0;
  }
  return row;
}

}  // namespace

double attention_default_scale(int64_t head_dim) {
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

bool attention_key_visible(const AttentionProblem& p, int64_t i, int64_t j) {
  const int64_t last = i + p.kv_len - p.q_len;  // the last key query i sees under a mask
  switch (p.mask) {
    case AttentionMaskKind::none:
      return true;
    case AttentionMaskKind::causal:
      return j <= last;
    case AttentionMaskKind::window:
      return last - p.window < j && j <= last;
  }
  return false;
}

AttentionForwardResult attention_forward(const AttentionProblem& p) {
  check_problem(p);
  const Layout at(p);
  const auto d = static_cast<std::size_t>(p.head_dim);
  AttentionForwardResult r;
  r.o.assign(static_cast<std::size_t>(p.query_size()), 0.0);
  r.o_terms.assign(static_cast<std::size_t>(p.query_size()), 0.0);
  r.lse.assign(static_cast<std::size_t>(p.row_count()), 0.0);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t g = at.kv_head(h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        const RowSoftmax row = row_softmax(p, at, b, h, i);
        r.lse[at.row(b, h, i)] = row.lse;
        double* o = &r.o[at.query(b, h, i)];
        double* o_terms = &r.o_terms[at.query(b, h, i)];
        for (int64_t j = 0; j < p.kv_len; ++j) {
          const double pj = row.p[static_cast<std::size_t>(j)];
          if (pj == 0.0) continue;  // not seen (or underflowed: no contribution either way)
          const double* v = &p.v[at.key(b, g, j)];
          for (std::size_t c = 0; c < d; ++c) {
            o[c] += pj * v[c];
            o_terms[c] += pj * std::fabs(v[c]);
          }
        }
      }
    }
  }
  return r;
}

// One query row (b, h, i) at a time, with its softmax P and output O
// recomputed as in the forward, and j over the keys it sees:
//   D       = sum_c dO[c] O[c]
//   dP_j    = sum_c dO[c] V_j[c]
//   dS_j    = P_j (dP_j - D)            (the softmax's Jacobian applied to dP)
//   dQ[c]   = scale sum_j dS_j K_j[c]
//   dK_j[c] += scale dS_j Q[c]          (summed over every row and query head
//   dV_j[c] += P_j dO[c]                 of the group that sees key j)
// The terms add up the same products in absolute value, dS_j's through its
// two sums written out (see attention_reference.hpp).
AttentionBackwardResult attention_backward(const AttentionProblem& p,
                                           const std::vector<double>& grad_o) {
  check_problem(p);
  if (grad_o.size() != static_cast<std::size_t>(p.query_size()))
    throw std::invalid_argument("attention reference: grad_o is not [B, Hq, T, d]");
  const Layout at(p);
  const auto d = static_cast<std::size_t>(p.head_dim);
  const auto query_size = static_cast<std::size_t>(p.query_size());
  const auto key_size = static_cast<std::size_t>(p.key_size());
  const double abs_scale = std::fabs(p.scale);
  AttentionBackwardResult grad;
  grad.grad_q.assign(query_size, 0.0);
  grad.grad_q_terms.assign(query_size, 0.0);
  grad.grad_k.assign(key_size, 0.0);
  grad.grad_k_terms.assign(key_size, 0.0);
  grad.grad_v.assign(key_size, 0.0);
  grad.grad_v_terms.assign(key_size, 0.0);

  std::vector<double> o(d);
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t h = 0; h < p.q_heads; ++h) {
      const int64_t g = at.kv_head(h);
      for (int64_t i = 0; i < p.q_len; ++i) {
        const RowSoftmax row = row_softmax(p, at, b, h, i);
        if (!row.sees_a_key) continue;
        const std::size_t qi = at.query(b, h, i);
        const double* q = &p.q[qi];
        const double* grad_out = &grad_o[qi];
        double* grad_q = &grad.grad_q[qi];
        double* grad_q_terms = &grad.grad_q_terms[qi];

        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t j = 0; j < p.kv_len; ++j) {
          const double* v = &p.v[at.key(b, g, j)];
          for (std::size_t c = 0; c < d; ++c) o[c] += row.p[static_cast<std::size_t>(j)] * v[c];
        }
        double D = 0.0, D_terms = 0.0;
        for (std::size_t c = 0; c < d; ++c) {
          D += grad_out[c] * o[c];
          D_terms += std::fabs(grad_out[c] * o[c]);
        }

        for (int64_t j = 0; j < p.kv_len; ++j) {
          if (!attention_key_visible(p, i, j)) continue;
          const double pj = row.p[static_cast<std::size_t>(j)];
          const std::size_t kj = at.key(b, g, j);
          const double* k = &p.k[kj];
          const double* v = &p.v[kj];
          double dP = 0.0, dP_terms = 0.0;
          for (std::size_t c = 0; c < d; ++c) {
            dP += grad_out[c] * v[c];
            dP_terms += std::fabs(grad_out[c] * v[c]);
          }
          const double dS = pj * (dP - D);
          const double dS_terms = pj * (dP_terms + D_terms);
          for (std::size_t c = 0; c < d; ++c) {
            grad_q[c] += p.scale * dS * k[c];
            grad_q_terms[c] += abs_scale * dS_terms * std::fabs(k[c]);
            grad.grad_k[kj + c] += p.scale * dS * q[c];
            grad.grad_k_terms[kj + c] += abs_scale * dS_terms * std::fabs(q[c]);
            grad.grad_v[kj + c] += pj * grad_out[c];
            grad.grad_v_terms[kj + c] += pj * std::fabs(grad_out[c]);
          }
        }
      }
    }
  }
  return grad;
}

}  // namespace exphil::reference
