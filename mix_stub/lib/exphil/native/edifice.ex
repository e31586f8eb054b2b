if Code.ensure_loaded?(Edifice.Block.FusedOp) do
  defmodule ExPhil.Native.Edifice do
    @moduledoc """
    Edifice's fused ops (`%Edifice.Block.FusedOp{}` blocks) as seen from this
    library: which of them one of our XLA FFI targets could run, and the
    answer to `EXLA.CustomCall.call/4` for them. Compiled only when Edifice is
    present.

    Edifice (the first user's library of Axon architectures) sends every fused
    op through `Nx.block(%Edifice.Block.FusedOp{op: op, attrs: %{}}, args,
    template, default_fun)`: 47 ops, 29 forward and 18 backward
    (`ops/0`). EXLA turns a block into a custom call only when the target
    takes exactly the block's operands and returns exactly its template. The
    scan targets of the y-only form (`exphil_<op>_y_fwd` and `_y_bwd`,
    `exphil_min_gru_activated_*`, `exphil_min_lstm_activated_*`) do that for
    14 of them (the MinGRU, MinLSTM, ELU-GRU, Real-GRU, diagonal-linear,
    liquid and linear scans and their backward ops),
    `exphil_selective_scan_y_fwd` and `_y_bwd` for Mamba's selective scan
    (f32 operands only), `exphil_attention_o_fwd` and `_o_bwd` for flash
    attention (its causal flag read as a constant of the expression; the
    backward recomputes lse), `exphil_gru_y_fwd`, `exphil_lstm_y_fwd` and
    their `_y_bwd` for the GRU and LSTM scans and their backward ops, and
    `exphil_slstm_y_fwd` for the sLSTM scan (which has no backward op): the
    `:native` rows, 23. `native_block/3` gives
    their custom call;
    `call/4` answers with it only under an EXLA that pins layouts (see
    `call/4`), and `:skip` otherwise and for every other op (ours return
    `h_final` besides `y`, want `lse` in the attention backward, take
    optional operands Edifice does not pass...). `ops/0` says, op by op, what
    differs and the smallest handler variant or kernel op that would make it
    native; `mix_stub/EDIFICE.md` is the long form.

    ## The native tier is opt-in

    Edifice takes its `Nx.block` tier as soon as *any* non-`Any`
    implementation of `EXLA.CustomCall` for `Edifice.Block.FusedOp` exists
    (`Edifice.Block.native_impl?/0`), and two implementations of one protocol
    for one struct clash when protocols are consolidated. So this library
    defines that implementation only when asked to, at compile time:

        # config/config.exs of the application
        config :exphil_native, edifice_native_tier: true

    (read with `Application.compile_env/3`; EXLA must be present too). It
    delegates to `call/4`. Turning it on makes `Edifice.Block.native_impl?()`
    true, so Edifice routes its fused ops through `Edifice.Block.run/5`, whose
    default functions are Edifice's own fallbacks: with every op `:skip`, the
    forward math of Edifice's pure path, run as Edifice's sequential
    fallbacks, with Edifice's hand-written backward functions as gradients.
    Those are not always the gradient of the forward: EDIFICE.md ("What
    turning the tier on changes") lists where (Mamba's selective scan), and
    that the TTT and RLA backward blocks cannot be built at all. Without the
    option, nothing here changes what Edifice does. An application that
    defines its own implementation for `FusedOp` can delegate to `call/4`
    instead.

    ## The rows

    `ops/0` returns one map per op, in the order of Edifice's FUSED_OPS.md:

      * `:index`, `:op`, `:direction` (`:forward` or `:backward`), `:pair`
        (the paired backward or forward op, or `nil`), `:entry` (the
        `Edifice.CUDA.FusedScan` function that builds it)
      * `:operands`, `:results` - names, in Edifice's order (the lengths are
        the block's operand count and its template's leaf count)
      * `:ours` - the op of this library that computes the same math, one
        that `ExPhil.Native.OpDescriptions` describes in the row's direction
        (`:min_gru`, `:min_gru_activated`, `:attention`, ...; a `:native`
        row's target is a form of that op's), or `nil`
      * `:status` - `:native` (a target of ours takes the block as it is),
        `:handler_variant` (our kernel computes this; a target with Edifice's
        operand and result lists would make it native, with no kernel
        change), `:kernel_op` (close to one of our ops; needs a new
        coefficient op or kernel mode as well) or `:no_kernel`
      * `:variant` - the smallest change that would make it native, a key of
        `variants/0` (`nil` for `:no_kernel` rows), and `:change`, a note on
        it for this op (or `nil`)
      * `:reason` - why it is not native today, with the Edifice code lines
        (files under Edifice's `lib/edifice/`) that show the math
      * `:models` - which of the backbones EDIFICE.md studies
        (`Edifice.build/2` names) build this op when the tier is on
      * `:target`, `:attributes` - for a `:native` row only: the custom-call
        target (`ExPhil.Native.Targets`) and its attribute values, a map or a
        function `(out, args) -> {:ok, map} | {:skip, reason}`, which is also
        how a row is native for some calls only (operand dtypes, sizes, a
        constant flag) and `:skip` for the others

    Making an op native is one row: give it `status: :native`, a `:target`
    (a new row of `include/exphil/xla_ffi_targets.h` with exactly Edifice's
    operands and results) and its `:attributes`. This module checks when it
    compiles that such a target takes the row's operand and result counts.
    """

    alias Edifice.Block.FusedOp
    alias ExPhil.Native.{Block, CustomCall, Targets}
    alias ExPhil.Native.Ops.GatedRnn

    @native_tier Application.compile_env(:exphil_native, :edifice_native_tier, false)
    @exla Code.ensure_loaded?(EXLA.CustomCall)

    @defaults %{
      pair: nil,
      ours: nil,
      variant: nil,
      change: nil,
      models: [],
      target: nil,
      attributes: %{}
    }

    # The smallest changes that would make ops native (`variants/0`).
    @variants %{
      v1:
        "Done: forward targets exphil_<op>_y_fwd with y as the only result (no h_final) that " <>
          "take h0 as Edifice passes it (always present: zeros of the input dtype). No kernel " <>
          "change: h_final is optional in the C API.",
      v2:
        "Done: a backward target without the grad_h_final operand, exphil_liquid_y_bwd: " <>
          "(tau, target, h0, y, grad_y) -> (grad_tau, grad_target, grad_h0). No kernel " <>
          "change: an absent grad_h_final is the C API's default.",
      v2b:
        "Done: exphil_linear_scan_y_bwd (a, h0, y, grad_y) -> (grad_a, grad_b, grad_h0), " <>
          "linear_scan's backward without b or grad_h_final. A kernel mode: the backward " <>
          "kernel otherwise rebuilds the states h_{t-1} in each tile from one row of y and " <>
          "the forward maps (a_t, b_t), so it read b; without b it reads each h_{t-1} from y " <>
          "(h0 at t = 0), as Edifice's backward does (cuda/scan/scan_backward.cuh, " <>
          "kStatesFromY; b may be NULL in the C++ API and C ABI).",
      k1:
        "Done: a scan coefficient op (cuda/scan/scan_ops.cuh, MinGruActivatedOp) for min_gru " <>
          "on a post-sigmoid gate: a = 1 - z, b = z c; grad_z = g (c - h_prev), grad_c = g z. " <>
          "Targets exphil_min_gru_activated_fwd (z, candidate, h0) -> y and " <>
          "exphil_min_gru_activated_bwd (z, candidate, h0, y, grad_y) -> (grad_z, " <>
          "grad_candidate, grad_h0).",
      k2:
        "Done: a scan coefficient op (MinLstmActivatedOp) for min_lstm on post-sigmoid gates: " <>
          "s = f + (i + 1e-6) as Edifice groups it, a = f/s, b = (i/s) c, gradients as " <>
          "MinLstmOp's without the sigmoid slopes. Targets exphil_min_lstm_activated_fwd and " <>
          "exphil_min_lstm_activated_bwd, in the forms of V1 and V2.",
      k3:
        "Done: a scan coefficient op (DiagLinearOp, ScanOp::diag_linear) a = sigmoid(a_vals), " <>
          "b = b_vals, target exphil_diag_linear_y_fwd (a, b, h0) -> y; its backward is V2b " <>
          "on the post-sigmoid a Edifice passes.",
      k4:
        "Done: a scan coefficient op (EluGruOp, ScanOp::elu_gru) z = sigmoid(gate), " <>
          "c' = 1 + elu(candidate) (exp(x) at and below zero, without the cancellation), " <>
          "h = (1 - z) h + z c', target exphil_elu_gru_y_fwd (gate, candidate, h0) -> y; its " <>
          "backward is K1's on the post-activation z and c' Edifice passes.",
      ss_f:
        "Done for f32: a selective-scan kernel mode, SelectiveScanInputScale::channel_mean " <>
          "(forward only), that scales the input term by the mean over the channels of " <>
          "clamp(dt) (B_bar[b,t,n] = mean_d clamp(dt[b,t,d]) B[b,t,n]) instead of each " <>
          "channel's delta: a pass computes the means [B, T] first " <>
          "(cuda/selective_scan/selective_scan_mean_delta.cuh); target " <>
          "exphil_selective_scan_y_fwd (x, dt, A, B, C) -> y, attributes softplus false, " <>
          "clamp [0.001, 0.1], input_scale 1, no optional operands, no h_final.",
      rnn:
        "Done: the GRU and LSTM targets in Edifice's form, exphil_gru_y_fwd (wx, R, h0) -> y, " <>
          "exphil_gru_y_bwd (wx, R, h0, y, grad_y) -> (grad_wx, grad_rh, grad_h0), " <>
          "exphil_lstm_y_fwd (wx, R, h0, c0) -> y and exphil_lstm_y_bwd (wx, R, h0, c0, y, " <>
          "grad_y) -> (grad_wx, grad_h0, grad_c0), and the sLSTM's exphil_slstm_y_fwd (wx, R, " <>
          "h0, c0) -> y (n0 = 1, m0 = 0 implicit; Edifice has no sLSTM backward op): our gru, " <>
          "lstm and slstm ops without the recurrent " <>
          "bias, the final states or grad_R (Edifice forms grad_R itself, from grad_rh for " <>
          "the GRU). No kernel change: the backward kernels write grad_rh, the gradient of " <>
          "h R, for this.",
      ss_b:
        "Done for f32: exphil_selective_scan_y_bwd (x, dt, A, B, C, grad_y) -> (grad_x, " <>
          "grad_dt, grad_B, grad_C), our backward with no optional operands, no grad_h_final " <>
          "and grad_A not computed (NULL in the C++ API), attributes softplus false, clamp " <>
          "[0.001, 0.1]. No kernel change. Our grad_B and grad_C take x's dtype and Edifice's " <>
          "template makes them f32, so the row is :skip unless every operand is f32 " <>
          "(bf16/f16 would need them stored as f32).",
      att_f:
        "Done: exphil_attention_o_fwd (q, k, v, flag) -> o, exphil_attention_fwd with a " <>
          "fourth operand it never reads and o as its only result (lse NULL in the C++ API). " <>
          "The row reads the mask from the constant causal_packed when EXLA lowers the block " <>
          "(`constant/1`; :skip when it is not a constant, or not 0 or 1): mask 0 or 1, " <>
          "window 0, layout BHTD, scale 0 (1/sqrt(d)), precision 0.",
      att_b:
        "Done: exphil_attention_o_bwd (q, k, v, o, grad_o, flag) -> (grad_q, grad_k, " <>
          "grad_v), exphil_attention_bwd without lse: the C++ API's recompute_lse runs the " <>
          "forward kernel into the backward's workspace (capture-safe; one forward pass " <>
          "more, its o discarded), mask read as in ATT-F.",
      laser:
        "An attention kernel variant that takes exp(V - v_max) as V is loaded and stores " <>
          "log(max(O, 1e-7)) + v_max, with its backward.",
      fox:
        "An attention kernel variant with an additive score bias cs_i - cs_j (one per-row and " <>
          "one per-column term), always causal, with grad_cs in its backward."
    }

    @labels %{
      v1: "V1",
      v2: "V2",
      v2b: "V2b",
      att_f: "ATT-F",
      att_b: "ATT-B",
      ss_b: "SS-B",
      rnn: "RNN",
      k1: "K1",
      k2: "K2",
      k3: "K3",
      k4: "K4",
      ss_f: "SS-F",
      laser: "LASER",
      fox: "FoX"
    }

    # Handler variants (new targets only) first, then kernel changes.
    @variant_order [
      :v1,
      :v2,
      :v2b,
      :att_f,
      :att_b,
      :ss_b,
      :rnn,
      :k1,
      :k2,
      :k3,
      :k4,
      :ss_f,
      :laser,
      :fox
    ]

    unless Enum.sort(@variant_order) == Enum.sort(Map.keys(@variants)) and
             Enum.sort(@variant_order) == Enum.sort(Map.keys(@labels)) do
      raise "ExPhil.Native.Edifice: every variant needs a label and a place in the order"
    end

    @mlp "no kernel of ours: the recurrence multiplies the state by a weight matrix inside " <>
           "the step, which is not an elementwise linear recurrence"

    # When the GRU, LSTM and sLSTM rows are :skip (gated_rnn_attributes/2).
    @rnn_skip ":skip for operands the kernels do not take (R f32 or wx's type, h0 and c0 " <>
                "of one type, f32 or wx's, as the gradients' templates; fwd and g wx's type, " <>
                "so not Nx's f32 cotangent under a bf16 wx) and for H above the device's " <>
                "multiprocessors times div(256, gates)"

    @rows [
      # ---------------------------------------------------------------- forward
      %{
        index: 1,
        op: :fused_mingru_scan,
        direction: :forward,
        pair: :fused_mingru_scan_backward,
        entry: "mingru/2",
        operands: [:z, :candidates, :h0],
        results: [:y],
        ours: :min_gru_activated,
        status: :native,
        variant: :k1,
        change: "exphil_min_gru_activated_fwd",
        target: "exphil_min_gru_activated_fwd",
        models: [:min_gru],
        reason:
          "native: the recurrence h = (1 - z) h + z c (cuda/fused_scan.ex:523) on the " <>
            "post-sigmoid z Edifice passes (cuda/fused_scan.ex:459), y only; " <>
            "MinGruActivatedOp computes a = 1 - z in f32 from the z it is given"
      },
      %{
        index: 2,
        op: :fused_minlstm_scan,
        direction: :forward,
        pair: :fused_minlstm_scan_backward,
        entry: "minlstm/3",
        operands: [:f, :i, :candidates, :h0],
        results: [:y],
        ours: :min_lstm_activated,
        status: :native,
        variant: :k2,
        change: "exphil_min_lstm_activated_fwd",
        target: "exphil_min_lstm_activated_fwd",
        models: [:min_lstm],
        reason:
          "native: Edifice's normalisation s = f + (i + 1.0e-6), h = (f/s) h + (i/s) c " <>
            "(cuda/fused_scan.ex:585-597), grouped and divided as Edifice does, on the " <>
            "post-sigmoid f and i Edifice passes (cuda/fused_scan.ex:488-489), y only"
      },
      %{
        index: 3,
        op: :fused_elu_gru_scan,
        direction: :forward,
        pair: :fused_elu_gru_scan_backward,
        entry: "elu_gru/2",
        operands: [:gates, :candidates, :h0],
        results: [:y],
        ours: :elu_gru,
        status: :native,
        variant: :k4,
        change: "exphil_elu_gru_y_fwd",
        target: "exphil_elu_gru_y_fwd",
        reason:
          "native: min_gru with the candidate through 1 + elu inside the op " <>
            "(cuda/fused_scan.ex:715-717), both activations inside EluGruOp, y only"
      },
      %{
        index: 4,
        op: :fused_real_gru_scan,
        direction: :forward,
        pair: :fused_real_gru_scan_backward,
        entry: "real_gru/2",
        operands: [:gates, :candidates, :h0],
        results: [:y],
        ours: :min_gru,
        status: :native,
        variant: :v1,
        change: "exphil_min_gru_y_fwd",
        target: "exphil_min_gru_y_fwd",
        reason:
          "native: exactly min_gru on raw gates, sigmoid inside the op " <>
            "(cuda/fused_scan.ex:753-754); exphil_min_gru_y_fwd is exphil_min_gru_fwd with h0 " <>
            "required and y its only result"
      },
      %{
        index: 5,
        op: :fused_diag_linear_scan,
        direction: :forward,
        pair: :fused_diag_linear_scan_backward,
        entry: "diag_linear/2",
        operands: [:a_vals, :b_vals, :h0],
        results: [:y],
        ours: :diag_linear,
        status: :native,
        variant: :k3,
        change: "exphil_diag_linear_y_fwd",
        target: "exphil_diag_linear_y_fwd",
        reason:
          "native: h = sigmoid(a) h + b with the sigmoid inside the op " <>
            "(cuda/fused_scan.ex:791), as DiagLinearOp computes it, y only"
      },
      %{
        index: 6,
        op: :fused_liquid_scan,
        direction: :forward,
        pair: :fused_liquid_scan_backward,
        entry: "liquid/2",
        operands: [:tau, :activation, :h0],
        results: [:y],
        ours: :liquid,
        status: :native,
        variant: :v1,
        change: "exphil_liquid_y_fwd",
        target: "exphil_liquid_y_fwd",
        reason:
          "native: the recurrence h = act + (h - act) exp(-1/tau) (cuda/fused_scan.ex:824-825; " <>
            "ours computes 1 - exp(-1/tau) as -expm1(-1/tau)), y only"
      },
      %{
        index: 7,
        op: :fused_linear_scan,
        direction: :forward,
        pair: :fused_linear_scan_backward,
        entry: "linear_scan/2",
        operands: [:a_vals, :b_vals, :h0],
        results: [:y],
        ours: :linear_scan,
        status: :native,
        variant: :v1,
        change: "exphil_linear_scan_y_fwd",
        target: "exphil_linear_scan_y_fwd",
        reason: "native: the recurrence h = a h + b (cuda/fused_scan.ex:876), y only"
      },
      %{
        index: 8,
        op: :fused_delta_net_scan,
        direction: :forward,
        pair: :fused_delta_rule_scan_backward,
        entry: "delta_net_scan/4",
        operands: [:q, :k, :v, :beta],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: a matrix-state delta rule, S += beta (v - S k) k^T, o = S q " <>
            "(cuda/fused_scan.ex:2212-2236)"
      },
      %{
        index: 9,
        op: :fused_gated_delta_net_scan,
        direction: :forward,
        pair: :fused_gated_delta_net_scan_backward,
        entry: "gated_delta_net_scan/5",
        operands: [:q, :k, :v, :beta, :alpha],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: the delta rule with a per-head scalar decay " <>
            "(cuda/fused_scan.ex:2256)"
      },
      %{
        index: 10,
        op: :fused_delta_product_scan,
        direction: :forward,
        entry: "delta_product_scan/4",
        operands: [:q, :k, :v, :beta],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: Householder-product delta rule with an RMS-normalised output " <>
            "(cuda/fused_scan.ex:2296)"
      },
      %{
        index: 11,
        op: :fused_slstm_scan,
        direction: :forward,
        entry: "slstm_scan/2",
        operands: [:wx, :recurrent_weight, :h0, :c0],
        results: [:y],
        ours: :slstm,
        status: :native,
        variant: :rnn,
        change: "exphil_slstm_y_fwd",
        target: "exphil_slstm_y_fwd",
        attributes: &__MODULE__.gated_rnn_attributes/2,
        reason:
          "native: the sLSTM of our slstm op, gates i, f, z, o of wx + h R, " <>
            "m = max(f + m, i), exponential gating stabilised by m, c = f c + i tanh(z), " <>
            "n = f n + i, h = sigmoid(o) c / max(|n|, 1) (cuda/fused_scan.ex:2371-2402), " <>
            "the product h R inside the kernel, no recurrent bias, h0 and c0 zeros of wx's " <>
            "type (cuda/fused_scan.ex:2361-2362), n0 = 1 and m0 = 0 as the fallback starts " <>
            "them (cuda/fused_scan.ex:2375-2376; the target leaves them to the library's " <>
            "defaults), y only; no backward op (Nx differentiates the fallback). #{@rnn_skip}"
      },
      %{
        index: 12,
        op: :fused_lstm_scan,
        direction: :forward,
        pair: :fused_lstm_scan_backward,
        entry: "lstm_scan/2",
        operands: [:wx, :recurrent_weight, :h0, :c0],
        results: [:y],
        ours: :lstm,
        status: :native,
        variant: :rnn,
        change: "exphil_lstm_y_fwd",
        target: "exphil_lstm_y_fwd",
        attributes: &__MODULE__.gated_rnn_attributes/2,
        models: [:lstm],
        reason:
          "native: the LSTM of our lstm op, gates i, f, g, o of wx + h R, c = f c + i g, " <>
            "h = o tanh(c) (cuda/fused_scan.ex:2437-2463), the product h R inside the kernel, " <>
            "no recurrent bias (Edifice's input projection has it, " <>
            "recurrent/recurrent.ex:323-327), h0 and c0 zeros of wx's type " <>
            "(cuda/fused_scan.ex:2410-2411), y only. #{@rnn_skip}"
      },
      %{
        index: 13,
        op: :fused_gru_scan,
        direction: :forward,
        pair: :fused_gru_scan_backward,
        entry: "gru_scan/2",
        operands: [:wx, :recurrent_weight, :h0],
        results: [:y],
        ours: :gru,
        status: :native,
        variant: :rnn,
        change: "exphil_gru_y_fwd",
        target: "exphil_gru_y_fwd",
        attributes: &__MODULE__.gated_rnn_attributes/2,
        models: [:gru],
        reason:
          "native: the GRU of our gru op, r, z = sigmoid(wx + h R), " <>
            "n = tanh(wx_n + r (h R)_n), h = (1 - z) n + z h (cuda/fused_scan.ex:2493-2531), " <>
            "the product h R inside the kernel, no recurrent bias, h0 zeros of wx's type " <>
            "(cuda/fused_scan.ex:2471), y only. #{@rnn_skip}"
      },
      %{
        index: 14,
        op: :fused_ttt_scan,
        direction: :forward,
        pair: :fused_ttt_scan_backward,
        entry: "ttt_scan/7",
        operands: [:q, :k, :v, :eta, :w0, :ln_gamma, :ln_beta],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: TTT-Linear, a per-step update of a weight matrix with a " <>
            "LayerNorm (cuda/fused_scan.ex:2555)"
      },
      %{
        index: 15,
        op: :fused_selective_scan,
        direction: :forward,
        pair: :fused_selective_scan_backward,
        entry: "selective_scan/5",
        operands: [:x, :dt, :a, :b, :c],
        results: [:y],
        ours: :selective_scan,
        status: :native,
        variant: :ss_f,
        change: "exphil_selective_scan_y_fwd, input_scale 1",
        target: "exphil_selective_scan_y_fwd",
        attributes: &__MODULE__.selective_scan_forward_attributes/2,
        models: [:mamba],
        reason:
          "native for f32 operands: the default fun (cuda/fused_scan.ex:2601-2604 -> " <>
            "ssm/common.ex:661-668) clamps dt to [0.001, 0.1] (ssm/common.ex:404) and scales " <>
            "B by the mean of dt over the channels (ssm/common.ex:431-435): our input_scale " <>
            "channel_mean. The default ignores the A operand and uses A = -(1..S) " <>
            "(ssm/common.ex:410); the target reads A, as Edifice's backward and its fused-op " <>
            "contract do: the same for Mamba, its one caller, which passes exactly that " <>
            "(ssm/mamba.ex:187-193). :skip for other dtypes (A stays f32 under a bf16 model, " <>
            "and the rows take operands of one type) and more than 256 states"
      },
      %{
        index: 16,
        op: :fused_kda_scan,
        direction: :forward,
        pair: :fused_kda_scan_backward,
        entry: "kda_scan/5",
        operands: [:q, :k, :v, :alpha, :beta],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: a delta rule with channel-wise decay (cuda/fused_scan.ex:2632)"
      },
      %{
        index: 17,
        op: :fused_rla_scan,
        direction: :forward,
        pair: :fused_rla_scan_backward,
        entry: "rla_scan/7",
        operands: [:q, :k, :v, :alpha, :beta, :gamma, :variant_t, :clip_t],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: dual-state residual linear attention; its settings come as " <>
            "tensor operands variant_t and clip_t (cuda/fused_scan.ex:2671-2692)"
      },
      %{
        index: 18,
        op: :fused_flash_attention,
        direction: :forward,
        pair: :fused_flash_attention_backward,
        entry: "flash_attention/4",
        operands: [:q, :k, :v, :causal_packed],
        results: [:o],
        ours: :attention,
        status: :native,
        variant: :att_f,
        change: "exphil_attention_o_fwd",
        target: "exphil_attention_o_fwd",
        attributes: &__MODULE__.flash_attention_attributes/2,
        models: [:infini_attention],
        reason:
          "native: the same softmax(Q K^T / sqrt(d)) V with a causal mask rows >= cols and " <>
            "T = S (cuda/fused_scan.ex:3476-3508; ours is bottom-right aligned, the same when " <>
            "T = S), no GQA, BHTD; the causal flag, a tensor operand {1} " <>
            "(cuda/fused_scan.ex:3431), is read as a constant when the block is lowered and " <>
            "given as the mask attribute (:skip when it is not a constant, for causal with " <>
            "T != S, or head widths other than 32, 64, 96, 128)"
      },
      %{
        index: 19,
        op: :fused_laser_attention,
        direction: :forward,
        pair: :fused_laser_attention_backward,
        entry: "laser_attention/4",
        operands: [:q, :k, :v, :v_max, :causal_packed],
        results: [:o],
        ours: :attention,
        status: :kernel_op,
        variant: :laser,
        reason:
          "LASER: O = log(max(softmax(Q K^T / sqrt(d)) exp(V - v_max), 1e-7)) + v_max " <>
            "(cuda/fused_scan.ex:3667-3703); our kernel has no value or output transform"
      },
      %{
        index: 20,
        op: :fused_fox_attention,
        direction: :forward,
        pair: :fused_fox_attention_backward,
        entry: "fox_attention/4",
        operands: [:q, :k, :v, :cs],
        results: [:o],
        ours: :attention,
        status: :kernel_op,
        variant: :fox,
        reason:
          "Forgetting attention: scores + (cs_i - cs_j), causal (cuda/fused_scan.ex:3863-3907); " <>
            "our kernel takes no score bias"
      },
      %{
        index: 21,
        op: :fused_reservoir_scan,
        direction: :forward,
        entry: "reservoir_scan/3",
        operands: [:wx, :w_res, :h0_packed],
        results: [:h_final],
        status: :no_kernel,
        reason:
          "#{@mlp}: h = tanh(wx + h W_res), final state only, leak rate packed into " <>
            "h0_packed (cuda/fused_scan.ex:4020-4033, 4067-4082)"
      },
      %{
        index: 22,
        op: :fused_titans_scan,
        direction: :forward,
        entry: "titans_scan/2",
        operands: [:packed],
        results: [:y],
        status: :no_kernel,
        reason:
          "no kernel of ours: surprise-gated memory with momentum, the momentum packed as a " <>
            "column (cuda/fused_scan.ex:4117-4130, 4159)"
      },
      %{
        index: 23,
        op: :fused_miras_scan,
        direction: :forward,
        entry: "miras_scan/2",
        operands: [:packed],
        results: [:y],
        status: :no_kernel,
        reason: "no kernel of ours: MIRAS memory (cuda/fused_scan.ex:4227-4240, 4269)"
      },
      %{
        index: 24,
        op: :fused_gsa_scan,
        direction: :forward,
        entry: "gsa_scan/4",
        operands: [:q, :k_slot, :v, :alpha],
        results: [:y],
        status: :no_kernel,
        reason: "no kernel of ours: gated slot attention (cuda/fused_scan.ex:4389)"
      },
      %{
        index: 25,
        op: :fused_mingru_block_scan,
        direction: :forward,
        entry: "mingru_block/4",
        operands: [:input, :weights, :h0],
        results: [:y],
        status: :no_kernel,
        reason:
          "a whole MinGRU stack from packed weights (per layer LayerNorm, two dense " <>
            "projections, scan, residual: cuda/fused_scan.ex:4521-4571); ours is the scan " <>
            "only. Reached only from MinGRU.fused_block_inference/4, never from Edifice.build"
      },
      %{
        index: 26,
        op: :fused_minlstm_block_scan,
        direction: :forward,
        entry: "minlstm_block/4",
        operands: [:input, :weights, :h0],
        results: [:y],
        status: :no_kernel,
        reason:
          "a whole MinLSTM stack from packed weights (cuda/fused_scan.ex:4647); ours is the " <>
            "scan only. Reached only from MinLSTM.fused_block_inference, never from Edifice.build"
      },
      %{
        index: 27,
        op: :fused_linear_block_scan,
        direction: :forward,
        entry: "linear_block/4",
        operands: [:input, :weights, :h0],
        results: [:y],
        status: :no_kernel,
        reason:
          "a whole linear-recurrence stack from packed weights (cuda/fused_scan.ex:4785-4831); " <>
            "ours is the scan only"
      },
      %{
        index: 28,
        op: :fused_lstm_block_scan,
        direction: :forward,
        entry: "lstm_block/5",
        operands: [:input, :weights, :h0, :c0],
        results: [:y],
        status: :no_kernel,
        reason: "#{@mlp}: a whole LSTM stack from packed weights (cuda/fused_scan.ex:4911)"
      },
      %{
        index: 29,
        op: :fused_gru_block_scan,
        direction: :forward,
        entry: "gru_block/4",
        operands: [:input, :weights, :h0],
        results: [:y],
        status: :no_kernel,
        reason: "#{@mlp}: a whole GRU stack from packed weights (cuda/fused_scan.ex:5055)"
      },
      # --------------------------------------------------------------- backward
      %{
        index: 1,
        op: :fused_mingru_scan_backward,
        direction: :backward,
        pair: :fused_mingru_scan,
        entry: "mingru/2",
        operands: [:z, :candidates, :h0, :fwd, :g],
        results: [:grad_z, :grad_cand, :grad_h0],
        ours: :min_gru_activated,
        status: :native,
        variant: :k1,
        change: "exphil_min_gru_activated_bwd",
        target: "exphil_min_gru_activated_bwd",
        models: [:min_gru],
        reason:
          "native: the gradient with respect to the post-sigmoid z, dz = dh (c - h_prev), " <>
            "dc = dh z, dh_prev = dh (1 - z) (cuda/fused_scan.ex:570-572, in 548-581); Edifice " <>
            "applies z (1 - z) afterwards (cuda/fused_scan.ex:478); no grad_h_final"
      },
      %{
        index: 2,
        op: :fused_minlstm_scan_backward,
        direction: :backward,
        pair: :fused_minlstm_scan,
        entry: "minlstm/3",
        operands: [:f, :i, :candidates, :h0, :fwd, :g],
        results: [:grad_f, :grad_i, :grad_cand, :grad_h0],
        ours: :min_lstm_activated,
        status: :native,
        variant: :k2,
        change: "exphil_min_lstm_activated_bwd",
        target: "exphil_min_lstm_activated_bwd",
        models: [:min_lstm],
        reason:
          "native: the gradients with respect to the post-sigmoid f and i through the " <>
            "normalisation (cuda/fused_scan.ex:623-676, the quotient rule of MinLstmOp without " <>
            "the sigmoid slopes, which Edifice applies afterwards: cuda/fused_scan.ex:508-509); " <>
            "no grad_h_final"
      },
      %{
        index: 3,
        op: :fused_elu_gru_scan_backward,
        direction: :backward,
        pair: :fused_elu_gru_scan,
        entry: "elu_gru/2",
        operands: [:z, :c, :h0, :fwd, :g],
        results: [:grad_z, :grad_c, :grad_h0],
        ours: :min_gru_activated,
        status: :native,
        variant: :k1,
        change: "exphil_min_gru_activated_bwd",
        target: "exphil_min_gru_activated_bwd",
        reason:
          "native: takes post-activation z and c = 1 + elu(candidates) " <>
            "(cuda/fused_scan.ex:686-687) and is the MinGRU backward on them " <>
            "(cuda/fused_scan.ex:941-974): K1's backward"
      },
      %{
        index: 4,
        op: :fused_real_gru_scan_backward,
        direction: :backward,
        pair: :fused_real_gru_scan,
        entry: "real_gru/2",
        operands: [:z, :candidates, :h0, :fwd, :g],
        results: [:grad_z, :grad_cand, :grad_h0],
        ours: :min_gru_activated,
        status: :native,
        variant: :k1,
        change: "exphil_min_gru_activated_bwd",
        target: "exphil_min_gru_activated_bwd",
        reason:
          "native: the MinGRU backward on the post-sigmoid z (cuda/fused_scan.ex:995-998 " <>
            "delegates to mingru_backward_fallback): K1's backward"
      },
      %{
        index: 5,
        op: :fused_diag_linear_scan_backward,
        direction: :backward,
        pair: :fused_diag_linear_scan,
        entry: "diag_linear/2",
        operands: [:a, :h0, :fwd, :g],
        results: [:grad_a, :grad_b, :grad_h0],
        ours: :linear_scan,
        status: :native,
        variant: :v2b,
        change: "exphil_linear_scan_y_bwd",
        target: "exphil_linear_scan_y_bwd",
        reason:
          "native: takes the post-sigmoid a (cuda/fused_scan.ex:768) and is the linear-scan " <>
            "backward (cuda/fused_scan.ex:1019-1022) without b or grad_h_final operands; the " <>
            "states come from y, as in Edifice's"
      },
      %{
        index: 6,
        op: :fused_liquid_scan_backward,
        direction: :backward,
        pair: :fused_liquid_scan,
        entry: "liquid/2",
        operands: [:tau, :activation, :h0, :fwd, :g],
        results: [:grad_tau, :grad_activation, :grad_h0],
        ours: :liquid,
        status: :native,
        variant: :v2,
        change: "exphil_liquid_y_bwd",
        target: "exphil_liquid_y_bwd",
        reason:
          "native: the same gradients as ours, dtau = dh (h_prev - act) e / tau^2, " <>
            "dact = dh (1 - e) (cuda/fused_scan.ex:1202-1238); exphil_liquid_y_bwd is " <>
            "exphil_liquid_bwd with h0 required and no grad_h_final"
      },
      %{
        index: 7,
        op: :fused_linear_scan_backward,
        direction: :backward,
        pair: :fused_linear_scan,
        entry: "linear_scan/2",
        operands: [:a_vals, :h0, :fwd, :g],
        results: [:grad_a, :grad_b, :grad_h0],
        ours: :linear_scan,
        status: :native,
        variant: :v2b,
        change: "exphil_linear_scan_y_bwd",
        target: "exphil_linear_scan_y_bwd",
        reason:
          "native: the same gradients as ours (cuda/fused_scan.ex:884-916) from a, h0 and " <>
            "the forward's y, with no b_vals (cuda/fused_scan.ex:859-866) and no " <>
            "grad_h_final; the states come from y, as in Edifice's"
      },
      %{
        index: 8,
        op: :fused_delta_rule_scan_backward,
        direction: :backward,
        pair: :fused_delta_net_scan,
        entry: "delta_net_scan/4",
        operands: [:q, :k, :v, :beta, :fwd, :g],
        results: [:grad_q, :grad_k, :grad_v, :grad_beta],
        status: :no_kernel,
        reason: "no kernel of ours (delta rule; cuda/fused_scan.ex:1257)"
      },
      %{
        index: 9,
        op: :fused_gated_delta_net_scan_backward,
        direction: :backward,
        pair: :fused_gated_delta_net_scan,
        entry: "gated_delta_net_scan/5",
        operands: [:q, :k, :v, :beta, :alpha, :fwd, :g],
        results: [:grad_q, :grad_k, :grad_v, :grad_beta, :grad_alpha],
        status: :no_kernel,
        reason: "no kernel of ours (gated delta rule; cuda/fused_scan.ex:1347)"
      },
      %{
        index: 10,
        op: :fused_lstm_scan_backward,
        direction: :backward,
        pair: :fused_lstm_scan,
        entry: "lstm_scan/2",
        operands: [:wx, :recurrent_weight, :h0, :c0, :fwd, :g],
        results: [:grad_wx, :grad_h0, :grad_c0],
        ours: :lstm,
        status: :native,
        variant: :rnn,
        change: "exphil_lstm_y_bwd",
        target: "exphil_lstm_y_bwd",
        attributes: &__MODULE__.gated_rnn_attributes/2,
        models: [:lstm],
        reason:
          "native: the default fun (cuda/fused_scan.ex:1044-1102) is our lstm backward: " <>
            "the gates' gradients di, df, dg, do as grad_wx, dh_prev = grad_wx R^T, " <>
            "dc_prev = dc f, so grad_h0 and grad_c0 at t = 0; its fwd is y alone, from which " <>
            "ours recomputes the cell states; no grad_R (Edifice forms it from grad_wx and " <>
            "the shifted y, cuda/fused_scan.ex:2421-2434). #{@rnn_skip}"
      },
      %{
        index: 11,
        op: :fused_gru_scan_backward,
        direction: :backward,
        pair: :fused_gru_scan,
        entry: "gru_scan/2",
        operands: [:wx, :recurrent_weight, :h0, :fwd, :g],
        results: [:grad_wx, :grad_rh, :grad_h0],
        ours: :gru,
        status: :native,
        variant: :rnn,
        change: "exphil_gru_y_bwd",
        target: "exphil_gru_y_bwd",
        attributes: &__MODULE__.gated_rnn_attributes/2,
        models: [:gru],
        reason:
          "native: the default fun (cuda/fused_scan.ex:1124-1182) is our gru backward: " <>
            "grad_wx = (dr, dz, dn) before the activations, grad_rh the gradient of h R, " <>
            "equal but for n's r dn, dh_prev = dh z + grad_rh R^T; no grad_R (Edifice forms " <>
            "it from grad_rh and the shifted y, cuda/fused_scan.ex:2480-2490). #{@rnn_skip}"
      },
      %{
        index: 12,
        op: :fused_ttt_scan_backward,
        direction: :backward,
        pair: :fused_ttt_scan,
        entry: "ttt_scan/7",
        operands: [:q, :k, :v, :eta, :w0, :ln_gamma, :ln_beta, :fwd, :g],
        results: [
          :grad_q,
          :grad_k,
          :grad_v,
          :grad_eta,
          :grad_w0,
          :grad_ln_gamma,
          :grad_ln_beta
        ],
        status: :no_kernel,
        reason:
          "no kernel of ours (cuda/fused_scan.ex:1834); and Edifice cannot build this block: " <>
            "it has 9 operands and Edifice.Block.wrap/2 stops at 8 (block.ex:52-59), so a " <>
            "gradient of ttt_scan with the tier on raises FunctionClauseError"
      },
      %{
        index: 13,
        op: :fused_selective_scan_backward,
        direction: :backward,
        pair: :fused_selective_scan,
        entry: "selective_scan/5",
        operands: [:x, :dt, :a, :b, :c, :g],
        results: [:grad_x, :grad_dt, :grad_b, :grad_c],
        ours: :selective_scan,
        status: :native,
        variant: :ss_b,
        change: "exphil_selective_scan_y_bwd, f32 only",
        target: "exphil_selective_scan_y_bwd",
        attributes: &__MODULE__.selective_scan_backward_attributes/2,
        models: [:mamba],
        reason:
          "native for f32 operands: the default fun (cuda/fused_scan.ex:1453-1532) is our " <>
            "backward: per-channel B_bar = dt B (cuda/fused_scan.ex:1469, 1497), A from the " <>
            "operand, dt clipped to [0.001, 0.1] and its gradient kept where " <>
            "0.001 <= dt <= 0.1, bounds included (cuda/fused_scan.ex:1513-1514), as our clamp " <>
            "(zero slope only strictly outside); :skip for other dtypes (the template's grad_b " <>
            "and grad_c are f32, ours x's dtype) and more than 256 states. It is not the " <>
            "gradient of Edifice's own forward default, which averages dt over the channels " <>
            "for B (see :fused_selective_scan)"
      },
      %{
        index: 14,
        op: :fused_kda_scan_backward,
        direction: :backward,
        pair: :fused_kda_scan,
        entry: "kda_scan/5",
        operands: [:q, :k, :v, :alpha, :beta, :fwd, :g],
        results: [:grad_q, :grad_k, :grad_v, :grad_alpha, :grad_beta],
        status: :no_kernel,
        reason: "no kernel of ours (cuda/fused_scan.ex:1552)"
      },
      %{
        index: 15,
        op: :fused_rla_scan_backward,
        direction: :backward,
        pair: :fused_rla_scan,
        entry: "rla_scan/7",
        operands: [:q, :k, :v, :alpha, :beta, :gamma, :fwd, :g, :variant_t, :clip_t],
        results: [:grad_q, :grad_k, :grad_v, :grad_alpha, :grad_beta, :grad_gamma],
        status: :no_kernel,
        reason:
          "no kernel of ours (cuda/fused_scan.ex:1675); and Edifice cannot build this block: " <>
            "it has 10 operands and Edifice.Block.wrap/2 stops at 8 (block.ex:52-59), so a " <>
            "gradient of rla_scan with the tier on raises FunctionClauseError"
      },
      %{
        index: 16,
        op: :fused_flash_attention_backward,
        direction: :backward,
        pair: :fused_flash_attention,
        entry: "flash_attention/4",
        operands: [:q, :k, :v, :fwd, :g, :causal_packed],
        results: [:grad_q, :grad_k, :grad_v],
        ours: :attention,
        status: :native,
        variant: :att_b,
        change: "exphil_attention_o_bwd",
        target: "exphil_attention_o_bwd",
        attributes: &__MODULE__.flash_attention_attributes/2,
        models: [:infini_attention],
        reason:
          "native: the same gradients (cuda/fused_scan.ex:3527-3570); exphil_attention_bwd " <>
            "needs the forward's lse, which Edifice's forward op cannot return (its template " <>
            "is o alone) and so never passes: exphil_attention_o_bwd recomputes it (one " <>
            "forward pass more, into the library's workspace) and takes the flag, a sixth " <>
            "operand, as ATT-F does (:skip in the same cases)"
      },
      %{
        index: 17,
        op: :fused_laser_attention_backward,
        direction: :backward,
        pair: :fused_laser_attention,
        entry: "laser_attention/4",
        operands: [:q, :k, :v, :v_max, :fwd, :g, :causal_packed],
        results: [:grad_q, :grad_k, :grad_v],
        ours: :attention,
        status: :kernel_op,
        variant: :laser,
        reason: "LASER's backward (cuda/fused_scan.ex:3723); our kernel has no value transform"
      },
      %{
        index: 18,
        op: :fused_fox_attention_backward,
        direction: :backward,
        pair: :fused_fox_attention,
        entry: "fox_attention/4",
        operands: [:q, :k, :v, :cs, :fwd, :g],
        results: [:grad_q, :grad_k, :grad_v, :grad_cs],
        ours: :attention,
        status: :kernel_op,
        variant: :fox,
        reason: "FoX's backward, with grad_cs (cuda/fused_scan.ex:3926); our kernel has no bias"
      }
    ]

    @rows Enum.map(@rows, &Map.merge(@defaults, &1))

    # The table's invariants, checked when this module compiles.
    {forward, backward} = Enum.split_with(@rows, &(&1.direction == :forward))

    unless length(forward) == 29 and length(backward) == 18 and
             length(Enum.uniq_by(@rows, & &1.op)) == 47 do
      raise "ExPhil.Native.Edifice: expected 47 distinct ops, 29 forward and 18 backward"
    end

    for row <- @rows do
      unless row.status in [:native, :handler_variant, :kernel_op, :no_kernel] do
        raise "ExPhil.Native.Edifice: #{row.op}: unknown status #{inspect(row.status)}"
      end

      if row.status == :native do
        target = Targets.fetch!(row.target)

        unless length(target.operands) == length(row.operands) and
                 length(target.results) == length(row.results) do
          raise "ExPhil.Native.Edifice: #{row.op} takes #{length(row.operands)} operands and " <>
                  "returns #{length(row.results)} results; #{row.target} takes " <>
                  "#{length(target.operands)} and returns #{length(target.results)}"
        end
      end

      if row.status in [:handler_variant, :kernel_op] and
           (row.ours == nil or not Map.has_key?(@variants, row.variant)) do
        raise "ExPhil.Native.Edifice: #{row.op}: a #{row.status} row names our op and a variant"
      end
    end

    @by_op Map.new(@rows, &{&1.op, &1})

    @doc """
    Every Edifice fused op, one map per op in the order of Edifice's
    FUSED_OPS.md (forward ops 1-29, then backward ops 1-18); see the module
    documentation for the keys.
    """
    @spec ops() :: [map()]
    def ops, do: @rows

    @doc """
    The handler variants and kernel ops that the rows' `:variant` names, by
    key: what each one is. `V*` and `RNN` need a new target only; `K*`, `SS-F`, `LASER`
    and `FOX` a kernel change as well (EDIFICE.md, "Variants").
    """
    @spec variants() :: %{atom() => String.t()}
    def variants, do: @variants

    @doc "The row of Edifice op `op` (`:error` for an op Edifice does not have)."
    @spec fetch(atom()) :: {:ok, map()} | :error
    def fetch(op), do: Map.fetch(@by_op, op)

    @doc """
    Whether this build defines `EXLA.CustomCall` for `Edifice.Block.FusedOp`:
    the application configured `edifice_native_tier: true` at compile time and
    EXLA is present.
    """
    @spec native_tier?() :: boolean()
    def native_tier?, do: @native_tier == true and @exla

    @doc """
    The answer to `EXLA.CustomCall.call(block, out, args, client)` for an
    Edifice fused-op block: `{:ok, %EXLA.CustomCall.Spec{}}` for a `:native`
    row's target, or `:skip`, and EXLA then compiles the block's default
    function (Edifice's fallback).

    It is `:skip` unless the client is a CUDA client, the EXLA this library
    was compiled against pins custom-call layouts
    (`ExPhil.Native.CustomCall.layouts_pinned?/0`; Edifice's blocks are
    traced inside `defn` and carry no eager flag, so they are never native
    without it), the op's row is `:native`, its attributes apply to these
    operands, and `ExPhil.Native.CustomCall.spec/4` accepts the call (inputs
    the kernels take, handlers registered). With the vendored EXLA, which does
    not pin layouts, it is always `:skip`; `native_block/3` gives what it
    would answer with.
    """
    @spec call(struct(), term(), [Nx.Tensor.t()], term()) :: :skip | {:ok, struct()}
    def call(%FusedOp{op: op}, out, args, client) do
      with true <- CustomCall.layouts_pinned?(),
           true <- match?(%{platform: :cuda}, client),
           {:ok, %Block{} = block} <- native_block(%FusedOp{op: op}, out, args) do
        CustomCall.spec(block, out, args, client)
      else
        _ -> :skip
      end
    end

    def call(_struct, _out, _args, _client), do: :skip

    @doc """
    The `ExPhil.Native.Block` (target and attribute values) that `call/4`
    turns into a custom call for an Edifice fused-op block with these
    operands (`args`) and output template (`out`), whatever the client and
    the EXLA: `{:ok, block}` for a `:native` row, or `{:skip, reason}`.
    `ExPhil.Native.CustomCall.fields/3` of the block gives the Spec's fields.
    """
    @spec native_block(struct(), term(), [Nx.Tensor.t()]) ::
            {:ok, Block.t()} | {:skip, String.t()}
    def native_block(%FusedOp{op: op}, out, args) do
      case fetch(op) do
        {:ok, %{status: :native} = row} -> block(row, out, args)
        {:ok, row} -> {:skip, "#{op} is not native (#{row.status})"}
        :error -> {:skip, "#{inspect(op)} is not an Edifice fused op"}
      end
    end

    @doc false
    # The ExPhil.Native.Block a row's target makes of a call, or {:skip, reason}.
    def block(%{target: target, attributes: attributes} = row, out, args)
        when is_binary(target) do
      values =
        case attributes do
          fun when is_function(fun, 2) -> fun.(out, args)
          %{} = map -> {:ok, map}
        end

      with {:ok, values} <- values do
        {:ok,
         %Block{
           target: target,
           attributes: values,
           eager: false,
           unsupported: unsupported(row, target, args)
         }}
      end
    end

    def block(row, _out, _args), do: {:skip, "#{row.op} has no target"}

    # The kernels take f32, bf16 and f16 operands of one type, a state
    # operand (h0, c0) or the GRU's and LSTM's R f32 or that type. Edifice
    # may pass an f32 gradient with bf16 inputs (the gradient of a bf16
    # model's f32 loss): such a call runs Edifice's default function rather
    # than reach a handler that would refuse it at run time.
    @f32_allowed ~w(h0 c0 R)
    defp unsupported(row, target, args) do
      type = Nx.type(hd(args))
      names = Enum.map(ExPhil.Native.Targets.fetch!(target).operands, &elem(&1, 0))

      mismatch =
        Enum.zip(names, args)
        |> Enum.find(fn {name, arg} ->
          Nx.type(arg) != type and not (name in @f32_allowed and Nx.type(arg) == {:f, 32})
        end)

      cond do
        type not in [{:f, 32}, {:bf, 16}, {:f, 16}] ->
          "#{row.op}: operands of type #{inspect(type)}"

        mismatch ->
          {name, arg} = mismatch

          "#{row.op}: operand #{name} of type #{inspect(Nx.type(arg))}, the others #{inspect(type)}"

        true ->
          nil
      end
    end

    @doc """
    The value of an operand that is a constant of the traced expression (as
    Edifice's flag tensors `causal_packed`, `variant_t` and `clip_t` are), as
    a flat list, or `:error`. A handler variant that needs a flag as an
    attribute reads it here when EXLA lowers the block.
    """
    @spec constant(Nx.Tensor.t()) :: {:ok, [number()]} | :error
    def constant(%Nx.Tensor{data: %Nx.Defn.Expr{op: :tensor, args: [tensor]}}),
      do: {:ok, Nx.to_flat_list(tensor)}

    def constant(%Nx.Tensor{data: %Nx.Defn.Expr{op: :constant, args: [number]}} = t),
      do: {:ok, List.duplicate(number, Nx.size(t))}

    def constant(_), do: :error

    # The kernels' limits (ExPhil.Native.Ops.SelectiveScan, Ops.Attention).
    @max_state 256
    @head_widths [32, 64, 96, 128]
    @max_grid 65_535

    @doc false
    # The attributes of :fused_selective_scan_backward's target: Edifice's
    # clamp, and :skip unless every operand is f32 (the template's grad_b and
    # grad_c are f32; our target writes them in x's dtype).
    def selective_scan_backward_attributes(_out, [_x, _dt, a, _b, _c, _g] = args) do
      {_channels, states} = Nx.shape(a)

      cond do
        type = Enum.find_value(args, &if(Nx.type(&1) != {:f, 32}, do: Nx.type(&1))) ->
          {:skip,
           "fused_selective_scan_backward: native for f32 operands only (grad_b and grad_c " <>
             "are f32 in Edifice's template, x's dtype in ours), got #{inspect(type)}"}

        states > @max_state ->
          {:skip, "the kernels take at most #{@max_state} states, not #{states}"}

        true ->
          {:ok, %{"softplus" => false, "clamp" => true, "dt_min" => 0.001, "dt_max" => 0.1}}
      end
    end

    @doc false
    # The attributes of :fused_selective_scan's target: Edifice's clamp and its
    # channel-mean input scale; :skip unless every operand is f32 (a bf16 model
    # keeps A in f32, and the rows take operands of one type).
    def selective_scan_forward_attributes(_out, [_x, _dt, a, _b, _c] = args) do
      {_channels, states} = Nx.shape(a)

      cond do
        type = Enum.find_value(args, &if(Nx.type(&1) != {:f, 32}, do: Nx.type(&1))) ->
          {:skip, "fused_selective_scan: native for f32 operands only, got #{inspect(type)}"}

        states > @max_state ->
          {:skip, "the kernels take at most #{@max_state} states, not #{states}"}

        true ->
          {:ok,
           %{
             "softplus" => false,
             "clamp" => true,
             "dt_min" => 0.001,
             "dt_max" => 0.1,
             "input_scale" => 1
           }}
      end
    end

    @doc false
    # The attributes of the targets of :fused_flash_attention and its backward
    # (causal_packed their last operand): the mask from the constant
    # causal_packed (Edifice masks when the flag == 1), BHTD, scale
    # 1/sqrt(d); :skip when the flag is not a constant 0 or 1, for operands of
    # more than one type, for a causal call with T != S (Edifice's mask is top-left aligned, ours bottom-right:
    # the same only when T = S) and for sizes the kernels do not take.
    def flash_attention_attributes(_out, [q, k | _] = args) do
      {batch, heads, steps, width} = Nx.shape(q)
      keys = elem(Nx.shape(k), 2)

      types = args |> Enum.map(&Nx.type/1) |> Enum.uniq()

      with {:ok, mask} <- causal_mask(List.last(args)) do
        cond do
          # In a gradient, g may be f32 under bf16 q, k, v (Nx's cotangent).
          length(types) > 1 ->
            {:skip, "operands of types #{inspect(types)}; the kernels take one type"}

          mask == 1 and steps != keys ->
            {:skip, "causal attention with #{steps} queries and #{keys} keys"}

          width not in @head_widths ->
            {:skip, "the kernels take head widths #{inspect(@head_widths)}, not #{width}"}

          max(batch, heads) > @max_grid ->
            {:skip, "the kernels take batch and heads up to #{@max_grid}"}

          true ->
            {:ok,
             %{"mask" => mask, "window" => 0, "layout" => 0, "scale" => 0.0, "precision" => 0}}
        end
      end
    end

    @doc false
    # The attributes of the GRU, LSTM and sLSTM targets (none), or :skip where the
    # kernels would refuse the call (gated_rnn_check/3), with H held to the
    # multiprocessors of device 0 (EXLA's default device) when the library
    # can tell them.
    def gated_rnn_attributes(out, args),
      do: gated_rnn_check(out, args, GatedRnn.multiprocessors())

    @doc false
    # Edifice's GRU, LSTM and sLSTM blocks: operands wx, recurrent_weight, h0 (c0 for
    # the LSTM) and, backward, fwd and g; results y, or the gradients (of the
    # sequences [B, T, G*H], of the states [B, H]). The kernels take wx, y,
    # grad_y and the sequence gradients of one type (f32, bf16 or f16), R of
    # that type or f32, the states and their gradients of one type, that one
    # or f32, and H up to `multiprocessors` times div(256, G) (the forward's
    # units per block; nil: no bound known, the handler refuses a larger H).
    def gated_rnn_check(out, [wx, r | rest] = args, multiprocessors) do
      {_batch, _steps, width} = Nx.shape(wx)
      {hidden, _} = Nx.shape(r)
      gates = div(width, hidden)

      all =
        if gates == 3,
          do: ~w(wx recurrent_weight h0 fwd g),
          else: ~w(wx recurrent_weight h0 c0 fwd g)

      names = Enum.take(all, length(args))
      type = Nx.type(wx)
      {states, sequences} = Enum.split(Enum.zip(Enum.drop(names, 2), rest), gates - 2)
      results = out |> List.wrap() |> Enum.flat_map(&leaves/1)
      state_results = for t <- results, Nx.rank(t) == 2, do: {"the gradient of a state", t}
      seq_results = for t <- results, Nx.rank(t) == 3, do: {"a result", t}
      state_types = Enum.uniq(for {_, t} <- states ++ state_results, do: Nx.type(t))

      mismatch =
        Enum.find(sequences ++ seq_results, fn {_, t} -> Nx.type(t) != type end)

      cond do
        type not in [{:f, 32}, {:bf, 16}, {:f, 16}] ->
          {:skip, "the kernels take f32, bf16 or f16, not wx of type #{inspect(type)}"}

        gates not in [3, 4] or length(args) not in [gates, gates + 2] ->
          {:skip, "#{length(args)} operands with #{gates} gates: not a GRU or LSTM block"}

        mismatch ->
          {name, t} = mismatch

          {:skip,
           "#{name} of type #{inspect(Nx.type(t))}, wx of type #{inspect(type)}: the kernels " <>
             "take one sequence type"}

        Nx.type(r) not in [type, {:f, 32}] ->
          {:skip,
           "recurrent_weight of type #{inspect(Nx.type(r))}: the kernels take f32 or wx's " <>
             "type, #{inspect(type)}"}

        length(state_types) != 1 or hd(state_types) not in [type, {:f, 32}] ->
          {:skip,
           "the states and their gradients of types #{inspect(state_types)}: the kernels take " <>
             "one type, f32 or wx's (#{inspect(type)})"}

        reason = GatedRnn.hidden_unsupported(gates, hidden, multiprocessors) ->
          {:skip, reason}

        true ->
          {:ok, %{}}
      end
    end

    defp leaves(tuple) when is_tuple(tuple),
      do: tuple |> Tuple.to_list() |> Enum.flat_map(&leaves/1)

    defp leaves(tensor), do: [tensor]

    defp causal_mask(causal_packed) do
      case constant(causal_packed) do
        {:ok, [flag]} when flag == 1 -> {:ok, 1}
        {:ok, [flag]} when flag == 0 -> {:ok, 0}
        {:ok, values} -> {:skip, "causal_packed is #{inspect(values)}, not [0] or [1]"}
        :error -> {:skip, "causal_packed is not a constant of the expression"}
      end
    end

    @doc """
    The op table and the variants table as Markdown (the tables of
    `mix_stub/EDIFICE.md`, which the tests keep equal to these).
    """
    @spec markdown_table() :: String.t()
    def markdown_table do
      ops =
        for row <- @rows do
          number = if row.direction == :forward, do: "F#{row.index}", else: "B#{row.index}"

          change =
            case {row.variant, row.change} do
              {nil, _} -> "-"
              {variant, nil} -> label(variant)
              {variant, note} -> "#{label(variant)}: #{note}"
            end

          [
            number,
            "`#{inspect(row.op)}`",
            "#{length(row.operands)} (#{names(row.operands)}) -> " <>
              "#{length(row.results)} (#{names(row.results)})",
            if(row.ours, do: "`#{row.ours}`", else: "-"),
            "#{row.status}",
            change,
            row.reason
          ]
        end

      variants =
        for variant <- @variant_order do
          text = Map.fetch!(@variants, variant)
          used = for row <- @rows, row.variant == variant, do: "`#{inspect(row.op)}`"
          [label(variant), text, Enum.join(used, ", ")]
        end

      ops_header = [
        "#",
        "op",
        "operands -> results",
        "ours",
        "status",
        "smallest change",
        "why not native"
      ]

      table(ops_header, ops) <>
        "\n" <> table(["variant", "what it is", "the ops it would serve"], variants)
    end

    defp label(variant), do: Map.fetch!(@labels, variant)

    defp table(header, rows) do
      line = fn cells ->
        "| " <> Enum.map_join(cells, " | ", &String.replace(&1, "|", "\\|")) <> " |\n"
      end

      line.(header) <> line.(Enum.map(header, fn _ -> "---" end)) <> Enum.map_join(rows, line)
    end

    defp names(list), do: Enum.map_join(list, ", ", &Atom.to_string/1)
  end

  if ExPhil.Native.Edifice.native_tier?() do
    defimpl EXLA.CustomCall, for: Edifice.Block.FusedOp do
      def call(block, out, args, client),
        do: ExPhil.Native.Edifice.call(block, out, args, client)
    end
  end
end
