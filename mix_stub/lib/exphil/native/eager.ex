defmodule ExPhil.Native.Eager do
  @moduledoc """
  The ops' default functions on tensors in the CUDA memory of a backend that
  runs them: there the fused kernels run on the tensors' own memory, through
  the NIF, instead of the pure-Nx implementation.

  Every `ExPhil.Native.Ops` op is an `Nx.block/4`. EXLA compiles it into a
  custom call (see `ExPhil.Native.CustomCall`); a backend with no hook for
  other libraries' blocks runs its default function on the concrete tensors.
  Torchx (Nx's libtorch backend) is one: its `block/4` calls the default
  function when an op is called eagerly on Torchx tensors, and when
  `Nx.Defn.Evaluator` evaluates a `defn` (or `Nx.Defn.grad/2`) on them, for
  the forward block and, through the ops' `custom_grad`, for the backward
  block. There, when `native?/2` holds, the default function:

    1. takes each input's device address with `Nx.to_pointer(t, mode:
       :local)` (Torchx first makes a non-contiguous tensor contiguous, in
       place, on its own stream);
    2. allocates each output as a new tensor of the same backend on the same
       device (the backend's `constant/3`, a fill on that device);
    3. calls the `ExPhil.Native` op with destination passing (`:outputs`),
       `stream: :legacy_default` and `sync: false`, and returns the output
       tensors at once.

  No data goes through the host, and nothing waits: neither the host nor the
  device.

  Ordering: libtorch enqueues its kernels on CUDA's legacy default stream
  (Torchx sets no other), and `stream: :legacy_default` enqueues the fused
  kernels there too, so they start after the kernels that produced their
  inputs and before any later Torchx kernel that reads their outputs.

  Lifetime: the input tensors are kept referenced until the kernels are
  enqueued (the pointers are plain addresses: a tensor collected before
  that would give its memory back to libtorch while the outputs are being
  allocated; the NIF refuses outputs that overlap inputs, which is how this
  showed). Then the call returns while the kernels may still run, and the
  Elixir side may drop the input and output tensors at once. libtorch's caching
  allocator gives freed memory only to later allocations for the same
  stream, whose kernels are enqueued after the fused kernels on that stream,
  so no one writes or frees memory the kernels still use (memory returned to
  the driver goes through `cudaFree`, which waits for the device). This is
  the rule libtorch relies on for its own kernels. The NIF's event for the
  call keeps no memory of its own and is not waited for when collected; the
  kernels' workspace comes from the library's pool, ordered on the same
  stream.

  Everywhere else the default function is the pure-Nx implementation:
  inside `defn` while tracing (the tensors are expressions: never the NIF),
  on other backends, on Torchx's CPU device, for inputs the kernels do not
  take (the block's `:unsupported`, or attention's tensors not 16-byte
  aligned) and where the NIF is not loaded. Torchx is not a dependency: this
  module names its backend only as a module to compare against.

  ## Telemetry

    * `[:exphil_native, :eager, :call]` - after the NIF took an op on the
      tensors' own memory. Measurements: `%{count: 1}`. Metadata: `:op`
      (`:min_gru`, ..., `:selective_scan`, `:attention`, `:gru`, `:lstm`, `:slstm`), `:direction`
      (`:forward` or `:backward`), `:backend`, `:device`, `:type` (the
      sequence tensors' type).
    * `[:exphil_native, :eager, :pure]` - when a default function runs the
      pure-Nx implementation on concrete tensors (not while tracing).
      Measurements: `%{count: 1}`. Metadata: `:op`, `:direction`,
      `:backend` (of the first tensor) and `:reason` (`:backend`,
      `:not_cuda`, `:mixed`, `:type`, `:alignment`, `:nif_not_loaded`,
      `:forced` (inside `pure/1`), or `{:unsupported, why}`).

  ## Limits

  Torchx keeps no device index in its tensors (`:cuda` stands for each CUDA
  device), so outputs are allocated with `device: :cuda`, libtorch's
  current device (0 unless changed). Inputs on another CUDA device then make
  the NIF raise `ArgumentError` naming both devices.
  """

  alias ExPhil.Native
  alias ExPhil.Native.{Block, OpDescriptions, Targets}
  alias ExPhil.Native.Ops.Args
  alias Nx.Tensor, as: T

  # Backends whose CUDA tensors take this path: their kernels run on the
  # legacy default stream, with a stream-ordered caching allocator. A module
  # name only; the backend need not be compiled.
  @backends [Torchx.Backend]

  @kernel_types [{:f, 32}, {:bf, 16}, {:f, 16}]

  @call_event [:exphil_native, :eager, :call]
  @pure_event [:exphil_native, :eager, :pure]

  @nif_options [stream: :legacy_default, sync: false]

  # The process dictionary key of pure/1.
  @forced_pure {__MODULE__, :pure}

  @scan_grads %{
    linear_scan: [:grad_a, :grad_b],
    min_gru: [:grad_gate, :grad_candidate],
    min_lstm: [:grad_forget, :grad_input, :grad_candidate],
    liquid: [:grad_tau, :grad_target]
  }

  @selective_scan_optional [:dt_bias, :d, :z, :h0]

  @doc "The telemetry event of a call through the NIF."
  def call_event, do: @call_event

  @doc "The telemetry event of a default function that ran the pure implementation."
  def pure_event, do: @pure_event

  @doc """
  A CUDA IPC pointer map for a tensor of a backend on this path (Torchx on
  CUDA), for another OS process to use through `ExPhil.Native`
  (`import_ipc/4`, or an op's tensor argument `{pointer, type, shape}`):
  `%{kind: :ipc, handle: <<_::512>>, data_size: bytes, offset: bytes}`.

  `Nx.to_pointer(tensor, mode: :ipc)` alone is not enough there: its handle
  names the allocation the tensor lies in, which libtorch's caching
  allocator shares among tensors, and it gives no offset; this adds it
  (`ExPhil.Native.allocation_offset/1`). Keep `tensor` alive while the other
  process uses the memory, and order the two (the other process sees the
  memory, not this one's stream).
  """
  @spec ipc_pointer(Nx.Tensor.t()) :: {:ok, map()} | {:error, term()}
  def ipc_pointer(%T{} = tensor) do
    %Nx.Pointer{address: address} = Nx.to_pointer(tensor, mode: :local)

    with {:ok, offset} <- Native.allocation_offset(address) do
      %Nx.Pointer{kind: :ipc, handle: handle, data_size: size} =
        Nx.to_pointer(tensor, mode: :ipc)

      {:ok, %{kind: :ipc, handle: handle, data_size: size, offset: offset}}
    end
  end

  @doc """
  Runs `fun` with the fused kernels off in the calling process: the ops'
  default functions run the pure-Nx implementation even on Torchx CUDA
  tensors (the pure event's reason is `:forced`). The same model on the same
  backend either way, for comparisons and benchmarks; the previous setting
  comes back when `fun` returns or raises. Returns what `fun` returns.

      ExPhil.Native.Eager.pure(fn -> predict_fn.(params, frames) end)
  """
  @spec pure((-> result)) :: result when result: term()
  def pure(fun) when is_function(fun, 0) do
    previous = Process.put(@forced_pure, true)

    try do
      fun.()
    after
      if previous, do: Process.put(@forced_pure, previous), else: Process.delete(@forced_pure)
    end
  end

  @doc """
  Whether the kernels can run on `tensors` (`nil`s, for absent operands,
  are skipped) in their own memory: concrete tensors, all of one backend
  whose CUDA tensors take this path (Torchx), on a CUDA device, of the
  kernels' types, with the NIF loaded. Option `:align`: the bytes every
  tensor's address must be a multiple of (default 1).

  It may make a non-contiguous tensor contiguous in place (through
  `Nx.to_pointer/2`), which leaves its values as they are.
  """
  def native?(tensors, opts \\ []) do
    match?({:native, _}, placement(tensors, Keyword.get(opts, :align, 1)))
  end

  @doc false
  # Runs native.(context, pointers) (pointers as `tensors`, nil for nil)
  # when `block` is supported and native?/2 holds, and emits the call event;
  # else pure.() and, on concrete tensors, the pure event.
  def run(%Block{unsupported: unsupported}, op, direction, tensors, native, pure, opts \\ []) do
    decision =
      cond do
        traced?(tensors) -> {:pure, :traced}
        Process.get(@forced_pure) -> {:pure, :forced}
        unsupported -> {:pure, {:unsupported, unsupported}}
        true -> placement(tensors, Keyword.get(opts, :align, 1))
      end

    case decision do
      {:native, ctx} ->
        ctx = Map.merge(ctx, %{op: op, direction: direction})
        result = native.(ctx, ctx.pointers)
        # Until here the tensors must stay referenced: the pointers are
        # plain addresses, and a tensor that Nx.Defn.Evaluator hands over
        # (the forward's outputs, say) may have no other reference. Collected
        # before the kernels are enqueued, its memory would go back to
        # libtorch's cache and could be handed to an output allocated
        # meanwhile. After the enqueue, stream order makes it safe.
        __MODULE__.keep_alive(tensors)

        :telemetry.execute(@call_event, %{count: 1}, %{
          op: op,
          direction: direction,
          backend: ctx.backend,
          device: ctx.device,
          type: ctx.type
        })

        result

      {:pure, :traced} ->
        pure.()

      {:pure, reason} ->
        :telemetry.execute(@pure_event, %{count: 1}, %{
          op: op,
          direction: direction,
          backend: backend_of(tensors),
          reason: reason
        })

        pure.()
    end
  end

  @doc false
  # A call the compiler cannot drop: keeps `term` alive up to it.
  def keep_alive(term), do: term

  ## Placement

  defp placement(tensors, align) do
    present = Enum.reject(tensors, &is_nil/1)

    with :ok <- if(present == [] or traced?(present), do: {:pure, :traced}, else: :ok),
         {:ok, backend, device} <- location(present),
         :ok <- types(present),
         :ok <- if(Native.load_error() == nil, do: :ok, else: {:pure, :nif_not_loaded}),
         {:ok, pointers} <- pointers(tensors, align) do
      {:native,
       %{backend: backend, device: device, type: Nx.type(hd(present)), pointers: pointers}}
    end
  end

  defp traced?(tensors), do: Enum.any?(tensors, &match?(%T{data: %Nx.Defn.Expr{}}, &1))

  defp location(tensors) do
    case tensors |> Enum.map(&backend_device/1) |> Enum.uniq() do
      [{backend, device}] when backend in @backends ->
        if cuda?(device), do: {:ok, backend, device}, else: {:pure, :not_cuda}

      [_] ->
        {:pure, :backend}

      places ->
        if Enum.all?(places, fn {backend, _} -> backend in @backends end),
          do: {:pure, :mixed},
          else: {:pure, :backend}
    end
  end

  # Torchx.Backend's data is %Torchx.Backend{ref: {device, reference}}; a
  # map pattern, so that Torchx need not be compiled.
  defp backend_device(%T{data: %{__struct__: backend, ref: {device, _}}}), do: {backend, device}
  defp backend_device(%T{data: %backend{}}), do: {backend, nil}

  defp backend_of([]), do: nil
  defp backend_of([nil | rest]), do: backend_of(rest)
  defp backend_of([%T{data: %backend{}} | _]), do: backend

  defp cuda?(:cuda), do: true
  defp cuda?({:cuda, _index}), do: true
  defp cuda?(_), do: false

  defp types(tensors) do
    if Enum.all?(tensors, &(Nx.type(&1) in @kernel_types)), do: :ok, else: {:pure, :type}
  end

  defp pointers(tensors, align) do
    pointers = Enum.map(tensors, &(&1 && pointer(&1)))

    aligned? =
      Enum.all?(pointers, fn
        nil -> true
        {%{kind: :local, address: address}, _, _} -> rem(address, align) == 0
        _ -> false
      end)

    if aligned?, do: {:ok, pointers}, else: {:pure, :alignment}
  end

  # A tensor argument of the NIF: {pointer map, type, shape}.
  defp pointer(%T{} = t), do: {Nx.to_pointer(t, mode: :local), Nx.type(t), Nx.shape(t)}

  # A new tensor of the context's backend and device, and its NIF argument.
  defp output(ctx, shape, type) do
    tensor = ctx.backend.constant(Nx.template(shape, type), 0.0, device: ctx.device)
    {tensor, pointer(tensor)}
  end

  defp outputs(ctx, specs) do
    Enum.map(specs, fn {shape, type} -> output(ctx, shape, type) end)
  end

  defp nif!(ctx, fun, args) do
    case apply(Native, fun, args) do
      {:ok, _event} ->
        :ok

      {:error, reason} ->
        raise RuntimeError,
              "ExPhil.Native.#{fun} failed on #{inspect(ctx.backend)} tensors " <>
                "(device #{inspect(ctx.device)}): #{inspect(reason)}"
    end
  end

  defp shape_type(%T{} = t), do: {Nx.shape(t), Nx.type(t)}

  ## Linear recurrences

  @doc false
  # The forward block's default function: {y, h_final}.
  def scan_forward(block, op, inputs, h0, pure) do
    run(
      block,
      op,
      :forward,
      inputs ++ [h0],
      fn ctx, pointers ->
        {input_pointers, [h0_pointer]} = Enum.split(pointers, -1)
        {batch, _steps, hidden} = shape = Nx.shape(hd(inputs))

        [{y, y_pointer}, {h_final, h_final_pointer}] =
          outputs(ctx, [{shape, Nx.type(hd(inputs))}, {{batch, hidden}, {:f, 32}}])

        options =
          [h0: h0_pointer, outputs: [y: y_pointer, h_final: h_final_pointer]] ++ @nif_options

        nif!(ctx, :"#{op}_forward", input_pointers ++ [options])
        {y, h_final}
      end,
      pure
    )
  end

  @doc false
  # The backward block's default function: the inputs' gradients and
  # grad_h0 (the placeholder without h0).
  def scan_backward(block, op, inputs, h0, y, grad_y, grad_h_final, pure) do
    run(
      block,
      op,
      :backward,
      inputs ++ [h0, y, grad_y, grad_h_final],
      fn ctx, pointers ->
        {input_pointers, [h0_pointer, y_pointer, grad_y_pointer, grad_h_final_pointer]} =
          Enum.split(pointers, -4)

        grads = outputs(ctx, Enum.map(inputs, &shape_type/1))
        grad_h0 = if h0, do: output(ctx, Nx.shape(h0), Nx.type(h0))

        named =
          Enum.zip(Map.fetch!(@scan_grads, op), Enum.map(grads, &elem(&1, 1))) ++
            if(grad_h0, do: [grad_h0: elem(grad_h0, 1)], else: [])

        options =
          [h0: h0_pointer, grad_h_final: grad_h_final_pointer, outputs: named] ++ @nif_options

        nif!(ctx, :"#{op}_backward", input_pointers ++ [y_pointer, grad_y_pointer, options])

        List.to_tuple(
          Enum.map(grads, &elem(&1, 0)) ++
            [if(grad_h0, do: elem(grad_h0, 0), else: Args.placeholder())]
        )
      end,
      pure
    )
  end

  ## Selective scan

  @doc false
  # `options`: the pure implementation's (:dt_bias, :d, :z, :h0 tensors or
  # nil, :softplus, :clamp). Returns {y, h_final}.
  def selective_scan_forward(block, [x, _dt, a, _b, _c] = inputs, options, pure) do
    optional = Enum.map(@selective_scan_optional, &options[&1])

    run(
      block,
      :selective_scan,
      :forward,
      inputs ++ optional,
      fn ctx, pointers ->
        {input_pointers, optional_pointers} = Enum.split(pointers, 5)
        {batch, _steps, channels} = Nx.shape(x)
        {_, states} = Nx.shape(a)

        [{y, y_pointer}, {h_final, h_final_pointer}] =
          outputs(ctx, [shape_type(x), {{batch, channels, states}, {:f, 32}}])

        nif_options =
          Enum.zip(@selective_scan_optional, optional_pointers) ++
            [softplus: options[:softplus], clamp: options[:clamp]] ++
            [outputs: [y: y_pointer, h_final: h_final_pointer]] ++ @nif_options

        nif!(ctx, :selective_scan_forward, input_pointers ++ [nif_options])
        {y, h_final}
      end,
      pure
    )
  end

  @doc false
  # `options` as for the forward, with :grad_h_final. Returns the tuple of
  # grad_x, grad_dt, grad_a, grad_b, grad_c and the optional inputs'
  # gradients (the placeholder for each absent input).
  def selective_scan_backward(block, inputs, grad_y, options, pure) do
    optional = Enum.map(@selective_scan_optional, &options[&1])
    grad_h_final = options[:grad_h_final]

    run(
      block,
      :selective_scan,
      :backward,
      inputs ++ optional ++ [grad_y, grad_h_final],
      fn ctx, pointers ->
        {input_pointers, rest} = Enum.split(pointers, 5)
        {optional_pointers, [grad_y_pointer, grad_h_final_pointer]} = Enum.split(rest, -2)
        grads = outputs(ctx, Enum.map(inputs, &shape_type/1))

        optional_grads =
          Enum.map(optional, fn
            nil -> nil
            t -> output(ctx, Nx.shape(t), Nx.type(t))
          end)

        named =
          Enum.zip([:grad_x, :grad_dt, :grad_a, :grad_b, :grad_c], Enum.map(grads, &elem(&1, 1))) ++
            for {key, {_, pointer}} <- Enum.zip(@selective_scan_optional, optional_grads),
                do: {:"grad_#{key}", pointer}

        nif_options =
          Enum.zip(@selective_scan_optional, optional_pointers) ++
            [
              softplus: options[:softplus],
              clamp: options[:clamp],
              grad_h_final: grad_h_final_pointer,
              outputs: named
            ] ++ @nif_options

        nif!(ctx, :selective_scan_backward, input_pointers ++ [grad_y_pointer, nif_options])

        List.to_tuple(
          Enum.map(grads, &elem(&1, 0)) ++
            Enum.map(optional_grads, fn
              nil -> Args.placeholder()
              {t, _} -> t
            end)
        )
      end,
      pure
    )
  end

  ## GRU, LSTM and sLSTM sequences

  @doc false
  # The default function of a GRU, LSTM or sLSTM block (`cell`, `direction`):
  # `named`, the block's tensors by their NIF names (`wx:`, `r:`, ..., nil
  # for an absent optional one), and `template`, the tuple of its results
  # in the target's order. The NIF takes the op description's required
  # inputs as arguments and the rest as options; every result of the target
  # is an output, by its name. Returns the results' tuple.
  def gated_rnn(block, cell, direction, named, template, pure) do
    run(
      block,
      cell,
      direction,
      Keyword.values(named),
      fn ctx, pointers ->
        results = template |> Tuple.to_list() |> Enum.map(&output(ctx, Nx.shape(&1), Nx.type(&1)))
        pointers = Enum.zip(Keyword.keys(named), pointers)
        outputs = Enum.map(results, &elem(&1, 1))
        {fun, args} = gated_rnn_call(cell, direction, pointers, outputs, precision(block))
        nif!(ctx, fun, args)
        results |> Enum.map(&elem(&1, 0)) |> List.to_tuple()
      end,
      pure
    )
  end

  # The NIF's precision option of a gated-RNN block: :tf32 where its
  # attribute "precision" says 1, else none (exact; the sLSTM's and the
  # y-only forms' blocks have no such attribute).
  defp precision(%{attributes: %{"precision" => 1}}), do: [precision: :tf32]
  defp precision(_block), do: []

  @doc false
  # The NIF call of a GRU, LSTM or sLSTM block: `{function, arguments}` for
  # `named`, the NIF arguments of its tensors by name (nil for an absent
  # optional one), and `outputs`, those of its results in the target's
  # order. The op description's required inputs are arguments, the rest
  # options, with the op's own `own`; each result of the target is an
  # output, by its name.
  def gated_rnn_call(cell, direction, named, outputs, own \\ []) do
    {positional, _optional, _outputs} =
      OpDescriptions.nif_signature(OpDescriptions.fetch!(cell, direction))

    positional = Enum.map(positional, &String.to_atom/1)

    names =
      for {name, _} <- Targets.fetch!(Targets.name(cell, direction)).results,
          do: name |> String.downcase() |> String.to_atom()

    options =
      Keyword.drop(named, positional) ++
        own ++ [outputs: Enum.zip(names, outputs)] ++ @nif_options

    {:"#{cell}_#{direction}", Enum.map(positional, &Keyword.fetch!(named, &1)) ++ [options]}
  end

  ## Attention

  # The attention kernels move rows in 16-byte vectors.
  @attention_align 16

  @doc false
  # `options`: :mask, :window, :layout, :scale, :precision (the NIF's).
  # Returns {o, lse}.
  def attention_forward(block, [q, _k, _v] = inputs, options, pure) do
    run(
      block,
      :attention,
      :forward,
      inputs,
      fn ctx, pointers ->
        [{o, o_pointer}, {lse, lse_pointer}] =
          outputs(ctx, [shape_type(q), {lse_shape(q, options[:layout]), {:f, 32}}])

        nif_options =
          attention_options(q, options) ++
            [outputs: [o: o_pointer, lse: lse_pointer]] ++ @nif_options

        nif!(ctx, :attention_forward, pointers ++ [nif_options])
        {o, lse}
      end,
      pure,
      align: @attention_align
    )
  end

  @doc false
  # Inputs q, k, v, o, lse, grad_o. Returns {grad_q, grad_k, grad_v}.
  def attention_backward(block, [q, k, v, _o, _lse, _grad_o] = inputs, options, pure) do
    run(
      block,
      :attention,
      :backward,
      inputs,
      fn ctx, pointers ->
        [{grad_q, gq}, {grad_k, gk}, {grad_v, gv}] =
          outputs(ctx, [shape_type(q), shape_type(k), shape_type(v)])

        nif_options =
          attention_options(q, options) ++
            [outputs: [grad_q: gq, grad_k: gk, grad_v: gv]] ++ @nif_options

        nif!(ctx, :attention_backward, pointers ++ [nif_options])
        {grad_q, grad_k, grad_v}
      end,
      pure,
      align: @attention_align
    )
  end

  defp lse_shape(q, :bthd), do: {elem(Nx.shape(q), 0), elem(Nx.shape(q), 2), elem(Nx.shape(q), 1)}
  defp lse_shape(q, _bhtd), do: {elem(Nx.shape(q), 0), elem(Nx.shape(q), 1), elem(Nx.shape(q), 2)}

  # :tf32x3 is for f32 inputs; the others take :exact only.
  defp attention_options(q, options) do
    precision = if Nx.type(q) == {:f, 32}, do: options[:precision], else: :exact

    [
      mask: options[:mask],
      window: options[:window],
      layout: options[:layout],
      scale: options[:scale],
      precision: precision
    ]
  end
end
