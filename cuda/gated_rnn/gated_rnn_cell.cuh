// One forward step of a gated-RNN cell for one (batch row, hidden unit):
// the math that gated_rnn_forward.cuh documents, shared by both forward
// layouts so that they cannot drift apart (the backward's gates kernel
// recomputes the same expressions from the pre-activations it stores).
#pragma once

#include "gated_rnn/gated_rnn_common.cuh"
#include "gated_rnn/slstm_cell.cuh"

namespace exphil::kernels {

// x: the gates' input projections wx_t; rh: h_{t-1} R + b, the recurrent
// pre-activations; hp: h_{t-1} of this unit (the GRU's z mixes it in);
// s: the cell's carried state (the LSTM's c in s.c; the sLSTM's c, n, m),
// advanced from step t-1 to t. Returns h_t.
template <GatedRnnCell kCell>
__device__ __forceinline__ float gated_rnn_cell_step(const float (&x)[kGatedRnnGates<kCell>],
                                                     const float (&rh)[kGatedRnnGates<kCell>],
                                                     float hp, SlstmState& s) {
  if constexpr (kCell == GatedRnnCell::gru) {
    const float r = gated_rnn_sigmoid(x[0] + rh[0]);
    const float z = gated_rnn_sigmoid(x[1] + rh[1]);
    const float n = tanhf(x[2] + r * rh[2]);
    return n + z * (hp - n);
  } else if constexpr (kCell == GatedRnnCell::lstm) {
    const float i = gated_rnn_sigmoid(x[0] + rh[0]);
    const float f = gated_rnn_sigmoid(x[1] + rh[1]);
    const float g = tanhf(x[2] + rh[2]);
    const float o = gated_rnn_sigmoid(x[3] + rh[3]);
    s.c = fmaf(f, s.c, i * g);
    return o * tanhf(s.c);
  } else {
    SlstmGates gates;
    return slstm_step(x[0] + rh[0], x[1] + rh[1], x[2] + rh[2], x[3] + rh[3], s, gates);
  }
}

// The layouts that keep a unit's state in registers for the whole sequence
// (k split, unit warps): its state before the first step, h0 and the cell's
// c0 (n0, m0) at index sidx of [B, H] (zeros, and n0 ones, where absent),
// and after the last, into whichever final states are asked for.
template <GatedRnnCell kCell>
__device__ __forceinline__ void gated_rnn_load_initial(const GatedRnnForwardParams& p, int64_t sidx,
                                                       float& hp, SlstmState& s) {
  hp = p.d_h0 ? load_state(p.d_h0, p.state_dtype, sidx) : 0.0f;
  s = {0.0f, 1.0f, 0.0f};
  if constexpr (kCell != GatedRnnCell::gru)
    if (p.d_c0) s.c = load_state(p.d_c0, p.state_dtype, sidx);
  if constexpr (kCell == GatedRnnCell::slstm) {
    if (p.d_n0) s.n = load_state(p.d_n0, p.state_dtype, sidx);
    if (p.d_m0) s.m = load_state(p.d_m0, p.state_dtype, sidx);
  }
}

template <GatedRnnCell kCell>
__device__ __forceinline__ void gated_rnn_store_finals(const GatedRnnForwardParams& p, int64_t sidx,
                                                       float h, const SlstmState& s) {
  if (p.d_h_final) store_state(p.d_h_final, p.state_dtype, sidx, h);
  if constexpr (kCell != GatedRnnCell::gru)
    if (p.d_c_final) store_state(p.d_c_final, p.state_dtype, sidx, s.c);
  if constexpr (kCell == GatedRnnCell::slstm) {
    if (p.d_n_final) store_state(p.d_n_final, p.state_dtype, sidx, s.n);
    if (p.d_m_final) store_state(p.d_m_final, p.state_dtype, sidx, s.m);
  }
}

}  // namespace exphil::kernels
