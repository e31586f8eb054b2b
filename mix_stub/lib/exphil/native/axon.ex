if Code.ensure_loaded?(Axon) do
  defmodule ExPhil.Native.Axon do
    @moduledoc """
    Axon layers around `ExPhil.Native.Ops`: MinGRU, MinLSTM, liquid cells,
    Mamba blocks, multi-head attention, and Axon's own GRU and LSTM, fused CUDA kernels under EXLA on
    CUDA and pure Nx elsewhere. Compiled only when Axon is present.

        input = Axon.input("frames", shape: {nil, 60, 32})

        model =
          input
          |> ExPhil.Native.Axon.mamba(state_size: 16, name: "mamba")
          |> ExPhil.Native.Axon.attention(num_heads: 4, head_size: 32, causal: true, window: 16)
          |> ExPhil.Native.Axon.min_gru(64, name: "min_gru")
          |> Axon.nx(fn sequence -> sequence[[.., -1, ..]] end)
          |> Axon.dense(8)

        {init_fn, predict_fn} = Axon.build(model)
        params = init_fn.(Nx.template({1, 60, 32}, :f32), Axon.ModelState.empty())

    Every layer takes a sequence `{batch, steps, features}` and is one Axon
    node (like `Axon.lstm/3`'s cell): its parameters sit under the layer's
    name, e.g. `params.data["min_gru"]["gate_kernel"]`. Its function is the
    same-named one in `ExPhil.Native.Axon.Layers`, usable inside `defn` with
    parameters of your own.

    `gru/3` and `lstm/3` are `Axon.gru/3` and `Axon.lstm/3` themselves, the
    same graph, options, parameters and result, with the recurrent node's
    function swapped for the fused GRU or LSTM (`Ops.gru/3`, `Ops.lstm/3`):
    a model's parameters load unchanged from one built with Axon's layers.
    `gru_stack/3` and `lstm_stack/3` run 2 to 4 such layers, each on the
    sequence of the one below, as one node (`Ops.gru_stack/4`,
    `Ops.lstm_stack/4`: one launch up to batch 4), each layer's Axon parameters
    under its index.

    ## Common options

      * `:name` - the layer's name (default `"<layer>_<n>"`, e.g. `"min_gru_0"`)
      * `:kernel_initializer` - initializer of every `*_kernel` parameter
        (default `:glorot_uniform`)
      * `:bias_initializer` - initializer of every `*_bias` parameter, except
        Mamba's `"dt_bias"` (default `:zeros`)

    An initializer is one of `Axon.Initializers`' names (`:zeros`,
    `:glorot_uniform`, ...) or a function `(shape, type)` or
    `(shape, type, key)` returning the tensor, as Axon's layers take them.

    The recurrent layers (`min_gru/3`, `min_lstm/3`, `liquid/3`, `mamba/2`)
    also take:

      * `:initial_state` - an Axon node giving the initial state `h0`
        (`{batch, units}`; `{batch, inner, state_size}` for `mamba/2`);
        default: zeros
      * `:return_state` - when `true`, the layer's output is the container
        `{sequence, final_state}`, `final_state` f32 under Axon's default
        policy; take either part with `Axon.nx(layer, &elem(&1, 1))`
        (default `false`: the sequence only)

    A bad option raises `ArgumentError` naming the option, what was
    expected and what was given.
    """

    alias ExPhil.Native.Axon.Layers
    alias ExPhil.Native.Ops.Args

    # Axon.param takes these names (Axon's own list, which it does not export).
    @initializers [
      :zeros,
      :ones,
      :uniform,
      :normal,
      :identity,
      :lecun_uniform,
      :lecun_normal,
      :he_uniform,
      :he_normal,
      :glorot_uniform,
      :glorot_normal,
      :variance_scaling
    ]

    @common_options [name: nil, kernel_initializer: :glorot_uniform, bias_initializer: :zeros]
    @recurrent_options @common_options ++ [initial_state: nil, return_state: false]

    # Mamba's dt initialisation range (mamba_simple.py's dt_min, dt_max, dt_init_floor).
    @dt_min 1.0e-3
    @dt_max 1.0e-1
    @dt_floor 1.0e-4

    @doc """
    A MinGRU layer: `Ops.min_gru/3` over two projections of `input`.

        gate      = input · gate_kernel + gate_bias
        candidate = input · candidate_kernel + candidate_bias
        h_t       = (1 - sigmoid(gate_t)) h_{t-1} + sigmoid(gate_t) candidate_t

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `units` - the width of the state, a positive integer
      * `opts` - see "Common options" in the moduledoc, with the recurrent ones

    ## Parameters

      * `"gate_kernel"`, `"candidate_kernel"` - `{features, units}`
      * `"gate_bias"`, `"candidate_bias"` - `{units}`

    Output: `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}`. Runs `ExPhil.Native.Axon.Layers.min_gru/6`.
    """
    def min_gru(input, units, opts \\ []) do
      scan_layer(:min_gru, input, units, opts, ~w(gate candidate), &Layers.min_gru/6)
    end

    @doc """
    A MinLSTM layer: `Ops.min_lstm/4` over three projections of `input`.

        forget     = input · forget_kernel + forget_bias
        input_gate = input · input_kernel + input_bias
        candidate  = input · candidate_kernel + candidate_bias

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `units` - the width of the state, a positive integer
      * `opts` - see "Common options" in the moduledoc, with the recurrent ones

    ## Parameters

      * `"forget_kernel"`, `"input_kernel"`, `"candidate_kernel"` - `{features, units}`
      * `"forget_bias"`, `"input_bias"`, `"candidate_bias"` - `{units}`

    Output: `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}`. Runs `ExPhil.Native.Axon.Layers.min_lstm/8`.
    """
    def min_lstm(input, units, opts \\ []) do
      scan_layer(:min_lstm, input, units, opts, ~w(forget input candidate), &Layers.min_lstm/8)
    end

    @doc """
    A liquid (closed-form continuous-time) layer: `Ops.liquid/3` over two
    projections of `input`.

        tau    = softplus(input · tau_kernel + tau_bias) + min_tau
        target = input · target_kernel + target_bias
        h_t    = target_t + (h_{t-1} - target_t) exp(-1 / tau_t)

    softplus keeps `tau > 0` with a gradient everywhere; the floor
    `:min_tau` keeps `1 / tau` finite where softplus underflows. With the
    default zero bias, `tau` starts near `softplus(0) = 0.69`: a state that
    keeps about a fifth of itself per step.

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `units` - the width of the state, a positive integer
      * `opts` - `:min_tau` (a positive number, default `1.0e-2`), and see
        "Common options" in the moduledoc, with the recurrent ones

    ## Parameters

      * `"tau_kernel"`, `"target_kernel"` - `{features, units}`
      * `"tau_bias"`, `"target_bias"` - `{units}`

    Output: `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}`. Runs `ExPhil.Native.Axon.Layers.liquid/6`.
    """
    def liquid(input, units, opts \\ []) do
      scan_layer(:liquid, input, units, opts, ~w(tau target), &Layers.liquid/6, min_tau: 1.0e-2)
    end

    @doc """
    A Mamba block (Gu and Dao, 2023; the block of `mamba_simple.py`, without
    the residual and the norm around it) on `Ops.selective_scan/6`:

        [x, z]     = input · in_proj_kernel
        x          = silu(causal depthwise conv1d of x over time + conv_bias)
        [dt, B, C] = x · x_proj_kernel
        y          = selective_scan(x, dt · dt_proj_kernel, A = -exp(a_log), B, C,
                                    dt_bias, D = d, gate z, softplus on dt)
        output     = y · out_proj_kernel

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `opts`:
        * `:state_size` - `N`, states per channel (default `16`)
        * `:expand` - the inner width's factor: `inner = expand * features` (default `2`)
        * `:conv_size` - the convolution's width in steps (default `4`)
        * `:dt_rank` - the width of dt's low-rank projection (default
          `ceil(features / 16)`)
        * and see "Common options" in the moduledoc, with the recurrent ones

    ## Parameters

      * `"in_proj_kernel"` - `{features, 2 * inner}` (x, then z; no bias)
      * `"conv_kernel"` - `{conv_size, inner}` (`[conv_size - 1]` weighs the
        current step), `"conv_bias"` - `{inner}`
      * `"x_proj_kernel"` - `{inner, dt_rank + 2 * N}` (dt, then B, then C; no bias)
      * `"dt_proj_kernel"` - `{dt_rank, inner}`
      * `"dt_bias"` - `{inner}`, initialised as Mamba does: `softplus⁻¹(dt)`
        with `dt` log-uniform in [0.001, 0.1], so that the first steps' `dt`
        spread over time scales (not `:bias_initializer`)
      * `"a_log"` - `{inner, N}`, initialised to `log(1..N)` in every channel
        (`A = -exp(a_log)`, S4D-real)
      * `"d"` - `{inner}`, the skip term, initialised to ones
      * `"out_proj_kernel"` - `{inner, features}` (no bias)

    Output: `{batch, steps, features}`, or `{sequence, final_state}` with
    `final_state` the scan's `{batch, inner, N}`. The state does not include
    the convolution's last `conv_size - 1` inputs: a sequence continued from
    `:initial_state` starts its convolution from zeros, so it is not the
    exact continuation of the sequence that gave the state. Runs
    `ExPhil.Native.Axon.Layers.mamba/11`.
    """
    def mamba(input, opts \\ []) do
      fun = "ExPhil.Native.Axon.mamba/2"
      input!(fun, input)

      opts =
        Args.options!(
          fun,
          opts,
          @recurrent_options ++ [state_size: 16, expand: 2, conv_size: 4, dt_rank: nil]
        )

      recurrent_options!(fun, opts)
      state_size = positive_integer!(fun, "option :state_size", opts[:state_size])
      expand = positive_integer!(fun, "option :expand", opts[:expand])
      conv_size = positive_integer!(fun, "option :conv_size", opts[:conv_size])

      dt_rank =
        case opts[:dt_rank] do
          nil ->
            &ceil(&1 / 16)

          rank when is_integer(rank) and rank > 0 ->
            fn _features -> rank end

          other ->
            raise ArgumentError,
                  "#{fun}: option :dt_rank expected nil or a positive integer, got: #{inspect(other)}"
        end

      inputs = layer_inputs(input, opts)
      inputs_count = length(inputs)
      kernel = &features_param(&1, inputs_count, &2, opts[:kernel_initializer])
      inner = &(expand * &1)

      params = [
        kernel.("in_proj_kernel", &{&1, 2 * inner.(&1)}),
        kernel.("conv_kernel", &{conv_size, inner.(&1)}),
        features_param("conv_bias", inputs_count, &{inner.(&1)}, opts[:bias_initializer]),
        kernel.("x_proj_kernel", &{inner.(&1), dt_rank.(&1) + 2 * state_size}),
        kernel.("dt_proj_kernel", &{dt_rank.(&1), inner.(&1)}),
        features_param("dt_bias", inputs_count, &{inner.(&1)}, &dt_bias_initializer/3),
        features_param("a_log", inputs_count, &{inner.(&1), state_size}, &a_log_initializer/2),
        features_param("d", inputs_count, &{inner.(&1)}, :ones),
        kernel.("out_proj_kernel", &{inner.(&1), &1})
      ]

      Axon.layer(
        layer_function(&Layers.mamba/11, opts[:initial_state], length(params)),
        inputs ++ params,
        name: opts[:name],
        op_name: :mamba,
        return_state: opts[:return_state]
      )
    end

    @doc """
    Multi-head self-attention with grouped-query heads on `Ops.attention/4`:
    projections of `input` to `num_heads` query heads and `num_kv_heads` key
    and value heads of `head_size`, attention, and an output projection back
    to `features`.

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `opts`:
        * `:num_heads` - query heads, a positive integer (required)
        * `:head_size` - each head's width, a positive integer (required;
          the CUDA kernels take 32, 64, 96 and 128, other widths run the
          pure-Nx attention)
        * `:num_kv_heads` - key and value heads, dividing `:num_heads`
          (default `:num_heads`; fewer is grouped-query attention)
        * `:causal` - step `t` attends to steps `<= t` only (default `false`)
        * `:window` - a positive integer: step `t` attends to steps
          `t - window + 1 .. t` only; needs `causal: true` (default `nil`)
        * and `:name`, `:kernel_initializer`, `:bias_initializer` (see
          "Common options" in the moduledoc)

    ## Parameters

    With `q_width = num_heads * head_size` and `kv_width = num_kv_heads * head_size`:

      * `"query_kernel"` - `{features, q_width}`, `"query_bias"` - `{q_width}`
      * `"key_kernel"`, `"value_kernel"` - `{features, kv_width}`
      * `"key_bias"`, `"value_bias"` - `{kv_width}`
      * `"output_kernel"` - `{q_width, features}`, `"output_bias"` - `{features}`

    Output: `{batch, steps, features}`. Runs
    `ExPhil.Native.Axon.Layers.attention/10`.
    """
    def attention(input, opts \\ []) do
      fun = "ExPhil.Native.Axon.attention/2"
      input!(fun, input)

      opts =
        Args.options!(
          fun,
          opts,
          @common_options ++
            [num_heads: nil, head_size: nil, num_kv_heads: nil, causal: false, window: nil]
        )

      common_options!(fun, opts)
      num_heads = positive_integer!(fun, "option :num_heads", opts[:num_heads])
      head_size = positive_integer!(fun, "option :head_size", opts[:head_size])
      num_kv_heads = opts[:num_kv_heads] || num_heads

      unless is_integer(num_kv_heads) and num_kv_heads > 0 and rem(num_heads, num_kv_heads) == 0 do
        raise ArgumentError,
              "#{fun}: option :num_kv_heads expected a positive integer dividing " <>
                "num_heads (#{num_heads}), got: #{inspect(opts[:num_kv_heads])}"
      end

      causal = boolean!(fun, "option :causal", opts[:causal])

      case opts[:window] do
        nil ->
          :ok

        window when is_integer(window) and window > 0 and causal ->
          :ok

        window when is_integer(window) and window > 0 ->
          raise ArgumentError,
                "#{fun}: option :window expected causal: true (a window looks back only), " <>
                  "got: window: #{window} with causal: false"

        window ->
          raise ArgumentError,
                "#{fun}: option :window expected nil or a positive integer, got: #{inspect(window)}"
      end

      q_width = num_heads * head_size
      kv_width = num_kv_heads * head_size
      kernel = &features_param(&1, 1, &2, opts[:kernel_initializer])
      bias = &Axon.param(&1, &2, initializer: opts[:bias_initializer])

      params = [
        kernel.("query_kernel", &{&1, q_width}),
        bias.("query_bias", {q_width}),
        kernel.("key_kernel", &{&1, kv_width}),
        bias.("key_bias", {kv_width}),
        kernel.("value_kernel", &{&1, kv_width}),
        bias.("value_bias", {kv_width}),
        kernel.("output_kernel", &{q_width, &1}),
        features_param("output_bias", 1, &{&1}, opts[:bias_initializer])
      ]

      Axon.layer(&Layers.attention/10, [input | params],
        name: opts[:name],
        op_name: :attention,
        num_heads: num_heads,
        num_kv_heads: num_kv_heads,
        causal: causal,
        window: opts[:window]
      )
    end

    # Axon.gru's and Axon.lstm's options, with their defaults (the mask's is
    # an Axon constant, nil here: the options given go to Axon as they are).
    @axon_rnn_options [
      name: nil,
      meta: nil,
      mask: nil,
      activation: :tanh,
      gate: :sigmoid,
      unroll: :dynamic,
      use_bias: true,
      kernel_initializer: :glorot_uniform,
      bias_initializer: :zeros
    ]

    @doc """
    `Axon.gru/2,3,4` on the fused GRU (`Ops.gru/3`): the same arguments,
    options, parameters and result, so that the parameters of a model built
    with `Axon.gru` load unchanged into one built with this (and back).

        {sequence, {hidden}} = ExPhil.Native.Axon.gru(input, 128, name: "gru")

    The graph is Axon's own, parameter for parameter: `"input_kernel"`
    (`"wir"`, `"wiz"`, `"win"`, each `{features, units}`), `"hidden_kernel"`
    (`"whr"`, `"whz"`, `"whn"`, each `{units, units}`), `"bias"` (`"br"`,
    `"bz"`, `"bin"`, `"bhn"`, each `{units}`) under the layer's name, and the
    random initial state of `gru/3` with its `"key"`. Only the layer's
    function differs: `ExPhil.Native.Axon.Layers.gru/7`, which runs the whole
    sequence in one call of the fused kernel (`:unroll` is ignored there).
    Layers with a `:mask`, or a `:gate` other than `:sigmoid` or an
    `:activation` other than `:tanh`, run Axon's `gru_cell` as `Axon.gru`
    does.

    ## Arguments

      * `input` - an Axon node `{batch, steps, features}`
      * `units` - the width of the state, a positive integer; or, in
        `gru/4` (and `gru/3` without options), `hidden_state` `{h}` before it,
        the initial state as an Axon node `{batch, units}`
      * `opts` - Axon's: `:name`, `:meta`, `:mask`, `:activation`, `:gate`,
        `:unroll`, `:use_bias`, `:kernel_initializer`, `:bias_initializer`;
        and without a hidden state, `:recurrent_initializer` and `:seed`;
        and the fused op's `:precision` (`:exact`, the default, or `:tf32`:
        `ExPhil.Native.Ops.gru/3`), kept in the node's options

    Returns `{sequence, {new_hidden}}`, Axon nodes `{batch, steps, units}` and
    `{batch, units}`.
    """
    def gru(input, units, opts \\ [])

    def gru(input, {%Axon{}} = hidden_state, units) when is_integer(units),
      do: gru(input, hidden_state, units, [])

    def gru(input, units, opts), do: axon_rnn(:gru, input, nil, units, opts)

    @doc """
    `Axon.gru/4`: the GRU of `gru/3` from the initial state `{h}`.
    """
    def gru(input, hidden_state, units, opts),
      do: axon_rnn(:gru, input, hidden_state, units, opts)

    @doc """
    `Axon.lstm/2,3,4` on the fused LSTM (`Ops.lstm/3`), as `gru/3` is
    `Axon.gru`'s: the same arguments, options, parameters (`"input_kernel"`:
    `"wii"`, `"wif"`, `"wig"`, `"wio"`; `"hidden_kernel"`: `"whi"`, `"whf"`,
    `"whg"`, `"who"`; `"bias"`: `"bi"`, `"bf"`, `"bg"`, `"bo"`) and result,
    `{sequence, {new_cell, new_hidden}}`, the carry in Axon's order `{c, h}`.
    The layer's function is `ExPhil.Native.Axon.Layers.lstm/7`. `lstm/4`
    takes the initial state `{c, h}` before `units`.
    """
    def lstm(input, units, opts \\ [])

    def lstm(input, {%Axon{}, %Axon{}} = hidden_state, units) when is_integer(units),
      do: lstm(input, hidden_state, units, [])

    def lstm(input, units, opts), do: axon_rnn(:lstm, input, nil, units, opts)

    @doc """
    `Axon.lstm/4`: the LSTM of `lstm/3` from the initial state `{c, h}`.
    """
    def lstm(input, hidden_state, units, opts),
      do: axon_rnn(:lstm, input, hidden_state, units, opts)

    # Axon's layer, then its recurrent node's function swapped for ours (of
    # the same arity: Axon leaves the bias out with use_bias: false). Every
    # node Axon returns holds that node, and gets the same swap.
    defp axon_rnn(cell, input, hidden_state, units, opts) do
      arity = if hidden_state, do: 4, else: 3
      fun = "ExPhil.Native.Axon.#{cell}/#{arity}"
      input!(fun, input)
      units = positive_integer!(fun, "argument 'units'", units)

      allowed =
        if hidden_state,
          do: @axon_rnn_options,
          else: @axon_rnn_options ++ [recurrent_initializer: :glorot_uniform, seed: nil]

      # :precision is the fused op's (Ops.gru/3), not Axon's: it goes to the
      # node's options, the rest to Axon as given.
      checked = Args.options!(fun, opts, allowed ++ [precision: :exact])
      common_options!(fun, checked)
      precision = Args.precision!(fun, checked[:precision])
      opts = Keyword.delete(opts, :precision)

      if Keyword.has_key?(opts, :recurrent_initializer),
        do: initializer!(fun, :recurrent_initializer, checked[:recurrent_initializer])

      {sequence, state} =
        case {cell, hidden_state} do
          {_, nil} ->
            apply(Axon, cell, [input, units, opts])

          {:gru, {%Axon{}}} ->
            Axon.gru(input, hidden_state, units, opts)

          {:lstm, {%Axon{}, %Axon{}}} ->
            Axon.lstm(input, hidden_state, units, opts)

          _ ->
            shape = if cell == :gru, do: "{h}", else: "{c, h}"

            raise ArgumentError,
                  "#{fun}: argument 'hidden_state' expected #{shape}, Axon nodes, " <>
                    "got: #{inspect(hidden_state)}"
        end

      %Axon{output: sequence_id, nodes: nodes} = sequence
      [rnn_id] = nodes[sequence_id].parent
      op = Function.capture(Layers, cell, length(nodes[rnn_id].args) + 1)

      swap = fn %Axon{nodes: nodes} = axon ->
        node = &%{&1 | op: op, opts: Keyword.put(&1.opts, :precision, precision)}
        %{axon | nodes: Map.update!(nodes, rnn_id, node)}
      end

      {swap.(sequence), state |> Tuple.to_list() |> Enum.map(swap) |> List.to_tuple()}
    end

    @doc """
    Stacked GRU layers in one node on `Ops.gru_stack/4`: `:layers` (2 to 4)
    layers of `units`, each with `Axon.gru`'s parameters under the layer's
    name, suffixed by the layer's index: `"input_kernel_0"` (`"wir"`,
    `"wiz"`, `"win"`, `{features, units}`; `{units, units}` above layer 0),
    `"hidden_kernel_0"` (`"whr"`, `"whz"`, `"whn"`), `"bias_0"` (`"br"`,
    `"bz"`, `"bin"`, `"bhn"`), then `"..._1"`, and so on. The same model
    built as a chain of `Axon.gru` layers (each on the sequence of the one
    before) computes the same, its layer `l`'s parameters under these
    `_l` names. Up to batch 4 the kernels run every layer in one launch
    each way.

        sequence = ExPhil.Native.Axon.gru_stack(input, 256, layers: 2, name: "gru")

    Options: `:layers` (default 2), `:precision` (`:exact`, the default, or
    `:tf32`: `ExPhil.Native.Ops.gru/3`), the common options, and the recurrent
    ones: `:initial_state` a node `{layers, batch, units}`, `:return_state`
    (then `{sequence, h_final}`, `h_final` `{layers, batch, units}`). The
    layer's function is `ExPhil.Native.Axon.Layers.gru_stack/3`.
    """
    def gru_stack(input, units, opts \\ []), do: stack_layer(:gru, input, units, opts)

    @doc """
    Stacked LSTM layers in one node on `Ops.lstm_stack/4`, as `gru_stack/3`
    stacks GRU layers, each with `Axon.lstm`'s parameters (`"wii"` ... under
    `"input_kernel_l"`, `"whi"` ... under `"hidden_kernel_l"`, `"bi"` ...
    under `"bias_l"`). `:initial_state` is `{c, h}`, two nodes `{layers,
    batch, units}`; with `:return_state` the result is `{sequence, {c_final,
    h_final}}`, Axon's carry order.
    """
    def lstm_stack(input, units, opts \\ []), do: stack_layer(:lstm, input, units, opts)

    @stack_parameters %{
      gru: [
        input_kernel: ~w(wir wiz win),
        hidden_kernel: ~w(whr whz whn),
        bias: ~w(br bz bin bhn)
      ],
      lstm: [
        input_kernel: ~w(wii wif wig wio),
        hidden_kernel: ~w(whi whf whg who),
        bias: ~w(bi bf bg bo)
      ]
    }

    defp stack_layer(cell, input, units, opts) do
      fun = "ExPhil.Native.Axon.#{cell}_stack/3"
      input!(fun, input)
      units = positive_integer!(fun, "argument 'units'", units)
      opts = Args.options!(fun, opts, @recurrent_options ++ [layers: 2, precision: :exact])
      common_options!(fun, opts)
      boolean!(fun, "option :return_state", opts[:return_state])
      Args.precision!(fun, opts[:precision])
      layers = opts[:layers]

      unless layers in 2..4 do
        raise ArgumentError, "#{fun}: option :layers expected 2, 3 or 4, got: #{inspect(layers)}"
      end

      for option <- [:kernel_initializer, :bias_initializer],
          do: initializer!(fun, option, opts[option])

      initial =
        case {cell, opts[:initial_state]} do
          {_, nil} ->
            []

          {:gru, %Axon{} = h0} ->
            [h0]

          {:lstm, {%Axon{} = c0, %Axon{} = h0}} ->
            [c0, h0]

          {_, other} ->
            shape = if cell == :gru, do: "an Axon node", else: "{c, h}, two Axon nodes"

            raise ArgumentError,
                  "#{fun}: option :initial_state expected #{shape}, got: #{inspect(other)}"
        end

      inputs = [input | initial]

      params =
        for l <- 0..(layers - 1),
            {kind, names} <- Map.fetch!(@stack_parameters, cell) do
          initializer =
            if kind == :bias, do: opts[:bias_initializer], else: opts[:kernel_initializer]

          shape = fn input_shape ->
            case kind do
              :input_kernel when l == 0 -> {features(input_shape), units}
              :bias -> {units}
              _kernel -> {units, units}
            end
          end

          Axon.param("#{kind}_#{l}", shape_of_input(length(inputs), shape),
            initializer: per_gate(names, initializer)
          )
        end

      Axon.layer(
        stack_function(length(inputs) + length(params), cell, length(inputs)),
        inputs ++ params,
        name: opts[:name],
        op_name: :"#{cell}_stack",
        return_state: opts[:return_state],
        precision: opts[:precision]
      )
    end

    # A parameter's shape function over the layer's inputs: the first's.
    defp shape_of_input(1, shape), do: shape
    defp shape_of_input(2, shape), do: fn input, _ -> shape.(input) end
    defp shape_of_input(3, shape), do: fn input, _, _ -> shape.(input) end

    # Axon's composite initializer: one tensor per gate, each from its own
    # key, as Axon.gru and Axon.lstm initialise theirs.
    defp per_gate(names, initializer) do
      fn shape, type, key ->
        init =
          if is_atom(initializer),
            do: apply(Axon.Initializers, initializer, []),
            else: initializer

        keys = Nx.Random.split(key, parts: length(names))

        names
        |> Enum.with_index()
        |> Map.new(fn {name, i} ->
          {name,
           if(is_function(init, 2), do: init.(shape, type), else: init.(shape, type, keys[i]))}
        end)
      end
    end

    # Axon calls a layer's function with its inputs and parameters
    # positionally, then its options: the stack's takes the input, the
    # initial states and its layers' parameters in threes.
    for count <- 7..15 do
      args = Macro.generate_arguments(count, __MODULE__)

      defp stack_function(unquote(count), cell, inputs) do
        fn unquote_splicing(args), opts ->
          {[input | initial], params} = Enum.split(unquote(args), inputs)
          layer_params = params |> Enum.chunk_every(3) |> Enum.map(&List.to_tuple/1)

          states =
            case {cell, initial} do
              {_, []} -> []
              {:gru, [h0]} -> [h0: h0]
              {:lstm, [c0, h0]} -> [c0: c0, h0: h0]
            end

          opts = Keyword.take(opts, [:return_state, :mode, :precision]) ++ states
          apply(Layers, :"#{cell}_stack", [input, layer_params, opts])
        end
      end
    end

    # MinGRU, MinLSTM and liquid: a kernel and a bias per projection, then the scan.
    # `extra_options` (defaults) go to the layer function as they are.
    defp scan_layer(op, input, units, opts, projections, layer_fun, extra_options \\ []) do
      fun = "ExPhil.Native.Axon.#{op}/3"
      input!(fun, input)
      units = positive_integer!(fun, "argument 'units'", units)
      opts = Args.options!(fun, opts, @recurrent_options ++ extra_options)
      recurrent_options!(fun, opts)
      layer_opts = Keyword.take(opts, Keyword.keys(extra_options))

      with {:ok, min_tau} <- Keyword.fetch(layer_opts, :min_tau),
           false <- is_number(min_tau) and min_tau > 0 do
        raise ArgumentError,
              "#{fun}: option :min_tau expected a positive number, got: #{inspect(min_tau)}"
      end

      inputs = layer_inputs(input, opts)

      params =
        Enum.flat_map(projections, fn projection ->
          [
            features_param(
              "#{projection}_kernel",
              length(inputs),
              &{&1, units},
              opts[:kernel_initializer]
            ),
            Axon.param("#{projection}_bias", {units}, initializer: opts[:bias_initializer])
          ]
        end)

      Axon.layer(
        layer_function(layer_fun, opts[:initial_state], length(params)),
        inputs ++ params,
        [name: opts[:name], op_name: op, return_state: opts[:return_state]] ++ layer_opts
      )
    end

    defp layer_inputs(input, opts), do: [input | List.wrap(opts[:initial_state])]

    # Axon hands a layer function its inputs positionally; the initial state,
    # an input, becomes the Layers function's :h0 option.
    defp layer_function(layer_fun, nil, _params_count), do: layer_fun

    defp layer_function(layer_fun, %Axon{}, params_count),
      do: taking_h0(layer_fun, params_count)

    for params_count <- [4, 6, 9] do
      params = Macro.generate_arguments(params_count, __MODULE__)

      defp taking_h0(layer_fun, unquote(params_count)) do
        fn input, h0, unquote_splicing(params), opts ->
          layer_fun.(input, unquote_splicing(params), Keyword.put(opts, :h0, h0))
        end
      end
    end

    # A parameter whose shape depends on the input's features: Axon calls its
    # shape function with the shape of every input of the layer, h0's too.
    defp features_param(name, 1, shape, initializer),
      do: Axon.param(name, &shape.(features(&1)), initializer: initializer)

    defp features_param(name, 2, shape, initializer),
      do: Axon.param(name, fn input, _h0 -> shape.(features(input)) end, initializer: initializer)

    defp features(input_shape), do: elem(input_shape, tuple_size(input_shape) - 1)

    defp dt_bias_initializer(shape, type, key) do
      {uniform, _key} = Nx.Random.uniform(key, shape: shape, type: :f32)
      log_min = :math.log(@dt_min)

      dt =
        uniform
        |> Nx.multiply(:math.log(@dt_max) - log_min)
        |> Nx.add(log_min)
        |> Nx.exp()
        |> Nx.max(@dt_floor)

      # softplus⁻¹(dt) = dt + log(1 - exp(-dt)), so softplus(dt_bias) = dt.
      dt
      |> Nx.add(Nx.log(Nx.negate(Nx.expm1(Nx.negate(dt)))))
      |> Nx.as_type(type)
    end

    defp a_log_initializer({_inner, state_size} = shape, type) do
      Nx.iota({1, state_size}, type: :f32)
      |> Nx.add(1)
      |> Nx.log()
      |> Nx.broadcast(shape)
      |> Nx.as_type(type)
    end

    ## Option checks

    defp input!(_fun, %Axon{} = input), do: input

    defp input!(fun, other) do
      raise ArgumentError,
            "#{fun}: argument 'input' expected an Axon node, got: #{inspect(other)}"
    end

    defp common_options!(fun, opts) do
      case opts[:name] do
        nil ->
          :ok

        name when is_binary(name) or is_function(name, 2) ->
          :ok

        other ->
          raise ArgumentError,
                "#{fun}: option :name expected nil, a string or a function of arity 2, " <>
                  "got: #{inspect(other)}"
      end

      initializer!(fun, :kernel_initializer, opts[:kernel_initializer])
      initializer!(fun, :bias_initializer, opts[:bias_initializer])
    end

    defp recurrent_options!(fun, opts) do
      common_options!(fun, opts)
      boolean!(fun, "option :return_state", opts[:return_state])

      case opts[:initial_state] do
        nil ->
          :ok

        %Axon{} ->
          :ok

        other ->
          raise ArgumentError,
                "#{fun}: option :initial_state expected nil or an Axon node, got: #{inspect(other)}"
      end
    end

    defp initializer!(_fun, _option, initializer)
         when initializer in @initializers or is_function(initializer, 2) or
                is_function(initializer, 3),
         do: :ok

    defp initializer!(fun, option, other) do
      raise ArgumentError,
            "#{fun}: option #{inspect(option)} expected one of #{inspect(@initializers)} " <>
              "or a function of arity 2 or 3, got: #{inspect(other)}"
    end

    defp positive_integer!(_fun, _what, value) when is_integer(value) and value > 0, do: value

    defp positive_integer!(fun, what, value) do
      raise ArgumentError, "#{fun}: #{what} expected a positive integer, got: #{inspect(value)}"
    end

    defp boolean!(_fun, _what, value) when is_boolean(value), do: value

    defp boolean!(fun, what, value) do
      raise ArgumentError, "#{fun}: #{what} expected a boolean, got: #{inspect(value)}"
    end
  end
end
