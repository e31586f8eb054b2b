defmodule ExPhil.Native.FuzzTest do
  # 10,000 random terms, many of them nearly valid, sent to every function
  # that takes arguments: each call must return an error or raise, never
  # crash the VM, and the NIF must still answer afterwards.
  use ExUnit.Case, async: true
  import Bitwise
  alias ExPhil.Native

  @functions [
    device_info: 1,
    memory_held: 1,
    synchronize: 1,
    await: 1,
    new_stream: 1,
    allocate: 3,
    upload: 4,
    download: 1,
    free: 1,
    pointer: 1,
    export_ipc: 1,
    import_ipc: 4,
    allocation_offset: 1,
    linear_scan_forward: 3,
    linear_scan_backward: 5,
    min_gru_forward: 3,
    min_gru_backward: 5,
    min_lstm_forward: 4,
    min_lstm_backward: 6,
    liquid_forward: 3,
    liquid_backward: 5,
    selective_scan_forward: 6,
    selective_scan_backward: 7,
    gru_forward: 3,
    gru_backward: 5,
    lstm_forward: 3,
    lstm_backward: 5
  ]

  @atoms [
    :ok,
    :f,
    :bf,
    :s,
    :local,
    :ipc,
    nil,
    true,
    false,
    :managed,
    :legacy_default,
    :y,
    :h0,
    :outputs,
    :sync,
    :stream,
    :state_type,
    :grad_h_final,
    :kind,
    :address,
    :data_size,
    :handle,
    :device,
    :dt_bias,
    :d,
    :z,
    :softplus,
    :clamp,
    :grad_x,
    :grad_a,
    :grad_h0
  ]

  # A near-valid call is refused: an ArgumentError or an error tuple, never
  # a result.
  defp assert_refused(name, args, seed) do
    result =
      try do
        apply(Native, name, args)
      rescue
        e -> {:raised, e.__struct__}
      end

    case result do
      {:raised, ArgumentError} ->
        :ok

      {:error, _} ->
        :ok

      other ->
        flunk("#{name} (seed #{seed}) returned #{inspect(other)} for #{inspect(args, limit: 12)}")
    end
  end

  defp type,
    do: Enum.random([{:f, 32}, {:f, 16}, {:bf, 16}, {:f, 64}, {:s, 32}, {:bf, 32}, {:f}, {1, 2}])

  defp shape do
    dims =
      for _ <- 0..:rand.uniform(4), do: Enum.random([0, 1, 2, 3, 5, 7, -1, 1 <<< 31, 1 <<< 62])

    List.to_tuple(dims)
  end

  defp pointer do
    case :rand.uniform(4) do
      1 ->
        %{kind: :local, address: :rand.uniform(1 <<< 47), data_size: :rand.uniform(1 <<< 20)}

      2 ->
        %{
          kind: :ipc,
          handle: :rand.bytes(Enum.random([0, 63, 64, 65])),
          data_size: :rand.uniform(4096)
        }

      3 ->
        %{kind: Enum.random(@atoms), address: term(1), data_size: term(1)}

      4 ->
        %ExPhil.Native.Buffer{ref: make_ref(), type: type(), shape: shape(), device: 0}
    end
  end

  # Type, shape and data_size that agree, at a random address: passes every
  # check the NIF itself makes, so the call reaches the library's.
  defp consistent_tensor do
    {type, size} = Enum.random([{{:f, 32}, 4}, {{:f, 16}, 2}, {{:bf, 16}, 2}])
    shape = List.to_tuple(for _ <- 1..Enum.random([1, 2, 3, 3, 3]), do: Enum.random([1, 2, 3, 7]))

    address =
      Enum.random([0, 1, 4096, :rand.uniform(1 <<< 47), 0x7F0000000000 + :rand.uniform(1 <<< 20)])

    {%{kind: :local, address: address, data_size: Tuple.product(shape) * size}, type, shape}
  end

  # Clamp bounds: valid, reversed, beyond f32, or not numbers.
  defp clamp(depth) do
    Enum.random([
      nil,
      {0.1, 0.5},
      {0.5, 0.1},
      {0, 1},
      {1.0e300, 2.0},
      {1 <<< 70, 0},
      {term(depth), term(depth)}
    ])
  end

  defp term(0),
    do: Enum.random([:rand.uniform(1000) - 500, 1.5, :y, "x", make_ref(), self(), [], {}])

  defp term(depth) do
    case :rand.uniform(18) do
      1 ->
        :rand.uniform(1 <<< 64) - (1 <<< 63)

      2 ->
        :rand.uniform() * 1.0e6 - 5.0e5

      3 ->
        Enum.random(@atoms)

      4 ->
        :rand.bytes(:rand.uniform(100) - 1)

      5 ->
        List.to_tuple(for _ <- 1..:rand.uniform(4), do: term(depth - 1))

      6 ->
        for _ <- 1..:rand.uniform(4), do: term(depth - 1)

      7 ->
        Map.new(for _ <- 1..:rand.uniform(4), do: {term(depth - 1), term(depth - 1)})

      8 ->
        make_ref()

      9 ->
        type()

      10 ->
        shape()

      11 ->
        pointer()

      12 ->
        {pointer(), type(), shape()}

      13 ->
        for _ <- 1..:rand.uniform(3), do: {Enum.random(@atoms), term(depth - 1)}

      14 ->
        [outputs: [y: {pointer(), type(), shape()}], sync: Enum.random([true, false, :x])]

      15 ->
        consistent_tensor()

      16 ->
        [outputs: [y: consistent_tensor(), h_final: consistent_tensor()], stream: term(depth - 1)]

      17 ->
        [
          softplus: Enum.random([true, false, nil, 0]),
          clamp: clamp(depth - 1),
          z: consistent_tensor()
        ]

      18 ->
        [
          outputs: [grad_x: consistent_tensor(), grad_a: consistent_tensor()],
          dt_bias: term(depth - 1)
        ]
    end
  end

  test "random terms get an error or an exception, and the VM survives" do
    seed = :rand.uniform(1 <<< 30)
    :rand.seed(:exsss, {seed, seed, seed})

    outcomes =
      for _ <- 1..10_000 do
        {name, arity} = Enum.random(@functions)
        args = for _ <- 1..arity, do: term(3)

        result =
          try do
            apply(Native, name, args)
          rescue
            e -> {:raised, e.__struct__}
          catch
            kind, value -> {:caught, kind, value}
          end

        case result do
          {:raised, _} ->
            :raised

          {:error, _} ->
            :error

          # Random arguments can be valid for allocation on a GPU: free it.
          {:ok, %ExPhil.Native.Buffer{} = b} when name in [:allocate, :upload] ->
            Native.free(b) && :allocated

          other ->
            flunk(
              "#{name}/#{arity} (seed #{seed}) returned #{inspect(other)} for #{inspect(args, limit: 8)}"
            )
        end
      end

    assert length(outcomes) == 10_000
    assert is_integer(Native.device_count())
  end

  # Selective-scan calls whose tensors all pass the NIF's own checks, with
  # options valid or nearly so: they get through decoding to the output
  # allocation and the library's checks, which must refuse them (nothing
  # is device memory) with an ArgumentError or an error, never a crash.
  test "nearly valid selective-scan calls are refused cleanly" do
    seed = :rand.uniform(1 <<< 30)
    :rand.seed(:exsss, {seed, seed, seed})

    grads = [
      :grad_x,
      :grad_dt,
      :grad_a,
      :grad_b,
      :grad_c,
      :grad_dt_bias,
      :grad_d,
      :grad_z,
      :grad_h0
    ]

    for _ <- 1..2_000 do
      optional =
        for name <- [:dt_bias, :d, :z, :h0, :grad_h_final],
            do: {name, Enum.random([nil, consistent_tensor()])}

      settings = [
        softplus: Enum.random([true, false]),
        clamp: Enum.random([nil, {0.1, 0.5}, {0, 1}, {-1.0, -1.0}]),
        sync: Enum.random([true, false])
      ]

      {name, args, outputs} =
        if :rand.uniform(2) == 1 do
          {:selective_scan_forward, [], [y: consistent_tensor(), h_final: consistent_tensor()]}
        else
          {:selective_scan_backward, [consistent_tensor()],
           Enum.map(grads, &{&1, consistent_tensor()})}
        end

      outputs = Enum.take_random(outputs, :rand.uniform(length(outputs) + 1) - 1)

      opts =
        Enum.take_random(optional ++ settings, :rand.uniform(8)) ++
          if(outputs == [], do: [], else: [outputs: outputs])

      opts =
        if name == :selective_scan_forward, do: Keyword.delete(opts, :grad_h_final), else: opts

      args = for(_ <- 1..5, do: consistent_tensor()) ++ args ++ [opts]

      assert_refused(name, args, seed)
    end

    assert is_integer(Native.device_count())
  end

  # GRU, LSTM and sLSTM calls whose tensors have the described shapes (now
  # and then one extent off by one) and dtypes (now and then another), with
  # any subset of the optional inputs and outputs: they get through decoding
  # to the library's checks, which must refuse them (nothing is device
  # memory) with an ArgumentError or an error, never a crash.
  test "nearly valid gru, lstm and slstm calls are refused cleanly" do
    seed = :rand.uniform(1 <<< 30)
    :rand.seed(:exsss, {seed, seed, seed})

    for _ <- 1..2_000 do
      cell = Enum.random([:gru, :lstm, :slstm])
      direction = Enum.random([:forward, :backward])
      states = ExPhil.Native.Pure.GatedRnn.states(cell)
      g = ExPhil.Native.Pure.GatedRnn.gates(cell)
      [b, t, h] = for _ <- 1..3, do: Enum.random([1, 2, 3])
      seq = Enum.random([{:f, 32}, {:f, 16}, {:bf, 16}])

      tensor = fn shape ->
        shape =
          if :rand.uniform(12) == 1,
            do: put_elem(shape, :rand.uniform(tuple_size(shape)) - 1, 4),
            else: shape

        type = if :rand.uniform(8) == 1, do: Enum.random([{:f, 32}, {:bf, 16}]), else: seq
        size = if type == {:f, 32}, do: 4, else: 2
        address = Enum.random([0, 4096, :rand.uniform(1 <<< 47)])
        {%{kind: :local, address: address, data_size: Tuple.product(shape) * size}, type, shape}
      end

      state = fn -> Enum.random([nil, tensor.({b, h})]) end
      # one per state of the cell, named by `name`
      each_state = fn name -> for s <- states, do: {:"#{name.(s)}", state.()} end

      optional =
        [bias: Enum.random([nil, tensor.({g * h})])] ++
          each_state.(&"#{&1}0") ++
          if(direction == :backward, do: each_state.(&"grad_#{&1}_final"), else: [])

      outputs =
        case direction do
          :forward ->
            [y: tensor.({b, t, h})] ++ for(s <- states, do: {:"#{s}_final", tensor.({b, h})})

          :backward ->
            [
              grad_wx: tensor.({b, t, g * h}),
              grad_r: tensor.({h, g * h}),
              grad_bias: tensor.({g * h})
            ] ++
              for(s <- states, do: {:"grad_#{s}0", tensor.({b, h})}) ++
              [grad_rh: tensor.({b, t, g * h})]
        end

      outputs = Enum.take_random(outputs, :rand.uniform(length(outputs) + 1) - 1)

      opts =
        Enum.take_random(optional, :rand.uniform(length(optional) + 1) - 1) ++
          [sync: Enum.random([true, false])] ++
          if(outputs == [], do: [], else: [outputs: outputs])

      args =
        [tensor.({b, t, g * h}), tensor.({h, g * h})] ++
          if(direction == :backward, do: [tensor.({b, t, h}), tensor.({b, t, h})], else: [])

      name = :"#{cell}_#{direction}"

      assert_refused(name, args ++ [opts], seed)
    end

    assert is_integer(Native.device_count())
  end
end
