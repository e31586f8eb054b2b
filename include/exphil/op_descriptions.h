/*
 * Every op direction of the library as data: its tensors (name, input or
 * output, optional or not, dtype rule, shape in named dimensions), its
 * scalar options (name, type, default, the values accepted) and its ways
 * in. This is the one description of each op:
 *
 *   - its entry: the C++ API's args of the op direction, run by
 *     exphil::run(args, stream) (checked by exphil::can_implement(args)),
 *     whose traits in c_src/ops/ launch the kernels through the one op
 *     pipeline; exphil::tensor_slot(args, name) reaches each tensor by the
 *     name given here;
 *   - the bindings that take their shape from it: the NIF decodes each op's
 *     tensor arguments, plans its outputs and binds them by these names;
 *     the XLA FFI handlers bind their buffers by the names of their target
 *     rows (xla_ffi_targets.h), which are these;
 *   - and everything checked against it: the C++ API's validation
 *     (test/abi/test_op_descriptions.cpp runs every row, and every option's
 *     values, through exphil::can_implement), the NIF's functions, options
 *     and outputs, the C ABI's functions and option structs, the XLA FFI
 *     targets, the Elixir layer's ops and Edifice table, and the README's
 *     tables (mix_stub's op_descriptions_test.exs and
 *     op_option_values_test.exs read this file).
 *
 * include/exphil/exphil.h and the C++ headers give each op's meaning.
 *
 *   EXPHIL_OP_DIRECTION(op, direction, tensors, options, bindings)
 *
 * op          the op's name: the C++ API's (ScanOp's name, "selective_scan",
 *             "attention", GatedRnnCell's name, and with "_stack" the
 *             stacked GRU and LSTM layers), the C ABI's and the NIF's
 *             (exphil_<op>_<direction>,
 *             <op>_<direction>) where the op has those ways in.
 * direction   forward or backward.
 * tensors     space-separated words "name:role:dtype:shape[:input]": the
 *             inputs, the optional ones last unless a required one follows
 *             (linear_scan backward's b), then the outputs:
 *               name   "h0?" is optional; the rest are required. Absent
 *                      is NULL in the C ABI and the C++ API, nil or a
 *                      left-out option in the NIF, and has_h0 = false (or,
 *                      without that attribute, zero elements) for an XLA
 *                      FFI operand; an absent optional output is not
 *                      written.
 *               role   in or out.
 *               dtype  seq: f32, f16 or bf16, the same for every seq tensor
 *                      of the call (the first one's); state: f32 or the seq
 *                      dtype, each state tensor its own; weight and carry:
 *                      f32 or the seq dtype, the same for every weight
 *                      (carry) tensor of the call (the first present one's);
 *                      f32: f32 only.
 *               shape  named dimensions, comma-separated; a name means the
 *                      same extent wherever it appears; "3H" is 3 times H
 *                      (the GRU's gates side by side; "4H" the LSTM's and sLSTM's);
 *                      the stacks' L is their layers (2 to 4) and K the
 *                      layers above the first, L - 1. The first tensor
 *                      that names a dimension sets it. Extents the kernels
 *                      limit (attention's head width d: 32, 64, 96 or 128;
 *                      the selective scan's N: 1 to 256) are the C++
 *                      headers'. Attention's shapes
 *                      are those of layout bhtd; bthd swaps the two middle
 *                      dimensions of q, k, v, o and their gradients.
 *               input  an optional output that may be given only with this
 *                      optional input (the gradient of an input the call
 *                      does not have is refused, not ignored).
 * options     space-separated words "name:type=default[:range][:if(cond)]":
 *               type     bool, i32, f32 or enum(a|b|...), whose values are
 *                        the C++ enumerators in order (0, 1, ...); an enum
 *                        takes those values only. An XLA FFI target that
 *                        has an option takes it as an attribute of the
 *                        same name, of MLIR type i1, i32, f32 and i32 (the
 *                        enumerator) respectively; the C ABI's options
 *                        struct as int32_t, int32_t, float and the enum's
 *                        EXPHIL_* constants, zero for the default. Two are
 *                        the C++ API's alone, in neither the C ABI nor the
 *                        NIF nor the full XLA FFI targets: the selective
 *                        scan's input_scale (an attribute of Edifice's
 *                        exphil_selective_scan_y_fwd only) and attention's
 *                        recompute_lse, with which the backward takes no
 *                        lse (Edifice's exphil_attention_o_bwd always
 *                        recomputes it).
 *               range    the values the call accepts: "lo..hi" (i32,
 *                        inclusive) or "finite" (f32: no NaN or infinity).
 *                        Without one, every value of the type.
 *               if(cond) the range holds only while cond does: "clamp" (that
 *                        bool option true) or "mask=window" (that enum
 *                        option at that value); otherwise the option is
 *                        not read. Rules between options (the selective
 *                        scan's dt_min <= dt_max; attention's tf32x3 for f32
 *                        inputs only) are the C++ headers'.
 * bindings    the ways in: cpp (exphil::<...>_forward/_backward with the
 *             op's args), c (exphil_<op>_<direction> in exphil.h), nif
 *             (ExPhil.Native.<op>_<direction>), xla (the XLA FFI targets
 *             exphil_<op>_fwd/_bwd with these tensors). Edifice's scan
 *             conventions are the C++ API's, and reach XLA through the
 *             y-only variants of xla_ffi_targets.h.
 *
 * The NIF takes an op's inputs up to the last required one as arguments, in
 * this order (nil for an absent optional one), the optional inputs after it
 * as options of the same name, and the outputs under outputs:; its names
 * are these, lower-cased.
 *
 * Every row is one line, so that a reader other than the C preprocessor can
 * parse it with a pattern; keep it so.
 */
