if Code.ensure_loaded?(Axon) do
  defmodule ExPhil.Native.Axon.Layers do
    @moduledoc """
    The functions behind `ExPhil.Native.Axon`'s layers, in the style of
    `Axon.Layers`: tensors in (input first, then the parameters, in the order
    the layer lists them), tensors out, usable inside and outside `defn`.
    `ExPhil.Native.Axon` builds the graph nodes that call them; call them
    directly to run a layer with parameters of your own.

    Every input is `{batch, steps, features}`. A projection is
    `dot(input, kernel) + bias` over the last axis.

    ## Recurrent options

    `min_gru/6`, `min_lstm/8`, `liquid/6` and `mamba/11` take:

      * `:h0` - the initial state (default: zeros): `{batch, units}`, or
        `{batch, inner, state_size}` for `mamba/11`
      * `:return_state` - when `true`, return `{sequence, final_state}`
        (`final_state` f32) instead of the sequence (default `false`)

    `:mode`, which Axon adds to every layer's options, is accepted and
    ignored: no layer here behaves differently in training.
    """

    import Nx.Defn

    alias ExPhil.Native.Ops

    @recurrent_options [h0: nil, return_state: false, mode: :inference]

    @doc """
    MinGRU over projections of `input`: `Ops.min_gru(gate, candidate)` with
    `gate = input · gate_kernel + gate_bias` and `candidate` likewise.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `gate_kernel`, `candidate_kernel` - `{features, units}`
      * `gate_bias`, `candidate_bias` - `{units}`

    ## Options

    See "Recurrent options" in the moduledoc.

    Returns `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}` f32.
    """
    deftransform min_gru(
                   input,
                   gate_kernel,
                   gate_bias,
                   candidate_kernel,
                   candidate_bias,
                   opts \\ []
                 ) do
      opts = options!("min_gru/6", opts, @recurrent_options)
      gate = project(input, gate_kernel, gate_bias)
      candidate = project(input, candidate_kernel, candidate_bias)
      Ops.min_gru(gate, candidate, h0: opts[:h0], final_state: opts[:return_state])
    end

    @doc """
    MinLSTM over projections of `input`: `Ops.min_lstm(forget, input_gate,
    candidate)`, each `input · *_kernel + *_bias`.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `forget_kernel`, `input_kernel`, `candidate_kernel` - `{features, units}`
      * `forget_bias`, `input_bias`, `candidate_bias` - `{units}`

    ## Options

    See "Recurrent options" in the moduledoc.

    Returns `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}` f32.
    """
    deftransform min_lstm(
                   input,
                   forget_kernel,
                   forget_bias,
                   input_kernel,
                   input_bias,
                   candidate_kernel,
                   candidate_bias,
                   opts \\ []
                 ) do
      opts = options!("min_lstm/8", opts, @recurrent_options)
      forget = project(input, forget_kernel, forget_bias)
      input_gate = project(input, input_kernel, input_bias)
      candidate = project(input, candidate_kernel, candidate_bias)

      Ops.min_lstm(forget, input_gate, candidate,
        h0: opts[:h0],
        final_state: opts[:return_state]
      )
    end

    @doc """
    Liquid (closed-form continuous-time) cell over projections of `input`:
    `Ops.liquid(tau, target)` with

        tau    = softplus(input · tau_kernel + tau_bias) + min_tau
        target = input · target_kernel + target_bias

    softplus keeps `tau` positive and smooth in its pre-activation; the floor
    `min_tau` keeps `1 / tau` (and its gradient, `1 / tau^2`) finite where
    softplus underflows to zero.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `tau_kernel`, `target_kernel` - `{features, units}`
      * `tau_bias`, `target_bias` - `{units}`

    ## Options

      * `:min_tau` - the floor added to `tau`, a positive number (default `1.0e-2`)

    and the recurrent options of the moduledoc.

    Returns `{batch, steps, units}`, or `{sequence, final_state}` with
    `final_state` `{batch, units}` f32.
    """
    deftransform liquid(input, tau_kernel, tau_bias, target_kernel, target_bias, opts \\ []) do
      opts = options!("liquid/6", opts, [min_tau: 1.0e-2] ++ @recurrent_options)
      tau = liquid_tau(project(input, tau_kernel, tau_bias), opts[:min_tau])
      target = project(input, target_kernel, target_bias)
      Ops.liquid(tau, target, h0: opts[:h0], final_state: opts[:return_state])
    end

    defnp(liquid_tau(pre_tau, min_tau), do: Axon.Activations.softplus(pre_tau) + min_tau)

    @doc """
    A Mamba block (Gu and Dao, 2023, as `mamba_simple.py` writes it) around
    `Ops.selective_scan`:

        [x, z]      = input · in_proj_kernel                  (split in halves)
        x           = silu(causal_depthwise_conv(x) + conv_bias)
        [dt, b, c]  = x · x_proj_kernel                       (dt_rank, N, N)
        y           = selective_scan(x, dt · dt_proj_kernel, -exp(a_log), b, c,
                                     dt_bias: dt_bias, d: d, z: z, softplus: true)
        output      = y · out_proj_kernel

    The convolution is causal: step `t` sees steps `t - conv_size + 1 .. t`
    (zeros before the first), `conv_kernel[conv_size - 1]` weighing step `t`
    itself, as PyTorch's `Conv1d(padding=conv_size - 1)` truncated to the
    first `steps` outputs.

    ## Parameter shapes

    With `inner = expand * features`, `N = state_size`:

      * `input` - `{batch, steps, features}`
      * `in_proj_kernel` - `{features, 2 * inner}` (x, then z)
      * `conv_kernel` - `{conv_size, inner}`
      * `conv_bias` - `{inner}`
      * `x_proj_kernel` - `{inner, dt_rank + 2 * N}` (dt, then B, then C)
      * `dt_proj_kernel` - `{dt_rank, inner}`
      * `dt_bias` - `{inner}`
      * `a_log` - `{inner, N}`
      * `d` - `{inner}`
      * `out_proj_kernel` - `{inner, features_out}`

    ## Options

    The recurrent options of the moduledoc; `:h0` and the final state are
    the scan's `{batch, inner, N}` only (see `ExPhil.Native.Axon.mamba/2`).

    Returns `{batch, steps, features_out}`, or `{sequence, final_state}` with
    `final_state` `{batch, inner, N}` f32.
    """
    deftransform mamba(
                   input,
                   in_proj_kernel,
                   conv_kernel,
                   conv_bias,
                   x_proj_kernel,
                   dt_proj_kernel,
                   dt_bias,
                   a_log,
                   d,
                   out_proj_kernel,
                   opts \\ []
                 ) do
      opts = options!("mamba/11", opts, @recurrent_options)
      {inner, state_size} = Nx.shape(a_log)
      dt_rank = Nx.axis_size(dt_proj_kernel, 0)

      xz = Nx.dot(input, [2], in_proj_kernel, [0])
      x = Nx.slice_along_axis(xz, 0, inner, axis: 2)
      z = Nx.slice_along_axis(xz, inner, inner, axis: 2)
      x = Axon.Activations.silu(causal_depthwise_conv(x, conv_kernel, conv_bias))

      dt_b_c = Nx.dot(x, [2], x_proj_kernel, [0])
      dt = Nx.slice_along_axis(dt_b_c, 0, dt_rank, axis: 2)
      b = Nx.slice_along_axis(dt_b_c, dt_rank, state_size, axis: 2)
      c = Nx.slice_along_axis(dt_b_c, dt_rank + state_size, state_size, axis: 2)
      dt = Nx.dot(dt, [2], dt_proj_kernel, [0])
      a = Nx.negate(Nx.exp(a_log))

      scanned =
        Ops.selective_scan(x, dt, a, b, c,
          dt_bias: dt_bias,
          d: d,
          z: z,
          softplus: true,
          h0: opts[:h0],
          final_state: opts[:return_state]
        )

      case scanned do
        {y, final_state} -> {Nx.dot(y, [2], out_proj_kernel, [0]), final_state}
        y -> Nx.dot(y, [2], out_proj_kernel, [0])
      end
    end

    # A sum of conv_size shifted copies: for Mamba's kernel of 4 this is
    # cheaper on every backend than a grouped Nx.conv with one group per channel.
    deftransformp causal_depthwise_conv(x, kernel, bias) do
      {_batch, steps, _channels} = Nx.shape(x)
      conv_size = Nx.axis_size(kernel, 0)
      padded = Nx.pad(x, 0, [{0, 0, 0}, {conv_size - 1, 0, 0}, {0, 0, 0}])

      Enum.reduce(0..(conv_size - 1), bias, fn tap, sum ->
        shifted = Nx.slice_along_axis(padded, tap, steps, axis: 1)
        Nx.add(sum, Nx.multiply(shifted, kernel[tap]))
      end)
    end

    @doc """
    Multi-head self-attention with grouped-query heads around `Ops.attention`
    (layout `:bthd`, so the projections' `{batch, steps, heads * head_size}`
    reshape to the kernel's layout without a transpose):

        q = input · query_kernel + query_bias    (num_heads heads)
        k = input · key_kernel + key_bias        (num_kv_heads heads)
        v = input · value_kernel + value_bias    (num_kv_heads heads)
        output = attention(q, k, v) · output_kernel + output_bias

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `query_kernel` - `{features, num_heads * head_size}`, `query_bias` - `{num_heads * head_size}`
      * `key_kernel`, `value_kernel` - `{features, num_kv_heads * head_size}`
      * `key_bias`, `value_bias` - `{num_kv_heads * head_size}`
      * `output_kernel` - `{num_heads * head_size, features_out}`, `output_bias` - `{features_out}`

    ## Options

      * `:num_heads` - query heads (required); `head_size` is the query
        kernel's width over it
      * `:num_kv_heads` - key and value heads, dividing `:num_heads`
        (default `:num_heads`)
      * `:causal` - step `t` attends to steps `<= t` only (default `false`)
      * `:window` - with `causal: true`, step `t` attends to the last
        `:window` steps `<= t` only (default `nil`: no window)

    Returns `{batch, steps, features_out}`.
    """
    deftransform attention(
                   input,
                   query_kernel,
                   query_bias,
                   key_kernel,
                   key_bias,
                   value_kernel,
                   value_bias,
                   output_kernel,
                   output_bias,
                   opts \\ []
                 ) do
      opts =
        options!("attention/10", opts,
          num_heads: nil,
          num_kv_heads: nil,
          causal: false,
          window: nil,
          mode: :inference
        )

      num_heads = opts[:num_heads]

      unless is_integer(num_heads) and num_heads > 0 and
               rem(Nx.axis_size(query_kernel, 1), num_heads) == 0 do
        raise ArgumentError,
              "ExPhil.Native.Axon.Layers.attention/10: option :num_heads expected a positive " <>
                "integer dividing the query kernel's #{Nx.axis_size(query_kernel, 1)} columns, " <>
                "got: #{inspect(num_heads)}"
      end

      num_kv_heads = opts[:num_kv_heads] || num_heads
      {batch, steps, _features} = Nx.shape(input)
      head_size = div(Nx.axis_size(query_kernel, 1), num_heads)

      heads = fn kernel, bias, count ->
        input
        |> project(kernel, bias)
        |> Nx.reshape({batch, steps, count, head_size})
      end

      mask_opts =
        case {opts[:causal], opts[:window]} do
          {false, nil} ->
            [mask: :none]

          {true, nil} ->
            [mask: :causal]

          {true, window} ->
            [mask: :window, window: window]

          {causal, window} ->
            raise ArgumentError,
                  "ExPhil.Native.Axon.Layers.attention/10: options :causal and :window expected " <>
                    "a boolean and nil, or true and a window, got: causal: #{inspect(causal)}, " <>
                    "window: #{inspect(window)}"
        end

      Ops.attention(
        heads.(query_kernel, query_bias, num_heads),
        heads.(key_kernel, key_bias, num_kv_heads),
        heads.(value_kernel, value_bias, num_kv_heads),
        [layout: :bthd] ++ mask_opts
      )
      |> Nx.reshape({batch, steps, num_heads * head_size})
      |> project(output_kernel, output_bias)
    end

    # Axon's default bias of a layer built with use_bias: false.
    @axon_zero_bias %{
      gru: %{"br" => 0, "bz" => 0, "bin" => 0, "bhn" => 0},
      lstm: %{"bi" => 0, "bf" => 0, "bg" => 0, "bo" => 0}
    }

    @doc """
    `Axon.Layers.gru/7` on `Ops.gru/3`: the same arguments, parameters and
    result, `{sequence, {new_hidden}}`, with the whole sequence in one call
    of the fused GRU instead of a loop of `gru_cell` (`:unroll` is ignored).
    Axon's parameters map onto the op as

        wx   = input · [wir wiz win] + [br bz bin]
        r    = [whr whz whn]
        bias = [0, 0, bhn]

    A mask other than Axon's default (a scalar `0`), or a `:gate` other than
    `:sigmoid` or an `:activation` other than `:tanh`, runs
    `Axon.Layers.gru/7` itself.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `hidden_state` - `{h}`, `h` `{batch, units}`
      * `input_kernel` - `%{"wir" => _, "wiz" => _, "win" => _}`, each `{features, units}`
      * `hidden_kernel` - `%{"whr" => _, "whz" => _, "whn" => _}`, each `{units, units}`
      * `bias` - `%{"br" => _, "bz" => _, "bin" => _, "bhn" => _}`, each `{units}`
        (left out: no bias, as Axon's `use_bias: false`)

    ## Options

    Axon's: `:activation`, `:gate`, `:unroll`, `:mode`; and `:precision`
    (`:exact`, the default, or `:tf32`: `Ops.gru/3`'s), which Axon's cells
    do not take.
    """
    deftransform gru(
                   input,
                   hidden_state,
                   mask,
                   input_kernel,
                   hidden_kernel,
                   bias \\ [],
                   opts \\ []
                 ) do
      gated_rnn(:gru, input, hidden_state, mask, input_kernel, hidden_kernel, bias, opts)
    end

    @doc """
    `Axon.Layers.lstm/7` on `Ops.lstm/3`: the same arguments, parameters and
    result, `{sequence, {new_cell, new_hidden}}`, the whole sequence in one
    call of the fused LSTM (`:unroll` is ignored). Axon's parameters map onto
    the op as

        wx = input · [wii wif wig wio] + [bi bf bg bo]
        r  = [whi whf whg who]

    and its carry `{c, h}` as `c0: c, h0: h`. Masks, gates and activations
    as in `gru/7`.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * `hidden_state` - `{c, h}`, each `{batch, units}`
      * `input_kernel` - `%{"wii" => _, "wif" => _, "wig" => _, "wio" => _}`, each `{features, units}`
      * `hidden_kernel` - `%{"whi" => _, "whf" => _, "whg" => _, "who" => _}`, each `{units, units}`
      * `bias` - `%{"bi" => _, "bf" => _, "bg" => _, "bo" => _}`, each `{units}`
        (left out: no bias)
    """
    deftransform lstm(
                   input,
                   hidden_state,
                   mask,
                   input_kernel,
                   hidden_kernel,
                   bias \\ [],
                   opts \\ []
                 ) do
      gated_rnn(:lstm, input, hidden_state, mask, input_kernel, hidden_kernel, bias, opts)
    end

    @doc """
    Stacked GRU layers on `Ops.gru_stack/4`: layer `l` has Axon's GRU
    parameters (`layer_params`, a list of `{input_kernel, hidden_kernel,
    bias}` per layer, each Axon's map, as `gru/7` takes them), layer 0 on
    `input`, layer `l > 0` on layer `l - 1`'s sequence. They map onto the op
    as `gru/7`'s do, layer by layer: layer 0's `wx = input · [wir wiz win] +
    [br bz bin]`; `r[l] = [whr whz whn]`, `bias[l] = [0 0 bhn]`; for `l > 0`,
    `w[l - 1] = [wir wiz win]` and `w_bias[l - 1] = [br bz bin]`.

    ## Parameter shapes

      * `input` - `{batch, steps, features}`
      * layer 0's input kernels `{features, units}`, the others' `{units,
        units}`; hidden kernels `{units, units}`; biases `{units}`

    ## Options

      * `:h0` - the initial states `{layers, batch, units}` (default: zeros)
      * `:return_state` - when `true`, return `{sequence, h_final}`,
        `h_final` `{layers, batch, units}`
      * `:precision` - `:exact` (default) or `:tf32` (`Ops.gru/3`'s)

    Returns the last layer's sequence `{batch, steps, units}`.
    """
    deftransform gru_stack(input, layer_params, opts \\ []) do
      opts =
        options!("gru_stack/3", opts,
          h0: nil,
          return_state: false,
          mode: :inference,
          precision: :exact
        )

      {wx, r, w, bias, w_bias} = stack_operands(:gru, input, layer_params)

      Ops.gru_stack(wx, r, w,
        bias: bias,
        w_bias: w_bias,
        h0: opts[:h0],
        final_state: opts[:return_state],
        precision: opts[:precision]
      )
    end

    @doc """
    Stacked LSTM layers on `Ops.lstm_stack/4`, as `gru_stack/3` stacks GRU
    layers, each with Axon's LSTM parameters (`lstm/7`'s maps): `r[l] = [whi
    whf whg who]`, layer 0's `wx = input · [wii wif wig wio] + [bi bf bg
    bo]`, and for `l > 0` `w[l - 1] = [wii wif wig wio]`, `w_bias[l - 1] =
    [bi bf bg bo]`.

    ## Options

      * `:h0`, `:c0` - the initial states and cells `{layers, batch, units}`
        (default: zeros)
      * `:return_state` - when `true`, return `{sequence, {c_final,
        h_final}}` (Axon's carry order), each `{layers, batch, units}`
    """
    deftransform lstm_stack(input, layer_params, opts \\ []) do
      opts =
        options!("lstm_stack/3", opts,
          h0: nil,
          c0: nil,
          return_state: false,
          mode: :inference,
          precision: :exact
        )

      {wx, r, w, _bias, w_bias} = stack_operands(:lstm, input, layer_params)

      out =
        Ops.lstm_stack(wx, r, w,
          w_bias: w_bias,
          h0: opts[:h0],
          c0: opts[:c0],
          final_state: opts[:return_state],
          precision: opts[:precision]
        )

      case out do
        {y, h, c} -> {y, {c, h}}
        y -> y
      end
    end

    @stack_gates %{
      gru: {~w(wir wiz win), ~w(whr whz whn), ~w(br bz bin)},
      lstm: {~w(wii wif wig wio), ~w(whi whf whg who), ~w(bi bf bg bo)}
    }

    # The stack's operands from Axon's per-layer maps: layer 0's input
    # projection, and R, W, the recurrent biases (the GRU's [0 0 bhn]) and
    # W_bias stacked.
    defp stack_operands(cell, input, [{ik0, _, b0} | _] = layer_params) do
      {inputs, hiddens, biases} = Map.fetch!(@stack_gates, cell)
      concat = fn map, names -> Nx.concatenate(Enum.map(names, &map[&1])) end
      kernel = fn map, names -> Nx.concatenate(Enum.map(names, &map[&1]), axis: 1) end

      wx = input_projection(input, Enum.map(inputs, &ik0[&1]), b0, biases)
      r = layer_params |> Enum.map(fn {_, hk, _} -> kernel.(hk, hiddens) end) |> Nx.stack()
      above = tl(layer_params)
      w = above |> Enum.map(fn {ik, _, _} -> kernel.(ik, inputs) end) |> Nx.stack()
      w_bias = above |> Enum.map(fn {_, _, b} -> concat.(b, biases) end) |> Nx.stack()

      bias =
        if cell == :gru do
          layer_params
          |> Enum.map(fn {_, _, b} ->
            zeros = Nx.broadcast(Nx.tensor(0, type: Nx.type(b["bhn"])), Nx.shape(b["bhn"]))
            Nx.concatenate([zeros, zeros, b["bhn"]])
          end)
          |> Nx.stack()
        end

      {wx, r, w, bias, w_bias}
    end

    # Axon's calling conventions: a bias map, or the options in its place
    # (no bias).
    defp gated_rnn(cell, input, hidden_state, mask, input_kernel, hidden_kernel, bias, opts) do
      {bias, opts} =
        cond do
          is_list(bias) ->
            {nil, bias}

          is_map(bias) ->
            {bias, opts}

          true ->
            raise ArgumentError,
                  "ExPhil.Native.Axon.Layers.#{cell}/7: argument 'bias' expected a map of " <>
                    "Axon's biases (or the options, for no bias), got: #{inspect(bias)}"
        end

      opts =
        options!("#{cell}/7", opts,
          mode: :inference,
          unroll: :static,
          activation: :tanh,
          gate: :sigmoid,
          conv_opts: [],
          precision: :exact
        )

      if default_mask?(mask) and opts[:activation] == :tanh and opts[:gate] == :sigmoid do
        fused(cell, input, hidden_state, input_kernel, hidden_kernel, bias, opts[:precision])
      else
        apply(Axon.Layers, cell, [
          input,
          hidden_state,
          mask,
          input_kernel,
          hidden_kernel,
          bias || Map.fetch!(@axon_zero_bias, cell),
          Keyword.delete(opts, :precision)
        ])
      end
    end

    # Axon's default mask: Axon.constant(0), a concrete scalar zero even
    # inside defn. Anything else (a mask from an input) runs Axon's cells.
    defp default_mask?(mask) when is_number(mask), do: mask == 0

    defp default_mask?(%Nx.Tensor{data: %Nx.Defn.Expr{}} = mask),
      do: Nx.shape(mask) == {} and ExPhil.Native.Ops.Args.zero_constant?(mask)

    defp default_mask?(%Nx.Tensor{shape: {}} = mask), do: Nx.to_number(mask) == 0

    defp default_mask?(_mask), do: false

    defp fused(:gru, input, {h0}, ik, hk, bias, precision) do
      wx = input_projection(input, [ik["wir"], ik["wiz"], ik["win"]], bias, ~w(br bz bin))
      r = Nx.concatenate([hk["whr"], hk["whz"], hk["whn"]], axis: 1)

      recurrent_bias =
        if bias do
          bhn = bias["bhn"]
          zeros = Nx.broadcast(Nx.tensor(0, type: Nx.type(bhn)), Nx.shape(bhn))
          Nx.concatenate([zeros, zeros, bhn])
        end

      {y, h} =
        Ops.gru(wx, r, bias: recurrent_bias, h0: h0, final_state: true, precision: precision)

      {y, {h}}
    end

    defp fused(:lstm, input, {c0, h0}, ik, hk, bias, precision) do
      wx =
        input_projection(
          input,
          [ik["wii"], ik["wif"], ik["wig"], ik["wio"]],
          bias,
          ~w(bi bf bg bo)
        )

      r = Nx.concatenate([hk["whi"], hk["whf"], hk["whg"], hk["who"]], axis: 1)
      {y, h, c} = Ops.lstm(wx, r, h0: h0, c0: c0, final_state: true, precision: precision)
      {y, {c, h}}
    end

    # input · [kernels] (+ [biases]): one product over every gate and step.
    defp input_projection(input, kernels, bias, bias_names) do
      wx = Nx.dot(input, [2], Nx.concatenate(kernels, axis: 1), [0])

      if bias,
        do: Nx.add(wx, Nx.concatenate(Enum.map(bias_names, &bias[&1]))),
        else: wx
    end

    defnp project(input, kernel, bias) do
      Nx.dot(input, [2], kernel, [0]) + bias
    end

    # Unknown options raise, as in ExPhil.Native.Ops; values are checked where
    # the layers are built (ExPhil.Native.Axon), or by the ops themselves.
    deftransformp options!(fun, opts, allowed) do
      ExPhil.Native.Ops.Args.options!("ExPhil.Native.Axon.Layers.#{fun}", opts, allowed)
    end
  end
end
