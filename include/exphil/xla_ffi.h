/*
 * libexphil_xla_ffi.so: the ops of exphil.h as typed XLA FFI handlers for the
 * CUDA platform, and a way to register them with an XLA runtime that is
 * already loaded in the process (EXLA's), with no link-time XLA dependency.
 *
 * This header needs no XLA headers: the handler types are declared by tag
 * only (struct XLA_FFI_CallFrame, struct XLA_FFI_Error of xla/ffi/api/c_api.h).
 *
 * ---------------------------------------------------------------------------
 * Custom-call contract (JAX: jax.ffi.ffi_call; EXLA: stablehlo.custom_call
 * with api_version 4). Every target name is also the exported symbol of its
 * handler. Operands and results are dense row-major device buffers in the
 * order listed; shapes, dtypes and semantics are those of exphil.h. Work is
 * enqueued on the stream XLA gives the call and is never waited for.
 *
 * include/exphil/xla_ffi_targets.h lists the same targets as data, one row
 * each: the operand, result and attribute names in order, which operands are
 * optional, and each attribute's MLIR type. The handlers and their tests are
 * built from it, and so are the Elixir layer's calls; this comment gives the
 * meaning. Where the two disagree, that file is right.
 *
 * Attributes. Each is a scalar of exactly the type listed (i1 is a boolean,
 * from JAX np.bool_; i32 is not i64, f32 is not f64). A required attribute
 * that is missing or of another type, and any attribute the target does not
 * list, is an invalid-argument error naming the target and the attribute: a
 * misspelt name is never ignored.
 *
 * Optional operands. An optional operand `x` (below: h0, grad_h_final,
 * dt_bias, D, z; the GRU's and LSTM's bias, c0 and grad_c_final) goes with
 * an optional i1 attribute has_x:
 *   has_x = false  x is absent: its buffer may have any shape (Nx, which has
 *                  no zero-size dimension, passes a scalar) and is never
 *                  read; the gradient result of x, if the target has one,
 *                  may have any shape too and is never written.
 *   has_x = true   x is present: a real tensor, which may not have zero
 *                  elements (an error naming x); its gradient result has
 *                  x's shape.
 *   no has_x       x is absent when its buffer has zero elements (e.g. shape
 *                  [0]), as JAX's callers pass it, and its gradient result
 *                  must then have zero elements too (it is not written);
 *                  otherwise x is present, as above.
 * An absent operand costs nothing: no zeros are made or read for it.
 *
 * Scans, op in {linear_scan, min_gru, min_lstm, liquid}, with the inputs
 *   linear_scan: a, b          min_gru: gate, candidate
 *   min_lstm:    forget, input, candidate          liquid: tau, target
 * each [B, T, H]; sequence dtype f32, bf16 or f16 (one per call); each state
 * tensor [B, H] f32 or the sequence dtype.
 *   exphil_<op>_fwd  operands: inputs..., h0 [B, H] (optional)
 *                    results:  y [B, T, H], h_final [B, H]
 *                    attributes: has_h0
 *   exphil_<op>_bwd  operands: inputs..., h0 (optional), y (the forward's),
 *                    grad_y [B, T, H], grad_h_final [B, H] (optional)
 *                    results:  grad of each input [B, T, H]..., grad_h0
 *                    [B, H] (the gradient of h0)
 *                    attributes: has_h0, has_grad_h_final
 *   An absent h0 is a zero initial state, and an absent grad_h_final no
 *   gradient into the final state. h_final takes the dtype it is given (f32
 *   or the sequence dtype).
 *
 * Scans, y-only form (the operands and results of Edifice's fused scan ops):
 * h0 always an operand, no final state in either direction, no attributes.
 *   exphil_<op>_y_fwd   op in {linear_scan, min_gru, liquid}
 *                       operands: inputs..., h0 [B, H]
 *                       results:  y [B, T, H]
 *   exphil_liquid_y_bwd operands: tau, target, h0, y, grad_y
 *                       results:  grad_tau, grad_target, grad_h0 [B, H]
 *   exphil_linear_scan_y_bwd
 *                       operands: a, h0, y, grad_y (no b: each state h_{t-1}
 *                                 is read from y, h0 at t = 0)
 *                       results:  grad_a, grad_b, grad_h0 [B, H]
 *   exphil_diag_linear_y_fwd  inputs a, b: h_t = sigmoid(a) h_{t-1} + b
 *   exphil_elu_gru_y_fwd      inputs gate, candidate: z = sigmoid(gate),
 *                       h_t = (1 - z) h_{t-1} + z (1 + elu(candidate))
 *                       (operands inputs..., h0; result y, as above)
 *   exphil_min_gru_activated_{fwd,bwd} and exphil_min_lstm_activated_{fwd,bwd}
 *   have this form, with gates already through the sigmoid, each in (0, 1):
 *     min_gru_activated  inputs z, candidate:
 *                        h_t = (1 - z) h_{t-1} + z candidate
 *     min_lstm_activated inputs f, i, candidate; s = f + (i + 1e-6):
 *                        h_t = (f / s) h_{t-1} + (i / s) candidate
 *   and their backward returns the gradients of z (f, i), not of logits:
 *     fwd  operands: inputs..., h0            results: y
 *     bwd  operands: inputs..., h0, y, grad_y results: grad of each input...,
 *                                                      grad_h0
 *
 * Selective scan (exphil.h, "selective_scan"). Attributes: softplus (i1),
 * clamp (i1), dt_min (f32), dt_max (f32); from JAX np.bool_ and np.float32;
 * and has_dt_bias, has_D, has_z, has_h0 (and, backward, has_grad_h_final).
 * dt_bias [D], D [D], z [B, T, D] and h0 [B, D, N] are optional.
 *   exphil_selective_scan_fwd  operands: x, dt, A, B, C, dt_bias, D, z, h0
 *                              results:  y [B, T, D] (dtype of x),
 *                                        h_final [B, D, N] f32
 *   exphil_selective_scan_bwd  operands: x, dt, A, B, C, dt_bias, D, z, h0,
 *                                        grad_y [B, T, D], grad_h_final
 *                                        [B, D, N] f32 (optional; absent:
 *                                        no gradient into the final state)
 *                              results:  grad_x, grad_dt, grad_A, grad_B,
 *                                        grad_C, grad_dt_bias, grad_D,
 *                                        grad_z, grad_h0 (the last four the
 *                                        gradients of the optional inputs)
 *   exphil_selective_scan_y_fwd  (Edifice's :fused_selective_scan)
 *                              operands: x, dt, A, B, C
 *                              results:  y
 *                              the forward above with no optional inputs
 *                              and no h_final; attributes softplus, clamp,
 *                              dt_min, dt_max and input_scale (i32: 0 each
 *                              channel's delta scales the input term, 1 the
 *                              mean of delta over the channels, as
 *                              Edifice's forward does; selective_scan.hpp,
 *                              SelectiveScanInputScale).
 *   exphil_selective_scan_y_bwd  (Edifice's :fused_selective_scan_backward)
 *                              operands: x, dt, A, B, C, grad_y
 *                              results:  grad_x, grad_dt, grad_B, grad_C
 *                              the backward above with no optional inputs,
 *                              no grad_h_final and grad_A not computed;
 *                              attributes softplus, clamp, dt_min, dt_max.
 *
 * Attention (exphil.h, "attention"). No optional operands. Attributes: mask
 * (i32: 0 none, 1 causal, 2 window), window (i32), layout (i32: 0 BHTD, 1
 * BTHD), scale (f32, 0 means 1 / sqrt(d)), precision (i32: 0 exact, 1
 * tf32x3; exphil.h, "Arithmetic"); from JAX np.int32 and np.float32.
 *   exphil_attention_fwd  operands: q, k, v
 *                         results:  o (the shape of q), lse [B, Hq, T] f32
 *   exphil_attention_bwd  operands: q, k, v, o, lse, grad_o
 *                         results:  grad_q, grad_k, grad_v
 *   exphil_attention_o_fwd  (Edifice's :fused_flash_attention)
 *                         operands: q, k, v, flag (never read: any type
 *                                   and shape; the caller gives its value
 *                                   as the mask attribute)
 *                         results:  o (the forward above without lse)
 *   exphil_attention_o_bwd  (Edifice's :fused_flash_attention_backward)
 *                         operands: q, k, v, o, grad_o, flag (never read)
 *                         results:  grad_q, grad_k, grad_v
 *                         the backward above without lse: each call
 *                         recomputes it with a forward pass into the
 *                         library's temporary memory (capture-safe, as
 *                         below), whose o it discards.
 *
 * GRU and LSTM sequences (exphil/gated_rnn.hpp, ops "gru" and "lstm").
 * Attributes: the has_* flags of the optional operands and precision (i32:
 * 0 exact, 1 tf32, f32 sequences only: exphil.h's exphil_gated_rnn_options);
 * R and bias in f32 or the dtype of wx, the states in f32 or that dtype
 * (one each per call).
 *   exphil_gru_fwd        operands: wx [B, T, 3H], R [H, 3H], bias? [3H],
 *                                   h0? [B, H]
 *                         results:  y [B, T, H], h_final [B, H]
 *   exphil_gru_bwd        operands: wx, R, y (the forward's), grad_y, bias?,
 *                                   h0?, grad_h_final?
 *                         results:  grad_wx, grad_R, grad_bias, grad_h0 (all
 *                                   written, the last two at zero bias and
 *                                   state when those are absent), grad_rh
 *                                   [B, T, 3H] (the gradient of h_{t-1} R +
 *                                   bias, Edifice's)
 *   exphil_lstm_fwd       operands: wx [B, T, 4H], R [H, 4H], bias? [4H],
 *                                   h0?, c0? [B, H]
 *                         results:  y, h_final, c_final
 *   exphil_lstm_bwd       operands: wx, R, y, grad_y, bias?, h0?, c0?,
 *                                   grad_h_final?, grad_c_final?
 *                         results:  grad_wx, grad_R, grad_bias, grad_h0,
 *                                   grad_c0, grad_rh
 *
 * GRU and LSTM sequences, y-only form (the operands and results of
 * Edifice's :fused_gru_scan, :fused_lstm_scan and their backward ops): no
 * bias, h0 (and c0) always operands, y the forward's only result, no
 * final-state gradients in, and of the gradients only those Edifice's
 * template has (grad_R and grad_bias are not computed: Edifice forms
 * grad_R from grad_rh, or for the LSTM from grad_wx, itself). No
 * attributes. The same math as above without bias (GRU n = tanh(wx_n +
 * r * (h R)_n)); dtypes as above (R f32 or the dtype of wx; h0, c0 and
 * their gradients f32 or that dtype, one per call).
 *   exphil_gru_y_fwd      operands: wx [B, T, 3H], R [H, 3H], h0 [B, H]
 *                         results:  y [B, T, H]
 *   exphil_gru_y_bwd      operands: wx, R, h0, y (the forward's), grad_y
 *                         results:  grad_wx [B, T, 3H], grad_rh [B, T, 3H],
 *                                   grad_h0 [B, H]
 *   exphil_lstm_y_fwd     operands: wx [B, T, 4H], R [H, 4H], h0, c0 [B, H]
 *                         results:  y [B, T, H]
 *   exphil_lstm_y_bwd     operands: wx, R, h0, c0, y (the forward's h,
 *                                   from which the cell states are
 *                                   recomputed), grad_y
 *                         results:  grad_wx [B, T, 4H], grad_h0, grad_c0
 *
 * Stacked GRU and LSTM layers (exphil/gated_rnn.hpp, ops "gru_stack" and
 * "lstm_stack"): L = 2 to 4 layers, K = L - 1; attributes the has_* flags
 * of the optional operands and precision, as above; dtypes as above, W and
 * W_bias with R.
 *   exphil_gru_stack_fwd  operands: wx [B, T, 3H], R [L, H, 3H], W [K, H, 3H],
 *                                   bias? [L, 3H], W_bias? [K, 3H], h0? [L, B, H]
 *                         results:  y [B, T, H] (the last layer's), y_lower
 *                                   [K, B, T, H] (the others', which the
 *                                   backward reads), h_final [L, B, H]
 *   exphil_gru_stack_bwd  operands: wx, R, W, y, y_lower, grad_y, bias?,
 *                                   W_bias?, h0?, grad_y_lower?, grad_h_final?
 *                         results:  grad_wx, grad_R, grad_W, grad_bias,
 *                                   grad_W_bias, grad_h0 (all written)
 *   exphil_lstm_stack_fwd / _bwd   the same with 4H, c0? [L, B, H] after h0,
 *                                   c_final after h_final, grad_c_final?
 *                                   after grad_h_final, grad_c0 last
 *
 * sLSTM sequences (exphil/gated_rnn.hpp, op "slstm": xLSTM's scalar LSTM,
 * exactly as Edifice's slstm_scan; gates i, f, z, o of wx + h R + bias,
 * exponential input and forget gates stabilized by the state m, the
 * normalizer state n). Attributes, dtypes and the absent-operand defaults
 * as the LSTM's above; an absent n0 is ones, an absent m0 zeros.
 *   exphil_slstm_fwd      operands: wx [B, T, 4H], R [H, 4H], bias? [4H],
 *                                   h0?, c0?, n0?, m0? [B, H]
 *                         results:  y, h_final, c_final, n_final, m_final
 *   exphil_slstm_bwd      operands: wx, R, y, grad_y, bias?, h0?, c0?, n0?,
 *                                   m0?, grad_h_final?, grad_c_final?,
 *                                   grad_n_final?, grad_m_final?
 *                         results:  grad_wx, grad_R, grad_bias, grad_h0,
 *                                   grad_c0, grad_n0, grad_m0 (all written,
 *                                   the defaults' gradients when absent),
 *                                   grad_rh [B, T, 4H]
 *   exphil_slstm_y_fwd    (Edifice's :fused_slstm_scan, which has no
 *                         backward op) operands: wx [B, T, 4H], R [H, 4H],
 *                                   h0, c0 [B, H]; n0 = 1 and m0 = 0 as
 *                                   Edifice's fallback starts them; no bias
 *                         results:  y [B, T, H]
 *
 * Errors. A failing handler returns an XLA error whose message starts with
 * the target name, then the library's message (or the handler's, naming the
 * operand, result or attribute). Codes: invalid argument for bad shapes,
 * dtypes, attributes or options (including an operand of an element type
 * other than f32, bf16 and f16); unimplemented for sizes the kernels cannot
 * run; resource exhausted for a failed allocation; unavailable without a
 * CUDA device; internal for CUDA failures and library bugs.
 *
 * Command buffers. Every handler declares itself command-buffer compatible
 * (in its metadata and at registration), so XLA may trace it into the CUDA
 * graphs of its command buffers along with the ops around it. XLA records a
 * traced call as a child graph, which may hold no memory-allocation node;
 * under capture the library's temporary memory is therefore a block the
 * graph owns, returned when XLA destroys the graph (exphil.h, "Graphs").
 * The launches of one command buffer share its blocks; PJRT (JAX, EXLA)
 * runs a device's executables on that device's one compute stream, so the
 * launches follow each other.
 */
