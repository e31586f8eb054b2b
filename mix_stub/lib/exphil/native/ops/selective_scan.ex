defmodule ExPhil.Native.Ops.SelectiveScan do
  @moduledoc false
  # Mamba's selective scan as Nx blocks: checks, the forward block, and
  # (inside defn) its gradient as a block for the backward target. The
  # default functions are ExPhil.Native.Pure.SelectiveScan, or the NIF on
  # Torchx CUDA tensors (ExPhil.Native.Eager).

  alias ExPhil.Native.{Block, Eager, Targets}
  alias ExPhil.Native.Ops.Args
  alias ExPhil.Native.Pure

  @fun "ExPhil.Native.Ops.selective_scan/6"

  # The kernels keep N states per channel in registers and shared memory.
  @max_state 256

  # Optional inputs in the targets' operand order: {option, operand name}.
  @optional [dt_bias: "dt_bias", d: "D", z: "z", h0: "h0"]

  def run(x, dt, a, b, c, opts) do
    opts =
      Args.options!(@fun, opts,
        dt_bias: nil,
        d: nil,
        z: nil,
        h0: nil,
        softplus: false,
        clamp: nil,
        final_state: false
      )

    {x, dt, a, b, c, optional, dims} = check!(x, dt, a, b, c, opts)
    type = Nx.type(x)
    {batch, steps, channels, states} = dims
    traced? = Args.traced?([x, dt, a, b, c | Keyword.values(optional)])

    {[x, dt, a, b, c], optional} =
      if traced?,
        do:
          {Enum.map([x, dt, a, b, c], &Args.expr/1),
           Keyword.new(optional, fn {k, t} -> {k, Args.expr(t)} end)},
        else: {[x, dt, a, b, c], optional}

    attributes = attributes(opts, optional)
    block = block(:forward, attributes, not traced?, type, states)

    operands = [
      x,
      dt,
      a,
      b,
      c | Enum.map(@optional, &(optional[elem(&1, 0)] || Args.placeholder()))
    ]

    template =
      {Nx.template({batch, steps, channels}, type),
       Nx.template({batch, channels, states}, Args.state_type(type))}

    out =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn operands ->
          [x, dt, a, b, c | rest] = operands
          options = pure_options(block, rest)

          Eager.selective_scan_forward(block, [x, dt, a, b, c], options, fn ->
            Pure.SelectiveScan.forward(x, dt, a, b, c, options)
          end)
        end)
      )

    present = Enum.flat_map(@optional, fn {key, _} -> List.wrap(optional[key]) end)

    Args.sequence_results(
      out,
      traced?,
      [x, dt, a, b, c | present],
      opts[:final_state],
      fn {grad_y, grad_h_final} ->
        backward([x, dt, a, b, c], optional, attributes, grad_y, grad_h_final, dims, type)
      end
    )
  end

  defp backward(inputs, optional, attributes, grad_y, grad_h_final, dims, type) do
    {_batch, _steps, _channels, states} = dims

    grad_h_final = Args.state_gradient(grad_h_final, type)

    attributes = Map.put(attributes, "has_grad_h_final", grad_h_final != nil)
    block = block(:backward, attributes, false, type, states)

    operands =
      inputs ++
        Enum.map(@optional, &(optional[elem(&1, 0)] || Args.placeholder())) ++
        [Nx.as_type(grad_y, type), grad_h_final || Args.placeholder()]

    [x, dt, a, b, c] = inputs

    template =
      List.to_tuple(
        [template(x), template(dt), template(a), template(b), template(c)] ++
          Enum.map(@optional, fn {key, _} ->
            if t = optional[key], do: template(t), else: Args.placeholder_template()
          end)
      )

    grads =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn operands ->
          {[x, dt, a, b, c | rest], [grad_y, grad_h_final]} = Enum.split(operands, -2)

          options =
            pure_options(block, rest)
            |> Keyword.put(
              :grad_h_final,
              if(block.attributes["has_grad_h_final"], do: grad_h_final)
            )

          Eager.selective_scan_backward(block, [x, dt, a, b, c], grad_y, options, fn ->
            grads = Pure.SelectiveScan.backward(x, dt, a, b, c, grad_y, options)

            List.to_tuple(
              [grads.grad_x, grads.grad_dt, grads.grad_a, grads.grad_b, grads.grad_c] ++
                Enum.map(@optional, fn {key, _} ->
                  Map.fetch!(grads, :"grad_#{key}") || Args.placeholder()
                end)
            )
          end)
        end)
      )

    {required, optional_grads} = grads |> Tuple.to_list() |> Enum.split(5)

    present =
      Enum.zip_with(@optional, optional_grads, fn {key, _}, grad ->
        if optional[key], do: [grad], else: []
      end)

    required ++ Enum.concat(present)
  end

  defp template(tensor), do: Nx.template(Nx.shape(tensor), Nx.type(tensor))

  # The pure implementation's options from the block's attributes and its
  # optional operands (in @optional's order).
  defp pure_options(%Block{attributes: attributes}, optional_operands) do
    optional =
      Enum.zip_with(@optional, optional_operands, fn {key, name}, operand ->
        {key, if(attributes["has_" <> name], do: operand)}
      end)

    clamp = if attributes["clamp"], do: {attributes["dt_min"], attributes["dt_max"]}
    optional ++ [softplus: attributes["softplus"], clamp: clamp]
  end

  defp attributes(opts, optional) do
    {clamp, dt_min, dt_max} =
      case opts[:clamp] do
        nil ->
          {false, 0.0, 0.0}

        {dt_min, dt_max} when is_number(dt_min) and is_number(dt_max) and dt_min <= dt_max ->
          {true, dt_min / 1, dt_max / 1}

        other ->
          raise ArgumentError,
                "#{@fun}: option :clamp expected nil or {dt_min, dt_max} with dt_min <= dt_max, " <>
                  "got: #{inspect(other)}"
      end

    unless is_boolean(opts[:softplus]) do
      raise ArgumentError,
            "#{@fun}: option :softplus expected a boolean, got: #{inspect(opts[:softplus])}"
    end

    Map.new(@optional, fn {key, name} -> {"has_" <> name, optional[key] != nil} end)
    |> Map.merge(%{
      "softplus" => opts[:softplus],
      "clamp" => clamp,
      "dt_min" => dt_min,
      "dt_max" => dt_max
    })
  end

  defp block(direction, attributes, eager, type, states) do
    unsupported =
      Args.unsupported_type(type) ||
        if states > @max_state, do: "the kernels take at most #{@max_state} states, not #{states}"

    %Block{
      target: Targets.name(:selective_scan, direction),
      attributes: attributes,
      eager: eager,
      unsupported: unsupported
    }
  end

  defp check!(x, dt, a, b, c, opts) do
    x = Args.tensor!(@fun, "x", x)
    Args.rank!(@fun, "x", x, 3, "{batch, steps, channels}")
    Args.float!(@fun, "x", x)
    {batch, steps, channels} = Nx.shape(x)
    type = Nx.type(x)

    sequence! = fn name, tensor ->
      tensor = Args.tensor!(@fun, name, tensor)
      Args.shape!(@fun, name, tensor, {batch, steps, channels}, "the shape of 'x'")
      Args.same_type!(@fun, name, tensor, type, "x")
    end

    dt = sequence!.("dt", dt)
    a = Args.tensor!(@fun, "a", a)
    Args.rank!(@fun, "a", a, 2, "{channels, states}")
    Args.float!(@fun, "a", a)
    {_, states} = Nx.shape(a)
    Args.shape!(@fun, "a", a, {channels, states}, "{channels, states}, channels from 'x'")

    state_input! = fn name, tensor ->
      tensor = Args.tensor!(@fun, name, tensor)

      Args.shape!(
        @fun,
        name,
        tensor,
        {batch, steps, states},
        "{batch, steps, states} of 'x' and 'a'"
      )

      Args.same_type!(@fun, name, tensor, type, "x")
    end

    b = state_input!.("b", b)
    c = state_input!.("c", c)

    # a, dt_bias, d and h0 are state-typed (f32 on the kernels).
    state! = fn name, tensor, shape, why ->
      tensor = Args.tensor!(@fun, name, tensor)
      Args.float!(@fun, name, tensor)
      Args.shape!(@fun, name, tensor, shape, why)
      Nx.as_type(tensor, Args.state_type(type))
    end

    optional = [
      dt_bias:
        opts[:dt_bias] && state!.("dt_bias", opts[:dt_bias], {channels}, "{channels} of 'x'"),
      d: opts[:d] && state!.("d", opts[:d], {channels}, "{channels} of 'x'"),
      z: opts[:z] && sequence!.("z", opts[:z]),
      h0:
        opts[:h0] &&
          state!.(
            "h0",
            opts[:h0],
            {batch, channels, states},
            "{batch, channels, states} of 'x' and 'a'"
          )
    ]

    {x, dt, Nx.as_type(a, Args.state_type(type)), b, c, optional,
     {batch, steps, channels, states}}
  end
end
