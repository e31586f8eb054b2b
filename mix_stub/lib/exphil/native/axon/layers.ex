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