#ifndef EXPHIL_XLA_FFI_H
#define EXPHIL_XLA_FFI_H

#include <stddef.h>

#include "exphil/exphil.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The types of xla/ffi/api/c_api.h, by tag. */
struct XLA_FFI_CallFrame;
struct XLA_FFI_Error;

/* The same function type as XLA_FFI_Handler. */
typedef struct XLA_FFI_Error* exphil_xla_ffi_handler(struct XLA_FFI_CallFrame* call_frame);

EXPHIL_API struct XLA_FFI_Error* exphil_linear_scan_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_linear_scan_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_gru_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_gru_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_lstm_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_lstm_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_liquid_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_liquid_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_linear_scan_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_gru_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_liquid_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_liquid_y_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_gru_activated_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_gru_activated_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_lstm_activated_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_min_lstm_activated_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_selective_scan_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_selective_scan_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_attention_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_attention_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_selective_scan_y_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_attention_o_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_attention_o_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_linear_scan_y_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_diag_linear_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_elu_gru_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_selective_scan_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_y_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_y_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_slstm_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_slstm_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_slstm_y_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_stack_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_gru_stack_bwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_stack_fwd(struct XLA_FFI_CallFrame* call_frame);
EXPHIL_API struct XLA_FFI_Error* exphil_lstm_stack_bwd(struct XLA_FFI_CallFrame* call_frame);

