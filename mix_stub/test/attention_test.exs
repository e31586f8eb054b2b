defmodule ExPhil.Native.AttentionReferenceTest do
  # The Elixir reference of attention that the GPU tests trust: its forward
  # against values worked out by hand, its masks against their definition,
  # its backward against central finite differences of its forward. No GPU
  # needed.
  use ExUnit.Case, async: true
  alias ExPhil.Native.AttentionReference, as: A

  defp dot(u, v), do: Enum.zip_with(u, v, &(&1 * &2)) |> Enum.sum()

  defp problem(dims, fields) do
    Map.merge(%{dims: dims, layout: :bhtd, mask: :none, window: nil, scale: nil}, Map.new(fields))
  end

  test "forward: one query, two keys, worked out by hand" do
    # scores 0 and log 3: probabilities 1/4 and 3/4
    p = problem({1, 1, 1, 1, 2, 1}, q: [1.0], k: [0.0, :math.log(3.0)], v: [2.0, 6.0], scale: 1.0)
    assert %{o: [o], lse: [lse]} = A.forward(p)
    assert_in_delta o, 0.25 * 2.0 + 0.75 * 6.0, 1.0e-14
    assert_in_delta lse, :math.log(4.0), 1.0e-14

    # the default scale is 1 / sqrt(d)
    p =
      problem({1, 1, 1, 1, 2, 4},
        q: [1.0, 1.0, 1.0, 1.0],
        k: [0.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0],
        v: Enum.to_list(1..8) |> Enum.map(&(&1 * 1.0))
      )

    # scores 0 and 4 / 2 = 2
    w = :math.exp(2.0) / (1.0 + :math.exp(2.0))
    %{o: o, lse: [lse]} = A.forward(p)
    assert_in_delta lse, :math.log(1.0 + :math.exp(2.0)), 1.0e-14

    for {got, c} <- Enum.with_index(o),
        do: assert_in_delta(got, (1 - w) * (c + 1) + w * (c + 5), 1.0e-13)
  end

  test "masks are aligned to the bottom right" do
    keys = fn t, s, mask, window, i ->
      A.keys(problem({1, 1, 1, t, s, 1}, mask: mask, window: window), i)
    end

    # T < S: query i stands at i + S - T
    assert keys.(3, 5, :causal, nil, 0) == [0, 1, 2]
    assert keys.(3, 5, :causal, nil, 2) == [0, 1, 2, 3, 4]
    assert keys.(3, 5, :window, 2, 0) == [1, 2]
    assert keys.(3, 5, :window, 1, 2) == [4]
    assert keys.(3, 5, :none, nil, 0) == [0, 1, 2, 3, 4]
    # T > S: the first T - S queries see no key
    assert keys.(5, 3, :causal, nil, 1) == []
    assert keys.(5, 3, :causal, nil, 2) == [0]
    assert keys.(5, 3, :window, 8, 4) == [0, 1, 2]
    assert keys.(5, 3, :window, 2, 1) == []
    # T = 1: the last key position
    assert keys.(1, 4, :causal, nil, 0) == [0, 1, 2, 3]
    assert keys.(1, 4, :window, 3, 0) == [1, 2, 3]
  end

  test "a query that sees no key: o = 0, lse = -inf, no gradient" do
    p = A.random({1, 2, 1, 4, 2, 3}, [mask: :causal], & &1)
    %{o: o, lse: lse} = A.forward(p)
    # rows 0 and 1 of each head see nothing
    assert Enum.take(lse, 2) == [:neg_infinity, :neg_infinity]
    assert Enum.slice(lse, 4, 2) == [:neg_infinity, :neg_infinity]
    assert Enum.all?(Enum.slice(lse, 2, 2), &is_float/1)
    assert Enum.take(o, 6) == List.duplicate(0.0, 6)
    %{grad_q: gq} = A.backward(p, ExPhil.Native.Reference.random(length(o), -1.0, 1.0))
    assert Enum.take(gq, 6) == List.duplicate(0.0, 6)
  end

  for {label, dims, options} <- [
        {"MHA, no mask", {2, 2, 2, 3, 4, 2}, []},
        {"GQA 2, causal, T < S", {1, 2, 1, 3, 4, 2}, [mask: :causal]},
        {"GQA 2, window, T > S (rows without keys), bthd", {1, 4, 2, 5, 3, 3},
         [mask: :window, window: 2, layout: :bthd]},
        {"bthd, causal, a given scale", {2, 2, 1, 4, 4, 2},
         [mask: :causal, layout: :bthd, scale: 0.7]}
      ] do
    test "backward matches finite differences: #{label}" do
      p = A.random(unquote(Macro.escape(dims)), unquote(options), & &1)
      w = ExPhil.Native.Reference.random(length(p.q), -1.0, 1.0)
      loss = fn p -> dot(A.forward(p).o, w) end
      grads = A.backward(p, w)
      ExPhil.Native.FiniteDifferences.assert_matches(loss, p, grads, [:q, :k, :v])
    end
  end
