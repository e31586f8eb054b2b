defmodule ExPhil.Native.Ops do
  @moduledoc """
  The library's ops on Nx tensors, inside and outside `defn`.

      defn step(x, params) do
        gate = Nx.dot(x, params.w_gate)
        candidate = Nx.dot(x, params.w_candidate)
        ExPhil.Native.Ops.min_gru(gate, candidate)
      end

  Each op is an `Nx.block/4`: its default function is a pure-Nx
  implementation of the same math (a log-step parallel scan for the
  recurrences, not a loop over time), which runs on every backend and
  compiler. Compiled by EXLA for a CUDA device, the block becomes an XLA
  custom call to the library's fused kernel (see `ExPhil.Native.CustomCall`
  for when). Inside `defn` each op is differentiable in every tensor input
  through `custom_grad`: the gradient is itself a block, for the backward
  kernel, whose default is the pure backward. The pure gradients are the
  native ones' reference.

  Arguments are checked when the op is traced (or called): a wrong rank,
  shape or type raises `ArgumentError` naming the argument, the expected and
  the received value. Inputs the kernels cannot take (f64, a head width other
  than 32, 64, 96 or 128, more than 256 selective-scan states, a GRU, LSTM or
  sLSTM `hidden` above what device 0's multiprocessors hold) always run the
  default function.

  Sequence tensors keep their type (f32, bf16 or f16 on the kernels); states
  and their gradients are f32. State inputs (`:h0`, `:c0`, `:n0`, `:m0`) and
  the GRU's, LSTM's and sLSTM's weights (`r`, `:bias`) of any float type are
  converted to f32 first.
  """

  alias ExPhil.Native.Ops

  @doc """
  The linear recurrence `h_t = a_t * h_{t-1} + b_t` over `{batch, steps, hidden}`.

  ## Options

    * `:h0` - the initial state `{batch, hidden}` (default: zeros)
    * `:final_state` - when `true`, returns `{y, h_final}` (`h_final` f32)
      instead of `y`

  Returns every state `y`, `{batch, steps, hidden}` in the inputs' type.
  """
  def linear_scan(a, b, opts \\ []), do: Ops.Scan.run(:linear_scan, [a, b], opts)

  @doc """
  MinGRU: `z = sigmoid(gate)`, `h_t = (1 - z) h_{t-1} + z candidate`.

  `gate` and `candidate` are `{batch, steps, hidden}` of one type; options
  and result as in `linear_scan/3`.
  """
  def min_gru(gate, candidate, opts \\ []), do: Ops.Scan.run(:min_gru, [gate, candidate], opts)

  @doc """
  MinLSTM: `f = sigmoid(forget)`, `i = sigmoid(input)`, `s = f + i + 1.0e-6`,
  `h_t = (f / s) h_{t-1} + (i / s) candidate`.

  Inputs `{batch, steps, hidden}` of one type; options and result as in
  `linear_scan/3`.
  """
  def min_lstm(forget, input, candidate, opts \\ []),
    do: Ops.Scan.run(:min_lstm, [forget, input, candidate], opts)

  @doc """
  Liquid (closed-form continuous-time) cell:
  `h_t = target + (h_{t-1} - target) exp(-1 / tau)`, `tau > 0`.

  Inputs `{batch, steps, hidden}` of one type; options and result as in
  `linear_scan/3`.
  """
  def liquid(tau, target, opts \\ []), do: Ops.Scan.run(:liquid, [tau, target], opts)

  @doc """
  Mamba's selective scan (S6):

      delta_t   = clamp(softplus?(dt_t + dt_bias))
      h_t[d, n] = exp(delta_t[d] a[d, n]) h_{t-1}[d, n] + delta_t[d] b_t[n] x_t[d]
      y_t[d]    = (sum_n c_t[n] h_t[d, n] + d[d] x_t[d]) * silu(z_t[d])

  `x`, `dt` `{batch, steps, channels}`; `a` `{channels, states}`; `b`, `c`
  `{batch, steps, states}`; `x`, `dt`, `b`, `c` (and `:z`) of one type.

  ## Options

    * `:dt_bias`, `:d` - `{channels}` (absent: no bias, no skip term)
    * `:z` - the gate `{batch, steps, channels}` (absent: no gate)
    * `:h0` - the initial state `{batch, channels, states}` (default: zeros)
    * `:softplus` - apply softplus to `dt + dt_bias` (default `false`)
    * `:clamp` - `{dt_min, dt_max}`: clamp delta, last (default: none)
    * `:final_state` - when `true`, returns `{y, h_final}` (`h_final` f32,
      `{batch, channels, states}`) instead of `y`

  `a`, `:dt_bias`, `:d` and `:h0` are converted to f32.
  """
  def selective_scan(x, dt, a, b, c, opts \\ []), do: Ops.SelectiveScan.run(x, dt, a, b, c, opts)

  @doc """
  Scaled dot-product attention with grouped-query heads:
  `softmax(scale q k^T + mask) v`.

  With the default layout, `q` is `{batch, q_heads, steps, width}` and `k`,
  `v` are `{batch, kv_heads, keys, width}`, `q_heads` a multiple of
  `kv_heads` (query head `h` reads key head `div(h, q_heads / kv_heads)`).

  ## Options

    * `:mask` - `:none` (default), `:causal` or `:window`, aligned to the
      bottom right when `steps != keys` (query `i` sees keys
      `j <= i + keys - steps`; `:window` the last `:window` of those). A query
      that sees no key gets zeros and no gradient.
    * `:window` - the window's width, with `mask: :window` only
    * `:scale` - the scores' factor (default `1 / sqrt(width)`)
    * `:layout` - `:bhtd` (default) or `:bthd` (`{batch, steps, heads, width}`)
    * `:precision` - `:exact` (default) or `:tf32x3`: how the kernels
      multiply f32 inputs (three TF32 tensor-core products per product,
      about 2^-21 relative; the default function ignores it)

  Returns `o`, the shape and type of `q`.
  """
  def attention(q, k, v, opts \\ []), do: Ops.Attention.run(q, k, v, opts)

  @doc """
  A GRU over a whole sequence (Axon's `gru_cell`, PyTorch's and cuDNN's GRU),
  the recurrent product `h_{t-1} r` fused into the kernel. `wx` is the input
  projection of every step, `x W + b` (computed by the caller, one product
  over all steps); with `rh_t = h_{t-1} r + bias` and the gates r, z, n side
  by side in the last axis:

      r   = sigmoid(wx_r + rh_r)
      z   = sigmoid(wx_z + rh_z)
      n   = tanh(wx_n + r * rh_n)
      h_t = (1 - z) * n + z * h_{t-1}

  `wx` is `{batch, steps, 3 * hidden}`, `r` `{hidden, 3 * hidden}`. Axon's
  `gru_cell` parameters map as: `wx = x · [wir wiz win] + [br bz bin]`,
  `r = [whr whz whn]`, `bias = [0, 0, bhn]` (`ExPhil.Native.Axon.gru/3` does
  it for you).

  ## Options

    * `:bias` - the recurrent bias `{3 * hidden}` (default: none), inside the
      reset for the n gate
    * `:h0` - the initial state `{batch, hidden}` (default: zeros)
    * `:final_state` - when `true`, returns `{y, h_final}` instead of `y`
    * `:precision` - `:exact` (default) or `:tf32`: with `{:f, 32}` `wx`,
      the kernels' products on tensor cores at TF32's precision or better,
      as cuDNN runs f32 by default (`ExPhil.Native.gru_forward/3` says
      how); other types run as with `:exact`. The default function is exact
      either way.

  Returns every state `y`, `{batch, steps, hidden}` in the type of `wx`;
  `h_final` is f32 (f64 for f64 inputs). `r`, `:bias` and `:h0` are converted
  to f32 (f64 for f64 inputs). Differentiable in `wx`, `r`, `:bias` and `:h0`.
  On the kernels, `hidden` is at most 256 / 3 units per multiprocessor of the
  GPU (11,220 on an H100); a larger one runs the default function (the limit
  is device 0's, read once).
  """
  def gru(wx, r, opts \\ []), do: Ops.GatedRnn.run(:gru, wx, r, opts)

  @doc """
  An LSTM over a whole sequence (Axon's `lstm_cell`, PyTorch's and cuDNN's
  LSTM), the recurrent product fused in. With `rh_t = h_{t-1} r + bias` and
  the gates i, f, g, o side by side in the last axis:

      i, f, o = sigmoid(wx + rh)      g = tanh(wx_g + rh_g)
      c_t = f * c_{t-1} + i * g       h_t = o * tanh(c_t)

  `wx` is `{batch, steps, 4 * hidden}`, `r` `{hidden, 4 * hidden}`. Axon's
  `lstm_cell` parameters map as: `wx = x · [wii wif wig wio] + [bi bf bg bo]`,
  `r = [whi whf whg who]`, no `:bias`; its carry `{c, h}` is `c0: c, h0: h`
  (`ExPhil.Native.Axon.lstm/3` does it for you).

  ## Options

    * `:bias` - a recurrent bias `{4 * hidden}` (default: none), added to
      the gates as if folded into `wx`
    * `:h0`, `:c0` - the initial state and cell `{batch, hidden}` (default:
      zeros)
    * `:final_state` - when `true`, returns `{y, h_final, c_final}` instead
      of `y`
    * `:precision` - as in `gru/3`

  Types, gradients and limits as in `gru/3` (`hidden` at most 64 units per
  multiprocessor on the kernels); differentiable in `wx`, `r`, `:bias`,
  `:h0` and `:c0`.
  """
  def lstm(wx, r, opts \\ []), do: Ops.GatedRnn.run(:lstm, wx, r, opts)

  @doc """
  L = 2 to 4 stacked GRU layers of one hidden size, as `torch.nn.GRU(hidden,
  hidden, L)` runs them: layer 0 is `gru/3` on `wx`, layer `l > 0` is
  `gru/3` on the layer below's output projected, `y_{l-1} · w[l - 1] +
  w_bias[l - 1]`. Up to batch 4 the kernels run the whole stack in one
  launch each way, each layer a step or two behind its neighbour (the
  latency path of a real-time model); above, the layers one after
  another.

  `wx` is `{batch, steps, 3 * hidden}`, `r` `{L, hidden, 3 * hidden}` (the
  layers' recurrent weights), `w` `{L - 1, hidden, 3 * hidden}` (the input
  weights of the layers above the first).

  ## Options

    * `:bias` - the recurrent biases `{L, 3 * hidden}` (default: none)
    * `:w_bias` - the input biases of the layers above the first `{L - 1, 3
      * hidden}` (default: none)
    * `:h0` - the initial states `{L, batch, hidden}` (default: zeros)
    * `:final_state` - when `true`, returns `{y, h_final}` with `h_final`
      `{L, batch, hidden}`, instead of `y`
    * `:precision` - as in `gru/3`

  Returns the last layer's `y`, `{batch, steps, hidden}` in the type of
  `wx`. Types as in `gru/3` (`r`, `w`, the biases and the states f32);
  differentiable in `wx`, `r`, `w` and every option given.
  """
  def gru_stack(wx, r, w, opts \\ []), do: Ops.GatedRnnStack.run(:gru, wx, r, w, opts)

  @doc """
  L = 2 to 4 stacked LSTM layers, as `gru_stack/4` stacks GRU layers, each
  layer `lstm/3` (`torch.nn.LSTM(hidden, hidden, L)`): `4 * hidden` for `3 *
  hidden`, the option `:c0` `{L, batch, hidden}`, and with `:final_state`
  `{y, h_final, c_final}`.
  """
  def lstm_stack(wx, r, w, opts \\ []), do: Ops.GatedRnnStack.run(:lstm, wx, r, w, opts)

  @doc """
  xLSTM's sLSTM (scalar LSTM with exponential gating) over a whole sequence,
  exactly as Edifice's `slstm_scan`, the recurrent product fused in. With
  `pre = wx_t + h_{t-1} r + bias` and the gates i, f, z, o side by side in
  the last axis:

      m_t = max(pre_f + m_{t-1}, pre_i)
      i   = exp(pre_i - m_t)      f = exp(pre_f + m_{t-1} - m_t)
      c_t = f * c_{t-1} + i * tanh(pre_z)
      n_t = f * n_{t-1} + i
      h_t = sigmoid(pre_o) * c_t / max(|n_t|, 1)

  `wx` is `{batch, steps, 4 * hidden}`, `r` `{hidden, 4 * hidden}` (Edifice's
  `recurrent_weight`).

  ## Options

    * `:bias` - a recurrent bias `{4 * hidden}` (default: none), added to
      the gates as if folded into `wx`
    * `:h0`, `:c0`, `:n0`, `:m0` - the initial state, cell, normaliser and
      stabiliser `{batch, hidden}` (default: Edifice's zeros, zeros, ones,
      zeros)
    * `:final_state` - when `true`, returns
      `{y, h_final, c_final, n_final, m_final}` instead of `y`

  Types, gradients and limits as in `lstm/3`; differentiable in `wx`, `r`,
  `:bias` and the initial states. At max()'s ties the gradient is split as
  Nx's autodiff splits it (half to each side).
  """
  def slstm(wx, r, opts \\ []), do: Ops.GatedRnn.run(:slstm, wx, r, opts)
end
