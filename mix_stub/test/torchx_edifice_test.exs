if Code.ensure_loaded?(Edifice.CUDA.FusedScan) do
  defmodule ExPhil.Native.TorchxEdificeTest do
    # Edifice's ops that ExPhil.Native claims native (mix_stub/EDIFICE.md),
    # checked for their math on Torchx CUDA tensors (issue 28): Torchx runs
    # a block's default function, so Edifice's own blocks never reach our
    # kernels there; instead Edifice's public function (its pure path, the
    # native tier off) and our op (the fused kernels through the NIF) take
    # the same tensors, and their outputs and gradients must agree.
    #
    # Covered: MinGRU and Real-GRU (our min_gru), MinLSTM, liquid, the
    # linear scan and flash attention, causal or not. Not here: ELU-GRU and
    # the diagonal linear scan (no Nx op of ours takes their activations;
    # their targets are checked against Edifice's math by
    # test/xla_ffi/check_edifice_ffi.py), and the selective scan (Edifice's
    # forward scales B by the mean of dt over the channels, our Nx op by each
    # channel's: its target exphil_selective_scan_y_fwd does Edifice's, the
    # Nx op does not).
    #
    # Tagged :torchx: run by scripts/torchx_gpu.sh, excluded elsewhere.
    use ExUnit.Case, async: false

    alias Edifice.CUDA.FusedScan
    alias ExPhil.Native.{Eager, Ops}

    @cuda {Torchx.Backend, device: :cuda}
    {b, t, h} = {2, 33, 64}
    @seq {b, t, h}
    # |ours - edifice| <= atol * max|edifice| + rtol * |edifice|, f32
    @atol 2.0e-4
    @rtol 2.0e-4

    setup do
      Nx.default_backend(@cuda)
      System.put_env("EDIFICE_AUTOTUNE", "0")
      test = self()
      id = {__MODULE__, make_ref()}
      :ok = :telemetry.attach(id, Eager.call_event(), &__MODULE__.relay/4, test)
      on_exit(fn -> :telemetry.detach(id) end)
      :ok
    end

    def relay(_event, _measurements, metadata, test) do
      if self() == test, do: send(test, {:native_call, metadata.op})
    end

    defp native_ops(acc \\ []) do
      receive do
        {:native_call, op} -> native_ops([op | acc])
      after
        0 -> Enum.uniq(acc)
      end
    end

    defp random(shape, seed, {lo, hi} \\ {-2.0, 2.0}) do
      Nx.with_default_backend(Nx.BinaryBackend, fn ->
        {u, _} = Nx.Random.uniform(Nx.Random.key(seed), lo, hi, shape: shape, type: :f32)
        u
      end)
      |> Nx.backend_transfer(@cuda)
    end

    # Output and the gradients of sum(output * weights) into every input,
    # under Nx.Defn.Evaluator on the inputs' backend.
    defp value_and_grads(fun, inputs, weights) do
      Nx.Defn.jit(
        fn inputs, weights ->
          Nx.Defn.value_and_grad(inputs, fn inputs ->
            inputs |> Tuple.to_list() |> then(&apply(fun, &1)) |> Nx.multiply(weights) |> Nx.sum()
          end)
          |> then(fn {_, grads} -> {apply(fun, Tuple.to_list(inputs)), grads} end)
        end,
        compiler: Nx.Defn.Evaluator
      ).(List.to_tuple(inputs), weights)
    end

    defp assert_close(name, got, want) do
      got = Nx.backend_transfer(got, Nx.BinaryBackend)
      want = Nx.backend_transfer(want, Nx.BinaryBackend)
      assert Nx.shape(got) == Nx.shape(want), "#{name}: shape"
      scale = want |> Nx.abs() |> Nx.reduce_max() |> Nx.to_number()
      err = Nx.subtract(got, want) |> Nx.abs()
      bound = Nx.add(@atol * max(scale, 1.0e-30), Nx.multiply(@rtol, Nx.abs(want)))
      worst = Nx.subtract(err, bound) |> Nx.reduce_max() |> Nx.to_number()
      assert worst <= 0, "#{name}: off by #{Nx.to_number(Nx.reduce_max(err))} (scale #{scale})"
    end

    defp check(name, edifice, ours, inputs, op, out_shape \\ @seq) do
      weights = random(out_shape, 99, {-1.0, 1.0})
      {want, want_grads} = value_and_grads(edifice, inputs, weights)
      native_ops()
      {got, got_grads} = value_and_grads(ours, inputs, weights)
      assert op in native_ops(), "#{name}: our op did not take the NIF"
      assert_close("#{name} output", got, want)

      for {g, w, i} <- Enum.zip([Tuple.to_list(got_grads), Tuple.to_list(want_grads), 0..9]) do
        assert_close("#{name} gradient #{i}", g, w)
      end
    end

    @tag :torchx
    test "MinGRU and Real-GRU: Edifice's mingru/2 and real_gru/2 against min_gru" do
      inputs = [random(@seq, 1), random(@seq, 2)]
      ours = fn g, c -> Ops.min_gru(g, c) end
      check("mingru", &FusedScan.mingru/2, ours, inputs, :min_gru)
      check("real_gru", &FusedScan.real_gru/2, ours, inputs, :min_gru)
    end

    @tag :torchx
    test "MinLSTM: Edifice's minlstm/3 against min_lstm" do
      inputs = [random(@seq, 3), random(@seq, 4), random(@seq, 5)]

      check(
        "minlstm",
        &FusedScan.minlstm/3,
        fn f, i, c -> Ops.min_lstm(f, i, c) end,
        inputs,
        :min_lstm
      )
    end

    @tag :torchx
    test "liquid and the linear scan: Edifice's liquid/2 and linear_scan/2 against ours" do
      tau_target = [random(@seq, 6, {0.5, 5.0}), random(@seq, 7)]
      check("liquid", &FusedScan.liquid/2, fn t, a -> Ops.liquid(t, a) end, tau_target, :liquid)
      a_b = [random(@seq, 8, {0.5, 1.0}), random(@seq, 9)]

      check(
        "linear_scan",
        &FusedScan.linear_scan/2,
        fn a, b -> Ops.linear_scan(a, b) end,
        a_b,
        :linear_scan
      )
    end

    @tag :torchx
    test "flash attention, causal or not: Edifice's flash_attention/4 against attention" do
      shape = {2, 4, 40, 64}
      qkv = [random(shape, 10), random(shape, 11), random(shape, 12)]

      for causal <- [false, true] do
        edifice = fn q, k, v -> FusedScan.flash_attention(q, k, v, causal: causal) end

        ours = fn q, k, v ->
          Ops.attention(q, k, v, mask: if(causal, do: :causal, else: :none))
        end

        check("flash_attention causal=#{causal}", edifice, ours, qkv, :attention, shape)
      end
    end
  end
end
