defmodule ExPhil.Native.Ops.GatedRnnStack do
  @moduledoc false
  # Stacked GRU and LSTM layers as Nx blocks (targets exphil_{gru,lstm}_stack_
  # {fwd,bwd}): checks, the forward block, and (inside defn) its gradient, a
  # block for the backward target. Default functions: ExPhil.Native.Pure.
  # GatedRnnStack, or the NIF on Torchx CUDA tensors (ExPhil.Native.Eager).
  # The forward's y_lower (every layer's y but the last) is a result the user
  # does not see: the backward reads it. An absent optional operand is the
  # scalar placeholder with has_<name> false, <name> as the target spells it.

  alias ExPhil.Native.{Block, Eager, Targets}
  alias ExPhil.Native.Ops.{Args, GatedRnn}
  alias ExPhil.Native.Pure

  # Optional inputs in the targets' order, with the targets' spellings.
  @target_names %{
    bias: "bias",
    w_bias: "W_bias",
    h0: "h0",
    c0: "c0",
    grad_y_lower: "grad_y_lower",
    grad_h_final: "grad_h_final",
    grad_c_final: "grad_c_final"
  }

  defp optional(:gru), do: [:bias, :w_bias, :h0]
  defp optional(:lstm), do: [:bias, :w_bias, :h0, :c0]
  defp finals(cell), do: for(s <- Pure.GatedRnn.states(cell), do: :"#{s}_final")

  def run(cell, wx, r, w, opts) do
    fun = "ExPhil.Native.Ops.#{cell}_stack/4"
    opts = Args.sequence_options!(fun, opts, optional(cell), precision: :exact)

    {wx, r, w, optional, {layers, batch, steps, hidden}} = check!(fun, cell, wx, r, w, opts)
    type = Nx.type(wx)
    precision = Args.gated_precision!(fun, opts[:precision], type)
    state = Args.state_type(type)
    traced? = Args.traced?([wx, r, w | Keyword.values(optional)])

    {wx, r, w, optional} =
      if traced?,
        do:
          {Args.expr(wx), Args.expr(r), Args.expr(w),
           Keyword.new(optional, fn {k, t} -> {k, Args.expr(t)} end)},
        else: {wx, r, w, optional}

    block = block(cell, :forward, optional, not traced?, type, hidden, precision)

    template =
      List.to_tuple([
        Nx.template({batch, steps, hidden}, type),
        Nx.template({layers - 1, batch, steps, hidden}, type)
        | Enum.map(finals(cell), fn _ -> Nx.template({layers, batch, hidden}, state) end)
      ])

    operands = [wx, r, w | Args.optional_operands(optional)]

    out =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn [wx, r, w | rest] ->
          given = given(optional, rest)

          Eager.gated_rnn(
            block,
            :"#{cell}_stack",
            :forward,
            [wx: wx, r: r, w: w] ++ given,
            template,
            fn ->
              out = Pure.GatedRnnStack.forward(cell, wx, r, w, given)
              List.to_tuple([out.y, out.y_lower | Enum.map(finals(cell), &Map.fetch!(out, &1))])
            end
          )
        end)
      )

    present = for {_key, t} <- optional, t != nil, do: t

    out =
      if traced?,
        do:
          Nx.Defn.Kernel.custom_grad(out, [wx, r, w | present], fn grads ->
            backward(cell, wx, r, w, optional, out, grads, type, precision)
          end),
        else: out

    # The user's results: y and the final states (y_lower is the backward's).
    [y, _y_lower | states] = Tuple.to_list(out)
    if opts[:final_state], do: List.to_tuple([y | states]), else: y
  end

  # The gradients of wx, r, w and of each optional input given, in that
  # order, from the backward block.
  defp backward(cell, wx, r, w, optional, out, grads, type, precision) do
    [y, y_lower | _] = Tuple.to_list(out)
    [grad_y, grad_y_lower | final_grads] = Tuple.to_list(grads)
    lower = if Args.zero_constant?(grad_y_lower), do: nil, else: Nx.as_type(grad_y_lower, type)

    finals =
      Enum.zip_with(finals(cell), final_grads, fn name, grad ->
        {:"grad_#{name}", Args.state_gradient(grad, type)}
      end)

    inputs = optional ++ [{:grad_y_lower, lower} | finals]
    {layers, hidden, width} = Nx.shape(r)
    {batch, _steps, _} = Nx.shape(wx)
    block = block(cell, :backward, inputs, false, type, hidden, precision)
    operands = [wx, r, w, y, y_lower, Nx.as_type(grad_y, type) | Args.optional_operands(inputs)]
    carry = Nx.template({layers, batch, hidden}, Args.state_type(type))

    templates = %{
      "grad_wx" => Nx.template(Nx.shape(wx), type),
      "grad_R" => Nx.template(Nx.shape(r), Nx.type(r)),
      "grad_W" => Nx.template(Nx.shape(w), Nx.type(r)),
      "grad_bias" => Nx.template({layers, width}, Nx.type(r)),
      "grad_W_bias" => Nx.template({layers - 1, width}, Nx.type(r)),
      "grad_h0" => carry,
      "grad_c0" => carry
    }

    names = for {name, _} <- Targets.fetch!(block.target).results, do: name
    template = List.to_tuple(Enum.map(names, &Map.fetch!(templates, &1)))

    result =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn [wx, r, w, y, y_lower, grad_y | rest] ->
          given = given(inputs, rest)
          named = [wx: wx, r: r, w: w, y: y, y_lower: y_lower, grad_y: grad_y] ++ given

          Eager.gated_rnn(block, :"#{cell}_stack", :backward, named, template, fn ->
            Pure.GatedRnnStack.backward(cell, wx, r, w, y, y_lower, grad_y, given)
            |> Args.gradients_tuple(names)
          end)
        end)
      )

    by_name = Map.new(Enum.zip(names, Tuple.to_list(result)))

    [by_name["grad_wx"], by_name["grad_R"], by_name["grad_W"]] ++
      for {key, t} <- optional, t != nil, do: Map.fetch!(by_name, "grad_" <> @target_names[key])
  end

  # The optional inputs `inputs` names, each the operand given or nil (its
  # placeholder, has_<name> false).
  defp given(inputs, operands) do
    Enum.zip_with(inputs, operands, fn {key, t}, operand -> {key, if(t != nil, do: operand)} end)
  end

  defp block(cell, direction, inputs, eager, type, hidden, precision) do
    has = Map.new(inputs, fn {key, t} -> {"has_" <> @target_names[key], t != nil} end)

    %Block{
      target: Targets.name(:"#{cell}_stack", direction),
      attributes: Map.put(has, "precision", precision),
      eager: eager,
      unsupported:
        Args.unsupported_type(type) ||
          GatedRnn.hidden_unsupported(Pure.GatedRnn.gates(cell), hidden)
    }
  end

  defp check!(fun, cell, wx, r, w, opts) do
    gates = Pure.GatedRnn.gates(cell)
    width = "#{gates} * hidden"

    wx = Args.float_tensor!(fun, "wx", wx, 3, "{batch, steps, #{width}}")
    r = Args.float_tensor!(fun, "r", r, 3, "{layers, hidden, #{width}}")
    {layers, hidden, _} = Nx.shape(r)

    unless layers in 2..4 do
      raise ArgumentError,
            "#{fun}: argument 'r' expected 2 to 4 layers (its first axis), got shape #{inspect(Nx.shape(r))}"
    end

    Args.shape!(fun, "r", r, {layers, hidden, gates * hidden}, "{layers, hidden, #{width}}")
    {batch, steps, _} = Nx.shape(wx)

    Args.shape!(
      fun,
      "wx",
      wx,
      {batch, steps, gates * hidden},
      "{batch, steps, #{width}}, hidden from 'r'"
    )

    w = Args.float_tensor!(fun, "w", w, 3, "{layers - 1, hidden, #{width}}")

    Args.shape!(
      fun,
      "w",
      w,
      {layers - 1, hidden, gates * hidden},
      "{layers - 1, hidden, #{width}} of 'r'"
    )

    # r, w, the biases and the initial states are state-typed (f32 on the kernels).
    state = Args.state_type(Nx.type(wx))

    optional =
      for key <- optional(cell) do
        {shape, why} =
          case key do
            :bias -> {{layers, gates * hidden}, "{layers, #{width}} of 'r'"}
            :w_bias -> {{layers - 1, gates * hidden}, "{layers - 1, #{width}} of 'r'"}
            _state -> {{layers, batch, hidden}, "{layers, batch, hidden} of 'r' and 'wx'"}
          end

        case opts[key] do
          nil ->
            {key, nil}

          tensor ->
            name = Atom.to_string(key)
            tensor = Args.tensor!(fun, name, tensor)
            Args.float!(fun, name, tensor)
            Args.shape!(fun, name, tensor, shape, why)
            {key, Nx.as_type(tensor, state)}
        end
      end

    {wx, Nx.as_type(r, state), Nx.as_type(w, state), optional, {layers, batch, steps, hidden}}
  end
end
