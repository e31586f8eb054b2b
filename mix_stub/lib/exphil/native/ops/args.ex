defmodule ExPhil.Native.Ops.Args do
  @moduledoc false
  # What every op does with its arguments before it builds its block: checks
  # that raise ArgumentError naming the function, the argument, the expected
  # and the received value; the scalar placeholder that stands for an absent
  # optional operand; and the default functions' argument spreading.

  alias Nx.Tensor, as: T

  @kernel_types [{:f, 32}, {:bf, 16}, {:f, 16}]

  @doc "A tensor (numbers are not accepted: their shape would be a guess)."
  def tensor!(_fun, _name, %T{} = tensor), do: tensor

  def tensor!(fun, name, other) do
    raise ArgumentError, "#{fun}: argument '#{name}' expected a tensor, got: #{inspect(other)}"
  end

  @doc "Raises unless `tensor` has `rank`; `dims` names the axes for the message."
  def rank!(fun, name, tensor, rank, dims) do
    if Nx.rank(tensor) != rank do
      raise ArgumentError,
            "#{fun}: argument '#{name}' expected rank #{rank} (#{dims}), " <>
              "got shape: #{inspect(Nx.shape(tensor))}"
    end

    tensor
  end

  @doc "Raises unless `tensor` has `shape`; `why` says where the shape comes from."
  def shape!(fun, name, tensor, shape, why) do
    if Nx.shape(tensor) != shape do
      raise ArgumentError,
            "#{fun}: argument '#{name}' expected shape #{inspect(shape)} (#{why}), " <>
              "got: #{inspect(Nx.shape(tensor))}"
    end

    tensor
  end

  @doc """
  The options of a sequence op: its optional inputs `keys` (nil by default),
  `:final_state` (a boolean, false by default) and the op's own `extra`
  (keyword defaults).
  """
  def sequence_options!(fun, opts, keys, extra \\ []) do
    opts = options!(fun, opts, Enum.map(keys, &{&1, nil}) ++ [final_state: false] ++ extra)

    unless is_boolean(opts[:final_state]) do
      raise ArgumentError,
            "#{fun}: option :final_state expected a boolean, got: #{inspect(opts[:final_state])}"
    end

    opts
  end

  @doc """
  The GRU's and LSTM's `:precision` (`:exact` or `:tf32`) as their targets'
  attribute "precision": 1 for `:tf32` on an f32 sequence, else 0. A 16-bit
  or f64 sequence runs as with `:exact` (its products are on tensor cores
  already, or exact), as attention's `:tf32x3` does.
  """
  def gated_precision!(fun, precision, type) do
    if precision!(fun, precision) == :tf32 and type == {:f, 32}, do: 1, else: 0
  end

  @doc "The GRU's and LSTM's `:precision` checked: `:exact` or `:tf32`."
  def precision!(_fun, precision) when precision in [:exact, :tf32], do: precision

  def precision!(fun, other) do
    raise ArgumentError,
          "#{fun}: option :precision expected :exact or :tf32, got: #{inspect(other)}"
  end

  @doc "A floating-point tensor of `rank` (`dims` names the axes for the message)."
  def float_tensor!(fun, name, tensor, rank, dims) do
    tensor = tensor!(fun, name, tensor)
    rank!(fun, name, tensor, rank, dims)
    float!(fun, name, tensor)
  end

  @doc "Raises unless `tensor` has a floating-point type."
  def float!(fun, name, tensor) do
    case Nx.type(tensor) do
      {kind, _} when kind in [:f, :bf] ->
        tensor

      type ->
        raise ArgumentError,
              "#{fun}: argument '#{name}' expected a floating-point tensor, got type: #{inspect(type)}"
    end
  end

  @doc "Raises unless `tensor` has the type `type` of argument `of`."
  def same_type!(fun, name, tensor, type, of) do
    if Nx.type(tensor) != type do
      raise ArgumentError,
            "#{fun}: argument '#{name}' expected type #{inspect(type)} (the type of '#{of}'), " <>
              "got: #{inspect(Nx.type(tensor))}"
    end

    tensor
  end

  @doc "nil when the kernels take sequence type `type`, otherwise why not."
  def unsupported_type(type) do
    if type in @kernel_types,
      do: nil,
      else: "the kernels take f32, bf16 and f16, not #{inspect(type)}"
  end

  @doc """
  The type of states and of the arithmetic for sequence type `type`: f32, as
  on the kernels; f64 for f64 inputs, which only the default functions take.
  """
  def state_type({:f, 64}), do: {:f, 64}
  def state_type(_type), do: {:f, 32}

  @doc """
  A recurrent op's results from its forward block's `out` `{y, final
  states...}`: traced (inside `defn`), with `backward.(grads)` as their
  gradient in `inputs`; then `out`, or `y` alone unless `final_state?`.
  """
  def sequence_results(out, traced?, inputs, final_state?, backward) do
    out = if traced?, do: Nx.Defn.Kernel.custom_grad(out, inputs, backward), else: out
    if final_state?, do: out, else: elem(out, 0)
  end

  @doc "Whether any tensor is an expression being traced (inside `defn`)."
  def traced?(tensors), do: Enum.any?(tensors, &match?(%T{data: %Nx.Defn.Expr{}}, &1))

  @doc """
  `tensor` as an expression: inside `defn`, a concrete tensor closed over is
  a constant, and `custom_grad/3` takes expressions only.
  """
  def expr(nil), do: nil
  def expr(tensor), do: Nx.Defn.Expr.tensor(tensor)

  @doc """
  The operand that stands for an absent optional input, and the result that
  stands for its gradient: an f32 scalar the handler never touches (its
  `has_*` attribute is false), since Nx has no zero-size tensors.
  """
  def placeholder, do: Nx.tensor(0.0, type: :f32)
  def placeholder_template, do: Nx.template({}, {:f, 32})

  @doc """
  The operands of optional inputs `[{key, tensor or nil}]`: each tensor, or
  the placeholder where it is absent.
  """
  def optional_operands(inputs), do: Enum.map(inputs, fn {_key, t} -> t || placeholder() end)

  @doc """
  A pure backward's gradients (a map keyed by lower-case atoms) as the tuple
  a block returns, in the order of the description's `names` (strings).
  """
  def gradients_tuple(grads, names) do
    names
    |> Enum.map(&Map.fetch!(grads, String.to_atom(String.downcase(&1))))
    |> List.to_tuple()
  end

  @doc """
  The gradient of a state output as the backward target takes it: `nil`
  (absent) for a traced constant zero, the gradient of an output the loss
  does not use; otherwise in the state type.
  """
  def state_gradient(grad, type) do
    if zero_constant?(grad), do: nil, else: Nx.as_type(grad, state_type(type))
  end

  @doc "Whether `tensor` is a traced constant zero (an unused output's gradient)."
  def zero_constant?(%T{data: %Nx.Defn.Expr{op: :constant, args: [value]}}), do: value == 0
  def zero_constant?(_), do: false

  @doc """
  A default function for `Nx.block/4` over `count` operands: ignores the block
  struct and calls `fun` with the operands as one list (up to 13, the
  sLSTM backward's).
  """
  for count <- 1..13 do
    operands = Macro.generate_arguments(count, __MODULE__)

    def spread(unquote(count), fun) do
      fn _block, unquote_splicing(operands) -> fun.(unquote(operands)) end
    end
  end

  @doc """
  Validates `opts` (a keyword list) against `allowed` (a keyword list of
  defaults) for `fun`, the function named in messages.
  """
  def options!(fun, opts, allowed) do
    unless Keyword.keyword?(opts) do
      raise ArgumentError,
            "#{fun}: argument 'opts' expected a keyword list, got: #{inspect(opts)}"
    end

    case Keyword.validate(opts, allowed) do
      {:ok, opts} ->
        opts

      {:error, unknown} ->
        raise ArgumentError,
              "#{fun}: unknown options #{inspect(unknown)}, expected one of " <>
                inspect(Keyword.keys(allowed))
    end
  end
end