#ifndef EXPHIL_OP_DESCRIPTIONS_H
#define EXPHIL_OP_DESCRIPTIONS_H

/* clang-format off */
#define EXPHIL_OP_DESCRIPTIONS(EXPHIL_OP_DIRECTION) \
  EXPHIL_OP_DIRECTION(linear_scan, forward, "a:in:seq:B,T,H b:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(linear_scan, backward, "a:in:seq:B,T,H b?:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_a:out:seq:B,T,H grad_b:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(min_gru, forward, "gate:in:seq:B,T,H candidate:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(min_gru, backward, "gate:in:seq:B,T,H candidate:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_gate:out:seq:B,T,H grad_candidate:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(min_lstm, forward, "forget:in:seq:B,T,H input:in:seq:B,T,H candidate:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(min_lstm, backward, "forget:in:seq:B,T,H input:in:seq:B,T,H candidate:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_forget:out:seq:B,T,H grad_input:out:seq:B,T,H grad_candidate:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(liquid, forward, "tau:in:seq:B,T,H target:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(liquid, backward, "tau:in:seq:B,T,H target:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_tau:out:seq:B,T,H grad_target:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(min_gru_activated, forward, "z:in:seq:B,T,H candidate:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(min_gru_activated, backward, "z:in:seq:B,T,H candidate:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_z:out:seq:B,T,H grad_candidate:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(min_lstm_activated, forward, "f:in:seq:B,T,H i:in:seq:B,T,H candidate:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(min_lstm_activated, backward, "f:in:seq:B,T,H i:in:seq:B,T,H candidate:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_f:out:seq:B,T,H grad_i:out:seq:B,T,H grad_candidate:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(diag_linear, forward, "a:in:seq:B,T,H b:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(diag_linear, backward, "a:in:seq:B,T,H b:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_a:out:seq:B,T,H grad_b:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(elu_gru, forward, "gate:in:seq:B,T,H candidate:in:seq:B,T,H h0?:in:state:B,H y:out:seq:B,T,H h_final?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(elu_gru, backward, "gate:in:seq:B,T,H candidate:in:seq:B,T,H y:in:seq:B,T,H grad_y:in:seq:B,T,H h0?:in:state:B,H grad_h_final?:in:state:B,H grad_gate:out:seq:B,T,H grad_candidate:out:seq:B,T,H grad_h0?:out:state:B,H", "", "cpp") \
  EXPHIL_OP_DIRECTION(selective_scan, forward, "x:in:seq:B,T,D dt:in:seq:B,T,D A:in:f32:D,N B:in:seq:B,T,N C:in:seq:B,T,N dt_bias?:in:f32:D D?:in:f32:D z?:in:seq:B,T,D h0?:in:f32:B,D,N y:out:seq:B,T,D h_final?:out:f32:B,D,N", "softplus:bool=false clamp:bool=false dt_min:f32=0:finite:if(clamp) dt_max:f32=0:finite:if(clamp) input_scale:enum(delta|channel_mean)=delta", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(selective_scan, backward, "x:in:seq:B,T,D dt:in:seq:B,T,D A:in:f32:D,N B:in:seq:B,T,N C:in:seq:B,T,N grad_y:in:seq:B,T,D dt_bias?:in:f32:D D?:in:f32:D z?:in:seq:B,T,D h0?:in:f32:B,D,N grad_h_final?:in:f32:B,D,N grad_x?:out:seq:B,T,D grad_dt?:out:seq:B,T,D grad_A?:out:f32:D,N grad_B?:out:seq:B,T,N grad_C?:out:seq:B,T,N grad_dt_bias?:out:f32:D:dt_bias grad_D?:out:f32:D:D grad_z?:out:seq:B,T,D:z grad_h0?:out:f32:B,D,N:h0", "softplus:bool=false clamp:bool=false dt_min:f32=0:finite:if(clamp) dt_max:f32=0:finite:if(clamp)", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(attention, forward, "q:in:seq:B,Hq,T,d k:in:seq:B,Hkv,S,d v:in:seq:B,Hkv,S,d o:out:seq:B,Hq,T,d lse?:out:f32:B,Hq,T", "mask:enum(none|causal|window)=none window:i32=0:1..2147483647:if(mask=window) layout:enum(bhtd|bthd)=bhtd scale:f32=0:finite precision:enum(exact|tf32x3)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(attention, backward, "q:in:seq:B,Hq,T,d k:in:seq:B,Hkv,S,d v:in:seq:B,Hkv,S,d o:in:seq:B,Hq,T,d lse:in:f32:B,Hq,T grad_o:in:seq:B,Hq,T,d grad_q?:out:seq:B,Hq,T,d grad_k?:out:seq:B,Hkv,S,d grad_v?:out:seq:B,Hkv,S,d", "mask:enum(none|causal|window)=none window:i32=0:1..2147483647:if(mask=window) layout:enum(bhtd|bthd)=bhtd scale:f32=0:finite precision:enum(exact|tf32x3)=exact recompute_lse:bool=false", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(slstm, forward, "wx:in:seq:B,T,4H R:in:weight:H,4H bias?:in:weight:4H h0?:in:carry:B,H c0?:in:carry:B,H n0?:in:carry:B,H m0?:in:carry:B,H y:out:seq:B,T,H h_final?:out:carry:B,H c_final?:out:carry:B,H n_final?:out:carry:B,H m_final?:out:carry:B,H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(slstm, backward, "wx:in:seq:B,T,4H R:in:weight:H,4H y:in:seq:B,T,H grad_y:in:seq:B,T,H bias?:in:weight:4H h0?:in:carry:B,H c0?:in:carry:B,H n0?:in:carry:B,H m0?:in:carry:B,H grad_h_final?:in:carry:B,H grad_c_final?:in:carry:B,H grad_n_final?:in:carry:B,H grad_m_final?:in:carry:B,H grad_wx?:out:seq:B,T,4H grad_R?:out:weight:H,4H grad_bias?:out:weight:4H grad_h0?:out:carry:B,H grad_c0?:out:carry:B,H grad_n0?:out:carry:B,H grad_m0?:out:carry:B,H grad_rh?:out:seq:B,T,4H", "", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(gru, forward, "wx:in:seq:B,T,3H R:in:weight:H,3H bias?:in:weight:3H h0?:in:carry:B,H y:out:seq:B,T,H h_final?:out:carry:B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(gru, backward, "wx:in:seq:B,T,3H R:in:weight:H,3H y:in:seq:B,T,H grad_y:in:seq:B,T,H bias?:in:weight:3H h0?:in:carry:B,H grad_h_final?:in:carry:B,H grad_wx?:out:seq:B,T,3H grad_R?:out:weight:H,3H grad_bias?:out:weight:3H grad_h0?:out:carry:B,H grad_rh?:out:seq:B,T,3H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(lstm, forward, "wx:in:seq:B,T,4H R:in:weight:H,4H bias?:in:weight:4H h0?:in:carry:B,H c0?:in:carry:B,H y:out:seq:B,T,H h_final?:out:carry:B,H c_final?:out:carry:B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(lstm, backward, "wx:in:seq:B,T,4H R:in:weight:H,4H y:in:seq:B,T,H grad_y:in:seq:B,T,H bias?:in:weight:4H h0?:in:carry:B,H c0?:in:carry:B,H grad_h_final?:in:carry:B,H grad_c_final?:in:carry:B,H grad_wx?:out:seq:B,T,4H grad_R?:out:weight:H,4H grad_bias?:out:weight:4H grad_h0?:out:carry:B,H grad_c0?:out:carry:B,H grad_rh?:out:seq:B,T,4H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(gru_stack, forward, "wx:in:seq:B,T,3H R:in:weight:L,H,3H W:in:weight:K,H,3H bias?:in:weight:L,3H W_bias?:in:weight:K,3H h0?:in:carry:L,B,H y:out:seq:B,T,H y_lower?:out:seq:K,B,T,H h_final?:out:carry:L,B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(gru_stack, backward, "wx:in:seq:B,T,3H R:in:weight:L,H,3H W:in:weight:K,H,3H y:in:seq:B,T,H y_lower:in:seq:K,B,T,H grad_y:in:seq:B,T,H bias?:in:weight:L,3H W_bias?:in:weight:K,3H h0?:in:carry:L,B,H grad_y_lower?:in:seq:K,B,T,H grad_h_final?:in:carry:L,B,H grad_wx?:out:seq:B,T,3H grad_R?:out:weight:L,H,3H grad_W?:out:weight:K,H,3H grad_bias?:out:weight:L,3H grad_W_bias?:out:weight:K,3H grad_h0?:out:carry:L,B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(lstm_stack, forward, "wx:in:seq:B,T,4H R:in:weight:L,H,4H W:in:weight:K,H,4H bias?:in:weight:L,4H W_bias?:in:weight:K,4H h0?:in:carry:L,B,H c0?:in:carry:L,B,H y:out:seq:B,T,H y_lower?:out:seq:K,B,T,H h_final?:out:carry:L,B,H c_final?:out:carry:L,B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla") \
  EXPHIL_OP_DIRECTION(lstm_stack, backward, "wx:in:seq:B,T,4H R:in:weight:L,H,4H W:in:weight:K,H,4H y:in:seq:B,T,H y_lower:in:seq:K,B,T,H grad_y:in:seq:B,T,H bias?:in:weight:L,4H W_bias?:in:weight:K,4H h0?:in:carry:L,B,H c0?:in:carry:L,B,H grad_y_lower?:in:seq:K,B,T,H grad_h_final?:in:carry:L,B,H grad_c_final?:in:carry:L,B,H grad_wx?:out:seq:B,T,4H grad_R?:out:weight:L,H,4H grad_W?:out:weight:K,H,4H grad_bias?:out:weight:L,4H grad_W_bias?:out:weight:K,4H grad_h0?:out:carry:L,B,H grad_c0?:out:carry:L,B,H", "precision:enum(exact|tf32)=exact", "cpp c nif xla")
/* clang-format on */

#endif /* EXPHIL_OP_DESCRIPTIONS_H */
