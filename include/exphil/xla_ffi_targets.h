/*
 * The custom-call targets of libexphil_xla_ffi.so as data: the one list of
 * their names, operands, results and attributes. The handlers' target list
 * (c_src/xla_ffi/targets.cpp) and their tests are built from it, and the
 * Elixir layer (mix_stub, ExPhil.Native.Targets) reads this file when it
 * compiles, so an EXLA custom call and the handler it reaches cannot disagree.
 * include/exphil/xla_ffi.h gives the meaning of each operand and result.
 *
 *   EXPHIL_XLA_FFI_TARGET(name, operands, results, attributes)
 *
 * name        the target, also the exported symbol of its handler.
 * operands    the operand names in order, space-separated. "h0?" marks an
 *             optional operand: absent when the attribute has_h0 is false;
 *             where has_h0 is not given, absent when the buffer has zero
 *             elements (JAX's callers pass shape [0]). An absent operand's
 *             buffer is never read; with has_h0 = false it may be of any
 *             shape (Nx, which has no zero-size dimension, passes a scalar).
 *             "flag" is an operand the handler never reads, of any type and
 *             shape: it is bound only so that the target takes a caller's
 *             operand list as it is (Edifice's causal flag tensor, whose
 *             value the caller gives as an attribute instead).
 * results     the result names in order. "grad_h0?" is the gradient of the
 *             optional operand h0: written only when h0 is present, and
 *             otherwise never touched (any shape with has_h0 = false, zero
 *             elements without it).
 * attributes  "name:type", type the MLIR type the handler decodes the
 *             attribute as (i1, i32 or f32; i32 is not i64). "name?:type" may
 *             be left out by the caller. One attribute per line of the
 *             contract; the handlers refuse an attribute not listed here.
 *
 * Every row is one line, so that a reader other than the C preprocessor can
 * parse it with a pattern; keep it so.
 */
#ifndef EXPHIL_XLA_FFI_TARGETS_H
#define EXPHIL_XLA_FFI_TARGETS_H

