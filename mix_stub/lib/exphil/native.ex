defmodule ExPhil.Native do
  @moduledoc """
  Fused GPU recurrences and attention on tensors in device memory, without
  host copies.

  Every op takes tensors that already live on a CUDA device and writes its
  results to device memory. A tensor argument is one of:

    * `{pointer, type, shape}`, where `pointer` is any map with the fields of
      `%Nx.Pointer{}` (so `Nx.to_pointer(t, mode: :local)` or `mode: :ipc`
      works as it is): `%{kind: :local, address: integer, data_size: bytes}`
      or `%{kind: :ipc, handle: <<_::512>>, data_size: bytes}`; or an
      `ExPhil.Native.Buffer` in place of the pointer. `type` is `{:f, 32}`,
      `{:f, 16}` or `{:bf, 16}`; `shape` a tuple. `data_size` must match type
      and shape.
    * an `ExPhil.Native.Buffer` on its own (its own type and shape).

  ## Ops

  The linear recurrences `h_t = a_t * h_{t-1} + b_t` over `[B, T, H]` tensors
  (see the project README for each op's math): `linear_scan`, `min_gru`,
  `min_lstm` and `liquid`, each with `*_forward` and `*_backward`. All
  sequence tensors of a call share one type; state tensors (`:h0`,
  `:h_final`, `:grad_h_final`, `:grad_h0`) are `{:f, 32}` or that type.

  Mamba's selective scan, `selective_scan_forward/6` and
  `selective_scan_backward/7`, has inputs of several shapes and options of
  its own (its docs say which); `:outputs`, `:sync` and `:stream` are as
  below.

  Scaled dot-product attention with grouped-query heads,
  `attention_forward/4` and `attention_backward/7`, takes `:mask`,
  `:window`, `:layout`, `:scale` and `:precision` (its docs say which); `:outputs`,
  `:sync` and `:stream` are as below.

  GRU, LSTM and sLSTM sequences with the recurrent product fused in,
  `gru_forward/3`, `gru_backward/5`, `lstm_forward/3`, `lstm_backward/5`,
  `slstm_forward/3` and `slstm_backward/5`, take the input projection `wx`
  and the recurrent weights `r`, and `:bias`, `:h0` (`:c0`, `:n0`, `:m0`)
  as options (their docs say which); `:outputs`, `:sync` and `:stream` are
  as below. Stacks of 2 to 4 GRU or LSTM layers, `gru_stack_forward/4`,
  `gru_stack_backward/7`, `lstm_stack_forward/4` and `lstm_stack_backward/7`,
  take the input weights `w` of the layers above the first besides.

  Options of the linear recurrences (keyword list or map):

    * `:h0` - initial state `[B, H]` (zeros when absent)
    * `:grad_h_final` (backward) - gradient of the final state `[B, H]`
    * `:outputs` - destination passing: tensors to write, by name (`:y`,
      `:h_final` forward; `:grad_<input>`, `:grad_h0` backward). The memory
      stays its owner's (for instance freshly computed EXLA tensors). Without
      `:outputs`, the op allocates a new `ExPhil.Native.Buffer` for every
      output (`:state_type` sets the type of `:h_final` / `:grad_h0`,
      default `{:f, 32}`).
    * `:sync` - `true` (default): return once the work has finished, so the
      results are safe for EXLA at once. `false`: return `{:ok, event}` at
      once; `await/1` waits and gives the outputs. The call's arguments and
      outputs are kept alive until the work is done.
    * `:stream` - `:managed` (default: the library's stream for the
      tensors' device, shared by every caller), `:legacy_default` (CUDA's
      legacy default stream of the tensors' device, `cudaStreamLegacy`:
      see "Synchronisation with libtorch" below) or an
      `ExPhil.Native.Stream` from `new_stream/1`, for work that need not
      wait behind other callers'. Raw `cudaStream_t` addresses are not
      accepted: a wrong one would crash the VM inside the driver.

  Ops return `{:ok, outputs}` (a map from output name to the tensor or
  buffer written), or `{:ok, event}` with `sync: false`.

  ## Synchronisation with EXLA

  The ops do not wait for work on other streams. Results of a compiled EXLA
  function are ready when EXLA hands out their pointers; a fresh upload may
  not be. Call `synchronize/1` first when an input may still be in flight on
  another stream.

  ## Synchronisation with libtorch (Torchx)

  The managed stream and `new_stream/1` streams are non-blocking: they do
  not wait for work on CUDA's legacy default stream, which is where libtorch
  (and so Torchx) runs its kernels. With `stream: :legacy_default` an op is
  enqueued on that same stream, so it starts after every kernel libtorch
  enqueued before it (the kernel that made its inputs, say) and libtorch's
  later kernels start after it, with no host wait and no device-wide
  synchronisation. `sync: false` is then safe on tensors from
  `Nx.to_pointer(t, mode: :local)` of Torchx tensors, dropping the event:
  libtorch's caching allocator gives a freed tensor's memory only to later
  work on the stream it was allocated on, which is ordered after the op, so
  the op's inputs and outputs need not outlive the call on the Elixir side.
  (An event that holds no memory of the NIF's own is not waited for when it
  is garbage-collected.) `ExPhil.Native.Ops` does exactly this for Torchx
  CUDA tensors (see `ExPhil.Native.Eager`).

  ## Errors

  Malformed arguments raise `ArgumentError` with a message naming the
  argument, the expected and the received value. Failures at run time return
  `{:error, reason}`: `:no_cuda_device`, `:out_of_memory`,
  `{:cuda_error, name, message}` or `{:internal, message}`. The module loads
  on a machine without a GPU; if the NIF library itself cannot be loaded,
  every function raises `ExPhil.Native.LoadError` with the reason.
  """

  import ExPhil.Native.NIF, only: [defnative: 1]
  alias ExPhil.Native.{Buffer, Event, Stream}

  @typedoc "An Nx type the ops accept."
  @type type :: {:f, 32} | {:f, 16} | {:bf, 16}

  @typedoc "The fields of `%Nx.Pointer{}` the NIF reads."
  @type pointer ::
          %{
            required(:kind) => :local,
            required(:address) => non_neg_integer(),
            required(:data_size) => non_neg_integer()
          }
          | %{
              required(:kind) => :ipc,
              required(:handle) => binary(),
              required(:data_size) => non_neg_integer()
            }

  @typedoc "A tensor in device memory."
  @type tensor :: {pointer() | Buffer.t(), type(), tuple()} | Buffer.t()

  @typedoc "Runtime failures."
  @type reason ::
          :no_cuda_device
          | :out_of_memory
          | {:cuda_error, atom(), String.t()}
          | {:internal, String.t()}
          | {:xla_ffi_registration, String.t()}

  @typedoc "Outputs by name: the tensors given in `:outputs`, or new buffers."
  @type outputs :: %{optional(atom()) => tensor()}

  @type op_result :: {:ok, outputs()} | {:ok, Event.t()} | {:error, reason()}

  @typedoc "The options every op takes: destination passing, waiting, and the stream (the module doc)."
  @type call_option ::
          {:outputs, [{atom(), tensor()}] | %{optional(atom()) => tensor()}}
          | {:sync, boolean()}
          | {:stream, :managed | :legacy_default | Stream.t()}

  @on_load :load_nif

  @doc false
  def load_nif do
    result =
      case :code.priv_dir(:exphil_native) do
        {:error, reason} -> {:error, {:priv_dir, reason}}
        priv -> :erlang.load_nif(:filename.join(priv, ~c"libexphil_nif"), 0)
      end

    :persistent_term.put({__MODULE__, :load_error}, if(result == :ok, do: nil, else: result))
    # The module loads either way; its functions then raise with the reason.
    :ok
  end

  @doc """
  Why the NIF library failed to load, or `nil` if it is loaded.
  """
  @spec load_error() :: term()
  def load_error, do: :persistent_term.get({__MODULE__, :load_error}, {:error, :not_loaded})

  @doc false
  def nif_load_error, do: %ExPhil.Native.LoadError{reason: load_error()}

  ## Devices

  @doc "The number of CUDA devices (0 on a machine without a GPU or driver)."
  @spec device_count() :: non_neg_integer() | {:error, reason()}
  defnative(device_count())

  @doc """
  Name, memory (`:total_memory`, `:free_memory` in bytes), compute
  capability and multiprocessor count of a device.
  """
  @spec device_info(non_neg_integer()) :: {:ok, map()} | {:error, reason()}
  defnative(device_info(device))

  @doc """
  The device memory the library holds on a device for its own work, in
  bytes: `:workspace_reserved` (its stream-ordered workspace pool, as
  reserved from the driver), `:workspace_in_use` (the part calls still
  enqueued use) and `:capture_blocks` (blocks kept for calls captured into
  CUDA graphs). Buffers from `allocate/3` and `upload/4` are the caller's and
  not counted. For checks that repeated calls do not grow it.
  """
  @spec memory_held(non_neg_integer()) :: {:ok, map()} | {:error, reason()}
  defnative(memory_held(device))

  @doc "Waits for all work on every device, from any stream."
  @spec synchronize() :: :ok | {:error, reason()}
  defnative(synchronize())

  @doc """
  Waits for all work on `device`, from any stream: use it before an op when
  an input may still be in flight (for instance a fresh upload by EXLA).
  """
  @spec synchronize(non_neg_integer()) :: :ok | {:error, reason()}
  defnative(synchronize(device))

  @doc """
  A new CUDA stream (non-blocking) on a device (options: `:device`, default
  0), for the `:stream` option of the ops. It is destroyed when garbage-
  collected, after the work queued on it.
  """
  @spec new_stream(keyword() | map()) :: {:ok, Stream.t()} | {:error, reason()}
  defnative(new_stream(opts \\ []))

  @doc "Waits for the work of an op called with `sync: false`; returns its outputs."
  @spec await(Event.t()) :: {:ok, outputs()} | {:error, reason()}
  defnative(await(event))

  ## Buffers

  @doc """
  Allocates device memory for a tensor of `type` and `shape` (options:
  `:device`, default 0). The memory is freed by `free/1` or when the buffer
  is garbage-collected.
  """
  @spec allocate(type(), tuple(), keyword() | map()) :: {:ok, Buffer.t()} | {:error, reason()}
  defnative(allocate(type, shape, opts \\ []))

  @doc "Copies a binary (native byte order) into a new buffer."
  @spec upload(binary(), type(), tuple(), keyword() | map()) ::
          {:ok, Buffer.t()} | {:error, reason()}
  defnative(upload(data, type, shape, opts \\ []))

  @doc """
  Copies a buffer (or a `{buffer, type, shape}` view of it) to a binary,
  after the work enqueued on its device's managed stream.
  """
  @spec download(Buffer.t() | tensor()) :: {:ok, binary()} | {:error, reason()}
  defnative(download(buffer))

  @doc """
  Frees a buffer's device memory now, or as soon as work in flight that uses
  it has finished. A second call returns `{:error, :already_freed}`.
  """
  @spec free(Buffer.t()) :: :ok | {:error, :already_freed}
  defnative(free(buffer))

  @doc """
  The pointer map of a buffer, `%{kind: :local, address: integer,
  data_size: bytes}`, for `Nx.from_pointer/4`. EXLA treats that memory as
  borrowed: keep the buffer alive (and unfreed) while the tensor is used.
  """
  @spec pointer(Buffer.t()) :: %{
          kind: :local,
          address: non_neg_integer(),
          data_size: non_neg_integer()
        }
  defnative(pointer(buffer))

  @doc """
  A CUDA IPC handle for a buffer, `%{kind: :ipc, handle: <<_::512>>,
  data_size: bytes}`, for another OS process to `import_ipc/4`. An `:ipc`
  pointer map may also carry `offset:` (bytes from the start of the
  allocation the handle names; default 0).
  """
  @spec export_ipc(Buffer.t()) :: {:ok, pointer()} | {:error, reason()}
  defnative(export_ipc(buffer))

  @doc """
  Maps memory exported by another process as a buffer of `type` and
  `shape` (options: `:device`, default 0). A handle is opened once per
  process and closed when the last buffer or call using it is gone; the
  mapped allocation must hold `data_size` bytes.
  """
  @spec import_ipc(pointer(), type(), tuple(), keyword() | map()) ::
          {:ok, Buffer.t()} | {:error, reason()}
  defnative(import_ipc(pointer, type, shape, opts \\ []))

  @doc "How many distinct IPC handles this process has open now."
  @spec open_ipc_handles() :: non_neg_integer()
  defnative(open_ipc_handles())

  @doc """
  Where a device address lies in its CUDA allocation, in bytes from the
  allocation's start. A CUDA IPC handle names the whole allocation, so an
  importer of memory that starts inside one (a Torchx tensor, in libtorch's
  caching allocator) needs it: pass it as `:offset` in the `:ipc` pointer
  map (`import_ipc/4` and the ops take it). `ExPhil.Native.Eager.ipc_pointer/1`
  does both for a Torchx CUDA tensor.
  """
  @spec allocation_offset(non_neg_integer()) :: {:ok, non_neg_integer()} | {:error, reason()}
  defnative(allocation_offset(address))

  ## Ops

  @doc """
  `h_t = a_t * h_{t-1} + b_t`. `a`, `b`: `[B, T, H]`. Outputs `:y`
  `[B, T, H]` and `:h_final` `[B, H]`.
  """
  @spec linear_scan_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(linear_scan_forward(a, b, opts \\ []))

  @doc """
  Gradients of `linear_scan_forward/3`: given its inputs, its `y` and
  `grad_y`, outputs `:grad_a`, `:grad_b` and `:grad_h0`. `b` may be `nil`:
  the gradients do not depend on it, and the states are then read from `y`
  (one more read of `y` per step).
  """
  @spec linear_scan_backward(tensor(), tensor() | nil, tensor(), tensor(), keyword() | map()) ::
          op_result()
  defnative(linear_scan_backward(a, b, y, grad_y, opts \\ []))

  @doc """
  `z = sigmoid(gate)`, `h_t = (1 - z) * h_{t-1} + z * candidate`. Outputs
  `:y` and `:h_final`.
  """
  @spec min_gru_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(min_gru_forward(gate, candidate, opts \\ []))

  @doc "Gradients of `min_gru_forward/3`: `:grad_gate`, `:grad_candidate`, `:grad_h0`."
  @spec min_gru_backward(tensor(), tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(min_gru_backward(gate, candidate, y, grad_y, opts \\ []))

  @doc """
  `f = sigmoid(forget)`, `i = sigmoid(input)`, `s = f + i + 1e-6`,
  `h_t = (f / s) * h_{t-1} + (i / s) * candidate`. Outputs `:y` and
  `:h_final`.
  """
  @spec min_lstm_forward(tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(min_lstm_forward(forget, input, candidate, opts \\ []))

  @doc "Gradients of `min_lstm_forward/4`: `:grad_forget`, `:grad_input`, `:grad_candidate`, `:grad_h0`."
  @spec min_lstm_backward(tensor(), tensor(), tensor(), tensor(), tensor(), keyword() | map()) ::
          op_result()
  defnative(min_lstm_backward(forget, input, candidate, y, grad_y, opts \\ []))

  @doc """
  `h_t = target + (h_{t-1} - target) * exp(-1 / tau)` (tau > 0). Outputs `:y`
  and `:h_final`.
  """
  @spec liquid_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(liquid_forward(tau, target, opts \\ []))

  @doc "Gradients of `liquid_forward/3`: `:grad_tau`, `:grad_target`, `:grad_h0`."
  @spec liquid_backward(tensor(), tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative(liquid_backward(tau, target, y, grad_y, opts \\ []))

  ## Selective scan

  @typedoc """
  Options of `selective_scan_forward/6`, as a keyword list or a map.
  `nil` stands for an absent optional tensor or clamp.
  """
  @type selective_scan_option ::
          {:dt_bias, tensor() | nil}
          | {:d, tensor() | nil}
          | {:z, tensor() | nil}
          | {:h0, tensor() | nil}
          | {:softplus, boolean()}
          | {:clamp, {number(), number()} | nil}
          | call_option()

  @typedoc "Options of `selective_scan_backward/7`: the forward's and `:grad_h_final`."
  @type selective_scan_backward_option ::
          selective_scan_option() | {:grad_h_final, tensor() | nil}

  @doc """
  Mamba's selective scan (S6). With `x`, `dt` of shape `[B, T, D]`, `a`
  `[D, N]` and `b`, `c` `[B, T, N]`, for each batch row, channel `i` and
  state entry `n`:

      u_t       = dt_t[i] + dt_bias[i]                    (with :dt_bias)
      u_t       = softplus(u_t)                           (with softplus: true)
      delta_t   = clamp(u_t, dt_min, dt_max)              (with :clamp; applied last)
      h_t[i, n] = exp(delta_t * a[i, n]) * h_{t-1}[i, n] + delta_t * b_t[n] * x_t[i]
      y_t[i]    = sum over n of c_t[n] * h_t[i, n] + d[i] * x_t[i]    (the skip with :d)
      y_t[i]    = y_t[i] * silu(z_t[i])                   (with :z)

  `x`, `dt`, `b`, `c` and `:z` share one type (`{:f, 32}`, `{:f, 16}` or
  `{:bf, 16}`); `a`, `:dt_bias`, `:d`, `:h0` and `:h_final` are always
  `{:f, 32}`, so there is no `:state_type`. N is 1 to 256; B, T and D are
  any size of at least 1.

  Options:

    * `:dt_bias` - `[D]`, added to `dt` before anything else (none when
      absent or `nil`)
    * `:d` - the skip weight `[D]` (none when absent or `nil`)
    * `:z` - the gate `[B, T, D]` (none when absent or `nil`)
    * `:h0` - the initial state `[B, D, N]` (zeros when absent or `nil`)
    * `:softplus` - `true` applies softplus after the bias (default `false`)
    * `:clamp` - `{dt_min, dt_max}`, two numbers with `dt_min <= dt_max`
      within f32's range (floats or 64-bit integers), applied last; `nil`
      (default): no clamp
    * `:outputs` - destination passing, as for every op: `:y` (required)
      and `:h_final` (optional). Without it, both are new buffers.
    * `:sync`, `:stream` - as for every op (see the module doc)

  Outputs: `:y` `[B, T, D]` of the type of `x`, and `:h_final` `[B, D, N]`
  `{:f, 32}` (the state after the last step).

  Bad option values raise `ArgumentError` naming the option. Shapes and
  types are checked by the library, whose messages name the tensors as
  exphil.h does: `A`, `B`, `C`, `D` (and `grad_A`, ...) are `a`, `b`, `c`,
  `:d` (and `:grad_a`, ...).
  """
  @spec selective_scan_forward(
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          [selective_scan_option()] | map()
        ) ::
          op_result()
  defnative(selective_scan_forward(x, dt, a, b, c, opts \\ []))

  @doc """
  Gradients of `selective_scan_forward/6`, given its inputs with the same
  options (`:dt_bias`, `:d`, `:z`, `:h0`, `:softplus`, `:clamp`) and
  `grad_y` `[B, T, D]` (type of `x`), the gradient of the loss with
  respect to `y`. It takes no `y`: the states are recomputed from the
  inputs.

  Options, besides the forward's:

    * `:grad_h_final` - the gradient with respect to the final state,
      `[B, D, N]` `{:f, 32}` (none when absent or `nil`)
    * `:outputs` - the gradients to write, by name: any of the outputs
      below, at least one. Only those are written, so a caller can leave
      out what it does not train (`:grad_a` of a frozen `a`, say). The
      gradient of an optional input that was not given is refused.

  Outputs: `:grad_x`, `:grad_dt`, `:grad_z` `[B, T, D]` and `:grad_b`,
  `:grad_c` `[B, T, N]` of the type of `x`; `:grad_a` `[D, N]`,
  `:grad_dt_bias`, `:grad_d` `[D]` and `:grad_h0` `[B, D, N]`, `{:f, 32}`.
  Without `:outputs`, the call makes new buffers for `:grad_x`, `:grad_dt`,
  `:grad_a`, `:grad_b`, `:grad_c`, and for the gradient of each optional
  input it was given (`:grad_dt_bias`, `:grad_d`, `:grad_z`, `:grad_h0`).

  No gradient flows through the clamp where it is active, that is where
  `u_t` (after softplus, if any) lies outside `[dt_min, dt_max]`. Sums
  over batch, time and channels (`:grad_a`, `:grad_dt_bias`, `:grad_d`,
  `:grad_b`, `:grad_c`) are taken in a fixed order: results are bitwise
  the same from run to run.
  """
  @spec selective_scan_backward(
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          [selective_scan_backward_option()] | map()
        ) :: op_result()
  defnative(selective_scan_backward(x, dt, a, b, c, grad_y, opts \\ []))

  ## Attention

  @typedoc """
  Options of `attention_forward/4` and `attention_backward/7`, as a keyword
  list or a map. `nil` stands for an absent `:window` or `:scale`.
  """
  @type attention_option ::
          {:mask, :none | :causal | :window}
          | {:window, pos_integer() | nil}
          | {:layout, :bhtd | :bthd}
          | {:scale, number() | nil}
          | {:precision, :exact | :tf32x3}
          | call_option()

  @doc """
  Scaled dot-product attention with grouped-query heads. For each batch row
  `b`, query head `h` and query `i`, with `g = div(h, div(Hq, Hkv))` the
  key/value head that `h` shares:

      s[j]      = scale * dot(q[b, h, i], k[b, g, j]) + mask[i, j]
      o[b, h, i]   = sum over j of softmax(s)[j] * v[b, g, j]
      lse[b, h, i] = log(sum over j of exp(s[j]))

  Shapes, by `:layout`:

    * `:bhtd` (default): `q` `[B, Hq, T, d]`; `k`, `v` `[B, Hkv, S, d]`
    * `:bthd`: `q` `[B, T, Hq, d]`; `k`, `v` `[B, S, Hkv, d]`

  `q`, `k` and `v` share one type (`{:f, 32}`, `{:f, 16}` or `{:bf, 16}`).
  Hq must be a multiple of Hkv (grouped-query attention; Hkv = Hq is
  ordinary multi-head attention, Hkv = 1 multi-query). The head width d is
  32, 64, 96 or 128; B, Hq, Hkv, T and S are any size of at least 1. Every
  tensor's memory must be 16-byte aligned (device allocations are).
  Softmax and every sum are f32; `{:f, 16}` and `{:bf, 16}` run on tensor
  cores (sm_80 and later), `{:f, 32}` in exact f32 unless
  `precision: :tf32x3` asks for tensor cores.

  Options:

    * `:mask` - `:none` (default: every key), `:causal` or `:window`. The
      masks are aligned to the bottom right: with T != S, query `i` stands
      at position `i + S - T`, so `:causal` lets it see the keys
      `j <= i + S - T`, and `:window` the last `:window` of those,
      `i + S - T - window < j <= i + S - T`. A query that sees no key (causal
      with T > S, say) gets `o = 0` and `lse = -inf`.
    * `:window` - with `mask: :window` (and only then; required), the number
      of keys each query sees, its own position included: an integer of at
      least 1.
    * `:layout` - `:bhtd` (default) or `:bthd`, as above.
    * `:scale` - the factor of the scores, a nonzero number within f32's
      range; `nil` (default): `1 / sqrt(d)`.
    * `:precision` - how `{:f, 32}` inputs are multiplied: `:exact`
      (default, f32 FMAs) or `:tf32x3`, on tensor cores, each product as
      three TF32 products of split operands (what PyTorch's
      memory-efficient backend does for f32): faster, within about 2^-21
      of each product rather than f32's 2^-24, still deterministic.
      `{:f, 16}` and `{:bf, 16}` inputs take `:exact` only.
    * `:outputs` - destination passing, as for every op: `:o` (required)
      and `:lse` (optional: not written if absent). Without it, both are
      new buffers.
    * `:sync`, `:stream` - as for every op (see the module doc)

  Outputs: `:o`, of the shape and type of `q`, and `:lse` `[B, Hq, T]`
  `{:f, 32}` (in either layout), the log-sum-exp of each query's scores,
  which `attention_backward/7` takes.

  Bad option values and the ranks of `q` and `k` raise `ArgumentError`
  naming the option or tensor; other shapes, types and the head width are
  checked by the library, whose messages name the tensors as here.
  """
  @spec attention_forward(tensor(), tensor(), tensor(), [attention_option()] | map()) ::
          op_result()
  defnative(attention_forward(q, k, v, opts \\ []))

  @doc """
  Gradients of `attention_forward/4`, given its inputs `q`, `k`, `v`, its
  outputs `o` and `lse` (from the same inputs and options), and `grad_o`
  (shape and type of `q`), the gradient of the loss with respect to `o`.
  The options `:mask`, `:window`, `:layout` and `:scale` must be the
  forward's; `:precision` is the backward's own.

  Options, besides those:

    * `:outputs` - the gradients to write, by name: any of `:grad_q`,
      `:grad_k`, `:grad_v`, at least one; only those are written.
    * `:sync`, `:stream` - as for every op (see the module doc)

  Outputs: `:grad_q` of the shape of `q`, `:grad_k` and `:grad_v` of the
  shape of `k`, all of the type of `q`. Without `:outputs`, all three are
  new buffers. `:grad_k` and `:grad_v` sum over the query heads that share
  each key/value head. A query that sees no key contributes no gradient
  (its `:grad_q` row is zero). Results are bitwise the same from run to run.
  """
  @spec attention_backward(
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          [attention_option()] | map()
        ) :: op_result()
  defnative(attention_backward(q, k, v, o, lse, grad_o, opts \\ []))

  ## GRU, LSTM and sLSTM sequences

  @typedoc """
  Options of `gru_forward/3`, `lstm_forward/3` and `slstm_forward/3`, as a
  keyword list or a map. `nil` stands for an absent tensor. `:precision` is
  the GRU's and LSTM's (and their stacks'), not the sLSTM's.
  """
  @type gated_rnn_option ::
          {:bias, tensor() | nil}
          | {:h0, tensor() | nil}
          | {:c0, tensor() | nil}
          | {:n0, tensor() | nil}
          | {:m0, tensor() | nil}
          | {:precision, :exact | :tf32}
          | call_option()

  @typedoc "Options of `gru_backward/5`, `lstm_backward/5` and `slstm_backward/5`: the forward's and the final states' gradients."
  @type gated_rnn_backward_option ::
          gated_rnn_option()
          | {:grad_h_final, tensor() | nil}
          | {:grad_c_final, tensor() | nil}
          | {:grad_n_final, tensor() | nil}
          | {:grad_m_final, tensor() | nil}

  @typedoc "`gated_rnn_backward_option()`s as a keyword list or a map."
  @type gated_rnn_backward_options :: [gated_rnn_backward_option()] | map()

  @doc """
  A GRU over a whole sequence (Axon's `gru_cell`, PyTorch's and cuDNN's GRU),
  the recurrent product fused in. With `wx` `[B, T, 3H]` the input projection
  of every step (`x W + b`, the caller's), `r` `[H, 3H]` the recurrent weights
  and `:bias` `[3H]` the recurrent bias, gates r, z, n side by side, for each
  step, with `rh = h_{t-1} r + bias`:

      r   = sigmoid(wx_r + rh_r)
      z   = sigmoid(wx_z + rh_z)
      n   = tanh(wx_n + r * rh_n)
      h_t = (1 - z) * n + z * h_{t-1}

  `wx` (and `y`) are `{:f, 32}`, `{:f, 16}` or `{:bf, 16}`; `r` and `:bias`
  one type, `{:f, 32}` or that of `wx`; the states one type, `{:f, 32}` or
  that of `wx`. Arithmetic and the carried state are f32.

  Options:

    * `:bias` - the recurrent bias `[3H]` (none when absent or `nil`):
      Axon's `bhn` is `[0, 0, bhn]`, its `br`, `bz`, `bin` belong in `wx`
    * `:h0` - the initial state `[B, H]` (zeros when absent or `nil`)
    * `:precision` - how an f32 sequence's products run: `:exact` (default,
      f32 multiply-adds) or `:tf32`, on tensor cores at TF32's precision or
      better, as cuDNN does by default (the forward's `r` rounded to f16's
      11 significant bits, `|r|` below 65504; the backward's operands in two
      bf16 halves; every sum f32): about twice as fast at `[64, 256, 512]`
      (bench/RESULTS.md). `{:f, 32}` `wx` only; a product whose layout
      cannot take the tensor cores (batch groups of fewer than 8 rows, as
      at B <= 4) runs exact.
    * `:outputs` - destination passing, as for every op: `:y` (required) and
      `:h_final` (optional). Without it, both are new buffers (`:h_final` of
      the type of `:h0`, `{:f, 32}` without it).
    * `:sync`, `:stream` - as for every op (see the module doc)

  Outputs: `:y` `[B, T, H]` (every `h_t`) of the type of `wx`, and `:h_final`
  `[B, H]`. H is at most 256 / 3 hidden units per multiprocessor of the
  device; a larger one is refused when the call meets the device.
  """
  @spec gru_forward(tensor(), tensor(), [gated_rnn_option()] | map()) :: op_result()
  defnative(gru_forward(wx, r, opts \\ []))

  @doc """
  Gradients of `gru_forward/3`, given its `wx`, `r` and options (`:bias`,
  `:h0`), its `y` and `grad_y` `[B, T, H]` (type of `wx`). The gates are
  recomputed from `y`.

  Options, besides the forward's:

    * `:grad_h_final` - the gradient with respect to the final state `[B, H]`
      (none when absent or `nil`)
    * `:outputs` - the gradients to write, by name: any of the outputs below,
      at least one; only those are written.

  Outputs: `:grad_wx` `[B, T, 3H]` (type of `wx`); `:grad_r` `[H, 3H]` and
  `:grad_bias` `[3H]` (type of `r`); `:grad_h0` `[B, H]` (type of the states
  given, `{:f, 32}` without any); `:grad_rh` `[B, T, 3H]` (type of `wx`), the
  gradient of the recurrent pre-activations `h_{t-1} r + bias`: `:grad_wx`
  but for the n gate, where it is `r` times it. `:grad_bias` and `:grad_h0`
  are the gradients at zero for a call without `:bias` or `:h0`. Without
  `:outputs`, all five are new buffers. Sums over batch and time
  (`:grad_r`, `:grad_bias`) are taken in a fixed order: results are bitwise
  the same from run to run.
  """
  @spec gru_backward(tensor(), tensor(), tensor(), tensor(), gated_rnn_backward_options()) ::
          op_result()
  defnative(gru_backward(wx, r, y, grad_y, opts \\ []))

  @doc """
  An LSTM over a whole sequence (Axon's `lstm_cell`, PyTorch's and cuDNN's
  LSTM), the recurrent product fused in. With `wx` `[B, T, 4H]` the input
  projection of every step, `r` `[H, 4H]` and `:bias` `[4H]`, gates i, f, g,
  o side by side, and `rh = h_{t-1} r + bias`:

      i, f, o = sigmoid(wx + rh)      g = tanh(wx_g + rh_g)
      c_t = f * c_{t-1} + i * g       h_t = o * tanh(c_t)

  Types as in `gru_forward/3`. Options as there, and `:c0`, the initial cell
  `[B, H]` (zeros when absent or `nil`; Axon's carry `{c, h}` is `c0: c,
  h0: h`). Outputs: `:y` `[B, T, H]`, `:h_final` and `:c_final` `[B, H]`
  (both optional under `:outputs`). H is at most 64 hidden units per
  multiprocessor of the device.
  """
  @spec lstm_forward(tensor(), tensor(), [gated_rnn_option()] | map()) :: op_result()
  defnative(lstm_forward(wx, r, opts \\ []))

  @doc """
  Gradients of `lstm_forward/3`, as `gru_backward/5` gives the GRU's, with
  `:c0` and `:grad_c_final` among the options, and `:grad_c0` among the
  outputs. `:grad_rh` equals `:grad_wx` for the LSTM.
  """
  @spec lstm_backward(tensor(), tensor(), tensor(), tensor(), gated_rnn_backward_options()) ::
          op_result()
  defnative(lstm_backward(wx, r, y, grad_y, opts \\ []))

  @doc """
  xLSTM's sLSTM over a whole sequence, exactly as Edifice's `slstm_scan`,
  the recurrent product fused in. With `wx` `[B, T, 4H]` the input
  projection of every step, `r` `[H, 4H]` and `:bias` `[4H]`, gates i, f, z,
  o side by side, and `pre = wx + h_{t-1} r + bias`:

      m_t = max(pre_f + m_{t-1}, pre_i)
      i = exp(pre_i - m_t),  f = exp(pre_f + m_{t-1} - m_t)
      c_t = f * c_{t-1} + i * tanh(pre_z),  n_t = f * n_{t-1} + i
      h_t = sigmoid(pre_o) * c_t / max(|n_t|, 1)

  Types as in `gru_forward/3`. Options as there, and `:c0`, `:n0`, `:m0`,
  the initial cell, normaliser and stabiliser `[B, H]` (when absent or
  `nil`: zeros, ones and zeros, Edifice's). Outputs: `:y` `[B, T, H]`,
  `:h_final`, `:c_final`, `:n_final` and `:m_final` `[B, H]` (all but `:y`
  optional under `:outputs`). H is at most 64 hidden units per
  multiprocessor of the device.
  """
  @spec slstm_forward(tensor(), tensor(), [gated_rnn_option()] | map()) :: op_result()
  defnative(slstm_forward(wx, r, opts \\ []))

  @doc """
  Gradients of `slstm_forward/3`, as `gru_backward/5` gives the GRU's, with
  `:c0`, `:n0`, `:m0` and `:grad_c_final`, `:grad_n_final`, `:grad_m_final`
  among the options, and `:grad_c0`, `:grad_n0`, `:grad_m0` among the
  outputs. `c`, `n` and `m` are recomputed from `y`. `:grad_rh` equals
  `:grad_wx`. At max()'s ties the gradient is split as Nx's autodiff splits
  it (half to each side).
  """
  @spec slstm_backward(tensor(), tensor(), tensor(), tensor(), gated_rnn_backward_options()) ::
          op_result()
  defnative(slstm_backward(wx, r, y, grad_y, opts \\ []))

  ## Stacked GRU and LSTM layers

  @typedoc """
  Options of `gru_stack_forward/4` and `lstm_stack_forward/4`, as a keyword
  list or a map. `nil` stands for an absent tensor.
  """
  @type gated_rnn_stack_option ::
          {:bias, tensor() | nil}
          | {:w_bias, tensor() | nil}
          | {:h0, tensor() | nil}
          | {:c0, tensor() | nil}
          | {:precision, :exact | :tf32}
          | call_option()

  @typedoc "Options of the stacks' backward: the forward's, and the gradients of its other outputs."
  @type gated_rnn_stack_backward_option ::
          gated_rnn_stack_option()
          | {:grad_y_lower, tensor() | nil}
          | {:grad_h_final, tensor() | nil}
          | {:grad_c_final, tensor() | nil}

  @doc """
  L = 2 to 4 stacked GRU layers of one hidden size H, as `torch.nn.GRU(H, H,
  L)` runs them: layer 0 is `gru_forward/3` on `wx` `[B, T, 3H]`, layer
  `l > 0` the same on `y_{l-1} w[l-1] + w_bias[l-1]`, the layer below's
  output projected here. `r` `[L, H, 3H]` stacks the layers' recurrent
  weights, `w` `[L-1, H, 3H]` the input weights of the layers above the
  first. Up to B = 4 the whole stack is one launch, each layer a step or
  two behind the one below it; above, the layers run one after another.

  Types as in `gru_forward/3`, `w` and `:w_bias` of the type of `r`.
  Options: `:bias` `[L, 3H]`, `:w_bias` `[L-1, 3H]` (none when absent or
  `nil`), `:h0` `[L, B, H]` (zeros), `:precision` (as `gru_forward/3`'s),
  `:outputs`, `:sync`, `:stream`.

  Outputs: `:y` `[B, T, H]` the last layer's output; `:y_lower` `[L-1, B, T,
  H]` the other layers' (the backward's input); `:h_final` `[L, B, H]`.
  """
  @spec gru_stack_forward(tensor(), tensor(), tensor(), [gated_rnn_stack_option()] | map()) ::
          op_result()
  defnative(gru_stack_forward(wx, r, w, opts \\ []))

  @doc """
  Gradients of `gru_stack_forward/4`, given its `wx`, `r`, `w` and options,
  its `y` and `y_lower`, and `grad_y` `[B, T, H]`. Options besides the
  forward's: `:grad_y_lower` `[L-1, B, T, H]` and `:grad_h_final` `[L, B,
  H]` (none when absent or `nil`); `:outputs` the gradients to write, at
  least one.

  Outputs: `:grad_wx` `[B, T, 3H]`, `:grad_r` `[L, H, 3H]`, `:grad_w` `[L-1,
  H, 3H]`, `:grad_bias` `[L, 3H]`, `:grad_w_bias` `[L-1, 3H]` and
  `:grad_h0` `[L, B, H]`. Up to B = 4 every layer's reverse walk is one
  launch, each layer a step or two behind the one above it; above, each
  layer's backward from the top down. Sums in a fixed order (bitwise the
  same from run to run).
  """
  @spec gru_stack_backward(
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          [gated_rnn_stack_backward_option()] | map()
        ) :: op_result()
  defnative(gru_stack_backward(wx, r, w, y, y_lower, grad_y, opts \\ []))

  @doc """
  Stacked LSTM layers, as `gru_stack_forward/4` stacks GRU layers, each
  layer `lstm_forward/3` (`torch.nn.LSTM(H, H, L)`): `4H` for `3H`, the
  option `:c0` `[L, B, H]` and the output `:c_final` `[L, B, H]`.
  """
  @spec lstm_stack_forward(tensor(), tensor(), tensor(), [gated_rnn_stack_option()] | map()) ::
          op_result()
  defnative(lstm_stack_forward(wx, r, w, opts \\ []))

  @doc """
  Gradients of `lstm_stack_forward/4`, as `gru_stack_backward/7` gives the
  GRU stack's, with `:c0` and `:grad_c_final` among the options and
  `:grad_c0` among the outputs.
  """
  @spec lstm_stack_backward(
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          tensor(),
          [gated_rnn_stack_backward_option()] | map()
        ) :: op_result()
  defnative(lstm_stack_backward(wx, r, w, y, y_lower, grad_y, opts \\ []))

  ## In-graph (XLA FFI)

  @doc """
  Registers every op's XLA FFI handler (`libexphil_xla_ffi.so`, built where
  XLA's FFI headers are; see the README) with the XLA runtime that EXLA has
  loaded in this VM, so that an `EXLA.CustomCall` inside a compiled graph can
  call them (target names such as `"exphil_min_gru_fwd"`; the contract is in
  `include/exphil/xla_ffi.h`). Call it once, after EXLA has started and
  before the first compilation that uses the targets.

  `handler_library` is the path of `libexphil_xla_ffi.so`; `xla_library` the
  path of EXLA's `libxla_extension.so` as it was loaded. The XLA library is
  only looked up, never loaded: one not already in the VM is an error, as is
  a handler library built against another XLA FFI version. The handler
  library stays loaded for the life of the VM. Registering twice is
  harmless.

  Returns `:ok` or `{:error, {:xla_ffi_registration, message}}` naming the
  reason. Untested against a live EXLA (no EXLA build was at hand); its
  failure paths and the registration itself are tested.
  """
  @spec register_xla_ffi(Path.t(), Path.t()) :: :ok | {:error, reason()}
  defnative(register_xla_ffi(handler_library, xla_library))
end
