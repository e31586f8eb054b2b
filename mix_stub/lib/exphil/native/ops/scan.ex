defmodule ExPhil.Native.Ops.Scan do
  @moduledoc false
  # The four linear recurrences as Nx blocks: checks, the forward block, and
  # (inside defn) its gradient, itself a block for the backward target. The
  # blocks' default functions are ExPhil.Native.Pure.Scan, or the NIF on
  # Torchx CUDA tensors (ExPhil.Native.Eager).

  alias ExPhil.Native.{Block, Eager, OpDescriptions, Targets}
  alias ExPhil.Native.Ops.Args
  alias ExPhil.Native.Pure

  def run(op, inputs, opts) do
    # The input names are the op's required inputs (include/exphil/op_descriptions.h).
    names =
      for t <- OpDescriptions.fetch!(op, :forward).tensors,
          t.role == :input,
          not t.optional,
          do: t.name

    fun = "ExPhil.Native.Ops.#{op}/#{length(names) + 1}"
    opts = Args.options!(fun, opts, h0: nil, final_state: false)
    {inputs, type, {batch, _steps, hidden}} = check_inputs!(fun, names, inputs)

    h0 =
      case opts[:h0] do
        nil ->
          nil

        h0 ->
          h0 = Args.tensor!(fun, "h0", h0)
          Args.float!(fun, "h0", h0)
          Args.shape!(fun, "h0", h0, {batch, hidden}, "{batch, hidden} of '#{hd(names)}'")
          Nx.as_type(h0, Args.state_type(type))
      end

    traced? = Args.traced?([h0 | inputs])

    {inputs, h0} =
      if traced?, do: {Enum.map(inputs, &Args.expr/1), Args.expr(h0)}, else: {inputs, h0}

    block = block(op, :forward, %{"has_h0" => h0 != nil}, not traced?, type)

    template =
      {Nx.template(Nx.shape(hd(inputs)), type),
       Nx.template({batch, hidden}, Args.state_type(type))}

    operands = inputs ++ [h0 || Args.placeholder()]

    out =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn operands ->
          {inputs, [h0]} = Enum.split(operands, -1)
          h0 = if block.attributes["has_h0"], do: h0

          Eager.scan_forward(block, op, inputs, h0, fn ->
            Pure.Scan.forward(op, inputs, h0)
          end)
        end)
      )

    differentiable = if h0, do: inputs ++ [h0], else: inputs

    Args.sequence_results(out, traced?, differentiable, opts[:final_state], fn {grad_y,
                                                                                grad_h_final} ->
      backward(op, inputs, h0, elem(out, 0), grad_y, grad_h_final, type)
    end)
  end

  # The gradients of `inputs` (and of h0 when given), from the backward block.
  defp backward(op, inputs, h0, y, grad_y, grad_h_final, type) do
    grad_h_final = Args.state_gradient(grad_h_final, type)

    attributes = %{"has_h0" => h0 != nil, "has_grad_h_final" => grad_h_final != nil}
    block = block(op, :backward, attributes, false, type)

    operands =
      inputs ++
        [
          h0 || Args.placeholder(),
          y,
          Nx.as_type(grad_y, type),
          grad_h_final || Args.placeholder()
        ]

    template =
      List.to_tuple(
        Enum.map(inputs, &Nx.template(Nx.shape(&1), type)) ++
          [if(h0, do: Nx.template(Nx.shape(h0), Nx.type(h0)), else: Args.placeholder_template())]
      )

    grads =
      Nx.block(
        block,
        operands,
        template,
        Args.spread(length(operands), fn operands ->
          {inputs, [h0, y, grad_y, grad_h_final]} = Enum.split(operands, -4)
          has? = &block.attributes["has_" <> &1]
          h0 = if has?.("h0"), do: h0
          grad_h_final = if has?.("grad_h_final"), do: grad_h_final

          Eager.scan_backward(block, op, inputs, h0, y, grad_y, grad_h_final, fn ->
            grads = Pure.Scan.backward(op, inputs, h0, y, grad_y, grad_h_final)

            if h0,
              do: grads,
              else: put_elem(grads, tuple_size(grads) - 1, Args.placeholder())
          end)
        end)
      )

    grads = Tuple.to_list(grads)
    if h0, do: grads, else: Enum.drop(grads, -1)
  end

  defp block(op, direction, attributes, eager, type) do
    %Block{
      target: Targets.name(op, direction),
      attributes: attributes,
      eager: eager,
      unsupported: Args.unsupported_type(type)
    }
  end

  defp check_inputs!(fun, names, inputs) do
    if length(inputs) != length(names) do
      raise ArgumentError, "#{fun}: expected #{length(names)} inputs, got #{length(inputs)}"
    end

    [{first_name, first} | _] =
      pairs =
      Enum.zip_with(names, inputs, fn name, input -> {name, Args.tensor!(fun, name, input)} end)

    Args.rank!(fun, first_name, first, 3, "{batch, steps, hidden}")
    Args.float!(fun, first_name, first)
    shape = Nx.shape(first)
    type = Nx.type(first)

    for {name, input} <- tl(pairs) do
      Args.shape!(fun, name, input, shape, "the shape of '#{first_name}'")
      Args.same_type!(fun, name, input, type, first_name)
    end

    {Enum.map(pairs, &elem(&1, 1)), type, shape}
  end
end
