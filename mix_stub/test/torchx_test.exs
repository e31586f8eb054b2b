defmodule ExPhil.Native.TorchxTest do
  # ExPhil.Native.Ops on Torchx tensors. Torchx runs an Nx.block's default
  # function; on CUDA tensors that function calls the NIF on the tensors'
  # own memory (ExPhil.Native.Eager): outputs allocated by Torchx on the same
  # device, destination passing, libtorch's stream (:legacy_default), no
  # host copy and no wait. Each test checks, through Eager's telemetry
  # events, that the NIF ran and the pure implementation did not, and
  # compares with the pure implementation on BinaryBackend copies of the
  # same values.
  #
  # Tests tagged :torchx need Torchx with a CUDA device: they run through
  # scripts/torchx_gpu.sh (the Mix project in scripts/torchx_project adds
  # Torchx) and are excluded elsewhere. The untagged ones check the pure
  # side of the dispatch and run anywhere.
  use ExUnit.Case, async: false
  import Bitwise, only: [<<<: 2]

  alias ExPhil.Native.{Eager, HostTransfers, Ops}

  @cuda {Torchx.Backend, device: :cuda}

  setup context do
    # Torchx tests: numbers in Nx calls become tensors on the device, not
    # host tensors that Torchx would copy over (a copy from host memory
    # waits for the stream, which would hide an ordering fault).
    if context[:torchx], do: Nx.default_backend(@cuda)
    test = self()
    id = {__MODULE__, make_ref()}

    :ok =
      :telemetry.attach_many(
        id,
        [Eager.call_event(), Eager.pure_event()],
        &__MODULE__.relay/4,
        test
      )

    on_exit(fn -> :telemetry.detach(id) end)
    :ok
  end

  # Telemetry handler: relays the events of the test's own process.
  def relay(event, _measurements, metadata, test) do
    if self() == test, do: send(test, {:eager, List.last(event), metadata})
  end

  defp flush_events do
    receive do
      {:eager, _, _} -> flush_events()
    after
      0 -> :ok
    end
  end

  defp events do
    receive do
      {:eager, kind, meta} -> [{kind, meta} | events()]
    after
      0 -> []
    end
  end

  defp random(shape, type, seed, {lo, hi} \\ {-1.0, 1.0}) do
    Nx.with_default_backend(Nx.BinaryBackend, fn ->
      {t, _} = Nx.Random.uniform(Nx.Random.key(seed), lo, hi, shape: shape, type: :f32)
      Nx.as_type(t, type)
    end)
  end

  ## Cases: named tensors (BinaryBackend) and a call of the op on them

  @seq {2, 16, 32}

  @all_ops [
    :linear_scan,
    :min_gru,
    :min_lstm,
    :liquid,
    :selective_scan,
    :attention,
    :gru,
    :lstm,
    :slstm
  ]

  defp op_case(op, type, variant \\ :full)

  defp op_case(op, type, variant) when op in [:linear_scan, :min_gru, :min_lstm, :liquid] do
    {names, ranges} =
      case op do
        :linear_scan -> {[:a, :b], [{0.5, 1.0}, {-1.0, 1.0}]}
        :min_gru -> {[:gate, :candidate], [{-4.0, 4.0}, {-2.0, 2.0}]}
        :min_lstm -> {[:forget, :input, :candidate], [{-4.0, 4.0}, {-4.0, 4.0}, {-2.0, 2.0}]}
        :liquid -> {[:tau, :target], [{0.5, 8.0}, {-2.0, 2.0}]}
      end

    inputs =
      Enum.zip_with([names, ranges, 1..3], fn [name, range, seed] ->
        {name, random(@seq, type, seed, range)}
      end)

    h0 = if variant == :full, do: [h0: random({2, 32}, :f32, 9)], else: []

    %{
      tensors: inputs ++ h0,
      call: fn t ->
        apply(Ops, op, Enum.map(names, &t[&1]) ++ [[h0: t[:h0], final_state: true]])
      end
    }
  end

  defp op_case(:selective_scan, type, variant) do
    {b, t, d, n} = {2, 16, 32, 16}

    required = [
      x: random({b, t, d}, type, 1),
      dt: random({b, t, d}, type, 2, {-2.0, 1.0}),
      a: random({d, n}, :f32, 3, {-2.0, -0.1}),
      b: random({b, t, n}, type, 4),
      c: random({b, t, n}, type, 5)
    ]

    optional =
      if variant == :full,
        do: [
          dt_bias: random({d}, :f32, 6, {-0.5, 0.5}),
          d: random({d}, :f32, 7),
          z: random({b, t, d}, type, 8),
          h0: random({b, d, n}, :f32, 9)
        ],
        else: []

    flags = if variant == :full, do: [softplus: true, clamp: {0.001, 0.5}], else: []

    %{
      tensors: required ++ optional,
      call: fn t ->
        opts = Enum.map(Keyword.keys(optional), &{&1, t[&1]}) ++ flags ++ [final_state: true]
        Ops.selective_scan(t[:x], t[:dt], t[:a], t[:b], t[:c], opts)
      end
    }
  end

  defp op_case(cell, type, variant) when cell in [:gru, :lstm, :slstm] do
    {b, t, h} = @seq
    g = ExPhil.Native.Pure.GatedRnn.gates(cell)

    required = [
      wx: random({b, t, g * h}, type, 1, {-2.0, 2.0}),
      r: random({h, g * h}, :f32, 2, {-0.3, 0.3})
    ]

    # The sLSTM's n0 >= 1, as its default and every n_final are.
    initial = [
      h0: random({b, h}, :f32, 4),
      c0: random({b, h}, :f32, 5),
      n0: random({b, h}, :f32, 6, {1.0, 2.0}),
      m0: random({b, h}, :f32, 7)
    ]

    optional =
      if variant == :full,
        do:
          [bias: random({g * h}, :f32, 3, {-0.5, 0.5})] ++
            Keyword.take(initial, Enum.map(ExPhil.Native.Pure.GatedRnn.states(cell), &:"#{&1}0")),
        else: []

    %{
      tensors: required ++ optional,
      call: fn t ->
        opts = Enum.map(Keyword.keys(optional), &{&1, t[&1]}) ++ [final_state: true]
        out = apply(Ops, cell, [t[:wx], t[:r], opts])

        # A 16-bit sLSTM gives y and h_final alone: the gradients of c_final,
        # n_final and m_final jump at max()'s ties, and the backward's
        # recompute from rounded y can land on the other side of one near
        # where the reference's is (test/gpu/test_gated_rnn.cpp).
        if cell == :slstm and type != {:f, 32}, do: {elem(out, 0), elem(out, 1)}, else: out
      end
    }
  end

  defp op_case(:attention, type, _variant) do
    %{
      tensors: [
        q: random({1, 4, 16, 64}, type, 1, {-2.0, 2.0}),
        k: random({1, 2, 16, 64}, type, 2, {-2.0, 2.0}),
        v: random({1, 2, 16, 64}, type, 3)
      ],
      call: fn t -> Ops.attention(t[:q], t[:k], t[:v], mask: :causal) end
    }
  end

  defp run(c, tensors), do: c.call.(Map.new(tensors))

  defp on_cuda(tensors),
    do: Enum.map(tensors, fn {k, t} -> {k, Nx.backend_transfer(t, @cuda)} end)

  defp pure(fun), do: Nx.with_default_backend(Nx.BinaryBackend, fun)

  # A heavy Torchx computation (two 4096^3 f32 matrix products, some
  # milliseconds) whose result
  # is exactly `t`: the kernel that writes the returned tensor is queued
  # behind them, so a call that read it off libtorch's stream order would
  # read memory not yet written.
  defp produced(t) do
    m = Nx.iota({4096, 4096}, type: :f32, backend: @cuda) |> Nx.divide(4096 * 4096)
    heavy = Enum.reduce(1..2, m, fn _, acc -> Nx.dot(acc, m) |> Nx.divide(4096) end)
    zero = heavy |> Nx.sum() |> Nx.multiply(0) |> Nx.as_type(Nx.type(t))
    Nx.add(t, zero)
  end

  defp flat(out),
    do: out |> List.wrap() |> Enum.flat_map(&if(is_tuple(&1), do: Tuple.to_list(&1), else: [&1]))

  # |got - want| <= atol * max|want| + rtol * |want|, elementwise.
  defp tolerance({:f, 32}), do: {2.0e-4, 2.0e-4}
  defp tolerance({:bf, 16}), do: {5.0e-2, 3.0e-2}
  defp tolerance({:f, 16}), do: {5.0e-3, 5.0e-3}

  # `type`: the case's sequence type, whose rounding reaches every output
  # (an f32 state or gradient of a bf16 problem too).
  defp assert_close(name, got, want, type) do
    assert Nx.shape(got) == Nx.shape(want), "#{name}: shape"
    assert Nx.type(got) == Nx.type(want), "#{name}: type"
    {atol, rtol} = tolerance(type)
    got = got |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.as_type(:f64)
    want = want |> Nx.backend_copy(Nx.BinaryBackend) |> Nx.as_type(:f64)

    pure(fn ->
      scale = Nx.to_number(Nx.reduce_max(Nx.abs(want)))
      bound = Nx.add(atol * max(scale, 1.0e-30), Nx.multiply(rtol, Nx.abs(want)))
      excess = Nx.to_number(Nx.reduce_max(Nx.subtract(Nx.abs(Nx.subtract(got, want)), bound)))
      finite = Nx.to_number(Nx.all(Nx.is_nan(got) |> Nx.logical_not()))
      assert finite == 1, "#{name}: NaN"
      assert excess <= 0, "#{name}: beyond the tolerance by #{excess} (scale #{scale})"
    end)
  end

  defp on_torchx_cuda?(%Nx.Tensor{data: %{__struct__: Torchx.Backend, ref: {:cuda, _}}}), do: true
  defp on_torchx_cuda?(_), do: false

  defp range(t) do
    %{address: address, data_size: size} = Nx.to_pointer(t, mode: :local)
    {address, address + size}
  end

  defp disjoint?({a0, a1}, {b0, b1}), do: a1 <= b0 or b1 <= a0

  ## Anywhere: the pure side of the dispatch

  describe "off Torchx CUDA" do
    test "native? holds for no tensor of another backend, nor for expressions" do
      refute Eager.native?([])
      refute Eager.native?([nil])
      refute Eager.native?([Nx.tensor([1.0, 2.0])])
      refute Eager.native?([Nx.Defn.Expr.tensor(Nx.tensor([1.0, 2.0]))])
    end

    test "on the BinaryBackend the default functions run the pure implementation, and say why" do
      c = op_case(:min_gru, {:f, 32})
      {y, h} = run(c, c.tensors)

      want =
        ExPhil.Native.Pure.Scan.forward(
          :min_gru,
          [c.tensors[:gate], c.tensors[:candidate]],
          c.tensors[:h0]
        )

      assert {y, h} == want

      assert [
               {:pure,
                %{op: :min_gru, direction: :forward, backend: Nx.BinaryBackend, reason: :backend}}
             ] =
               events()

      x = random({1, 2, 16, 48}, :f32, 1)
      Ops.attention(x, x, x)
      assert [{:pure, %{op: :attention, reason: {:unsupported, reason}}}] = events()
      assert reason =~ "head widths"

      c = op_case(:liquid, {:f, 64})
      run(c, c.tensors)
      assert [{:pure, %{reason: {:unsupported, _}}}] = events()
    end

    test "Eager.pure/1 forces the pure implementation in its process, and restores what was" do
      c = op_case(:min_gru, {:f, 32})
      want = run(c, c.tensors)
      events()

      assert Eager.pure(fn -> run(c, c.tensors) end) == want
      assert [{:pure, %{op: :min_gru, reason: :forced}}] = events()

      # nested, and after a raise: the outer setting, then none
      Eager.pure(fn ->
        assert_raise RuntimeError, fn -> Eager.pure(fn -> raise "inside" end) end
        run(c, c.tensors)
      end)

      assert [{:pure, %{reason: :forced}}] = events()
      run(c, c.tensors)
      assert [{:pure, %{reason: :backend}}] = events()

      # another process is not affected
      Eager.pure(fn -> Task.await(Task.async(fn -> run(c, c.tensors) end)) end)
      assert events() == []
    end

    test "while tracing (inside defn) the default functions never reach the NIF nor emit events" do
      for op <- @all_ops do
        c = op_case(op, {:f, 32})
        keys = Keyword.keys(c.tensors)
        fun = fn vars -> c.call.(Map.new(Enum.zip(keys, Tuple.to_list(vars)))) end
        vars = List.to_tuple(Keyword.values(c.tensors))
        loss = fn v -> v |> fun.() |> flat() |> Enum.map(&Nx.sum/1) |> Enum.reduce(&Nx.add/2) end
        Nx.Defn.debug_expr(fun).(vars)
        Nx.Defn.debug_expr(fn v -> Nx.Defn.grad(v, loss) end).(vars)
        assert events() == []
      end
    end

    test "Nx.Defn.grad with the Evaluator reaches the backward block's default function" do
      for op <- @all_ops do
        c = op_case(op, {:f, 32})
        w = weights(c)
        events()
        grad(c, c.tensors, w)

        kinds =
          events()
          |> Enum.map(fn {kind, meta} -> {kind, meta.op, meta.direction} end)
          |> Enum.uniq()

        assert Enum.sort(kinds) == Enum.sort(for d <- grad_directions(op), do: {:pure, op, d})
      end
    end
  end

  # The blocks a gradient evaluates: the selective scan's backward
  # recomputes the states from the inputs, so its forward block is not
  # needed (the Evaluator skips it); the others take the forward's outputs.
  defp grad_directions(:selective_scan), do: [:backward]
  defp grad_directions(_op), do: [:backward, :forward]

  # Random weights, one per output of the case (BinaryBackend).
  defp weights(c) do
    pure(fn -> run(c, c.tensors) end)
    |> flat()
    |> Enum.with_index(20)
    |> Enum.map(fn {out, seed} -> random(Nx.shape(out), :f32, seed) end)
  end

  # The gradients of sum(w_i * out_i) over the op's outputs, with respect to
  # every tensor of the case, by Nx.Defn.grad (the Evaluator, the default
  # compiler): inside, the blocks' default functions get concrete tensors
  # of the inputs' backend.
  defp grad(c, tensors, weights) do
    keys = Keyword.keys(tensors)
    vars = List.to_tuple(Keyword.values(tensors))
    backend = if on_torchx_cuda?(elem(vars, 0)), do: @cuda, else: Nx.BinaryBackend
    # (a transfer to the tensor's own backend and device still copies)
    weights =
      Enum.map(weights, &if(on_torchx_cuda?(&1), do: &1, else: Nx.backend_transfer(&1, backend)))

    # Inside Nx.Defn.jit, so that the weights are parameters rather than
    # tensors captured by the gradient function (which Nx.Defn.grad/2
    # refuses off the default backend).
    Nx.with_default_backend(backend, fn ->
      Nx.Defn.jit(fn vars, weights ->
        Nx.Defn.grad(vars, fn vars ->
          c.call.(Map.new(Enum.zip(keys, Tuple.to_list(vars))))
          |> flat()
          |> Enum.zip_with(Tuple.to_list(weights), fn out, w ->
            Nx.sum(Nx.multiply(Nx.as_type(out, :f32), w))
          end)
          |> Enum.reduce(&Nx.add/2)
        end)
      end).(vars, List.to_tuple(weights))
      |> Tuple.to_list()
      |> then(&Enum.zip(keys, &1))
    end)
  end

  defp assert_grads_close(label, got, want, type) do
    assert Keyword.keys(got) == Keyword.keys(want)

    for {{name, g}, {_, w}} <- Enum.zip(got, want) do
      assert on_torchx_cuda?(g), "#{label} grad of #{name}: not a Torchx CUDA tensor"
      assert_close("#{label} grad of #{name}", g, w, type)
    end
  end

  ## Torchx CUDA

  @ops @all_ops

  for op <- @ops, type <- [{:f, 32}, {:bf, 16}, {:f, 16}] do
    @tag :torchx
    test "#{op} #{inspect(type)}: forward in the tensors' own memory, ordered with Torchx's kernels" do
      op = unquote(op)
      c = op_case(op, unquote(type))
      want = pure(fn -> run(c, c.tensors) end) |> flat()
      events()

      inputs = c.tensors |> on_cuda() |> Enum.map(fn {k, t} -> {k, produced(t)} end)
      {got, transfers} = HostTransfers.count(fn -> run(c, inputs) |> flat() end)
      assert transfers == %{}, "tensors moved to or from the host: #{inspect(transfers)}"

      assert [{:call, %{op: ^op, direction: :forward, backend: Torchx.Backend, device: :cuda}}] =
               events()

      assert Enum.all?(got, &on_torchx_cuda?/1)

      # fresh tensors: no output overlaps an input or another output
      input_ranges = Enum.map(inputs, fn {_, t} -> range(t) end)
      output_ranges = Enum.map(got, &range/1)

      for {o, i} <- Enum.with_index(output_ranges),
          other <- input_ranges ++ List.delete_at(output_ranges, i),
          do: assert(disjoint?(o, other))

      # consumed by Torchx ops at once
      doubled = Enum.map(got, &Nx.multiply(&1, 2))

      for {g, w, i} <- Enum.zip([doubled, want, 0..9]) do
        assert_close("output #{i}", g, Nx.multiply(w, 2), unquote(type))
      end
    end

    @tag :torchx
    test "#{op} #{inspect(type)}: Nx.Defn.grad with the Evaluator runs both blocks in the tensors' own memory" do
      op = unquote(op)
      c = op_case(op, unquote(type))
      w = weights(c)
      want = grad(c, c.tensors, w)
      events()

      inputs = on_cuda(c.tensors)
      w = Enum.map(w, &Nx.backend_transfer(&1, @cuda))
      {got, transfers} = HostTransfers.count(fn -> grad(c, inputs, w) end)
      assert transfers == %{}, "tensors moved to or from the host: #{inspect(transfers)}"

      assert Enum.sort(Enum.map(events(), fn {kind, meta} -> {kind, meta.op, meta.direction} end)) ==
               Enum.sort(for d <- grad_directions(op), do: {:call, op, d})

      assert_grads_close("#{op}", got, want, unquote(type))
    end
  end

  @tag :torchx
  test "control: the host-transfer counter sees each way Torchx moves a tensor to or from the host" do
    t = random({3, 5}, :f32, 1) |> Nx.backend_transfer(@cuda)
    moved = fn fun -> fun |> HostTransfers.count() |> elem(1) end

    assert moved.(fn -> Nx.to_binary(t) end) == %{{Torchx, :to_blob, 2} => 1}
    assert moved.(fn -> Nx.to_number(t[0][0]) end) == %{{Torchx, :to_blob, 2} => 1}
    assert moved.(fn -> Nx.backend_copy(t, Nx.BinaryBackend) end) == %{{Torchx, :to_blob, 1} => 1}
    assert moved.(fn -> Nx.tensor([1.0, 2.0]) end) == %{{Torchx, :from_blob, 4} => 1}
    # a slice at a start held in a tensor reads it on the host
    start = Nx.tensor(1)
    assert [{Torchx, :item, 1}] = Map.keys(moved.(fn -> Nx.slice(t, [start, 0], [1, 5]) end))

    assert moved.(fn -> Nx.backend_copy(t, {Torchx.Backend, device: :cpu}) end) ==
             %{{Torchx, :to_device, 2} => 1}

    assert moved.(fn -> Nx.multiply(t, t) end) == %{}
  end

  # The second OS process: imports two tensors by their IPC pointer maps
  # (offsets included), runs min_gru on them into its own buffer, and sends
  # the result back.
  @ipc_child """
  alias ExPhil.Native
  [gate, candidate] = Enum.map(System.argv(), &:erlang.binary_to_term(Base.decode64!(&1)))
  dims = {2, 64, 96}
  {:ok, y} = Native.allocate({:f, 32}, dims)
  {:ok, _} = Native.min_gru_forward({gate, {:f, 32}, dims}, {candidate, {:f, 32}, dims}, outputs: [y: y])
  {:ok, bytes} = Native.download(y)
  IO.write("REPORT:" <> Base.encode64(bytes))
  """

  @tag :torchx
  @tag timeout: 120_000
  test "Torchx tensors shared through CUDA IPC with a second OS process, used there by an op" do
    dims = {2, 64, 96}
    # In a row: libtorch's caching allocator packs small tensors into one
    # segment, so some start inside the allocation their handle names.
    [_first, gate, candidate] =
      for seed <- 20..22, do: random(dims, :f32, seed) |> Nx.backend_transfer(@cuda)

    {:ok, g} = Eager.ipc_pointer(gate)
    {:ok, c} = Eager.ipc_pointer(candidate)
    assert g.offset > 0 or c.offset > 0, "both at their allocation's start: offsets untested"
    assert g.data_size == Nx.byte_size(gate)
    # written before the other process reads them (Torchx's work is on the
    # legacy default stream; this waits for every stream)
    :ok = ExPhil.Native.synchronize()

    ebin = Path.join(:code.lib_dir(:exphil_native), "ebin")
    args = Enum.map([g, c], &Base.encode64(:erlang.term_to_binary(&1)))

    {output, status} =
      System.cmd(System.find_executable("elixir"), ["-pa", ebin, "-e", @ipc_child | args],
        stderr_to_stdout: true
      )

    assert status == 0, output
    [_, encoded] = String.split(output, "REPORT:")
    theirs = encoded |> Base.decode64!() |> Nx.from_binary(:f32, backend: Nx.BinaryBackend)
    ours = Ops.min_gru(gate, candidate)
    assert_close("y from the other process", Nx.reshape(theirs, dims), ours, {:f, 32})
    flush_events()
  end

  @tag :torchx
  test "10,000 calls grow neither the library's device memory nor the device's, once warm" do
    # Long enough for a segmented plan, whose workspace comes from the
    # library's pool: the pool must be reused, not grown.
    gate = random({2, 4096, 64}, :f32, 11) |> Nx.backend_transfer(@cuda)
    candidate = random({2, 4096, 64}, :f32, 12) |> Nx.backend_transfer(@cuda)
    # Each output freed at once: a dropped Torchx tensor returns its memory to
    # libtorch's cache only when the BEAM collects its reference, whose
    # timing is not the library's (one run's late collection made libtorch
    # take another 100 MiB segment from the device).
    call = fn -> Ops.min_gru(gate, candidate) |> Nx.backend_deallocate() end
    for _ <- 1..200, do: call.()
    :erlang.garbage_collect()
    :ok = ExPhil.Native.synchronize()
    {:ok, held} = ExPhil.Native.memory_held(0)
    {:ok, %{free_memory: free}} = ExPhil.Native.device_info(0)
    assert held.workspace_reserved > 0, "no workspace: the test would prove nothing"

    for _ <- 1..10_000, do: call.()
    :erlang.garbage_collect()
    :ok = ExPhil.Native.synchronize()
    {:ok, held_after} = ExPhil.Native.memory_held(0)
    {:ok, %{free_memory: free_after}} = ExPhil.Native.device_info(0)
    flush_events()

    assert held_after.workspace_reserved <= held.workspace_reserved,
           "the library's pool grew: #{inspect(held)} -> #{inspect(held_after)}"

    assert held_after.workspace_in_use == 0
    assert held_after.capture_blocks == held.capture_blocks
    # libtorch's cache and the pool are warm: what the device has free stays
    # (within a MiB of the driver's own bookkeeping)
    assert free - free_after <= 1 <<< 20,
           "device free memory fell by #{free - free_after} bytes over 10,000 calls"
  end

  @tag :torchx
  test "Eager.pure/1 runs the pure implementation on Torchx CUDA tensors, with the same result" do
    c = op_case(:min_gru, {:f, 32})
    inputs = on_cuda(c.tensors)
    native = run(c, inputs) |> flat()
    assert [{:call, %{op: :min_gru}}] = events()
    forced = Eager.pure(fn -> run(c, inputs) end) |> flat()
    assert [{:pure, %{op: :min_gru, reason: :forced, backend: Torchx.Backend}}] = events()
    assert Enum.all?(forced, &on_torchx_cuda?/1)

    for {n, f, i} <- Enum.zip([native, forced, 0..9]),
        do: assert_close("output #{i}", n, f, {:f, 32})
  end

  @tag :torchx
  test "absent optional inputs (no h0, a plain selective scan, a GRU, an LSTM and an sLSTM without bias and initial states): placeholders both ways" do
    for {op, variant} <- [
          min_gru: :minimal,
          liquid: :minimal,
          selective_scan: :minimal,
          gru: :minimal,
          lstm: :minimal,
          slstm: :minimal
        ] do
      c = op_case(op, {:f, 32}, variant)
      want = pure(fn -> run(c, c.tensors) end) |> flat()
      w = weights(c)
      want_grads = grad(c, c.tensors, w)
      events()
      got = run(c, on_cuda(c.tensors)) |> flat()
      got_grads = grad(c, on_cuda(c.tensors), w)

      assert Enum.sort(Enum.map(events(), fn {kind, meta} -> {kind, meta.direction} end)) ==
               Enum.sort([call: :forward] ++ for(d <- grad_directions(op), do: {:call, d}))

      Enum.zip_with(got, want, &assert_close("#{op} output", &1, &2, {:f, 32}))
      assert_grads_close("#{op}", got_grads, want_grads, {:f, 32})
    end
  end

  @tag :torchx
  test "a hundred calls whose tensors are dropped at once: libtorch's allocator reuses memory in stream order" do
    c = op_case(:min_gru, {:f, 32})
    want = pure(fn -> run(c, c.tensors) end) |> flat() |> hd()
    base = on_cuda(c.tensors)

    sums =
      for i <- 1..100 do
        # fresh inputs each time, freed as soon as the call returns
        inputs = Enum.map(base, fn {k, t} -> {k, Nx.multiply(t, 1)} end)
        {y, _} = run(c, inputs)
        :erlang.garbage_collect()
        if rem(i, 10) == 0, do: :erlang.garbage_collect()
        Nx.sum(Nx.as_type(y, :f32))
      end

    assert length(Enum.filter(events(), &match?({:call, _}, &1))) == 100
    expected = pure(fn -> Nx.to_number(Nx.sum(want)) end)

    for s <- sums do
      assert_in_delta Nx.to_number(s), expected, 1.0e-3 * max(abs(expected), 1.0)
    end
  end

  @tag :torchx
  test "Torchx tensors the kernels cannot take run the pure implementation: CPU, misaligned" do
    c = op_case(:min_gru, {:f, 32})

    cpu =
      Enum.map(c.tensors, fn {k, t} ->
        {k, Nx.backend_transfer(t, {Torchx.Backend, device: :cpu})}
      end)

    pure(fn -> run(c, cpu) end)
    assert [{:pure, %{reason: :not_cuda, backend: Torchx.Backend}}] = events()

    # q 2 bytes into an allocation (a view made with Nx.from_pointer: Torchx
    # copies slices): the attention kernels need 16-byte alignment.
    q = random({1, 4, 16, 64}, {:bf, 16}, 1)

    base =
      Nx.concatenate([Nx.tensor([0.0], type: :bf16), Nx.flatten(q)]) |> Nx.backend_transfer(@cuda)

    %{address: address} = Nx.to_pointer(base, mode: :local)
    pointer = %Nx.Pointer{kind: :local, address: address + 2, data_size: Nx.byte_size(q)}
    shifted = Nx.from_pointer(@cuda, pointer, {:bf, 16}, Nx.shape(q))
    assert rem(Nx.to_pointer(shifted, mode: :local).address, 16) == 2
    o = Ops.attention(shifted, shifted, shifted)
    assert [{:pure, %{reason: :alignment, op: :attention}}] = events()
    assert_close("misaligned o", o, pure(fn -> Ops.attention(q, q, q) end), {:bf, 16})
    # base owns the memory that shifted views
    assert Nx.to_pointer(base, mode: :local).address == address
  end

  @tag :torchx
  test "control: the same call on the library's own stream is not ordered with Torchx's" do
    # Not an assertion: it shows that the ordering tests above can fail. The
    # NIF on the managed (non-blocking) stream does not wait for the Torchx
    # kernels that produce its inputs. Each round has inputs of its own, so
    # memory that libtorch's allocator hands back holds another round's
    # values, not the right ones.
    pointer = fn t -> {Nx.to_pointer(t, mode: :local), Nx.type(t), Nx.shape(t)} end

    stale =
      for round <- 1..5 do
        inputs = [
          random(@seq, {:f, 32}, 100 + round, {-4.0, 4.0}),
          random(@seq, {:f, 32}, 200 + round)
        ]

        {want, _} = pure(fn -> ExPhil.Native.Pure.Scan.forward(:min_gru, inputs, nil) end)
        y = Nx.add(Nx.broadcast(Nx.tensor(0.0), @seq), 0)

        [gate, candidate] =
          inputs |> Enum.map(&Nx.backend_transfer(&1, @cuda)) |> Enum.map(&produced/1)

        args = [
          pointer.(gate),
          pointer.(candidate),
          [outputs: [y: pointer.(y)], stream: :managed]
        ]

        {:ok, _} = apply(ExPhil.Native, :min_gru_forward, args)
        got = Nx.backend_copy(y, Nx.BinaryBackend)
        pure(fn -> Nx.to_number(Nx.reduce_max(Nx.abs(Nx.subtract(got, want)))) end) > 1.0e-3
      end

    IO.puts(
      "\ncontrol (stream: :managed, not ordered with Torchx): " <>
        "#{Enum.count(stale, & &1)} of 5 calls read inputs not yet written"
    )
  end
end
