defmodule ExPhil.Native do
  @moduledoc """
  Fused GPU recurrences on tensors in device memory, without host copies.

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

  Options (keyword list or map):

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
      tensors' device, shared by every caller) or an `ExPhil.Native.Stream`
      from `new_stream/1`, for work that need not wait behind other
      callers'. Raw `cudaStream_t` addresses are not accepted: a wrong one
      would crash the VM inside the driver.

  Ops return `{:ok, outputs}` (a map from output name to the tensor or
  buffer written), or `{:ok, event}` with `sync: false`.

  ## Synchronisation with EXLA

  The ops do not wait for work on other streams. Results of a compiled EXLA
  function are ready when EXLA hands out their pointers; a fresh upload may
  not be. Call `synchronize/1` first when an input may still be in flight on
  another stream.

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
          %{required(:kind) => :local, required(:address) => non_neg_integer(), required(:data_size) => non_neg_integer()}
          | %{required(:kind) => :ipc, required(:handle) => binary(), required(:data_size) => non_neg_integer()}

  @typedoc "A tensor in device memory."
  @type tensor :: {pointer() | Buffer.t(), type(), tuple()} | Buffer.t()

  @typedoc "Runtime failures."
  @type reason ::
          :no_cuda_device
          | :out_of_memory
          | {:cuda_error, atom(), String.t()}
          | {:internal, String.t()}

  @typedoc "Outputs by name: the tensors given in `:outputs`, or new buffers."
  @type outputs :: %{optional(atom()) => tensor()}

  @type op_result :: {:ok, outputs()} | {:ok, Event.t()} | {:error, reason()}

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
  def nif_not_loaded!, do: raise(ExPhil.Native.LoadError, reason: load_error())

  ## Devices

  @doc "The number of CUDA devices (0 on a machine without a GPU or driver)."
  @spec device_count() :: non_neg_integer() | {:error, reason()}
  defnative device_count()

  @doc """
  Name, memory (`:total_memory`, `:free_memory` in bytes), compute
  capability and multiprocessor count of a device.
  """
  @spec device_info(non_neg_integer()) :: {:ok, map()} | {:error, reason()}
  defnative device_info(device)

  @doc "Waits for all work on every device, from any stream."
  @spec synchronize() :: :ok | {:error, reason()}
  defnative synchronize()

  @doc """
  Waits for all work on `device`, from any stream: use it before an op when
  an input may still be in flight (for instance a fresh upload by EXLA).
  """
  @spec synchronize(non_neg_integer()) :: :ok | {:error, reason()}
  defnative synchronize(device)

  @doc """
  A new CUDA stream (non-blocking) on a device (options: `:device`, default
  0), for the `:stream` option of the ops. It is destroyed when garbage-
  collected, after the work queued on it.
  """
  @spec new_stream(keyword() | map()) :: {:ok, Stream.t()} | {:error, reason()}
  defnative new_stream(opts \\ [])

  @doc "Waits for the work of an op called with `sync: false`; returns its outputs."
  @spec await(Event.t()) :: {:ok, outputs()} | {:error, reason()}
  defnative await(event)

  ## Buffers

  @doc """
  Allocates device memory for a tensor of `type` and `shape` (options:
  `:device`, default 0). The memory is freed by `free/1` or when the buffer
  is garbage-collected.
  """
  @spec allocate(type(), tuple(), keyword() | map()) :: {:ok, Buffer.t()} | {:error, reason()}
  defnative allocate(type, shape, opts \\ [])

  @doc "Copies a binary (native byte order) into a new buffer."
  @spec upload(binary(), type(), tuple(), keyword() | map()) :: {:ok, Buffer.t()} | {:error, reason()}
  defnative upload(data, type, shape, opts \\ [])

  @doc """
  Copies a buffer (or a `{buffer, type, shape}` view of it) to a binary,
  after the work enqueued on its device's managed stream.
  """
  @spec download(Buffer.t() | tensor()) :: {:ok, binary()} | {:error, reason()}
  defnative download(buffer)

  @doc """
  Frees a buffer's device memory now, or as soon as work in flight that uses
  it has finished. A second call returns `{:error, :already_freed}`.
  """
  @spec free(Buffer.t()) :: :ok | {:error, :already_freed}
  defnative free(buffer)

  @doc """
  The pointer map of a buffer, `%{kind: :local, address: integer,
  data_size: bytes}`, for `Nx.from_pointer/4`. EXLA treats that memory as
  borrowed: keep the buffer alive (and unfreed) while the tensor is used.
  """
  @spec pointer(Buffer.t()) :: %{kind: :local, address: non_neg_integer(), data_size: non_neg_integer()}
  defnative pointer(buffer)

  @doc """
  A CUDA IPC handle for a buffer, `%{kind: :ipc, handle: <<_::512>>,
  data_size: bytes}`, for another OS process to `import_ipc/4`.
  """
  @spec export_ipc(Buffer.t()) :: {:ok, pointer()} | {:error, reason()}
  defnative export_ipc(buffer)

  @doc """
  Maps memory exported by another process as a buffer of `type` and
  `shape` (options: `:device`, default 0). A handle is opened once per
  process and closed when the last buffer or call using it is gone; the
  mapped allocation must hold `data_size` bytes.
  """
  @spec import_ipc(pointer(), type(), tuple(), keyword() | map()) :: {:ok, Buffer.t()} | {:error, reason()}
  defnative import_ipc(pointer, type, shape, opts \\ [])

  @doc "How many distinct IPC handles this process has open now."
  @spec open_ipc_handles() :: non_neg_integer()
  defnative open_ipc_handles()

  ## Ops

  @doc """
  `h_t = a_t * h_{t-1} + b_t`. `a`, `b`: `[B, T, H]`. Outputs `:y`
  `[B, T, H]` and `:h_final` `[B, H]`.
  """
  @spec linear_scan_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative linear_scan_forward(a, b, opts \\ [])

  @doc """
  Gradients of `linear_scan_forward/3`: given its inputs, its `y` and
  `grad_y`, outputs `:grad_a`, `:grad_b` and `:grad_h0`.
  """
  @spec linear_scan_backward(tensor(), tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative linear_scan_backward(a, b, y, grad_y, opts \\ [])

  @doc """
  `z = sigmoid(gate)`, `h_t = (1 - z) * h_{t-1} + z * candidate`. Outputs
  `:y` and `:h_final`.
  """
  @spec min_gru_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative min_gru_forward(gate, candidate, opts \\ [])

  @doc "Gradients of `min_gru_forward/3`: `:grad_gate`, `:grad_candidate`, `:grad_h0`."
  @spec min_gru_backward(tensor(), tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative min_gru_backward(gate, candidate, y, grad_y, opts \\ [])

  @doc """
  `f = sigmoid(forget)`, `i = sigmoid(input)`, `s = f + i + 1e-6`,
  `h_t = (f / s) * h_{t-1} + (i / s) * candidate`. Outputs `:y` and
  `:h_final`.
  """
  @spec min_lstm_forward(tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative min_lstm_forward(forget, input, candidate, opts \\ [])

  @doc "Gradients of `min_lstm_forward/4`: `:grad_forget`, `:grad_input`, `:grad_candidate`, `:grad_h0`."
  @spec min_lstm_backward(tensor(), tensor(), tensor(), tensor(), tensor(), keyword() | map()) ::
          op_result()
  defnative min_lstm_backward(forget, input, candidate, y, grad_y, opts \\ [])

  @doc """
  `h_t = target + (h_{t-1} - target) * exp(-1 / tau)` (tau > 0). Outputs `:y`
  and `:h_final`.
  """
  @spec liquid_forward(tensor(), tensor(), keyword() | map()) :: op_result()
  defnative liquid_forward(tau, target, opts \\ [])

  @doc "Gradients of `liquid_forward/3`: `:grad_tau`, `:grad_target`, `:grad_h0`."
  @spec liquid_backward(tensor(), tensor(), tensor(), tensor(), keyword() | map()) :: op_result()
  defnative liquid_backward(tau, target, y, grad_y, opts \\ [])
end
