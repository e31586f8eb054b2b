defmodule ExPhil.Native.Ops.Attention do
  @moduledoc false
  # Scaled dot-product attention with grouped-query heads as Nx blocks:
  # checks, the forward block, and (inside defn) its gradient as a block for
  # the backward target. The default functions are ExPhil.Native.Pure.Attention,
  # or the NIF on Torchx CUDA tensors (ExPhil.Native.Eager).

  alias ExPhil.Native.{Block, Eager, Targets}
  alias ExPhil.Native.Ops.Args
  alias ExPhil.Native.Pure

  @fun "ExPhil.Native.Ops.attention/4"

  # The head widths the kernels are compiled for, and the grid's limit on
  # batch and query heads.
  @head_widths [32, 64, 96, 128]
  @max_grid 65_535

  @masks %{none: 0, causal: 1, window: 2}
  @layouts %{bhtd: 0, bthd: 1}
  @precisions %{exact: 0, tf32x3: 1}

  def run(q, k, v, opts) do
    opts =
      Args.options!(@fun, opts,
        mask: :none,
        window: nil,
        scale: nil,
        layout: :bhtd,
        precision: :exact
      )

    {q, k, v, dims} = check!(q, k, v, opts[:layout])
    pure_opts = pure_options!(opts)
    traced? = Args.traced?([q, k, v])
    [q, k, v] = if traced?, do: Enum.map([q, k, v], &Args.expr/1), else: [q, k, v]
    type = Nx.type(q)
    attributes = attributes(opts)
    {batch, q_heads, steps, _kv_heads, _keys, _width} = dims

    template =
      {Nx.template(Nx.shape(q), type),
       Nx.template({batch, q_heads, steps}, Args.state_type(type))}

    nif_opts = Keyword.take(opts, [:mask, :window, :layout, :scale, :precision])
    block = block(:forward, attributes, not traced?, dims, type)

    out =
      Nx.block(block, [q, k, v], template, fn _block, q, k, v ->
        Eager.attention_forward(block, [q, k, v], nif_opts, fn ->
          Pure.Attention.forward(q, k, v, pure_opts)
        end)
      end)

    out =
      if traced? do
        {o, lse} = out

        Nx.Defn.Kernel.custom_grad(out, [q, k, v], fn {grad_o, _grad_lse} ->
          operands = [q, k, v, o, lse, Nx.as_type(grad_o, type)]
          template = {template(q), template(k), template(v)}

          block = block(:backward, attributes, false, dims, type)

          grads =
            Nx.block(block, operands, template, fn _block, q, k, v, o, lse, grad_o ->
              Eager.attention_backward(block, [q, k, v, o, lse, grad_o], nif_opts, fn ->
                Pure.Attention.backward(q, k, v, o, lse, grad_o, pure_opts)
              end)
            end)

          Tuple.to_list(grads)
        end)
      else
        out
      end

    elem(out, 0)
  end

  defp template(tensor), do: Nx.template(Nx.shape(tensor), Nx.type(tensor))

  defp block(direction, attributes, eager, dims, type) do
    {batch, q_heads, _steps, _kv_heads, _keys, width} = dims

    unsupported =
      cond do
        reason = Args.unsupported_type(type) ->
          reason

        width not in @head_widths ->
          "the kernels take head widths #{inspect(@head_widths)}, not #{width}"

        max(batch, q_heads) > @max_grid ->
          "the kernels take batch and heads up to #{@max_grid}"

        true ->
          nil
      end

    %Block{
      target: Targets.name(:attention, direction),
      attributes: attributes,
      eager: eager,
      unsupported: unsupported
    }
  end

  defp attributes(opts) do
    %{
      "mask" => Map.fetch!(@masks, opts[:mask]),
      "window" => opts[:window] || 0,
      "layout" => Map.fetch!(@layouts, opts[:layout]),
      # 0 asks the kernels for 1 / sqrt(d).
      "scale" => (opts[:scale] || 0) / 1,
      "precision" => Map.fetch!(@precisions, opts[:precision])
    }
  end

  defp pure_options!(opts) do
    mask = opts[:mask]
    window = opts[:window]

    unless Map.has_key?(@masks, mask) do
      raise ArgumentError,
            "#{@fun}: option :mask expected :none, :causal or :window, got: #{inspect(mask)}"
    end

    cond do
      mask == :window and not (is_integer(window) and window >= 1) ->
        raise ArgumentError,
              "#{@fun}: option :window expected a positive integer with mask: :window, got: #{inspect(window)}"

      mask != :window and window != nil ->
        raise ArgumentError,
              "#{@fun}: option :window is for mask: :window only, got window: #{inspect(window)} with mask: #{inspect(mask)}"

      true ->
        :ok
    end

    scale = opts[:scale]

    unless scale == nil or (is_number(scale) and scale != 0) do
      raise ArgumentError,
            "#{@fun}: option :scale expected nil or a nonzero number, got: #{inspect(scale)}"
    end

    unless Map.has_key?(@precisions, opts[:precision]) do
      raise ArgumentError,
            "#{@fun}: option :precision expected :exact or :tf32x3, got: #{inspect(opts[:precision])}"
    end

    [mask: mask, window: window, scale: scale, layout: opts[:layout]]
  end

  defp check!(q, k, v, layout) do
    {axes, head_axis, step_axis} =
      case layout do
        :bhtd ->
          {"{batch, heads, steps, width}", 1, 2}

        :bthd ->
          {"{batch, steps, heads, width}", 2, 1}

        other ->
          raise ArgumentError,
                "#{@fun}: option :layout expected :bhtd or :bthd, got: #{inspect(other)}"
      end

    q = Args.tensor!(@fun, "q", q)
    Args.rank!(@fun, "q", q, 4, axes)
    Args.float!(@fun, "q", q)
    k = Args.tensor!(@fun, "k", k)
    Args.rank!(@fun, "k", k, 4, axes)
    Args.same_type!(@fun, "k", k, Nx.type(q), "q")

    batch = elem(Nx.shape(q), 0)
    width = elem(Nx.shape(q), 3)
    q_heads = elem(Nx.shape(q), head_axis)
    kv_heads = elem(Nx.shape(k), head_axis)
    keys = elem(Nx.shape(k), step_axis)

    kv_shape =
      Nx.shape(k)
      |> put_elem(0, batch)
      |> put_elem(3, width)

    Args.shape!(@fun, "k", k, kv_shape, "batch and width of 'q'")

    if rem(q_heads, kv_heads) != 0 do
      raise ArgumentError,
            "#{@fun}: argument 'k' expected a number of heads that divides the #{q_heads} of 'q', got: #{kv_heads}"
    end

    v = Args.tensor!(@fun, "v", v)
    Args.shape!(@fun, "v", v, kv_shape, "the shape of 'k'")
    Args.same_type!(@fun, "v", v, Nx.type(q), "q")

    {q, k, v, {batch, q_heads, elem(Nx.shape(q), step_axis), kv_heads, keys, width}}
  end
end
