// CPU reference of the fused GRU, LSTM and sLSTM sequences
// (cuda/gated_rnn/gated_rnn_forward.cuh gives the math, slstm_cell.cuh the
// sLSTM's step and its ties), forward and backward, in double.
//
// Written step by step from the definition (the sLSTM's line by line from
// Edifice's slstm_scan_fallback), with the backward derived by hand and
// checked against central finite differences of the forward
// (test/unit/test_gated_rnn_reference.cpp), at max()'s ties too, where it
// takes Nx's rule (half to each side), which is what a central difference
// across the kink sees. The GPU results are checked against it.
#pragma once

#include <cstdint>
#include <vector>

namespace exphil::reference {

enum class GatedRnnKind { gru, lstm, slstm };

// One problem, all row-major in double. Optional inputs are empty when
// absent (zeros).
struct GatedRnnProblem {
  GatedRnnKind kind = GatedRnnKind::gru;
  int64_t batch = 0, steps = 0, hidden = 0;  // B, T, H
  std::vector<double> wx;    // [B, T, G*H]
  std::vector<double> R;     // [H, G*H]
  std::vector<double> bias;  // [G*H] or empty
  std::vector<double> h0;    // [B, H] or empty
  std::vector<double> c0;    // [B, H] or empty (LSTM, sLSTM)
  std::vector<double> n0;    // [B, H] or empty (sLSTM; ones)
  std::vector<double> m0;    // [B, H] or empty (sLSTM; zeros)

  int64_t gates() const { return kind == GatedRnnKind::gru ? 3 : 4; }
  int64_t gate_width() const { return gates() * hidden; }
  int64_t sequence_size() const { return batch * steps * hidden; }
  int64_t state_size() const { return batch * hidden; }
};

struct GatedRnnForwardResult {
  std::vector<double> y;        // [B, T, H]
  std::vector<double> h_final;  // [B, H]
  std::vector<double> c_final;  // [B, H] (LSTM, sLSTM; empty for the GRU)
  std::vector<double> n_final;  // [B, H] (sLSTM; empty for the others)
  std::vector<double> m_final;  // [B, H] (sLSTM; empty for the others)
};

// Gradients of every input (bias and R always, as if present; h0 and the
// cell's other initial states always, at their default when absent), and
// grad_rh, the gradient of
// the recurrent pre-activations h_{t-1} R + bias [B, T, G*H]. R and bias are
// sums over batch and time, so they come with the sums of the absolute
// values of their terms, the scale of a float sum's rounding error.
struct GatedRnnBackwardResult {
  std::vector<double> wx, R, bias, h0, c0, n0, m0, rh;  // c0: LSTM, sLSTM; n0, m0: sLSTM
  std::vector<double> R_terms, bias_terms;
};

GatedRnnForwardResult gated_rnn_forward(const GatedRnnProblem& p);

// grad_y [B, T, H]; the final states' gradients [B, H] or empty (zeros).
GatedRnnBackwardResult gated_rnn_backward(const GatedRnnProblem& p,
                                          const std::vector<double>& grad_y,
                                          const std::vector<double>& grad_h_final,
                                          const std::vector<double>& grad_c_final,
                                          const std::vector<double>& grad_n_final = {},
                                          const std::vector<double>& grad_m_final = {});

// Stacked layers (the ops gru_stack and lstm_stack), forward: layer 0 on
// wx, layer l > 0 on wx_l = y_{l-1} W[l-1] + W_bias[l-1], every sum in
// double from the layer below's double y.
struct GatedRnnStackProblem {
  GatedRnnKind kind = GatedRnnKind::gru;  // gru or lstm
  int64_t batch = 0, steps = 0, hidden = 0;
  std::vector<double> wx;  // [B, T, G*H], layer 0's
  // Per layer: R [H, G*H]; bias [G*H], h0 and c0 [B, H], each empty when
  // absent.
  std::vector<std::vector<double>> R, bias, h0, c0;
  // Per layer above the first: W [H, G*H]; W_bias [G*H] or empty.
  std::vector<std::vector<double>> W, W_bias;
};

// Each layer's forward, in order.
std::vector<GatedRnnForwardResult> gated_rnn_stack_forward(const GatedRnnStackProblem& p);

// The stack's backward: from the gradients of the last layer's y [B, T, H],
// of each lower layer's y (grad_y_lower, per layer below the last, each
// [B, T, H] or empty) and of each layer's final states (per layer, [B, H]
// or empty), the gradients of every input, per layer as the problem holds
// them (bias, h0 and c0 always, at their defaults when absent; W_bias
// likewise).
struct GatedRnnStackBackwardResult {
  std::vector<double> wx;                            // [B, T, G*H]
  std::vector<std::vector<double>> R, bias, h0, c0;  // per layer
  std::vector<std::vector<double>> W, W_bias;        // per layer above the first
  // The sums of their terms' magnitudes (as GatedRnnBackwardResult's).
  std::vector<std::vector<double>> R_terms, bias_terms, W_terms, W_bias_terms;
};
GatedRnnStackBackwardResult gated_rnn_stack_backward(
    const GatedRnnStackProblem& p, const std::vector<double>& grad_y,
    const std::vector<std::vector<double>>& grad_y_lower,
    const std::vector<std::vector<double>>& grad_h_final,
    const std::vector<std::vector<double>>& grad_c_final);

}  // namespace exphil::reference