/* One custom-call target: its name (equal to the handler's symbol) and its
 * execute-stage handler. */
typedef struct exphil_xla_ffi_target {
  const char* name;
  exphil_xla_ffi_handler* handler;
} exphil_xla_ffi_target;

/* Every target of this library, in static storage; writes their number to
 * *count (count may be NULL). */
EXPHIL_API const exphil_xla_ffi_target* exphil_xla_ffi_targets(size_t* count);

/* Registers every target, platform "CUDA", execute stage only, with the XLA
 * runtime in the already-loaded shared library `xla_library_path` (a path,
 * or a name as dlopen takes it; the library that defines
 * xla::ffi::GetXlaFfiApi(), e.g. EXLA's libxla_extension.so). It is looked up
 * with RTLD_NOLOAD: never loaded here, and a library not already in the
 * process is an error.
 *
 * Returns EXPHIL_OK, or
 *   EXPHIL_ERROR_INVALID_ARGUMENT  xla_library_path is NULL, names no library
 *                                  loaded in this process, or that library
 *                                  does not define xla::ffi::GetXlaFfiApi();
 *   EXPHIL_ERROR_NOT_SUPPORTED     the runtime's API is NULL, of another
 *                                  major version or too small, or it refused
 *                                  a registration (the message names the
 *                                  target and carries the runtime's reason);
 *   EXPHIL_ERROR_INTERNAL          out of host memory (or an exception out
 *                                  of the runtime).
 * On failure, the message is written to `error` (at most error_size bytes,
 * NUL included, truncated to fit; nothing is written when error is NULL or
 * error_size is 0); on success `error` is left as it is. Targets registered
 * before a refused one stay registered. Registering again is harmless: XLA
 * accepts a repeated registration of the same handlers. Thread-safe as far as
 * the runtime's registry is.
 */
EXPHIL_API exphil_status exphil_xla_ffi_register(const char* xla_library_path, char* error,
                                                 size_t error_size);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EXPHIL_XLA_FFI_H */