/* clang-format off */
#define EXPHIL_XLA_FFI_TARGETS(EXPHIL_XLA_FFI_TARGET) \
  EXPHIL_XLA_FFI_TARGET(exphil_linear_scan_fwd, "a b h0?", "y h_final", "has_h0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_linear_scan_bwd, "a b h0? y grad_y grad_h_final?", "grad_a grad_b grad_h0?", "has_h0?:i1 has_grad_h_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_gru_fwd, "gate candidate h0?", "y h_final", "has_h0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_gru_bwd, "gate candidate h0? y grad_y grad_h_final?", "grad_gate grad_candidate grad_h0?", "has_h0?:i1 has_grad_h_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_lstm_fwd, "forget input candidate h0?", "y h_final", "has_h0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_lstm_bwd, "forget input candidate h0? y grad_y grad_h_final?", "grad_forget grad_input grad_candidate grad_h0?", "has_h0?:i1 has_grad_h_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_liquid_fwd, "tau target h0?", "y h_final", "has_h0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_liquid_bwd, "tau target h0? y grad_y grad_h_final?", "grad_tau grad_target grad_h0?", "has_h0?:i1 has_grad_h_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_selective_scan_fwd, "x dt A B C dt_bias? D? z? h0?", "y h_final", "softplus:i1 clamp:i1 dt_min:f32 dt_max:f32 has_dt_bias?:i1 has_D?:i1 has_z?:i1 has_h0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_selective_scan_bwd, "x dt A B C dt_bias? D? z? h0? grad_y grad_h_final?", "grad_x grad_dt grad_A grad_B grad_C grad_dt_bias? grad_D? grad_z? grad_h0?", "softplus:i1 clamp:i1 dt_min:f32 dt_max:f32 has_dt_bias?:i1 has_D?:i1 has_z?:i1 has_h0?:i1 has_grad_h_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_attention_fwd, "q k v", "o lse", "mask:i32 window:i32 layout:i32 scale:f32 precision:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_attention_bwd, "q k v o lse grad_o", "grad_q grad_k grad_v", "mask:i32 window:i32 layout:i32 scale:f32 precision:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_linear_scan_y_fwd, "a b h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_gru_y_fwd, "gate candidate h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_liquid_y_fwd, "tau target h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_liquid_y_bwd, "tau target h0 y grad_y", "grad_tau grad_target grad_h0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_gru_activated_fwd, "z candidate h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_gru_activated_bwd, "z candidate h0 y grad_y", "grad_z grad_candidate grad_h0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_lstm_activated_fwd, "f i candidate h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_min_lstm_activated_bwd, "f i candidate h0 y grad_y", "grad_f grad_i grad_candidate grad_h0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_selective_scan_y_bwd, "x dt A B C grad_y", "grad_x grad_dt grad_B grad_C", "softplus:i1 clamp:i1 dt_min:f32 dt_max:f32") \
  EXPHIL_XLA_FFI_TARGET(exphil_attention_o_fwd, "q k v flag", "o", "mask:i32 window:i32 layout:i32 scale:f32 precision:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_attention_o_bwd, "q k v o grad_o flag", "grad_q grad_k grad_v", "mask:i32 window:i32 layout:i32 scale:f32 precision:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_linear_scan_y_bwd, "a h0 y grad_y", "grad_a grad_b grad_h0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_diag_linear_y_fwd, "a b h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_elu_gru_y_fwd, "gate candidate h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_selective_scan_y_fwd, "x dt A B C", "y", "softplus:i1 clamp:i1 dt_min:f32 dt_max:f32 input_scale:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_fwd, "wx R bias? h0?", "y h_final", "has_bias?:i1 has_h0?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_bwd, "wx R y grad_y bias? h0? grad_h_final?", "grad_wx grad_R grad_bias grad_h0 grad_rh", "has_bias?:i1 has_h0?:i1 has_grad_h_final?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_fwd, "wx R bias? h0? c0?", "y h_final c_final", "has_bias?:i1 has_h0?:i1 has_c0?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_bwd, "wx R y grad_y bias? h0? c0? grad_h_final? grad_c_final?", "grad_wx grad_R grad_bias grad_h0 grad_c0 grad_rh", "has_bias?:i1 has_h0?:i1 has_c0?:i1 has_grad_h_final?:i1 has_grad_c_final?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_y_fwd, "wx R h0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_y_bwd, "wx R h0 y grad_y", "grad_wx grad_rh grad_h0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_y_fwd, "wx R h0 c0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_y_bwd, "wx R h0 c0 y grad_y", "grad_wx grad_h0 grad_c0", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_slstm_fwd, "wx R bias? h0? c0? n0? m0?", "y h_final c_final n_final m_final", "has_bias?:i1 has_h0?:i1 has_c0?:i1 has_n0?:i1 has_m0?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_slstm_bwd, "wx R y grad_y bias? h0? c0? n0? m0? grad_h_final? grad_c_final? grad_n_final? grad_m_final?", "grad_wx grad_R grad_bias grad_h0 grad_c0 grad_n0 grad_m0 grad_rh", "has_bias?:i1 has_h0?:i1 has_c0?:i1 has_n0?:i1 has_m0?:i1 has_grad_h_final?:i1 has_grad_c_final?:i1 has_grad_n_final?:i1 has_grad_m_final?:i1") \
  EXPHIL_XLA_FFI_TARGET(exphil_slstm_y_fwd, "wx R h0 c0", "y", "") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_stack_fwd, "wx R W bias? W_bias? h0?", "y y_lower h_final", "has_bias?:i1 has_W_bias?:i1 has_h0?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_gru_stack_bwd, "wx R W y y_lower grad_y bias? W_bias? h0? grad_y_lower? grad_h_final?", "grad_wx grad_R grad_W grad_bias grad_W_bias grad_h0", "has_bias?:i1 has_W_bias?:i1 has_h0?:i1 has_grad_y_lower?:i1 has_grad_h_final?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_stack_fwd, "wx R W bias? W_bias? h0? c0?", "y y_lower h_final c_final", "has_bias?:i1 has_W_bias?:i1 has_h0?:i1 has_c0?:i1 precision?:i32") \
  EXPHIL_XLA_FFI_TARGET(exphil_lstm_stack_bwd, "wx R W y y_lower grad_y bias? W_bias? h0? c0? grad_y_lower? grad_h_final? grad_c_final?", "grad_wx grad_R grad_W grad_bias grad_W_bias grad_h0 grad_c0", "has_bias?:i1 has_W_bias?:i1 has_h0?:i1 has_c0?:i1 has_grad_y_lower?:i1 has_grad_h_final?:i1 has_grad_c_final?:i1 precision?:i32")
/* clang-format on */

#endif /* EXPHIL_XLA_FFI_TARGETS_H */
