defmodule ExPhil.Native.Ops.GatedRnn do
  @moduledoc false
  # The GRU, LSTM and sLSTM sequences as Nx blocks: checks, the forward
  # block, and (inside defn) its gradient, a block for the backward target.
  # The blocks' default functions are ExPhil.Native.Pure.GatedRnn, or the
  # NIF on Torchx CUDA tensors (ExPhil.Native.Eager). Operands and results
  # are in the targets' order (exphil_{gru,lstm,slstm}_{fwd,bwd},
  # xla_ffi_targets.h); an absent optional operand is the scalar placeholder
  # with has_<name> false.

  alias ExPhil.Native.{Block, Eager, Targets}
  alias ExPhil.Native.Ops.Args
  alias ExPhil.Native.Pure

  # The optional inputs of `cell`, in the targets' operand order (the
  # recurrent bias, then the initial states), and its final states (the
  # forward's results after y) whose gradients the backward takes.
  defp optional(cell), do: [:bias | for(s <- Pure.GatedRnn.states(cell), do: :"#{s}0")]
  defp finals(cell), do: for(s <- Pure.GatedRnn.states(cell), do: :"#{s}_final")

  # The op's own options: the GRU's and LSTM's :precision (the sLSTM has
  # none).
  defp own_options(:slstm), do: []
  defp own_options(_cell), do: [precision: :exact]

  def run(cell, wx, r, opts) do
    fun = "ExPhil.Native.Ops.#{cell}/3"
    optional_keys = optional(cell)
    opts = Args.sequence_options!(fun, opts, optional_keys, own_options(cell))

    {wx, r, optional, {batch, steps, hidden}} = check!(fun, cell, wx, r, opts)
    type = Nx.type(wx)
    # The targets' attributes besides has_*: "precision", where the op has
    # the option (own_options/1).
    own =
      if Keyword.has_key?(opts, :precision),
        do: %{"precision" => Args.gated_precision!(fun, opts[:precision], type)},
        else: %{}

    traced? = Args.traced?([wx, r | Keyword.values(optional)])

    {wx, r, optional} =
      if traced?,
        do:
          {Args.expr(wx), Args.expr(r), Keyword.new(optional, fn {k, t} -> {k, Args.expr(t)} end)},
        else: {wx, r, optional}

    block = block(cell, :forward, Map.merge(has(optional), own), not traced?, type, hidden)
    state = Args.state_type(type)

    template =
      List.to_tuple([
        Nx.template({batch, steps, hidden}, type)
        | Enum.map(finals(cell), fn _ -> Nx.template({batch, hidden}, state) end)
      ])

    operands = [wx, r | Args.optional_operands(optional)]

    out =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn [wx, r | rest] ->
          given = given(block, optional_keys, rest)

          Eager.gated_rnn(block, cell, :forward, [wx: wx, r: r] ++ given, template, fn ->
            out = Pure.GatedRnn.forward(cell, wx, r, given)
            List.to_tuple([out.y | Enum.map(finals(cell), &Map.fetch!(out, &1))])
          end)
        end)
      )

    present = for {_key, t} <- optional, t != nil, do: t

    Args.sequence_results(out, traced?, [wx, r | present], opts[:final_state], fn grads ->
      backward(cell, wx, r, optional, elem(out, 0), grads, type, own)
    end)
  end

  # The gradients of wx, r and of each optional input given, in that order,
  # from the backward block.
  defp backward(cell, wx, r, optional, y, grads, type, own) do
    [grad_y | final_grads] = Tuple.to_list(grads)

    finals =
      Enum.zip_with(finals(cell), final_grads, fn name, grad ->
        {:"grad_#{name}", Args.state_gradient(grad, type)}
      end)

    inputs = optional ++ finals
    {batch, _steps, _} = Nx.shape(wx)
    {hidden, width} = Nx.shape(r)
    block = block(cell, :backward, Map.merge(has(inputs), own), false, type, hidden)
    operands = [wx, r, y, Nx.as_type(grad_y, type) | Args.optional_operands(inputs)]
    state = Args.state_type(type)

    # The target's results, every one always written: grad_wx, grad_R,
    # grad_bias, grad_h0, (grad_c0, grad_n0, grad_m0,) grad_rh.
    carry = Nx.template({batch, hidden}, state)

    templates = %{
      "grad_wx" => template(wx),
      "grad_R" => template(r),
      "grad_bias" => Nx.template({width}, Nx.type(r)),
      "grad_h0" => carry,
      "grad_c0" => carry,
      "grad_n0" => carry,
      "grad_m0" => carry,
      "grad_rh" => template(wx)
    }

    names = for {name, _} <- Targets.fetch!(block.target).results, do: name
    template = List.to_tuple(Enum.map(names, &Map.fetch!(templates, &1)))
    keys = Keyword.keys(inputs)

    result =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn [wx, r, y, grad_y | rest] ->
          given = given(block, keys, rest)
          named = [wx: wx, r: r, y: y, grad_y: grad_y] ++ given

          Eager.gated_rnn(block, cell, :backward, named, template, fn ->
            Pure.GatedRnn.backward(cell, wx, r, y, grad_y, given)
            |> Args.gradients_tuple(names)
          end)
        end)
      )

    by_name = Map.new(Enum.zip(names, Tuple.to_list(result)))

    [by_name["grad_wx"], by_name["grad_R"]] ++
      for {key, t} <- optional, t != nil, do: Map.fetch!(by_name, "grad_#{key}")
  end

  defp template(tensor), do: Nx.template(Nx.shape(tensor), Nx.type(tensor))

  defp has(inputs), do: Map.new(inputs, fn {key, t} -> {"has_#{key}", t != nil} end)

  # The optional inputs the block was given, `keys` zipped with its operands
  # after the required ones: nil where has_<key> is false.
  defp given(%Block{attributes: attributes}, keys, operands) do
    Enum.zip_with(keys, operands, fn key, operand ->
      {key, if(attributes["has_#{key}"], do: operand)}
    end)
  end

  defp block(cell, direction, attributes, eager, type, hidden) do
    %Block{
      target: Targets.name(cell, direction),
      attributes: attributes,
      eager: eager,
      unsupported:
        Args.unsupported_type(type) || hidden_unsupported(Pure.GatedRnn.gates(cell), hidden)
    }
  end

  @doc false
  # nil, or why the kernels cannot run hidden size H: a block holds at most
  # div(256, gates) units and every block needs a multiprocessor of its own
  # (cuda/gated_rnn/gated_rnn_plan.cpp), so H is at most that times the
  # multiprocessors of device 0 (EXLA's default device; nil when the library
  # cannot tell: no bound, the kernels refuse a larger H when called). Such
  # a block runs its pure-Nx function; Edifice's blocks fall back alike.
  def hidden_unsupported(gates, hidden, multiprocessors \\ multiprocessors()) do
    limit = multiprocessors && multiprocessors * div(256, gates)

    if limit && hidden > limit,
      do:
        "H = #{hidden} is more than the device's #{multiprocessors} multiprocessors hold " <>
          "(#{limit}, div(256, #{gates}) units each)"
  end

  @doc false
  # The multiprocessor count of device 0, asked for once per VM; nil when
  # the library cannot tell (no device, or the NIF not loaded).
  def multiprocessors do
    key = {__MODULE__, :multiprocessors}

    case :persistent_term.get(key, :unknown) do
      :unknown ->
        count =
          try do
            case ExPhil.Native.device_info(0) do
              {:ok, %{multiprocessor_count: n}} when is_integer(n) and n > 0 -> n
              _ -> nil
            end
          rescue
            _ -> nil
          end

        :persistent_term.put(key, count)
        count

      count ->
        count
    end
  end

  defp check!(fun, cell, wx, r, opts) do
    gates = Pure.GatedRnn.gates(cell)
    width = "#{gates} * hidden"

    wx = Args.float_tensor!(fun, "wx", wx, 3, "{batch, steps, #{width}}")
    r = Args.float_tensor!(fun, "r", r, 2, "{hidden, #{width}}")
    {hidden, _} = Nx.shape(r)

    Args.shape!(
      fun,
      "r",
      r,
      {hidden, gates * hidden},
      "{hidden, #{width}}, hidden from its first axis"
    )

    {batch, steps, _} = Nx.shape(wx)

    Args.shape!(
      fun,
      "wx",
      wx,
      {batch, steps, gates * hidden},
      "{batch, steps, #{width}}, hidden from 'r'"
    )

    # r, bias and the initial states are state-typed (f32 on the kernels).
    state = Args.state_type(Nx.type(wx))

    state! = fn name, tensor, shape, why ->
      tensor = Args.tensor!(fun, name, tensor)
      Args.float!(fun, name, tensor)
      Args.shape!(fun, name, tensor, shape, why)
      Nx.as_type(tensor, state)
    end

    optional =
      for key <- optional(cell) do
        {shape, why} =
          case key do
            :bias -> {{gates * hidden}, "{#{width}} of 'r'"}
            _state -> {{batch, hidden}, "{batch, hidden} of 'wx' and 'r'"}
          end

        case opts[key] do
          nil -> {key, nil}
          tensor -> {key, state!.(Atom.to_string(key), tensor, shape, why)}
        end
      end

    {wx, Nx.as_type(r, state), optional, {batch, steps, hidden}}
  end
end
