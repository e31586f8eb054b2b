defmodule ExPhil.Native.EdificeTest do
  # Edifice's fused ops against ExPhil.Native.Edifice's table: the blocks
  # Edifice builds for small MinGRU, MinLSTM, Mamba, InfiniAttention, LSTM
  # and GRU models, and for every Edifice.CUDA.FusedScan entry point, have the
  # operand and result counts of the table (Edifice's FUSED_OPS.md), and
  # ExPhil.Native.Edifice.call/4 answers :skip for each on a CUDA and a host
  # client. With the opt-in off (as here), Edifice's models run and train on
  # the BinaryBackend as Edifice's pure path.
  #
  # Edifice builds no fused-op block at all unless an EXLA.CustomCall
  # implementation for Edifice.Block.FusedOp exists (Edifice.Block.native_impl?/0),
  # and the test environment defines none. `with_native_tier/1` defines one for
  # the duration of a call, as `config :exphil_native, edifice_native_tier: true`
  # would (it delegates to ExPhil.Native.Edifice.call/4): protocols are
  # consolidated, so it loads EXLA.CustomCall's unconsolidated module, compiles
  # the implementation, and afterwards deletes it and loads the consolidated
  # module again. Hence async: false.
  use ExUnit.Case, async: false

  alias Edifice.Block.FusedOp
  alias ExPhil.Native.Blocks
  alias Edifice.CUDA.FusedScan
  alias ExPhil.Native.Edifice, as: NativeEdifice

  # Edifice.build/2 names: the backbones EDIFICE.md studies.
  @models [:min_gru, :min_lstm, :mamba, :attention, :infini_attention, :lstm, :gru]

  @model_opts %{
    min_gru: [
      embed_dim: 8,
      hidden_size: 8,
      num_layers: 2,
      seq_len: 4,
      window_size: 4,
      dropout: 0.0
    ],
    min_lstm: [
      embed_dim: 8,
      hidden_size: 8,
      num_layers: 2,
      seq_len: 4,
      window_size: 4,
      dropout: 0.0
    ],
    mamba: [
      embed_dim: 8,
      hidden_size: 8,
      state_size: 2,
      expand_factor: 2,
      conv_size: 2,
      num_layers: 1,
      seq_len: 4,
      window_size: 4,
      dropout: 0.0
    ],
    attention: [
      embed_dim: 8,
      num_heads: 2,
      head_dim: 4,
      window_size: 4,
      num_layers: 1,
      ffn_dim: 8,
      dropout: 0.0
    ],
    infini_attention: [
      embed_dim: 8,
      hidden_size: 8,
      num_heads: 2,
      segment_size: 2,
      num_layers: 1,
      seq_len: 4,
      window_size: 4,
      dropout: 0.0
    ],
    lstm: [embed_dim: 8, hidden_size: 8, num_layers: 2, seq_len: 4, window_size: 4, dropout: 0.0],
    gru: [embed_dim: 8, hidden_size: 8, num_layers: 2, seq_len: 4, window_size: 4, dropout: 0.0]
  }

  # ------------------------------------------------------------------ helpers

  # Runs fun with the given OS environment variables (nil: unset), then
  # restores them.
  defp with_env(vars, fun) do
    old = Map.new(vars, fn {name, _} -> {name, System.get_env(name)} end)
    Enum.each(vars, fn {name, value} -> put_env(name, value) end)

    try do
      fun.()
    after
      Enum.each(old, fn {name, value} -> put_env(name, value) end)
    end
  end

  defp put_env(name, nil), do: System.delete_env(name)
  defp put_env(name, value), do: System.put_env(name, value)

  # Runs fun with an EXLA.CustomCall implementation for Edifice.Block.FusedOp
  # that delegates to ExPhil.Native.Edifice.call/4 (the opt-in's), and with
  # EDIFICE_AUTOTUNE=0, so that Edifice takes its Nx.block tier without
  # benchmarking (which needs EXLA's NIF).
  defp with_native_tier(fun) do
    protocol = EXLA.CustomCall
    impl = Module.concat(protocol, FusedOp)
    consolidated = Protocol.consolidated?(protocol)
    consolidated_beam = List.to_string(:code.which(protocol))
    plain_beam = Path.join(Application.app_dir(:exla, "ebin"), "#{protocol}.beam")

    if consolidated, do: load_beam!(protocol, plain_beam)

    try do
      Code.compile_quoted(
        quote do
          defimpl EXLA.CustomCall, for: Edifice.Block.FusedOp do
            def call(block, out, args, client),
              do: ExPhil.Native.Edifice.call(block, out, args, client)
          end
        end
      )

      assert Edifice.Block.native_impl?()
      with_env([{"EDIFICE_AUTOTUNE", "0"}, {"EDIFICE_DISABLE_FUSED", nil}], fun)
    after
      :code.purge(impl)
      :code.delete(impl)
      :code.purge(impl)
      if consolidated, do: load_beam!(protocol, consolidated_beam)
    end
  end

  defp load_beam!(module, path) do
    :code.purge(module)
    {:module, ^module} = :code.load_abs(String.to_charlist(Path.rootname(path)))
  end

  # The Edifice fused-op blocks of a traced expression, each node once:
  # [{%FusedOp{}, operands, output template}].
  defp fused_blocks(container), do: Blocks.find(container, FusedOp)

  # Every captured block is a row of the table with its operand and result
  # counts, and call/4 says :skip for it on CUDA and on the host (the vendored
  # EXLA does not pin layouts). A :native row's block maps to its target's
  # custom call exactly (assert_native_block/4); any other row's to none.
  defp assert_blocks_in_table(blocks) do
    for {%FusedOp{op: op} = struct, operands, out} <- blocks do
      assert {:ok, row} = NativeEdifice.fetch(op), "#{inspect(op)} is not in the table"

      assert length(operands) == length(row.operands),
             "#{inspect(op)}: #{length(operands)} operands, the table says #{length(row.operands)}"

      assert length(Blocks.results(out)) == length(row.results),
             "#{inspect(op)}: #{length(Blocks.results(out))} results, the table says #{length(row.results)}"

      assert struct.attrs == %{}
      refute ExPhil.Native.CustomCall.layouts_pinned?()
      assert NativeEdifice.call(struct, out, operands, Blocks.client(:cuda)) == :skip
      assert NativeEdifice.call(struct, out, operands, Blocks.client(:host)) == :skip

      cond do
        row.status != :native ->
          assert {:skip, _} = NativeEdifice.native_block(struct, out, operands)

        # The attention rows of these small blocks (head width 2 or 4) are
        # :skip for the width alone; the wide blocks are checked in
        # "the selective-scan and attention blocks".
        row.target in ["exphil_attention_o_fwd", "exphil_attention_o_bwd"] and
            elem(Nx.shape(hd(operands)), 3) < 32 ->
          assert {:skip, "the kernels take head widths " <> _} =
                   NativeEdifice.native_block(struct, out, operands)

        true ->
          assert_native_block(row, struct, out, operands)
      end
    end
  end

  # The block of a :native row: its target takes exactly the block's operands
  # and returns exactly its template (ExPhil.Native.CustomCall.fields/3 checks
  # the counts), with no optional operand or result, every buffer of the shape
  # and type the handler takes (block_shapes/3), and the attributes the
  # target's contract needs. Returns the attributes as MLIR text.
  defp assert_native_block(row, struct, out, operands) do
    assert {:ok, %ExPhil.Native.Block{} = block} =
             NativeEdifice.native_block(struct, out, operands)

    assert block.target == row.target and block.eager == false and block.unsupported == nil
    target = ExPhil.Native.Targets.fetch!(row.target)

    assert %{call_target_name: name, attributes: attributes} =
             ExPhil.Native.CustomCall.fields(block, out, operands)

    assert name == row.target
    assert Enum.all?(target.operands, &match?({_, :required}, &1))
    assert Enum.all?(target.results, &match?({_, :always}, &1))
    assert Enum.map(attributes, &elem(&1, 0)) == Enum.map(target.attributes, &elem(&1, 0))

    expected = block_shapes(row.target, operands, attributes)

    for {{name, _}, tensor} <-
          Enum.zip(target.operands, operands) ++
            Enum.zip(target.results, Blocks.results(out)) do
      assert {name, {Nx.shape(tensor), Nx.type(tensor)}} == {name, Map.fetch!(expected, name)}
    end

    attributes
  end

  # name => {shape, type} for every buffer of a native block, as the handler
  # takes it.
  defp block_shapes("exphil_selective_scan_y_bwd", [x, _dt, a, _b, _c, _g], attributes) do
    # Edifice's clamp (0.001 and 0.1 as f32 hold them, printed exactly); f32
    # only: grad_B and grad_C are f32 in Edifice's template and in x's dtype in
    # ours.
    assert attributes == [
             {"softplus", "false"},
             {"clamp", "true"},
             {"dt_min", "0.0010000000474974513 : f32"},
             {"dt_max", "0.10000000149011612 : f32"}
           ]

    {batch, steps, channels} = Nx.shape(x)
    {^channels, states} = Nx.shape(a)
    seq = {{batch, steps, channels}, {:f, 32}}
    bn = {{batch, steps, states}, {:f, 32}}

    %{"x" => seq, "dt" => seq, "A" => {{channels, states}, {:f, 32}}, "B" => bn, "C" => bn}
    |> Map.merge(%{"grad_y" => seq, "grad_x" => seq, "grad_dt" => seq})
    |> Map.merge(%{"grad_B" => bn, "grad_C" => bn})
  end

  defp block_shapes("exphil_selective_scan_y_fwd", [x, _dt, a, _b, _c], attributes) do
    # Edifice's clamp and its channel-mean input scale (ssm/common.ex:431-435).
    assert attributes == [
             {"softplus", "false"},
             {"clamp", "true"},
             {"dt_min", "0.0010000000474974513 : f32"},
             {"dt_max", "0.10000000149011612 : f32"},
             {"input_scale", "1 : i32"}
           ]

    {batch, steps, channels} = Nx.shape(x)
    {^channels, states} = Nx.shape(a)
    seq = {{batch, steps, channels}, {:f, 32}}
    bn = {{batch, steps, states}, {:f, 32}}

    %{
      "x" => seq,
      "dt" => seq,
      "A" => {{channels, states}, {:f, 32}},
      "B" => bn,
      "C" => bn,
      "y" => seq
    }
  end

  defp block_shapes("exphil_attention_o_bwd", [q | _], attributes) do
    block_shapes("exphil_attention_o_fwd", [q], attributes)
    bhtd = {Nx.shape(q), Nx.type(q)}
    names = ~w(q k v o grad_o grad_q grad_k grad_v)
    Map.new(names, &{&1, bhtd}) |> Map.put("flag", {{1}, Nx.type(q)})
  end

  defp block_shapes("exphil_attention_o_fwd", [q | _], attributes) do
    # BHTD, 1/sqrt(d), exact; the mask from the flag (read as a constant).
    assert [
             {"mask", mask},
             {"window", "0 : i32"},
             {"layout", "0 : i32"},
             {"scale", "0.0 : f32"},
             {"precision", "0 : i32"}
           ] = attributes

    assert mask in ["0 : i32", "1 : i32"]
    bhtd = {Nx.shape(q), Nx.type(q)}
    %{"q" => bhtd, "k" => bhtd, "v" => bhtd, "flag" => {{1}, Nx.type(q)}, "o" => bhtd}
  end

  # The GRU, LSTM and sLSTM targets: no attributes; wx and the gradients of the
  # gate pre-activations [B, T, G*H] (G = 3 for the GRU, 4 for the (s)LSTM), R
  # [H, G*H], y and grad_y [B, T, H], the states [B, H], all of wx's type
  # (Edifice's templates) but R, which may be f32.
  @gated_rnn_targets ~w(exphil_gru_y_fwd exphil_gru_y_bwd exphil_lstm_y_fwd exphil_lstm_y_bwd
                         exphil_slstm_y_fwd)
  defp block_shapes(target, [wx, r | _], []) when target in @gated_rnn_targets do
    {batch, steps, width} = Nx.shape(wx)
    {hidden, ^width} = Nx.shape(r)
    assert width == hidden * if(String.starts_with?(target, "exphil_gru"), do: 3, else: 4)
    type = Nx.type(wx)
    gates = {{batch, steps, width}, type}
    seq = {{batch, steps, hidden}, type}
    state = {{batch, hidden}, type}

    %{"wx" => gates, "R" => {{hidden, width}, Nx.type(r)}, "y" => seq, "grad_y" => seq}
    |> Map.merge(%{"grad_wx" => gates, "grad_rh" => gates})
    |> Map.merge(%{"h0" => state, "c0" => state, "grad_h0" => state, "grad_c0" => state})
  end

  # The scans' y-only targets: no attributes; the sequences are [B, T, H] and
  # the states (h0, grad_h0) [B, H], all of the first operand's type
  # (Edifice's templates).
  defp block_shapes(target, [first | _] = operands, []) do
    {batch, _steps, width} = sequence = Nx.shape(first)
    type = Nx.type(first)
    names = ExPhil.Native.Targets.fetch!(target)
    names = Enum.map(names.operands ++ names.results, &elem(&1, 0))
    assert length(operands) <= length(names)

    Map.new(names, fn name ->
      {name, {if(name in ["h0", "grad_h0"], do: {batch, width}, else: sequence), type}}
    end)
  end

  defp input(shape), do: Nx.iota(shape, type: :f32) |> Nx.divide(7) |> Nx.sin()

  defp build(model) do
    {init_fn, predict_fn} = Axon.build(Edifice.build(model, @model_opts[model]), seed: 3)
    x = input({2, 4, 8})
    params = init_fn.(Nx.template({2, 4, 8}, :f32), Axon.ModelState.empty())
    {predict_fn, params, x}
  end

  # The fused-op blocks of the model's forward expression and of its gradient's.
  defp traced_blocks(model) do
    {predict_fn, params, x} = build(model)
    loss = fn data -> predict_fn.(%{params | data: data}, x) |> Nx.sum() end
    forward = Nx.Defn.debug_expr(fn data -> predict_fn.(%{params | data: data}, x) end)
    gradient = Nx.Defn.debug_expr(fn data -> Nx.Defn.grad(data, loss) end)
    fused_blocks({forward.(params.data), gradient.(params.data)})
  end

  # ------------------------------------------------------------------- tables

  test "the table has Edifice's 47 ops, 23 native" do
    ops = NativeEdifice.ops()
    assert length(ops) == 47
    assert Enum.count(ops, &(&1.direction == :forward)) == 29
    assert Enum.count(ops, &(&1.direction == :backward)) == 18
    assert Enum.all?(ops, &(&1.status in [:native, :handler_variant, :kernel_op, :no_kernel]))
    assert Enum.all?(ops, &(&1.status == :native or &1.target == nil))

    native = for %{status: :native} = row <- ops, into: %{}, do: {row.op, row.target}

    assert native == %{
             fused_mingru_scan: "exphil_min_gru_activated_fwd",
             fused_minlstm_scan: "exphil_min_lstm_activated_fwd",
             fused_real_gru_scan: "exphil_min_gru_y_fwd",
             fused_liquid_scan: "exphil_liquid_y_fwd",
             fused_linear_scan: "exphil_linear_scan_y_fwd",
             fused_mingru_scan_backward: "exphil_min_gru_activated_bwd",
             fused_minlstm_scan_backward: "exphil_min_lstm_activated_bwd",
             fused_elu_gru_scan_backward: "exphil_min_gru_activated_bwd",
             fused_real_gru_scan_backward: "exphil_min_gru_activated_bwd",
             fused_liquid_scan_backward: "exphil_liquid_y_bwd",
             fused_selective_scan_backward: "exphil_selective_scan_y_bwd",
             fused_flash_attention: "exphil_attention_o_fwd",
             fused_flash_attention_backward: "exphil_attention_o_bwd",
             fused_elu_gru_scan: "exphil_elu_gru_y_fwd",
             fused_diag_linear_scan: "exphil_diag_linear_y_fwd",
             fused_linear_scan_backward: "exphil_linear_scan_y_bwd",
             fused_diag_linear_scan_backward: "exphil_linear_scan_y_bwd",
             fused_selective_scan: "exphil_selective_scan_y_fwd",
             fused_gru_scan: "exphil_gru_y_fwd",
             fused_gru_scan_backward: "exphil_gru_y_bwd",
             fused_lstm_scan: "exphil_lstm_y_fwd",
             fused_lstm_scan_backward: "exphil_lstm_y_bwd",
             fused_slstm_scan: "exphil_slstm_y_fwd"
           }

    for {_op, target} <- native, do: assert(%{} = ExPhil.Native.Targets.fetch!(target))

    # Pairs point at each other (FUSED_OPS.md: 18 forward ops with a backward op).
    for %{pair: pair} = row <- ops, pair != nil do
      assert {:ok, %{pair: back}} = NativeEdifice.fetch(pair)
      assert back == row.op
    end

    assert Enum.count(ops, &(&1.direction == :forward and &1.pair != nil)) == 18

    # Their ops of ours: op_descriptions_test.exs holds them to the descriptions.
    for row <- ops, row.status != :no_kernel do
      assert row.ours != nil
      assert Map.has_key?(NativeEdifice.variants(), row.variant)
    end

    # In the order and numbering of Edifice's FUSED_OPS.md.
    listed =
      Regex.scan(
        ~r/^\| (\d+) \| `:(\w+)` \|/m,
        File.read!(Path.join(Mix.Project.deps_paths()[:edifice], "FUSED_OPS.md"))
      )

    assert Enum.map(listed, fn [_, index, op] -> {String.to_integer(index), op} end) ==
             Enum.map(ops, &{&1.index, Atom.to_string(&1.op)})

    counts = Enum.frequencies_by(ops, & &1.status)
    assert counts == %{native: 23, kernel_op: 4, no_kernel: 20}

    # EDIFICE.md carries the table this module renders.
    doc = File.read!(Path.expand("../EDIFICE.md", __DIR__))

    assert String.contains?(doc, NativeEdifice.markdown_table()),
           "EDIFICE.md's tables differ from ExPhil.Native.Edifice.markdown_table/0"
  end

  test "the opt-in is off here: no implementation for FusedOp, Edifice's tier off" do
    refute NativeEdifice.native_tier?()
    assert Protocol.consolidated?(EXLA.CustomCall)
    assert EXLA.CustomCall.impl_for(%FusedOp{op: :fused_mingru_scan}) == EXLA.CustomCall.Any
    refute Edifice.Block.native_impl?()
    refute FusedScan.custom_call_available?()
  end

  test "call/4 is :skip for any op and client under an EXLA that does not pin layouts" do
    refute ExPhil.Native.CustomCall.layouts_pinned?()
    out = Nx.template({2, 4, 8}, :f32)
    args = [Nx.template({2, 4, 8}, :f32), Nx.template({2, 4, 8}, :f32), Nx.template({2, 8}, :f32)]

    for %{op: op} <- NativeEdifice.ops(), platform <- [:cuda, :host] do
      assert NativeEdifice.call(%FusedOp{op: op}, out, args, Blocks.client(platform)) == :skip
    end

    assert NativeEdifice.call(%FusedOp{op: :not_an_op}, out, args, Blocks.client(:cuda)) == :skip
  end

  test "a target of ours as it is cannot take an Edifice block (why V1 and V2b are needed)" do
    with_native_tier(fn ->
      a = input({2, 4, 8})
      fun = fn a, b -> FusedScan.linear_scan(a, b) end
      forward = Nx.Defn.debug_expr(fun).(a, a)
      gradient = Nx.Defn.debug_expr(fn a -> Nx.Defn.grad(a, &Nx.sum(fun.(&1, &1))) end).(a)

      [{%FusedOp{op: :fused_linear_scan}, fwd_args, fwd_out}] = fused_blocks(forward)

      [{%FusedOp{op: :fused_linear_scan_backward}, bwd_args, bwd_out}] =
        gradient
        |> fused_blocks()
        |> Enum.filter(&(elem(&1, 0).op == :fused_linear_scan_backward))

      # A :native row pointing at today's targets: the Block is made, and the
      # custom call's operand and result counts are refused.
      for {op, target, args, out, message} <- [
            {:fused_linear_scan, "exphil_linear_scan_fwd", fwd_args, fwd_out,
             "has 3 operands and 1 results, the target takes 3 and returns 2"},
            {:fused_linear_scan_backward, "exphil_linear_scan_bwd", bwd_args, bwd_out,
             "has 4 operands and 3 results, the target takes 6 and returns 3"}
          ] do
        row = %{op: op, target: target, attributes: %{"has_h0" => true}}
        assert {:ok, %ExPhil.Native.Block{} = block} = NativeEdifice.block(row, out, args)
        assert block.target == target and block.eager == false and block.unsupported == nil

        assert_raise ArgumentError, ~r/#{message}/, fn ->
          ExPhil.Native.CustomCall.fields(block, out, args)
        end
      end

      # The attributes of a row may depend on the call.
      skip = %{op: :fused_linear_scan, target: "x", attributes: fn _, _ -> {:skip, "no"} end}
      assert NativeEdifice.block(skip, fwd_out, fwd_args) == {:skip, "no"}
    end)
  end

  # ------------------------------------------------------------------ models

  test "Edifice MinGRU, MinLSTM, Mamba, attention, InfiniAttention, LSTM, GRU: their fused-op blocks are the table's" do
    # Without the tier Edifice builds no fused-op block.
    for model <- @models, do: assert(traced_blocks(model) == [])

    with_native_tier(fn ->
      for model <- @models do
        blocks = traced_blocks(model)
        assert_blocks_in_table(blocks)

        captured = blocks |> Enum.map(&elem(&1, 0).op) |> Enum.uniq() |> Enum.sort()
        listed = for row <- NativeEdifice.ops(), model in row.models, do: row.op
        assert captured == Enum.sort(listed), "#{model}: #{inspect(captured)}"
      end
    end)

    # The protocol is back as it was.
    assert Protocol.consolidated?(EXLA.CustomCall)
    refute Edifice.Block.native_impl?()
  end

  test "every FusedScan entry point: 45 blocks with the table's counts; TTT's and RLA's backward cannot be built" do
    r = fn shape -> input(shape) |> Nx.abs() |> Nx.add(0.5) end
    {b, t, h, nh, d} = {1, 2, 4, 2, 2}
    w = fn per_layer -> r.({2 * per_layer}) end

    entries = [
      {&FusedScan.mingru/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.minlstm/3, [r.({b, t, h}), r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.elu_gru/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.real_gru/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.diag_linear/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.liquid/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.linear_scan/2, [r.({b, t, h}), r.({b, t, h})]},
      {&FusedScan.delta_net_scan/4, List.duplicate(r.({b, t, nh, d}), 4)},
      {&FusedScan.gated_delta_net_scan/5,
       List.duplicate(r.({b, t, nh, d}), 4) ++ [r.({b, t, nh})]},
      {&FusedScan.delta_product_scan/4,
       [r.({b, t, nh, d}), r.({b, t, 2, nh, d}), r.({b, t, 2, nh, d}), r.({b, t, 2, nh})]},
      {&FusedScan.slstm_scan/2, [r.({b, t, 4 * h}), r.({h, 4 * h})]},
      {&FusedScan.lstm_scan/2, [r.({b, t, 4 * h}), r.({h, 4 * h})]},
      {&FusedScan.gru_scan/2, [r.({b, t, 3 * h}), r.({h, 3 * h})]},
      {&FusedScan.ttt_scan/7, List.duplicate(r.({b, t, h}), 4) ++ [r.({h, h}), r.({h}), r.({h})]},
      {&FusedScan.selective_scan/5,
       [r.({b, t, h}), r.({b, t, h}), Nx.negate(r.({h, 3})), r.({b, t, 3}), r.({b, t, 3})]},
      {&FusedScan.kda_scan/5, List.duplicate(r.({b, t, nh, d}), 4) ++ [r.({b, t, nh})]},
      {&FusedScan.rla_scan/6,
       List.duplicate(r.({b, t, nh, d}), 3) ++ List.duplicate(r.({b, t, nh, 1, 1}), 3)},
      {&FusedScan.flash_attention(&1, &2, &3, causal: true),
       List.duplicate(r.({b, nh, t, d}), 3)},
      {&FusedScan.laser_attention(&1, &2, &3, causal: true),
       List.duplicate(r.({b, nh, t, d}), 3)},
      {&FusedScan.fox_attention/4, List.duplicate(r.({b, nh, t, d}), 3) ++ [r.({b, nh, t})]},
      {&FusedScan.reservoir_scan/2, [r.({b, t, h}), r.({h, h})]},
      {&FusedScan.titans_scan(&1, memory_size: h), [r.({b, t, 4 * h})]},
      {&FusedScan.miras_scan(&1, memory_size: h), [r.({b, t, 5 * h})]},
      {&FusedScan.gsa_scan/4,
       [r.({b, t, nh, d}), r.({b, t, nh, 3}), r.({b, t, nh, d}), r.({b, t, nh})]},
      {&FusedScan.mingru_block(&1, &2, &3, 2),
       [r.({b, t, h}), w.(2 * h * h + 4 * h), r.({b, 2, h})]},
      {&FusedScan.minlstm_block(&1, &2, &3, 2),
       [r.({b, t, h}), w.(3 * h * h + 5 * h), r.({b, 2, h})]},
      {&FusedScan.linear_block(&1, &2, &3, 2),
       [r.({b, t, h}), w.(2 * h * h + 4 * h), r.({b, 2, h})]},
      {&FusedScan.lstm_block(&1, &2, &3, &4, 2),
       [r.({b, t, h}), w.(8 * h * h + 6 * h), r.({b, 2, h}), r.({b, 2, h})]},
      {&FusedScan.gru_block(&1, &2, &3, 2), [r.({b, t, h}), w.(6 * h * h + 5 * h), r.({b, 2, h})]}
    ]

    unbuildable = [:fused_ttt_scan_backward, :fused_rla_scan_backward]

    {captured, raised} =
      with_native_tier(fn ->
        for {fun, args} <- entries, reduce: {[], []} do
          {captured, raised} ->
            call = fn args -> apply(fun, Tuple.to_list(args)) end
            forward = fused_blocks(Nx.Defn.debug_expr(call).(List.to_tuple(args)))
            assert [{%FusedOp{op: op}, _, _}] = forward
            {:ok, row} = NativeEdifice.fetch(op)

            gradient =
              try do
                Nx.Defn.debug_expr(fn args -> Nx.Defn.grad(args, &Nx.sum(call.(&1))) end).(
                  List.to_tuple(args)
                )
                |> fused_blocks()
              rescue
                error in FunctionClauseError ->
                  assert {error.module, error.function, error.arity} == {Edifice.Block, :wrap, 2}
                  :raised
              end

            case gradient do
              :raised ->
                assert row.pair in unbuildable
                {forward ++ captured, [row.pair | raised]}

              blocks ->
                {forward ++ blocks ++ captured, raised}
            end
        end
      end)

    assert_blocks_in_table(captured)
    captured_ops = captured |> Enum.map(&elem(&1, 0).op) |> Enum.uniq()
    assert length(captured_ops) == 45
    assert Enum.sort(raised) == Enum.sort(unbuildable)

    all = Enum.map(NativeEdifice.ops(), & &1.op)
    assert Enum.sort(captured_ops ++ raised) == Enum.sort(all)

    # The flag operands are constants of the expression, readable when EXLA
    # lowers the block (what ATT-F needs).
    flash = for {%FusedOp{op: :fused_flash_attention}, args, _} <- captured, do: List.last(args)
    assert [flag | _] = flash
    assert NativeEdifice.constant(flag) == {:ok, [1.0]}
    [q | _] = for {%FusedOp{op: :fused_flash_attention}, args, _} <- captured, do: hd(args)
    assert NativeEdifice.constant(q) == :error
  end

  test "the selective-scan and attention blocks: native, or :skip where they must be" do
    {b, t, h, n} = {2, 5, 3, 4}
    {heads, width} = {2, 32}

    {ss, attention} =
      with_native_tier(fn ->
        ss =
          for type <- [:f32, :bf16] do
            args =
              for shape <- [{b, t, h}, {b, t, h}, {h, n}, {b, t, n}, {b, t, n}], do: input(shape)

            args = Enum.map(args, &Nx.as_type(&1, type)) |> List.update_at(2, &Nx.negate/1)
            call = fn args -> apply(FusedScan, :selective_scan, Tuple.to_list(args)) end

            grad =
              Nx.Defn.debug_expr(fn args -> Nx.Defn.grad(args, &Nx.sum(call.(&1))) end).(
                List.to_tuple(args)
              )

            assert [block] =
                     for(
                       {%FusedOp{op: :fused_selective_scan_backward}, _, _} = blk <-
                         fused_blocks(grad),
                       do: blk
                     )

            expr = Nx.Defn.debug_expr(call).(List.to_tuple(args))

            assert [forward] =
                     for(
                       {%FusedOp{op: :fused_selective_scan}, _, _} = blk <- fused_blocks(expr),
                       do: blk
                     )

            {type, block, forward}
          end

        attention =
          for type <- [:f32, :bf16], causal <- [false, true], steps <- [1, 7] do
            qkv = for _ <- 1..3, do: input({1, heads, steps, width}) |> Nx.as_type(type)

            call = fn args ->
              apply(FusedScan, :flash_attention, Tuple.to_list(args) ++ [[causal: causal]])
            end

            expr = Nx.Defn.debug_expr(call).(List.to_tuple(qkv))

            grad =
              Nx.Defn.debug_expr(fn args -> Nx.Defn.grad(args, &Nx.sum(call.(&1))) end).(
                List.to_tuple(qkv)
              )

            assert [{%FusedOp{op: :fused_flash_attention}, _, _} = block] = fused_blocks(expr)

            assert [backward] =
                     for(
                       {%FusedOp{op: :fused_flash_attention_backward}, _, _} = blk <-
                         fused_blocks(grad),
                       do: blk
                     )

            {type, causal, block, backward}
          end

        {ss, attention}
      end)

    # :fused_selective_scan and its backward: native for f32 operands only.
    {:ok, ss_row} = NativeEdifice.fetch(:fused_selective_scan_backward)
    {:ok, ss_f_row} = NativeEdifice.fetch(:fused_selective_scan)
    {_, {struct, operands, out}, {f_struct, f_operands, f_out}} = List.keyfind(ss, :f32, 0)
    assert_native_block(ss_row, struct, out, operands)
    assert_native_block(ss_f_row, f_struct, f_out, f_operands)
    {_, {struct, operands, out}, {f_struct, f_operands, f_out}} = List.keyfind(ss, :bf16, 0)

    assert {:skip, "fused_selective_scan_backward: native for f32 operands only" <> _} =
             NativeEdifice.native_block(struct, out, operands)

    assert {:skip, "fused_selective_scan: native for f32 operands only" <> _} =
             NativeEdifice.native_block(f_struct, f_out, f_operands)

    # Any operand other than f32 (here A alone) is :skip, and so are more states
    # than the kernels keep.
    {_, {struct, [x, dt, a, bm, c, g], out}, {f_struct, _, f_out}} = List.keyfind(ss, :f32, 0)

    assert {:skip, _} =
             NativeEdifice.native_block(f_struct, f_out, [x, dt, Nx.as_type(a, :f16), bm, c])

    assert {:skip, _} =
             NativeEdifice.native_block(struct, out, [x, dt, Nx.as_type(a, :f16), bm, c, g])

    wide = [
      x,
      dt,
      Nx.template({h, 257}, :f32),
      Nx.template({b, t, 257}, :f32),
      Nx.template({b, t, 257}, :f32),
      g
    ]

    assert {:skip, "the kernels take at most 256 states, not 257"} =
             NativeEdifice.native_block(struct, out, wide)

    assert {:skip, "the kernels take at most 256 states, not 257"} =
             NativeEdifice.native_block(f_struct, f_out, Enum.drop(wide, -1))

    # :fused_flash_attention and its backward: native in f32 and bf16, the
    # mask from the flag.
    {:ok, att_row} = NativeEdifice.fetch(:fused_flash_attention)
    {:ok, att_b_row} = NativeEdifice.fetch(:fused_flash_attention_backward)

    for {type, causal, {struct, operands, out}, {b_struct, b_operands, b_out}} <- attention do
      mask = {"mask", if(causal, do: "1 : i32", else: "0 : i32")}
      assert mask in assert_native_block(att_row, struct, out, operands)

      # Nx's cotangent g is f32 under bf16 q, k, v: one type only, so :skip.
      if type == :f32 do
        assert mask in assert_native_block(att_b_row, b_struct, b_out, b_operands)
      else
        assert Nx.type(Enum.at(b_operands, 4)) == {:f, 32}

        assert {:skip, "operands of types " <> _} =
                 NativeEdifice.native_block(b_struct, b_out, b_operands)
      end
    end

    # The flag is read as a constant; one computed at run time (a parameter of
    # the expression here), or of another value, is :skip.
    {_, _, {struct, [q, k, v, flag], out}, _} = hd(attention)
    assert NativeEdifice.constant(flag) == {:ok, [0.0]}
    param = Nx.Defn.debug_expr(&Nx.add(&1, 0)).(Nx.tensor([1.0]))

    assert {:skip, "causal_packed is not a constant of the expression"} =
             NativeEdifice.native_block(struct, out, [q, k, v, param])

    assert {:skip, "causal_packed is [2.0], not [0] or [1]"} =
             NativeEdifice.native_block(struct, out, [
               q,
               k,
               v,
               Nx.Defn.Expr.tensor(Nx.tensor([2.0]))
             ])

    # Causal with T != S (Edifice's mask top-left, ours bottom-right), and a
    # head width the kernels do not take, are :skip.
    one = Nx.Defn.Expr.tensor(Nx.tensor([1.0]))
    k9 = Nx.template({1, heads, 9, width}, :f32)
    q7 = Nx.template({1, heads, 7, width}, :f32)

    assert {:skip, "causal attention with 7 queries and 9 keys"} =
             NativeEdifice.native_block(struct, Nx.template({1, heads, 7, width}, :f32), [
               q7,
               k9,
               k9,
               one
             ])

    zero = Nx.Defn.Expr.tensor(Nx.tensor([0.0]))
    assert {:ok, _} = NativeEdifice.native_block(struct, q7, [q7, k9, k9, zero])
    q48 = Nx.template({1, heads, 7, 48}, :f32)

    assert {:skip, "the kernels take head widths " <> _} =
             NativeEdifice.native_block(struct, q48, [q48, q48, q48, one])

    # The backward reads its flag, the last of six operands, the same way.
    {_, _, _, {b_struct, [q, k, v, fwd, g, _flag], b_out}} = hd(attention)

    assert {:skip, "causal_packed is not a constant of the expression"} =
             NativeEdifice.native_block(b_struct, b_out, [q, k, v, fwd, g, param])
  end

  test "the GRU, LSTM and sLSTM blocks: native, or :skip where the kernels would refuse them" do
    {b, t, h} = {2, 5, 6}

    traced =
      with_native_tier(fn ->
        for {entry, gates} <- [{:gru_scan, 3}, {:lstm_scan, 4}], type <- [:f32, :bf16] do
          args =
            [input({b, t, gates * h}), input({h, gates * h}) |> Nx.divide(4)]
            |> Enum.map(&Nx.as_type(&1, type))

          call = fn args -> apply(FusedScan, entry, Tuple.to_list(args)) end
          backward_op = :"fused_#{entry}_backward"
          assert [forward] = fused_blocks(Nx.Defn.debug_expr(call).(List.to_tuple(args)))

          grad =
            Nx.Defn.debug_expr(fn args -> Nx.Defn.grad(args, &Nx.sum(call.(&1))) end).(
              List.to_tuple(args)
            )

          assert [backward] =
                   for({%FusedOp{op: ^backward_op}, _, _} = blk <- fused_blocks(grad), do: blk)

          {entry, type, forward, backward}
        end
      end)

    for {entry, type, {f_struct, f_args, f_out}, {b_struct, b_args, b_out}} <- traced do
      {:ok, f_row} = NativeEdifice.fetch(f_struct.op)
      {:ok, b_row} = NativeEdifice.fetch(b_struct.op)
      assert f_row.target == "exphil_#{String.trim_trailing("#{entry}", "_scan")}_y_fwd"
      # Edifice's h0 and c0 are zeros of wx's type; every operand of the
      # forward is of that type.
      assert Enum.all?(f_args, &(Nx.type(&1) == Nx.type(hd(f_args))))
      assert_native_block(f_row, f_struct, f_out, f_args)

      if type == :f32 do
        assert_native_block(b_row, b_struct, b_out, b_args)
      else
        # Nx's cotangent g is f32 under a bf16 wx, and so are the block's
        # results: the kernels take one sequence type, so :skip.
        assert Nx.type(List.last(b_args)) == {:f, 32}
        assert Enum.all?(Blocks.results(b_out), &(Nx.type(&1) == {:f, 32}))

        assert {:skip, "g of type {:f, 32}, wx of type {:bf, 16}: the kernels take one " <> _} =
                 NativeEdifice.native_block(b_struct, b_out, b_args)

        # With g and the results of wx's type (Edifice's templates), native.
        b_args = List.update_at(b_args, -1, &Nx.as_type(&1, :bf16))
        b_out = b_out |> Blocks.results() |> Enum.map(&Nx.template(Nx.shape(&1), :bf16))
        b_out = List.to_tuple(b_out)
        assert_native_block(b_row, b_struct, b_out, b_args)
      end
    end

    # The sLSTM: its forward block native (n0 = 1 and m0 = 0 left to the
    # library), and no backward block: Nx differentiates Edifice's fallback.
    slstm =
      with_native_tier(fn ->
        for type <- [:f32, :bf16] do
          args =
            [input({b, t, 4 * h}), input({h, 4 * h}) |> Nx.divide(4)]
            |> Enum.map(&Nx.as_type(&1, type))

          call = fn args -> apply(FusedScan, :slstm_scan, Tuple.to_list(args)) end
          assert [forward] = fused_blocks(Nx.Defn.debug_expr(call).(List.to_tuple(args)))

          grad =
            Nx.Defn.debug_expr(fn args -> Nx.Defn.grad(args, &Nx.sum(call.(&1))) end).(
              List.to_tuple(args)
            )

          assert Enum.all?(
                   fused_blocks(grad),
                   &match?({%FusedOp{op: :fused_slstm_scan}, _, _}, &1)
                 )

          forward
        end
      end)

    for {f_struct, f_args, f_out} <- slstm do
      {:ok, f_row} = NativeEdifice.fetch(f_struct.op)
      assert f_row.target == "exphil_slstm_y_fwd" and f_row.pair == nil
      assert Enum.all?(f_args, &(Nx.type(&1) == Nx.type(hd(f_args))))
      assert_native_block(f_row, f_struct, f_out, f_args)
    end

    # What the kernels take besides Edifice's own types: R in f32 under a bf16
    # wx, the states in f32 (and their gradients with them).
    tpl = &Nx.template/2
    wx = tpl.({b, t, 4 * h}, :bf16)
    seq = tpl.({b, t, h}, :bf16)
    lstm = %FusedOp{op: :fused_lstm_scan, attrs: %{}}
    lstm_b = %FusedOp{op: :fused_lstm_scan_backward, attrs: %{}}
    r32 = tpl.({h, 4 * h}, :f32)
    {s16, s32} = {tpl.({b, h}, :bf16), tpl.({b, h}, :f32)}

    assert {:ok, %{unsupported: nil}} = NativeEdifice.native_block(lstm, seq, [wx, r32, s16, s16])
    assert {:ok, %{unsupported: nil}} = NativeEdifice.native_block(lstm, seq, [wx, r32, s32, s32])

    assert {:ok, %{unsupported: nil}} =
             NativeEdifice.native_block(lstm_b, {wx, s32, s32}, [wx, r32, s32, s32, seq, seq])

    # And what they do not: one states type per call, gradients included; R
    # of a third type; a sequence operand or result of another type; f64.
    for {op, out, args, why} <- [
          {lstm, seq, [wx, r32, s32, s16], "the states and their gradients of types"},
          {lstm_b, {wx, s16, s16}, [wx, r32, s32, s32, seq, seq],
           "the states and their gradients of types"},
          {lstm, seq, [wx, tpl.({h, 4 * h}, :f16), s16, s16],
           "recurrent_weight of type {:f, 16}"},
          {lstm_b, {wx, s16, s16}, [wx, r32, s16, s16, tpl.({b, t, h}, :f32), seq],
           "fwd of type {:f, 32}"},
          {lstm_b, {tpl.({b, t, 4 * h}, :f32), s16, s16}, [wx, r32, s16, s16, seq, seq],
           "a result of type {:f, 32}"},
          {lstm, tpl.({b, t, h}, :f64),
           [tpl.({b, t, 4 * h}, :f64), tpl.({h, 4 * h}, :f64), s32, s32],
           "the kernels take f32, bf16 or f16"}
        ] do
      assert {:skip, reason} = NativeEdifice.native_block(op, out, args)
      assert reason =~ why
    end

    # H up to the device's multiprocessors times div(256, G) units: 2
    # multiprocessors hold an LSTM of H = 128 and a GRU of H = 170.
    for {gates, fits} <- [{4, 128}, {3, 170}] do
      for hidden <- [fits, fits + 1] do
        x = tpl.({1, 3, gates * hidden}, :f32)

        args = [
          x,
          tpl.({hidden, gates * hidden}, :f32)
          | List.duplicate(tpl.({1, hidden}, :f32), gates - 2)
        ]

        out = tpl.({1, 3, hidden}, :f32)
        assert NativeEdifice.gated_rnn_check(out, args, nil) == {:ok, %{}}

        if hidden == fits do
          assert NativeEdifice.gated_rnn_check(out, args, 2) == {:ok, %{}}
        else
          assert NativeEdifice.gated_rnn_check(out, args, 2) ==
                   {:skip,
                    "H = #{hidden} is more than the device's 2 multiprocessors hold " <>
                      "(#{fits}, div(256, #{gates}) units each)"}
        end
      end
    end
  end

  test "operands of mixed types (an f32 gradient of a bf16 model) are not native" do
    seq = Nx.template({2, 5, 3}, :bf16)
    out = {seq, seq, Nx.template({2, 3}, :bf16)}
    op = %FusedOp{op: :fused_mingru_scan_backward, attrs: %{}}

    args = [seq, seq, Nx.template({2, 3}, :bf16), seq, seq]
    assert {:ok, %{unsupported: nil}} = NativeEdifice.native_block(op, out, args)

    # h0, a state, may be f32; the incoming gradient may not.
    args = [seq, seq, Nx.template({2, 3}, :f32), seq, seq]
    assert {:ok, %{unsupported: nil}} = NativeEdifice.native_block(op, out, args)

    args = [seq, seq, Nx.template({2, 3}, :bf16), seq, Nx.template({2, 5, 3}, :f32)]
    assert {:ok, %{unsupported: why}} = NativeEdifice.native_block(op, out, args)
    assert why =~ "operand grad_y of type {:f, 32}, the others {:bf, 16}"
  end

  test "Edifice models predict and train on the BinaryBackend with our library loaded" do
    for model <- [:min_gru, :min_lstm, :mamba] do
      {predict_fn, params, x} = build(model)
      target = Nx.iota({2, 8}, type: :f32) |> Nx.divide(16)

      out = predict_fn.(params, x)
      assert out.shape == {2, 8}
      assert out.data.__struct__ == Nx.BinaryBackend

      step =
        Nx.Defn.jit(fn data, x, target ->
          {loss, grads} =
            Nx.Defn.value_and_grad(data, fn data ->
              predict_fn.(%{params | data: data}, x)
              |> Nx.subtract(target)
              |> Nx.pow(2)
              |> Nx.mean()
            end)

          data =
            Map.new(data, fn {layer, ps} ->
              {layer,
               Map.new(ps, fn {name, p} ->
                 {name, Nx.subtract(p, Nx.multiply(0.1, grads[layer][name]))}
               end)}
            end)

          {loss, data}
        end)

      {losses, _} =
        Enum.map_reduce(1..4, params.data, fn _, data ->
          {loss, data} = step.(data, x, target)
          {Nx.to_number(loss), data}
        end)

      assert List.last(losses) < hd(losses), "#{model}: losses #{inspect(losses)}"
    end
  end

  test "the tier on: forwards unchanged; gradients too, except Mamba's where dt < 0.1" do
    # Mamba's dt is softplus(...) clamped to [0.001, 0.1]: at initialisation
    # softplus is near 0.69 and every channel's dt is 0.1. Lowering the bias
    # of dt_proj spreads dt over [0.007, 0.25].
    low_dt = fn data ->
      put_in(
        data,
        ["mamba_block_1_ssm_dt_proj", "bias"],
        Nx.iota({16}) |> Nx.divide(4) |> Nx.subtract(5)
      )
    end

    run = fn model, change ->
      {predict_fn, params, x} = build(model)
      params = %{params | data: change.(params.data)}
      weights = x[[.., 0, ..]]

      loss = fn data ->
        predict_fn.(%{params | data: data}, x) |> Nx.multiply(weights) |> Nx.sum()
      end

      {predict_fn.(params, x), Nx.Defn.jit(&Nx.Defn.grad(&1, loss)).(params.data)}
    end

    for {model, change, gradients_agree} <- [
          {:min_gru, & &1, true},
          {:min_lstm, & &1, true},
          {:mamba, & &1, true},
          {:mamba, low_dt, false}
        ] do
      {out, grads} = run.(model, change)
      {tier_out, tier_grads} = with_native_tier(fn -> run.(model, change) end)
      assert_close(tier_out, out)

      diff =
        Enum.max(
          for {layer, ps} <- grads, {name, g} <- ps do
            max_abs(Nx.subtract(tier_grads[layer][name], g)) / max(max_abs(g), 1.0e-30)
          end
        )

      if gradients_agree do
        assert diff < 1.0e-4, "#{model}: #{diff}"
      else
        # Edifice's selective-scan backward default scales B by each channel's
        # dt, its forward default by their mean (EDIFICE.md, "What turning
        # the tier on changes").
        assert diff > 1.0e-2, "#{model}: #{diff}"
      end
    end
  end

  defp max_abs(t), do: t |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()

  defp assert_close(a, b) do
    assert Nx.all_close(a, b, atol: 1.0e-5, rtol: 1.0e-5) |> Nx.to_number() == 1
  end
end