end

defmodule ExPhil.Native.AttentionErrorsTest do
  # Every error path of the attention NIFs that needs no GPU: bad options
  # and tensors raise ArgumentError naming the argument (the NIF's own
  # checks, then the library's, which come before any device access when
  # the outputs are given); a well-formed call on a machine without a GPU
  # returns {:error, :no_cuda_device}.
  use ExUnit.Case, async: true
  import Bitwise
  alias ExPhil.Native

  defp gpu?, do: Native.device_count() > 0

  defp bytes({:f, 32}), do: 4
  defp bytes(_), do: 2

  # A tensor at a fake address, 16-byte aligned.
  defp tensor(address, shape, type \\ {:f, 32}) do
    {%{kind: :local, address: address, data_size: Tuple.product(shape) * bytes(type)}, type,
     shape}
  end

  # Every tensor of a well-formed call at B1 Hq2 Hkv1 T4 S6 d32 in `layout`,
  # 1 MiB apart (so that none overlaps), with `changes` ({shape, type} or a
  # whole tensor by name) applied.
  @names [:q, :k, :v, :o, :lse, :grad_o, :grad_q, :grad_k, :grad_v]
  defp call(changes \\ [], layout \\ :bhtd) do
    {q, kv} =
      case layout do
        :bhtd -> {{{1, 2, 4, 32}, {:f, 32}}, {{1, 1, 6, 32}, {:f, 32}}}
        :bthd -> {{{1, 4, 2, 32}, {:f, 32}}, {{1, 6, 1, 32}, {:f, 32}}}
      end

    base = %{
      q: q,
      k: kv,
      v: kv,
      o: q,
      lse: {{1, 2, 4}, {:f, 32}},
      grad_o: q,
      grad_q: q,
      grad_k: kv,
      grad_v: kv
    }

    for {name, n} <- Enum.with_index(@names), into: %{} do
      case Keyword.get(changes, name, base[name]) do
        {shape, type} when is_tuple(shape) -> {name, tensor((n + 1) <<< 20, shape, type)}
        other -> {name, other}
      end
    end
  end

  defp forward(c, opts), do: Native.attention_forward(c.q, c.k, c.v, opts)
  defp backward(c, opts), do: Native.attention_backward(c.q, c.k, c.v, c.o, c.lse, c.grad_o, opts)
  defp fwd_outputs(c), do: [outputs: [o: c.o, lse: c.lse]]
  defp bwd_outputs(c), do: [outputs: [grad_q: c.grad_q, grad_k: c.grad_k, grad_v: c.grad_v]]

  # Both directions, with their outputs given (so that the library's checks
  # are reached without a GPU) and `opts`.
  defp both(c, opts),
    do: [
      fn -> forward(c, opts ++ fwd_outputs(c)) end,
      fn -> backward(c, opts ++ bwd_outputs(c)) end
    ]

  defp assert_both(pattern, c, opts \\ []) do
    for f <- both(c, opts), do: assert_raise(ArgumentError, pattern, f)
  end

  test "option names and the common options are checked" do
    c = call()

    assert_raise ArgumentError,
                 ~r/argument 'opts': expected option names among :mask, :window, :layout, :scale, :precision, :outputs, :sync, :stream, got :h0/,
                 fn -> forward(c, h0: c.q) end

    assert_raise ArgumentError,
                 ~r/argument 'opts': expected option names among .*, got :lse/,
                 fn -> backward(c, lse: c.lse) end

    assert_raise ArgumentError,
                 ~r/argument 'opts': expected a keyword list or a map, got "causal"/,
                 fn -> forward(c, "causal") end

    assert_both(~r/argument 'sync': expected true or false, got :maybe/, c, sync: :maybe)

    assert_both(
      ~r/argument 'stream': expected :managed, :legacy_default or an ExPhil.Native.Stream, got 1/,
      c,
      stream: 1
    )
  end

  test "precision is checked, naming the option, and :tf32x3 is for f32 inputs only" do
    for bad <- [:tf32, :fast, nil, 1, "exact"] do
      assert_both(
        ~r/argument 'precision': expected :exact or :tf32x3 \(f32 inputs only\), got #{Regex.escape(inspect(bad))}/,
        call(),
        precision: bad
      )
    end

    for type <- [{:f, 16}, {:bf, 16}] do
      {q, kv} = {{{1, 2, 4, 32}, type}, {{1, 1, 6, 32}, type}}
      c = call(q: q, k: kv, v: kv, o: q, grad_o: q, grad_q: q, grad_k: kv, grad_v: kv)

      assert_both(
        ~r/argument 'precision': expected :exact with f16 or bf16 inputs \(:tf32x3 multiplies f32\), got :tf32x3/,
        c,
        precision: :tf32x3
      )
    end
  end

  test "mask, window, layout and scale are checked, naming the option" do
    c = call()

    for bad <- [:full, nil, "causal", 1, true] do
      assert_both(
        ~r/argument 'mask': expected :none, :causal or :window, got #{Regex.escape(inspect(bad))}/,
        c,
        mask: bad
      )
    end

    # window: required with mask: :window, refused with any other mask
    for opts <- [[mask: :window], [mask: :window, window: nil]] do
      assert_both(
        ~r/argument 'window': expected an integer in 1..2147483647 with mask: :window .*, got none/,
        c,
        opts
      )
    end

    for bad <- [0, -1, 1.5, 1 <<< 31, 1 <<< 64, :all, "4"] do
      assert_both(
        ~r/argument 'window': expected an integer in 1..2147483647 with mask: :window, got #{Regex.escape(inspect(bad))}/,
        c,
        mask: :window,
        window: bad
      )
    end

    for opts <- [[window: 4], [mask: :causal, window: 4], [mask: :none, window: 0]] do
      assert_both(
        ~r/argument 'window': expected nil unless mask: :window, got #{opts[:window]}/,
        c,
        opts
      )
    end

    for bad <- [:bshd, :BHTD, "bhtd", nil, 0] do
      assert_both(
        ~r/argument 'layout': expected :bhtd \(\[B, H, T, d\]\) or :bthd \(\[B, T, H, d\]\), got #{Regex.escape(inspect(bad))}/,
        c,
        layout: bad
      )
    end

    # 0 would mean 1 / sqrt(d) to the library; 1.0e-50 rounds to 0 in f32
    for bad <- [0, 0.0, -0.0, 1.0e-50, 1.0e39, -1.0e300, 1 <<< 64, :default, "0.125", {0.125}] do
      assert_both(
        ~r/argument 'scale': expected nil \(1 \/ sqrt\(d\)\) or a nonzero number within f32's range .*, got #{Regex.escape(inspect(bad))}/,
        c,
        scale: bad
      )
    end
  end

  test "tensor arguments and the ranks of q and k are checked" do
    c = call()

    for {name, n} <- Enum.with_index([:q, :k, :v]) do
      args = List.replace_at([c.q, c.k, c.v], n, :nope)

      assert_raise ArgumentError,
                   ~r/argument '#{name}': expected a tensor \{pointer, type, shape\} or an ExPhil.Native.Buffer, got :nope/,
                   fn ->
                     apply(Native, :attention_forward, args ++ [[]])
                   end
    end

    for {name, n} <- [o: 3, lse: 4, grad_o: 5] do
      args = List.replace_at([c.q, c.k, c.v, c.o, c.lse, c.grad_o], n, {})

      assert_raise ArgumentError, ~r/argument '#{name}': expected a tensor/, fn ->
        apply(Native, :attention_backward, args ++ [[]])
      end
    end

    assert_raise ArgumentError,
                 ~r/argument 'q': expected type \{:f, 32\}, \{:f, 16\} or \{:bf, 16\}, got \{:f, 64\}/,
                 fn ->
                   forward(
                     call(
                       q:
                         {%{kind: :local, address: 1 <<< 20, data_size: 2048}, {:f, 64},
                          {1, 2, 4, 32}}
                     ),
                     []
                   )
                 end

    assert_raise ArgumentError,
                 ~r/argument 'k': expected data_size 768 \(type \{:f, 32\} and shape \{1, 1, 6, 32\}\), got 100/,
                 fn ->
                   forward(
                     call(
                       k:
                         {%{kind: :local, address: 2 <<< 20, data_size: 100}, {:f, 32},
                          {1, 1, 6, 32}}
                     ),
                     []
                   )
                 end

    # with or without outputs:, whatever the outputs are
    for opts <- [[], [sync: false]], extra <- [[], :outputs] do
      c3 = call(q: {{1, 4, 32}, {:f, 32}})
      c5 = call(k: {{1, 1, 6, 32, 1}, {:f, 32}})
      fwd = fn c -> forward(c, opts ++ if(extra == :outputs, do: fwd_outputs(c), else: [])) end
      bwd = fn c -> backward(c, opts ++ if(extra == :outputs, do: bwd_outputs(c), else: [])) end

      assert_raise ArgumentError,
                   ~r/argument 'q': expected rank 4 \[B, Hq, T, d\], got shape \{1, 4, 32\}/,
                   fn -> fwd.(c3) end

      assert_raise ArgumentError,
                   ~r/argument 'q': expected rank 4 \[B, Hq, T, d\], got shape \{1, 4, 32\}/,
                   fn -> bwd.(c3) end

      assert_raise ArgumentError,
                   ~r/argument 'k': expected rank 4 \[B, Hkv, S, d\], got shape \{1, 1, 6, 32, 1\}/,
                   fn -> fwd.(c5) end

      assert_raise ArgumentError,
                   ~r/argument 'k': expected rank 4 \[B, Hkv, S, d\], got shape \{1, 1, 6, 32, 1\}/,
                   fn -> bwd.(c5) end
    end

    assert_raise ArgumentError,
                 ~r/argument 'q': expected rank 4 \[B, T, Hq, d\], got shape \{4, 32\}/,
                 fn ->
                   forward(call(q: {{4, 32}, {:f, 32}}), layout: :bthd)
                 end

    assert_raise ArgumentError,
                 ~r/argument 'k': expected rank 4 \[B, S, Hkv, d\], got shape \{6, 32\}/,
                 fn ->
                   backward(call(k: {{6, 32}, {:f, 32}}), layout: :bthd)
                 end
  end

  test "outputs: is checked" do
    c = call()

    assert_raise ArgumentError,
                 ~r/argument 'outputs': expected a tensor for :o \(destination passing gives every required output\), got none/,
                 fn ->
                   forward(c, outputs: [lse: c.lse])
                 end

    for empty <- [[], %{}] do
      assert_raise ArgumentError,
                   ~r/argument 'outputs': expected at least one output among :grad_q, :grad_k, :grad_v, got #{Regex.escape(inspect(empty))}/,
                   fn -> backward(c, outputs: empty) end
    end

    assert_raise ArgumentError,
                 ~r/argument 'outputs': expected output names among :o, :lse, got :y/,
                 fn ->
                   forward(c, outputs: [o: c.o, y: c.o])
                 end

    assert_raise ArgumentError,
                 ~r/argument 'outputs': expected output names among :grad_q, :grad_k, :grad_v, got :grad_o/,
                 fn ->
                   backward(c, outputs: [grad_o: c.grad_o])
                 end

    assert_raise ArgumentError, ~r/argument 'grad_k': expected a tensor/, fn ->
      backward(c, outputs: %{grad_k: :nope})
    end
  end

  test "the library's checks come before any device access and name the argument" do
    # head widths: 32, 64, 96 and 128 only
    for d <- [16, 48, 100, 256] do
      c =
        call(
          q: {{1, 2, 4, d}, {:f, 32}},
          k: {{1, 1, 6, d}, {:f, 32}},
          v: {{1, 1, 6, d}, {:f, 32}},
          o: {{1, 2, 4, d}, {:f, 32}},
          grad_o: {{1, 2, 4, d}, {:f, 32}},
          grad_q: {{1, 2, 4, d}, {:f, 32}},
          grad_k: {{1, 1, 6, d}, {:f, 32}},
          grad_v: {{1, 1, 6, d}, {:f, 32}}
        )

      assert_both(
        ~r/argument 'q': head width d = #{d}; the kernels support d = 32, 64, 96 and 128/,
        c
      )
    end

    # GQA: Hq a multiple of Hkv
    c = call(q: {{1, 3, 4, 32}, {:f, 32}}, k: {{1, 2, 6, 32}, {:f, 32}})

    assert_both(
      ~r/attention (forward|backward): argument 'k': expected a head count Hkv that divides Hq = 3 \(the heads of 'q'\), got Hkv = 2/,
      c
    )

    # types: one for q, k, v, o, grad_o and the gradients; lse f32
    assert_both(
      ~r/argument 'k': expected dtype f32 \(the dtype of 'q'\), got bf16/,
      call(k: {{1, 1, 6, 32}, {:bf, 16}})
    )

    assert_both(
      ~r/argument 'v': expected dtype f32 \(the dtype of 'q'\), got f16/,
      call(v: {{1, 1, 6, 32}, {:f, 16}})
    )

    assert_raise ArgumentError,
                 ~r/attention forward: argument 'o': expected dtype f32 \(the dtype of 'q'\), got bf16/,
                 fn ->
                   c = call(o: {{1, 2, 4, 32}, {:bf, 16}})
                   forward(c, fwd_outputs(c))
                 end

    for c <- [call(lse: {{1, 2, 4}, {:bf, 16}})] do
      assert_raise ArgumentError,
                   ~r/attention forward: argument 'lse': expected dtype f32, got bf16/,
                   fn -> forward(c, fwd_outputs(c)) end

      assert_raise ArgumentError,
                   ~r/attention backward: argument 'lse': expected dtype f32, got bf16/,
                   fn -> backward(c, bwd_outputs(c)) end
    end

    assert_raise ArgumentError,
                 ~r/attention backward: argument 'grad_o': expected dtype bf16 \(the dtype of 'q'\), got f32/,
                 fn ->
                   bf = {{1, 2, 4, 32}, {:bf, 16}}
                   kv = {{1, 1, 6, 32}, {:bf, 16}}
                   c = call(q: bf, k: kv, v: kv, o: bf, grad_q: bf, grad_k: kv, grad_v: kv)
                   backward(c, bwd_outputs(c))
                 end

    # shapes
    assert_both(
      ~r/argument 'k': expected shape \[B, Hkv, S, d\] with B = 1 and d = 32 \(from 'q'\), got \[2, 1, 6, 32\]/,
      call(k: {{2, 1, 6, 32}, {:f, 32}})
    )

    assert_both(
      ~r/argument 'v': expected shape \[1, 1, 6, 32\] \(the shape of 'k'\), got \[1, 1, 5, 32\]/,
      call(v: {{1, 1, 5, 32}, {:f, 32}})
    )

    assert_raise ArgumentError,
                 ~r/attention forward: argument 'lse': expected shape \[1, 2, 4\] \(\[B, Hq, T\] from 'q'\), got \[1, 4, 2\]/,
                 fn ->
                   c = call(lse: {{1, 4, 2}, {:f, 32}})
                   forward(c, fwd_outputs(c))
                 end

    assert_raise ArgumentError,
                 ~r/attention backward: argument 'grad_k': expected shape \[1, 1, 6, 32\] \(the shape of 'k'\), got \[1, 2, 6, 32\]/,
                 fn ->
                   c = call(grad_k: {{1, 2, 6, 32}, {:f, 32}})
                   backward(c, bwd_outputs(c))
                 end

    assert_both(
      ~r/argument 'q': expected every dimension >= 1, got \[1, 2, 0, 32\]/,
      call(q: {{1, 2, 0, 32}, {:f, 32}})
    )

    # [B, T, H, d]: the descriptions follow the layout; lse stays [B, Hq, T]
    assert_both(
      ~r/argument 'k': expected shape \[B, S, Hkv, d\] with B = 1 and d = 32 \(from 'q'\), got \[1, 6, 1, 64\]/,
      call([k: {{1, 6, 1, 64}, {:f, 32}}], :bthd),
      layout: :bthd
    )

    assert_both(
      ~r/argument 'k': expected a head count Hkv that divides Hq = 3 \(the heads of 'q'\), got Hkv = 2/,
      call([q: {{1, 4, 3, 32}, {:f, 32}}, k: {{1, 6, 2, 32}, {:f, 32}}], :bthd),
      layout: :bthd
    )

    assert_both(
      ~r/argument 'lse': expected shape \[1, 2, 4\] \(\[B, Hq, T\] from 'q'\), got \[1, 4, 2\]/,
      call([lse: {{1, 4, 2}, {:f, 32}}], :bthd),
      layout: :bthd
    )

    assert_both(
      ~r/argument 'v': expected shape \[1, 6, 1, 32\] \(the shape of 'k'\), got \[1, 1, 6, 32\]/,
      call([v: {{1, 1, 6, 32}, {:f, 32}}], :bthd),
      layout: :bthd
    )

    # alignment and overlaps
    assert_both(
      ~r/argument 'v': data pointer 0x300008 is not aligned to 16 bytes/,
      call(v: tensor((3 <<< 20) + 8, {1, 1, 6, 32}))
    )

    assert_raise ArgumentError,
                 ~r/attention forward: argument 'o': output memory .* overlaps argument 'q'/,
                 fn ->
                   c = call(o: tensor((1 <<< 20) + 512, {1, 2, 4, 32}))
                   forward(c, fwd_outputs(c))
                 end

    assert_raise ArgumentError,
                 ~r/attention backward: argument 'grad_k': output memory .* overlaps argument 'grad_v'/,
                 fn ->
                   c = call(grad_v: tensor(8 <<< 20, {1, 1, 6, 32}))
                   backward(c, bwd_outputs(c))
                 end
  end

  test "well-formed calls fail cleanly where there is no GPU memory" do
    c = call()
    bthd = call([], :bthd)

    calls = [
      fn -> forward(c, []) end,
      fn -> forward(c, fwd_outputs(c)) end,
      fn -> forward(c, outputs: %{o: c.o}, mask: :causal, scale: 0.125) end,
      fn -> forward(c, %{mask: :window, window: 3, layout: :bhtd, scale: nil}) end,
      fn -> forward(bthd, [layout: :bthd, mask: :none, window: nil] ++ fwd_outputs(bthd)) end,
      fn -> backward(c, []) end,
      fn -> backward(c, [mask: :causal] ++ bwd_outputs(c)) end,
      fn -> backward(c, outputs: [grad_k: c.grad_k]) end,
      fn ->
        backward(bthd, [layout: :bthd, mask: :window, window: 1, scale: -2] ++ bwd_outputs(bthd))
      end
    ]

    for call <- calls do
      if gpu?() do
        # fake addresses: rejected by the library's device check
        assert_raise ArgumentError, ~r/argument 'q': expected device memory/, call
      else
        assert {:error, :no_cuda_device} = call.()
      end
    end
  end

  test "random terms in every argument position get an error or an exception, never a crash" do
    c = call()

    terms = [
      :nope,
      nil,
      1,
      -1.5,
      "x",
      {},
      [],
      %{},
      {1, 2, 3},
      [mask: :window],
      [window: 2],
      c.q,
      c.lse,
      make_ref()
    ]

    for _ <- 1..500 do
      fwd = for _ <- 1..4, do: Enum.random(terms)
      bwd = for _ <- 1..7, do: Enum.random(terms)

      for {f, args} <- [attention_forward: fwd, attention_backward: bwd] do
        try do
          result = apply(Native, f, args)
          assert match?({:error, _}, result), "#{f}#{inspect(args)} returned #{inspect(result)}"
        rescue
          ArgumentError -> :ok
        end
      end
    end

    assert is_integer(Native.device_count())
  end
