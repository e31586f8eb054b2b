defmodule Mix.Tasks.Exphil.ExlaCases do
  @shortdoc "Writes the custom calls EXLA would emit for the ops (JSON, for the GPU check)"

  @moduledoc """
  Writes, as JSON, the custom calls that EXLA would emit for the library's
  ops: every op, dtype and option set that changes a call, each traced
  inside `Nx.Defn.grad` (as `test/custom_call_test.exs` does), its forward
  and backward blocks lowered through `ExPhil.Native.CustomCall.fields/3`.

      MIX_ENV=test mix exphil.exla_cases OUT.json

  `test/xla_ffi/exla_form/check_exla_form.py` builds the StableHLO module
  of each call from this file and runs it on a GPU through JAX's XLA.

  For each case: `name`, `op`, `dtype`, `shape` (the op's dimensions),
  `options` (what the op was called with, for the references) and, for
  `forward` and `backward`: `target`, `operands` and `results` (name, shape,
  dtype, and whether it is the f32 scalar placeholder of an absent optional
  operand or of its gradient), and `attributes`, `[name, MLIR text]` exactly
  as `CustomCall.fields/3` gives them. The layouts are not listed: a patched
  EXLA pins every operand and result to row-major (`layouts: "row_major"`).

  The sLSTM (`op` "slstm") likewise with `bias`, `h0`, `c0`, `n0` and `m0`,
  without its final states (their gradients jump at ties of m's max()).
  The GRU and LSTM (`op` "gru", "lstm") are traced with `bias`, `h0` and
  (LSTM) `c0` each given or not (`options`, true where given) and the final
  states used or not (`final_state`), at H 37, T 1 and H 130; their
  backward's results are all written (no placeholders), given or not.

  The stacks (`op` "gru_stack", "lstm_stack") likewise with `bias`,
  `w_bias`, `h0` (and `c0`) all given or none, or `w_bias` alone, the final
  states used or not, 2 and 3 layers at B 1 and 2.

  Where Edifice is present, also one case per pair of Edifice fused ops
  that are both native (`ExPhil.Native.Edifice`, EDIFICE.md): the forward
  and the backward block as `ExPhil.Native.Edifice.native_block/3` makes
  them of operands of Edifice's shapes (`op` "edifice", `options` naming the
  two Edifice ops). Its attributes are `CustomCall.fields/3`'s, as for the
  others; test/edifice_test.exs checks that Edifice's own blocks map to the
  same targets with the same operands, results and attributes.

  Needs the test environment (`ExPhil.Native.Blocks`, test/support).
  """

  use Mix.Task

  alias ExPhil.Native.{CustomCall, Ops, Targets}

  @types [{"f32", {:f, 32}}, {"bf16", {:bf, 16}}, {"f16", {:f, 16}}]

  @impl true
  def run(args) do
    path =
      case args do
        [path] -> path
        _ -> Mix.raise("usage: MIX_ENV=test mix exphil.exla_cases OUT.json")
      end

    Mix.Task.run("compile")
    # test/support is compiled in the test environment only; a variable keeps
    # the compiler from looking for it in the others.
    blocks = ExPhil.Native.Blocks

    unless Code.ensure_loaded?(blocks) do
      Mix.raise(
        "exphil.exla_cases needs ExPhil.Native.Blocks (test/support): run with MIX_ENV=test"
      )
    end

    cases =
      Enum.map(
        scan_cases() ++
          selective_cases() ++
          attention_cases() ++ gated_rnn_cases() ++ slstm_cases() ++ gated_rnn_stack_cases(),
        &trace(&1, blocks)
      ) ++ edifice_cases(blocks)

    File.mkdir_p!(Path.dirname(path))

    File.write!(
      path,
      json(%{"layouts" => "row_major", "cases" => cases}) <> "\n"
    )

    Mix.shell().info("exphil.exla_cases: #{length(cases)} cases written to #{path}")
  end

  # --- cases -----------------------------------------------------------------

  defp scan_cases do
    {b, t, h} = {2, 33, 129}

    for op <- [:linear_scan, :min_gru, :min_lstm, :liquid],
        {dtype, type} <- @types,
        h0? <- [false, true],
        final? <- [false, true] do
      names = Enum.map(1..ExPhil.Native.Pure.Scan.input_count(op), &"input#{&1}")
      inputs = Map.new(names, &{&1, zeros({b, t, h}, type)})
      inputs = if h0?, do: Map.put(inputs, "h0", zeros({b, h}, :f32)), else: inputs

      %{
        name: "#{op} #{dtype} h0=#{h0?} final_state=#{final?}",
        op: op,
        dtype: dtype,
        shape: %{"batch" => b, "steps" => t, "hidden" => h},
        options: %{"h0" => h0?, "final_state" => final?},
        inputs: inputs,
        fun: fn inputs ->
          seq = Enum.map(names, &inputs[&1])
          apply(Ops, op, seq ++ [[h0: inputs["h0"], final_state: final?]])
        end
      }
    end
  end

  # {optional inputs, softplus, clamp, final state}
  @selective [
    {[], false, nil, false},
    {[:dt_bias, :d, :z, :h0], true, {0.001, 0.1}, true},
    {[:z], false, {0.005, 0.05}, true},
    {[:dt_bias, :d], true, nil, false},
    {[:h0], true, {0.001, 0.1}, true}
  ]

  defp selective_cases do
    {b, t, d, n} = {2, 17, 5, 16}

    for {dtype, type} <- @types, {optional, softplus, clamp, final?} <- @selective do
      shapes = %{
        x: {{b, t, d}, type},
        dt: {{b, t, d}, type},
        a: {{d, n}, :f32},
        b: {{b, t, n}, type},
        c: {{b, t, n}, type},
        dt_bias: {{d}, :f32},
        d: {{d}, :f32},
        z: {{b, t, d}, type},
        h0: {{b, d, n}, :f32}
      }

      keys = [:x, :dt, :a, :b, :c | optional]
      inputs = Map.new(keys, fn key -> {key, apply(&zeros/2, Tuple.to_list(shapes[key]))} end)
      on = Enum.map_join(optional, ",", &Atom.to_string/1)

      %{
        name:
          "selective_scan #{dtype} [#{if on == "", do: "none", else: on}] softplus=#{softplus} " <>
            "clamp=#{if clamp, do: "#{elem(clamp, 0)}..#{elem(clamp, 1)}", else: "none"} " <>
            "final_state=#{final?}",
        op: :selective_scan,
        dtype: dtype,
        shape: %{"batch" => b, "steps" => t, "channels" => d, "states" => n},
        options:
          Map.new([:dt_bias, :d, :z, :h0], &{Atom.to_string(&1), &1 in optional})
          |> Map.merge(%{
            "softplus" => softplus,
            "clamp" => clamp && Tuple.to_list(clamp),
            "final_state" => final?
          }),
        inputs: inputs,
        fun: fn inputs ->
          opts =
            Enum.map(optional, &{&1, inputs[&1]}) ++
              [softplus: softplus, clamp: clamp, final_state: final?]

          Ops.selective_scan(inputs.x, inputs.dt, inputs.a, inputs.b, inputs.c, opts)
        end
      }
    end
  end

  # {mask, window, layout, {q heads, kv heads}, scale}
  @attention [
    {:none, nil, :bhtd, {4, 4}, nil},
    {:none, nil, :bthd, {4, 2}, 0.125},
    {:causal, nil, :bhtd, {4, 2}, nil},
    {:causal, nil, :bthd, {4, 4}, 0.125},
    {:window, 8, :bhtd, {4, 2}, 0.125},
    {:window, 8, :bthd, {4, 4}, nil}
  ]

  defp attention_cases do
    {b, t, s, d} = {2, 40, 40, 64}

    for {dtype, type} <- @types,
        precision <- if(dtype == "f32", do: [:exact, :tf32x3], else: [:exact]),
        {mask, window, layout, {hq, hkv}, scale} <- @attention do
      shape = fn heads, steps ->
        if layout == :bhtd, do: {b, heads, steps, d}, else: {b, steps, heads, d}
      end

      opts = [mask: mask, window: window, layout: layout, scale: scale, precision: precision]

      %{
        name:
          "attention #{dtype} #{mask}#{if window, do: "(#{window})"} #{layout} heads=#{hq}/#{hkv} " <>
            "scale=#{scale || "default"} precision=#{precision}",
        op: :attention,
        dtype: dtype,
        shape: %{
          "batch" => b,
          "q_heads" => hq,
          "kv_heads" => hkv,
          "steps" => t,
          "keys" => s,
          "width" => d
        },
        options: %{
          "mask" => Atom.to_string(mask),
          "window" => window,
          "layout" => Atom.to_string(layout),
          "scale" => scale,
          "precision" => Atom.to_string(precision)
        },
        inputs: %{
          q: zeros(shape.(hq, t), type),
          k: zeros(shape.(hkv, s), type),
          v: zeros(shape.(hkv, s), type)
        },
        fun: fn inputs -> Ops.attention(inputs.q, inputs.k, inputs.v, opts) end
      }
    end
  end

  # {shape {batch, steps, hidden}, optional inputs, final state, dtypes,
  # precision}: H 37 (not a multiple of any tile), T 1 (no step reads a y),
  # H 130, each optional input alone, all of them, none; f16 once per cell;
  # and precision :tf32 once, in f32 at B 24 H 48 (tiles of 8 rows, H a
  # multiple of 16: on tensor cores). The GRU has no c0: the row of c0
  # alone is the LSTM's only, and the others drop it.
  @gated_rnn [
    {{2, 17, 37}, [], false, ["f32", "bf16"], :exact},
    {{2, 17, 37}, [:bias, :h0, :c0], true, ["f32", "bf16", "f16"], :exact},
    {{2, 17, 37}, [:bias], false, ["f32", "bf16"], :exact},
    {{2, 17, 37}, [:h0], true, ["f32", "bf16"], :exact},
    {{2, 17, 37}, [:c0], false, ["f32", "bf16"], :exact},
    {{3, 1, 37}, [:bias, :h0, :c0], true, ["f32", "bf16"], :exact},
    {{2, 9, 130}, [:bias, :h0, :c0], false, ["f32", "bf16"], :exact},
    {{24, 9, 48}, [:bias, :h0, :c0], true, ["f32"], :tf32}
  ]

  defp gated_rnn_cases do
    for cell <- [:gru, :lstm],
        {{b, t, h}, optional, final?, dtypes, precision} <- @gated_rnn,
        cell == :lstm or optional != [:c0],
        optional = if(cell == :gru, do: optional -- [:c0], else: optional),
        {dtype, type} <- @types,
        dtype in dtypes do
      g = ExPhil.Native.Pure.GatedRnn.gates(cell)

      inputs = %{
        wx: zeros({b, t, g * h}, type),
        r: zeros({h, g * h}, :f32),
        bias: zeros({g * h}, :f32),
        h0: zeros({b, h}, :f32),
        c0: zeros({b, h}, :f32)
      }

      keys = if cell == :gru, do: [:bias, :h0], else: [:bias, :h0, :c0]
      on = Enum.map_join(optional, ",", &Atom.to_string/1)

      # (:exact, the default, is left out of the name and the options.)
      tf32? = precision == :tf32

      %{
        name:
          "#{cell} #{dtype} B#{b} T#{t} H#{h} [#{if on == "", do: "none", else: on}] " <>
            "final_state=#{final?}" <> if(tf32?, do: " precision=tf32", else: ""),
        op: cell,
        dtype: dtype,
        shape: %{"batch" => b, "steps" => t, "hidden" => h},
        options:
          Map.new(keys, &{Atom.to_string(&1), &1 in optional})
          |> Map.put("final_state", final?)
          |> then(&if(tf32?, do: Map.put(&1, "precision", "tf32"), else: &1)),
        inputs: Map.take(inputs, [:wx, :r | optional]),
        fun: fn inputs ->
          opts =
            Enum.map(optional, &{&1, inputs[&1]}) ++
              [final_state: final?, precision: precision]

          apply(Ops, cell, [inputs.wx, inputs.r, opts])
        end
      }
    end
  end

  # The sLSTM's: each optional input (bias, h0, c0, n0, m0) alone, all,
  # none; T 1 and H 130; every dtype. Without the final states: their
  # gradients (of c, n and m) jump at ties of m's max(), which random inputs
  # and their broadcast variants meet now and then; y's does not while n >=
  # 1 (n0 is drawn in [1, 2]). check_jax_ffi.py's gated section checks the
  # targets with every final state's cotangent, redrawing near ties.
  @slstm [
    {{2, 17, 37}, [], ["f32", "bf16", "f16"]},
    {{2, 17, 37}, [:bias, :h0, :c0, :n0, :m0], ["f32", "bf16", "f16"]},
    {{2, 17, 37}, [:bias], ["f32"]},
    {{2, 17, 37}, [:h0], ["f32"]},
    {{2, 17, 37}, [:c0], ["f32"]},
    {{2, 17, 37}, [:n0], ["f32", "bf16"]},
    {{2, 17, 37}, [:m0], ["f32"]},
    {{3, 1, 37}, [:bias, :h0, :c0, :n0, :m0], ["f32", "bf16"]},
    {{2, 9, 130}, [:bias, :h0, :n0], ["f32", "bf16"]}
  ]

  defp slstm_cases do
    keys = [:bias, :h0, :c0, :n0, :m0]

    for {{b, t, h}, optional, dtypes} <- @slstm, {dtype, type} <- @types, dtype in dtypes do
      inputs =
        Map.new(keys, fn
          :bias -> {:bias, zeros({4 * h}, :f32)}
          key -> {key, zeros({b, h}, :f32)}
        end)

      on = Enum.map_join(optional, ",", &Atom.to_string/1)

      %{
        name: "slstm #{dtype} B#{b} T#{t} H#{h} [#{if on == "", do: "none", else: on}]",
        op: :slstm,
        dtype: dtype,
        shape: %{"batch" => b, "steps" => t, "hidden" => h},
        options:
          Map.new(keys, &{Atom.to_string(&1), &1 in optional}) |> Map.put("final_state", false),
        inputs:
          Map.merge(
            %{wx: zeros({b, t, 4 * h}, type), r: zeros({h, 4 * h}, :f32)},
            Map.take(inputs, optional)
          ),
        fun: fn inputs ->
          Ops.slstm(inputs.wx, inputs.r, Enum.map(optional, &{&1, inputs[&1]}))
        end
      }
    end
  end

  # The stacks' ({layers, batch, steps, hidden}, optional inputs, final
  # states, dtypes): B1 and B2 (the forward's two one-launch layouts),
  # every optional input or none or w_bias alone, 2 and 3 layers.
  @gated_rnn_stack [
    {{2, 1, 17, 37}, [], false, ["f32", "bf16"]},
    {{3, 2, 9, 37}, [:bias, :w_bias, :h0, :c0], true, ["f32", "bf16", "f16"]},
    {{2, 1, 5, 64}, [:w_bias], false, ["f32"]}
  ]

  defp gated_rnn_stack_cases do
    for cell <- [:gru, :lstm],
        {{l, b, t, h}, optional, final?, dtypes} <- @gated_rnn_stack,
        optional = if(cell == :gru, do: optional -- [:c0], else: optional),
        {dtype, type} <- @types,
        dtype in dtypes do
      gh = ExPhil.Native.Pure.GatedRnn.gates(cell) * h

      inputs = %{
        wx: zeros({b, t, gh}, type),
        r: zeros({l, h, gh}, :f32),
        w: zeros({l - 1, h, gh}, :f32),
        bias: zeros({l, gh}, :f32),
        w_bias: zeros({l - 1, gh}, :f32),
        h0: zeros({l, b, h}, :f32),
        c0: zeros({l, b, h}, :f32)
      }

      keys = if cell == :gru, do: [:bias, :w_bias, :h0], else: [:bias, :w_bias, :h0, :c0]
      on = Enum.map_join(optional, ",", &Atom.to_string/1)

      %{
        name:
          "#{cell}_stack #{dtype} L#{l} B#{b} T#{t} H#{h} [#{if on == "", do: "none", else: on}] " <>
            "final_state=#{final?}",
        op: :"#{cell}_stack",
        dtype: dtype,
        shape: %{"layers" => l, "batch" => b, "steps" => t, "hidden" => h},
        options:
          Map.new(keys, &{Atom.to_string(&1), &1 in optional})
          |> Map.put("final_state", final?),
        inputs: Map.take(inputs, [:wx, :r, :w | optional]),
        fun: fn inputs ->
          opts = Enum.map(optional, &{&1, inputs[&1]}) ++ [final_state: final?]
          apply(Ops, :"#{cell}_stack", [inputs.wx, inputs.r, inputs.w, opts])
        end
      }
    end
  end

  # The pairs of native Edifice rows: {forward op, backward op}. The
  # selective scan is native for f32 operands only.
  @edifice_pairs [
    {:fused_mingru_scan, :fused_mingru_scan_backward},
    {:fused_minlstm_scan, :fused_minlstm_scan_backward},
    {:fused_elu_gru_scan, :fused_elu_gru_scan_backward},
    {:fused_real_gru_scan, :fused_real_gru_scan_backward},
    {:fused_diag_linear_scan, :fused_diag_linear_scan_backward},
    {:fused_liquid_scan, :fused_liquid_scan_backward},
    {:fused_linear_scan, :fused_linear_scan_backward},
    {:fused_selective_scan, :fused_selective_scan_backward},
    {:fused_flash_attention, :fused_flash_attention_backward},
    {:fused_gru_scan, :fused_gru_scan_backward},
    {:fused_lstm_scan, :fused_lstm_scan_backward}
  ]

  defp edifice_cases(blocks) do
    edifice = ExPhil.Native.Edifice

    if Code.ensure_loaded?(edifice) do
      for {forward, backward} <- @edifice_pairs,
          {dtype, type} <- @types,
          forward != :fused_selective_scan or dtype == "f32",
          causal <- if(forward == :fused_flash_attention, do: [false, true], else: [nil]) do
        {shape, operands} = edifice_blocks(forward, backward, type, causal)

        [fwd, bwd] =
          for {op, {args, template}} <- [
                {forward, operands.forward},
                {backward, operands.backward}
              ] do
            struct = struct(Edifice.Block.FusedOp, op: op, attrs: %{})

            case edifice.native_block(struct, template, args) do
              {:ok, block} -> call({block, args, template}, blocks)
              {:skip, why} -> Mix.raise("#{op} #{dtype}: not native here: #{why}")
            end
          end

        %{
          "name" =>
            "edifice #{forward} #{dtype}#{if causal != nil, do: " causal=#{causal}", else: ""}",
          "op" => "edifice",
          "dtype" => dtype,
          "shape" => shape,
          "options" => %{
            "forward_op" => Atom.to_string(forward),
            "backward_op" => Atom.to_string(backward),
            "causal" => causal
          },
          "forward" => fwd,
          "backward" => bwd
        }
      end
    else
      []
    end
  end

  # {shape, %{forward: {operands, template}, backward: {operands, template}}}
  # for an Edifice pair, the operands in Edifice's order and shapes (its
  # FUSED_OPS.md), as native_block/3 takes them.
  defp edifice_blocks(:fused_selective_scan, _backward, type, nil) do
    {b, t, d, n} = {2, 17, 5, 16}
    seq = zeros({b, t, d}, type)
    proj = zeros({b, t, n}, type)
    a = zeros({d, n}, type)
    args = [seq, seq, a, proj, proj]

    {%{"batch" => b, "steps" => t, "channels" => d, "states" => n},
     %{forward: {args, seq}, backward: {args ++ [seq], {seq, seq, proj, proj}}}}
  end

  defp edifice_blocks(:fused_flash_attention, _backward, type, causal) do
    {b, h, t, w} = {2, 4, 40, 64}
    bhtd = zeros({b, h, t, w}, type)
    # Edifice's causal_packed, a constant of the traced expression
    flag = Nx.Defn.Expr.tensor(Nx.tensor([if(causal, do: 1, else: 0)], type: type))

    {%{"batch" => b, "heads" => h, "steps" => t, "width" => w},
     %{
       forward: {[bhtd, bhtd, bhtd, flag], bhtd},
       backward: {[bhtd, bhtd, bhtd, bhtd, bhtd, flag], {bhtd, bhtd, bhtd}}
     }}
  end

  # The GRU's and LSTM's: wx [B, T, G*H], R [H, G*H] and the states in the
  # sequence type, as Edifice passes them; the backward's fwd is y.
  defp edifice_blocks(forward, backward, type, nil)
       when forward in [:fused_gru_scan, :fused_lstm_scan] do
    {b, t, h} = {2, 17, 37}
    gh = if(forward == :fused_gru_scan, do: 3, else: 4) * h

    {seq, state, wx, r} =
      {zeros({b, t, h}, type), zeros({b, h}, type), zeros({b, t, gh}, type), zeros({h, gh}, type)}

    {:ok, f} = ExPhil.Native.Edifice.fetch(forward)
    {:ok, g} = ExPhil.Native.Edifice.fetch(backward)
    value = %{wx: wx, recurrent_weight: r, h0: state, c0: state, fwd: seq, g: seq}
    grads = %{grad_wx: wx, grad_rh: wx, grad_h0: state, grad_c0: state}

    {%{"batch" => b, "steps" => t, "hidden" => h},
     %{
       forward: {Enum.map(f.operands, &value[&1]), seq},
       backward:
         {Enum.map(g.operands, &value[&1]), g.results |> Enum.map(&grads[&1]) |> List.to_tuple()}
     }}
  end

  defp edifice_blocks(forward, backward, type, nil) do
    {b, t, h} = {2, 33, 129}
    seq = zeros({b, t, h}, type)
    state = zeros({b, h}, type)
    {:ok, f} = ExPhil.Native.Edifice.fetch(forward)
    {:ok, g} = ExPhil.Native.Edifice.fetch(backward)
    as_operands = fn names -> Enum.map(names, &if(&1 == :h0, do: state, else: seq)) end
    grads = g.results |> Enum.map(&if(&1 == :grad_h0, do: state, else: seq)) |> List.to_tuple()

    {%{"batch" => b, "steps" => t, "hidden" => h},
     %{forward: {as_operands.(f.operands), seq}, backward: {as_operands.(g.operands), grads}}}
  end

  defp zeros(shape, type), do: Nx.broadcast(Nx.tensor(0, type: type), shape)

  # --- tracing ---------------------------------------------------------------

  # The forward and backward blocks of the case's op, traced with the
  # gradient of the sum of every output (as f32) into every tensor input.
  defp trace(spec, blocks) do
    fun = fn inputs ->
      loss = fn inputs ->
        inputs
        |> spec.fun.()
        |> then(&if(is_tuple(&1), do: Tuple.to_list(&1), else: [&1]))
        |> Enum.map(&Nx.sum(Nx.as_type(&1, :f32)))
        |> Enum.reduce(&Nx.add/2)
      end

      # The forward too: a backward that recomputes (the selective scan's)
      # leaves it out of the gradient's expression.
      {spec.fun.(inputs), Nx.Defn.grad(inputs, loss)}
    end

    found = blocks.capture(fun, [spec.inputs])
    forward = one!(spec, found, "_fwd")
    backward = one!(spec, found, "_bwd")

    %{
      "name" => spec.name,
      "op" => Atom.to_string(spec.op),
      "dtype" => spec.dtype,
      "shape" => spec.shape,
      "options" => spec.options,
      "forward" => call(forward, blocks),
      "backward" => call(backward, blocks)
    }
  end

  # The forward is traced twice (the output, and inside the gradient): the
  # same block, either node.
  defp one!(spec, found, suffix) do
    case Enum.filter(found, &String.ends_with?(elem(&1, 0).target, suffix)) do
      [first | _] = matching ->
        if matching |> Enum.map(&elem(&1, 0)) |> Enum.uniq() |> length() != 1 do
          Mix.raise("#{spec.name}: #{length(matching)} different #{suffix} blocks")
        end

        first

      [] ->
        Mix.raise("#{spec.name}: no #{suffix} block traced")
    end
  end

  defp call({block, operands, out}, blocks) do
    if block.unsupported, do: Mix.raise("#{block.target}: unsupported: #{block.unsupported}")
    target = Targets.fetch!(block.target)
    fields = CustomCall.fields(block, out, operands)
    absent? = fn name -> block.attributes["has_" <> name] == false end

    operands =
      Enum.zip_with(target.operands, operands, fn {name, presence}, tensor ->
        tensor(name, tensor, presence == :optional and absent?.(name))
      end)

    results =
      Enum.zip_with(target.results, blocks.results(out), fn {name, kind}, tensor ->
        placeholder =
          case kind do
            {:gradient_of, input} -> absent?.(input)
            :always -> false
          end

        tensor(name, tensor, placeholder)
      end)

    %{
      "target" => fields.call_target_name,
      "operands" => operands,
      "results" => results,
      "attributes" => Enum.map(fields.attributes, fn {name, text} -> [name, text] end)
    }
  end

  defp tensor(name, tensor, placeholder) do
    %{
      "name" => name,
      "shape" => Tuple.to_list(Nx.shape(tensor)),
      "dtype" => type_name(Nx.type(tensor)),
      "placeholder" => placeholder
    }
  end

  defp type_name(type) do
    case List.keyfind(@types, type, 1) do
      {name, _} -> name
      nil -> Mix.raise("unexpected type #{inspect(type)}")
    end
  end

  # --- JSON (maps, lists, strings, numbers, booleans, nil) -------------------

  defp json(nil), do: "null"
  defp json(value) when is_boolean(value), do: Atom.to_string(value)
  defp json(value) when is_integer(value), do: Integer.to_string(value)
  defp json(value) when is_float(value), do: :erlang.float_to_binary(value, [:short])

  defp json(value) when is_binary(value),
    do: ~s(") <> String.replace(value, ["\\", ~s(")], &("\\" <> &1)) <> ~s(")

  defp json(list) when is_list(list), do: "[" <> Enum.map_join(list, ", ", &json/1) <> "]"

  defp json(map) when is_map(map) do
    entries =
      map
      |> Enum.sort()
      |> Enum.map_join(", ", fn {k, v} -> json(to_string(k)) <> ": " <> json(v) end)

    "{" <> entries <> "}"
  end
end
