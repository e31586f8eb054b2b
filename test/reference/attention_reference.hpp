// CPU reference of scaled dot-product attention (exphil.h, "attention"),
// forward and backward, in double.
//
// Written row by row from the definition: the scores of one query against
// the keys it sees, a softmax stabilised by the row maximum, and the
// standard backward (dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)),
// dQ = scale dS K, dK = scale dS^T Q), checked against central finite
// differences of the forward (test/unit/test_attention_reference.cpp). The
// GPU results are checked against it.
//
// Every tensor here is [B, H, T, d] (layout BHTD): the reference knows
// nothing of layouts, the GPU harness permutes to and from BTHD.
#pragma once

#include <cstdint>
#include <vector>

#include "exphil/exphil.h"

namespace exphil::reference {

// exphil_attention_mask, value for value (query i, key j).
enum class AttentionMaskKind : int32_t {
  none = EXPHIL_ATTENTION_MASK_NONE,      // every key
  causal = EXPHIL_ATTENTION_MASK_CAUSAL,  // j <= i + S - T
  window = EXPHIL_ATTENTION_MASK_WINDOW,  // i + S - T - window < j <= i + S - T
};

// One problem, all row-major in double. Query head h reads key/value head
// h / (Hq / Hkv).
struct AttentionProblem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0;  // B, Hq, Hkv (Hq a multiple of Hkv)
  int64_t q_len = 0, kv_len = 0, head_dim = 0;   // T, S, d
  std::vector<double> q;                          // [B, Hq, T, d]
  std::vector<double> k, v;                       // [B, Hkv, S, d]
  AttentionMaskKind mask = AttentionMaskKind::none;
  int window = 0;  // keys seen with AttentionMaskKind::window, >= 1
  // Used as given, never defaulted: set it to the scale the kernel applies,
  // attention_default_scale(head_dim) when the options leave it 0.
  double scale = 0.0;

  int64_t query_size() const { return batch * q_heads * q_len * head_dim; }  // q, o, grad_o
  int64_t key_size() const { return batch * kv_heads * kv_len * head_dim; }  // k, v
  int64_t row_count() const { return batch * q_heads * q_len; }              // lse
};

// Each output comes with the sums of the absolute values of its terms, of
// the same shape: the scale of the rounding error a float computation of
// it makes, however much the terms cancel. For the forward, with P the
// softmax of a row over the keys it sees,
//   o_terms[b, h, i, c] = sum_j P_ij |V_jc|.
struct AttentionForwardResult {
  std::vector<double> o;        // [B, Hq, T, d]; 0 in a row that sees no key
  std::vector<double> lse;      // [B, Hq, T];    -infinity in a row that sees no key
  std::vector<double> o_terms;  // [B, Hq, T, d]; 0 in a row that sees no key
};

// Gradients, and the sums of the absolute values of their terms, with
// dS_ij = P_ij (dP_ij - D_i), dP_ij = sum_c dO_ic V_jc, D_i = sum_c dO_ic O_ic
// written out as the sums they are:
//   dS_terms_ij     = P_ij (sum_c |dO_ic V_jc| + sum_c |dO_ic O_ic|)
//   grad_q_terms[i, c] = |scale| sum_j dS_terms_ij |K_jc|
//   grad_k_terms[j, c] = |scale| sum_(h, i) dS_terms_ij |Q_ic|
//   grad_v_terms[j, c] = sum_(h, i) P_ij |dO_ic|
// (j over the keys row i sees; (h, i) over the query heads sharing the key
// head and their rows that see key j). dS_terms_ij >= |dS_ij|, so these
// bound |scale| sum_j |dS_ij K_jc| and the like too; unlike those they do not
// vanish where dP_ij and D_i cancel, which is exactly where a float dS_ij is
// all rounding error (of dP, D, or an O rounded to f16/bf16). An error of
// P itself (the scores, lse, exp, a P rounded to f16/bf16) is relative, so
// each term, and with it the output, moves by that fraction of these sums.
struct AttentionBackwardResult {
  std::vector<double> grad_q;                      // [B, Hq, T, d]; 0 in a row that sees no key
  std::vector<double> grad_k, grad_v;              // [B, Hkv, S, d]; summed over the group
  std::vector<double> grad_q_terms;                // shaped as grad_q
  std::vector<double> grad_k_terms, grad_v_terms;  // shaped as grad_k, grad_v
};

// 1 / sqrt(head_dim): exphil's scale when the options leave it 0.
double attention_default_scale(int64_t head_dim);

// Whether query i (0 <= i < T) sees key j (0 <= j < S) under p's mask.
bool attention_key_visible(const AttentionProblem& p, int64_t i, int64_t j);

// The forward and the backward throw std::invalid_argument on a problem
// whose shapes do not hold together (Hq not a multiple of Hkv, a tensor of
// the wrong size, ...).
AttentionForwardResult attention_forward(const AttentionProblem& p);

// grad_o [B, Hq, T, d]. Recomputes the forward; rows that see no key pass
// no gradient.
AttentionBackwardResult attention_backward(const AttentionProblem& p,
                                           const std::vector<double>& grad_o);

}  // namespace exphil::reference