end

defmodule ExPhil.Native.AttentionTest do
  # Attention on the GPU against the Elixir reference: forward and
  # backward, f32 and bf16, across shapes (T != S, GQA, T = 1, every head
  # width), masks and both layouts, into NIF-owned buffers; rows that see
  # no key; destination passing into Nx-style pointer maps with a chosen
  # set of outputs; sync: false with await/1 on a stream of its own.
  use ExUnit.Case, async: false
  @moduletag :gpu
  import ExPhil.Native.GPUCase, only: [upload!: 3, download!: 2]
  alias ExPhil.Native
  alias ExPhil.Native.AttentionReference, as: A
  alias ExPhil.Native.Reference, as: R

  # {atol relative to the output's max |ref|, rtol}, by the call's type
  # (brief: f32 about 1e-4 of the magnitude, bf16 3e-2). The f32 lse of a
  # bf16 call is computed in f32 from the same bf16 values as the
  # reference: it gets f32's.
  defp tolerance({:f, 32}), do: {1.0e-4, 1.0e-4}
  defp tolerance({:bf, 16}), do: {3.0e-2, 2.0e-2}

  defp bf16(values), do: elem(R.to_bf16(values), 0)
  defp round_fn({:bf, 16}), do: &bf16/1
  defp round_fn(_), do: &R.to_f32/1

  # The NIF's options for a problem.
  defp options(p, extra) do
    [mask: p.mask, layout: p.layout, window: p.window, scale: p.scale] ++ extra
  end

  # A problem at `dims`, its uploads (q, k, v, grad_o) and the reference.
  defp problem(dims, opts, type) do
    round = round_fn(type)
    p = A.random(dims, opts, round)
    grad_o = round.(R.random(length(p.q), -1.0, 1.0))
    shapes = A.shapes(p)

    uploads = %{
      q: upload!(p.q, shapes.q, type),
      k: upload!(p.k, shapes.k, type),
      v: upload!(p.v, shapes.k, type),
      grad_o: upload!(grad_o, shapes.q, type)
    }

    layout = %{
      o: {shapes.q, type},
      lse: {shapes.lse, {:f, 32}},
      grad_q: {shapes.q, type},
      grad_k: {shapes.k, type},
      grad_v: {shapes.k, type}
    }

    grads = A.backward(p, grad_o)
    # A gradient can be zero by cancellation alone (one key: softmax is
    # constant, so grad_q and grad_k are 0), where the GPU leaves rounding
    # noise of the terms that cancel: its scale is floored at a tenth of the
    # largest gradient of the call.
    floor = 0.1 * R.scale(Map.values(grads))
    scales = Map.new(grads, fn {name, ref} -> {name, max(R.scale([ref]), floor)} end)

    %{
      p: p,
      type: type,
      uploads: uploads,
      layout: layout,
      ref: Map.merge(A.forward(p), grads),
      scales: scales
    }
  end

  defp forward(s, extra \\ []) do
    u = s.uploads
    Native.attention_forward(u.q, u.k, u.v, options(s.p, extra))
  end

  defp backward(s, o, lse, extra \\ []) do
    u = s.uploads
    Native.attention_backward(u.q, u.k, u.v, o, lse, u.grad_o, options(s.p, extra))
  end

  # Each output against its reference; NIF-owned buffers also by type and
  # shape. As in the selective-scan tests, atol is relative to the output's
  # own max |ref| (gradients: floored, see problem/3). lse may hold -inf
  # (rows that see no key): those must match exactly, the rest within f32's
  # tolerance of 1 + max |lse|.
  defp check(s, outputs) do
    for {name, tensor} <- outputs do
      {shape, type} = s.layout[name]
      ref = Map.fetch!(s.ref, name)

      with %Native.Buffer{} <- tensor do
        assert {tensor.shape, tensor.type} == {shape, type}, "#{name}"
      end

      if name == :lse do
        {:ok, binary} = Native.download(tensor)
        got = A.decode_f32_specials(binary)
        assert length(got) == length(ref)

        for {g, r, i} <- Enum.zip([got, ref, 0..(length(ref) - 1)]),
            not is_float(r) or not is_float(g) do
          assert g == r, "lse[#{i}]: got #{inspect(g)}, reference #{inspect(r)}"
        end

        finite = for {g, r} <- Enum.zip(got, ref), is_float(r), do: {g, r}

        if finite != [] do
          {gs, rs} = Enum.unzip(finite)
          {atol, rtol} = tolerance({:f, 32})
          ratio = R.error_ratio(gs, rs, 1.0 + R.scale([rs]), atol, rtol)
          assert ratio <= 1.0, "lse: worst error #{Float.round(ratio, 3)} times the tolerance"
        end
      else
        got = download!(tensor, type)
        # decode_f32 stops at the first NaN or infinity (decode_bf16 raises)
        assert length(got) == Tuple.product(shape), "#{name}: non-finite values"
        {atol, rtol} = tolerance(type)
        # o: rows that see no key must be exactly zero, hence the tiny floor
        scale = Map.get_lazy(s.scales, name, fn -> max(R.scale([ref]), 1.0e-30) end)
        ratio = R.error_ratio(got, ref, scale, atol, rtol)
        assert ratio <= 1.0, "#{name}: worst error #{Float.round(ratio, 3)} times the tolerance"
      end
    end
  end

  # {B, Hq, Hkv, T, S, d}, options
  @cases [
    {{1, 2, 2, 16, 16, 32}, []},
    {{2, 4, 2, 17, 33, 64}, [mask: :causal, layout: :bthd]},
    {{1, 2, 1, 24, 20, 32}, [mask: :window, window: 5]},
    {{2, 2, 2, 1, 40, 64}, [mask: :causal, layout: :bthd]},
    {{2, 2, 1, 1, 7, 32}, [mask: :window, window: 3]},
    {{1, 4, 2, 33, 33, 64}, [mask: :causal, scale: 0.3]},
    {{1, 2, 1, 40, 19, 32}, [layout: :bthd]},
    {{1, 1, 1, 1, 1, 32}, []},
    {{1, 2, 1, 9, 12, 96}, [mask: :window, window: 4, layout: :bthd]},
    {{1, 2, 2, 5, 70, 128}, [mask: :causal]}
  ]

  for type <- [{:f, 32}, {:bf, 16}], {dims, opts} <- @cases do
    test "#{inspect(type)} #{inspect(dims)} #{inspect(opts)}: forward and backward match the reference" do
      s = problem(unquote(Macro.escape(dims)), unquote(opts), unquote(Macro.escape(type)))
      assert {:ok, fwd} = forward(s)
      assert Enum.sort(Map.keys(fwd)) == [:lse, :o]
      check(s, fwd)

      assert {:ok, bwd} = backward(s, fwd.o, fwd.lse)
      assert Enum.sort(Map.keys(bwd)) == [:grad_k, :grad_q, :grad_v]
      check(s, bwd)
    end
  end

  # precision: :tf32x3 (f32 products on tensor cores) within f32's tolerance
  for {dims, opts} <- Enum.take_every(@cases, 2) do
    test "{:f, 32} #{inspect(dims)} #{inspect(opts)} precision: :tf32x3: forward and backward match the reference" do
      s = problem(unquote(Macro.escape(dims)), unquote(opts), {:f, 32})
      assert {:ok, fwd} = forward(s, precision: :tf32x3)
      check(s, fwd)
      assert {:ok, bwd} = backward(s, fwd.o, fwd.lse, precision: :tf32x3)
      check(s, bwd)
    end
  end

  for type <- [{:f, 32}, {:bf, 16}], layout <- [:bhtd, :bthd] do
    test "#{inspect(type)} #{layout}: rows that see no key get o = 0, lse = -inf and no gradient" do
      # causal with T > S: the first T - S = 12 queries of every head see no key
      s =
        problem(
          {2, 2, 1, 20, 8, 32},
          [mask: :causal, layout: unquote(layout)],
          unquote(Macro.escape(type))
        )

      assert {:ok, fwd} = forward(s)
      check(s, fwd)

      {:ok, lse_binary} = Native.download(fwd.lse)
      lse = A.decode_f32_specials(lse_binary)
      masked = for {x, r} <- Enum.with_index(lse), rem(r, 20) < 12, do: x
      assert length(masked) == 2 * 2 * 12

      assert Enum.all?(masked, &(&1 == :neg_infinity)),
             "lse of rows without keys: #{inspect(Enum.uniq(masked))}"

      assert lse |> Enum.reject(&(&1 == :neg_infinity)) |> Enum.all?(&is_float/1)

      # o and grad_q of those rows: exactly zero
      {b, hq, t, d} = {2, 2, 20, 32}

      rows_of = fn values ->
        for bi <- 0..(b - 1), h <- 0..(hq - 1), i <- 0..(t - 1), i < 12, c <- 0..(d - 1) do
          index =
            if unquote(layout) == :bhtd,
              do: ((bi * hq + h) * t + i) * d + c,
              else: ((bi * t + i) * hq + h) * d + c

          elem(values, index)
        end
      end

      assert Enum.all?(rows_of.(List.to_tuple(download!(fwd.o, s.type))), &(&1 == 0))

      assert {:ok, bwd} = backward(s, fwd.o, fwd.lse)
      check(s, bwd)
      assert Enum.all?(rows_of.(List.to_tuple(download!(bwd.grad_q, s.type))), &(&1 == 0))
    end
  end

  # A pointer map over a new buffer of NaNs, as Nx.to_pointer gives one, and
  # the buffer that owns the memory (to keep alive until the last use).
  defp nan_view(s, name) do
    {shape, type} = s.layout[name]
    {:ok, buffer} = Native.upload(nans(shape, type), type, shape)
    {{Native.pointer(buffer), type, shape}, buffer}
  end

  defp nans(shape, {:f, 32}), do: :binary.copy(<<0xFF, 0xFF, 0xFF, 0x7F>>, Tuple.product(shape))
  defp nans(shape, _), do: :binary.copy(<<0xFF, 0x7F>>, Tuple.product(shape))

  # Downloads through the owning buffer (a pointer map cannot be read back).
  defp owned(views),
    do:
      Map.new(views, fn {name, {{_ptr, type, shape}, owner}} -> {name, {owner, type, shape}} end)

  for type <- [{:f, 32}, {:bf, 16}] do
    test "#{inspect(type)}: destination passing into pointer maps writes the outputs asked for, and only those" do
      s =
        problem(
          {1, 4, 2, 21, 29, 64},
          [mask: :window, window: 9, layout: :bthd],
          unquote(Macro.escape(type))
        )

      # forward without :lse, then with it
      {o, o_owner} = nan_view(s, :o)
      assert {:ok, %{o: ^o} = fwd} = forward(s, outputs: [o: o])
      assert map_size(fwd) == 1
      check(s, owned(%{o: {o, o_owner}}))

      {lse, lse_owner} = nan_view(s, :lse)
      assert {:ok, %{o: ^o, lse: ^lse}} = forward(s, outputs: %{o: o, lse: lse})
      check(s, owned(%{o: {o, o_owner}, lse: {lse, lse_owner}}))

      # one gradient, then the other two; the rest stays NaN
      views = Map.new([:grad_q, :grad_k, :grad_v], &{&1, nan_view(s, &1)})
      only_k = %{grad_k: elem(views.grad_k, 0)}
      assert {:ok, ^only_k} = backward(s, o, lse, outputs: only_k)
      check(s, owned(Map.take(views, [:grad_k])))
      {shape_q, _} = s.layout.grad_q

      assert {:ok, nans(shape_q, s.type)} == Native.download(elem(views.grad_q, 1)),
             "grad_q was written"

      rest = %{grad_q: elem(views.grad_q, 0), grad_v: elem(views.grad_v, 0)}
      assert {:ok, ^rest} = backward(s, o, lse, outputs: rest)
      check(s, owned(views))

      owners =
        [o_owner, lse_owner | Enum.map(Map.values(views), &elem(&1, 1))] ++ Map.values(s.uploads)

      Enum.each(owners, &(:ok = Native.free(&1)))
    end
  end

  test "sync: false returns events for await/1, on a stream of the caller's" do
    s = problem({2, 4, 1, 19, 23, 64}, [mask: :causal], {:bf, 16})
    assert {:ok, %Native.Stream{} = stream} = Native.new_stream(device: 0)

    assert {:ok, %Native.Event{} = event} = forward(s, sync: false, stream: stream)
    assert {:ok, fwd} = Native.await(event)
    check(s, fwd)

    assert {:ok, %Native.Event{} = event} =
             backward(s, fwd.o, fwd.lse, sync: false, stream: stream)

    assert {:ok, bwd} = Native.await(event)
    assert {:ok, ^bwd} = Native.await(event)
    check(s, bwd)
  end

  test "results are bitwise the same from run to run" do
    s = problem({1, 4, 2, 37, 45, 64}, [mask: :window, window: 13], {:bf, 16})

    runs =
      for _ <- 1..2 do
        {:ok, fwd} = forward(s)
        {:ok, bwd} = backward(s, fwd.o, fwd.lse)

        for {_name, buffer} <- Enum.sort(Map.merge(fwd, bwd)),
            do: elem(Native.download(buffer), 1)
      end

    assert Enum.uniq(runs) |> length() == 1
  end

  test "bad shapes with real buffers still raise, after allocating the outputs" do
    s = problem({1, 2, 1, 4, 6, 32}, [], {:f, 32})
    {:ok, k48} = Native.upload(:binary.copy(<<0::32>>, 6 * 48), {:f, 32}, {1, 1, 6, 48})

    assert_raise ArgumentError,
                 ~r/attention forward: argument 'k': expected shape \[B, Hkv, S, d\] with B = 1 and d = 32/,
                 fn ->
                   Native.attention_forward(s.uploads.q, k48, s.uploads.v)
                 end
  end
end
