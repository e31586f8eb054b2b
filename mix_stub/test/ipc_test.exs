defmodule ExPhil.Native.IPCTest do
  # CUDA IPC across two OS processes: this VM exports buffers, a second VM
  # imports them, runs an op into one of them, and both read the result.
  use ExUnit.Case, async: false
  @moduletag :gpu
  import ExPhil.Native.GPUCase
  alias ExPhil.Native
  alias ExPhil.Native.Reference, as: R

  @child """
  alias ExPhil.Native
  [gate, cand, y] = Enum.map(System.argv(), &:erlang.binary_to_term(Base.decode64!(&1)))
  dims = {1, 16, 32}
  {:ok, g1} = Native.import_ipc(gate, {:f, 32}, dims)
  {:ok, g2} = Native.import_ipc(gate, {:f, 32}, dims)
  {:ok, c} = Native.import_ipc(cand, {:f, 32}, dims)
  {:ok, yb} = Native.import_ipc(y, {:f, 32}, dims)
  opened = Native.open_ipc_handles()
  too_big =
    try do
      # far beyond the 2 KiB allocation, past any rounding of its size
      Native.import_ipc(%{y | data_size: y.data_size * 4096}, {:f, 32}, {4096, 16, 32})
    rescue
      e in ArgumentError -> Exception.message(e)
    end
  {:ok, _} = Native.min_gru_forward(g1, c, outputs: [y: yb])
  {:ok, bytes} = Native.download(yb)
  :ok = Native.free(g1)
  after_one = Native.open_ipc_handles()
  :ok = Native.free(g2)
  after_both = Native.open_ipc_handles()
  report = %{y: bytes, opened: opened, after_one: after_one, after_both: after_both, too_big: too_big}
  IO.write("REPORT:" <> Base.encode64(:erlang.term_to_binary(report)))
  """

  @tag timeout: 120_000
  test "a second OS process imports exported buffers, runs an op on them, and both see the result" do
    dims = {1, 16, 32}
    p = problem(:min_gru, dims)
    y = poisoned!(dims)
    handles = for b <- p.buffers ++ [y], do: elem(Native.export_ipc(b), 1)
    assert Enum.all?(handles, &match?(%{kind: :ipc, handle: <<_::binary-size(64)>>}, &1))

    ebin = Path.join(:code.lib_dir(:exphil_native), "ebin")
    args = Enum.map(handles, &Base.encode64(:erlang.term_to_binary(&1)))

    {output, status} =
      System.cmd(System.find_executable("elixir"), ["-pa", ebin, "-e", @child | args],
        stderr_to_stdout: true
      )

    assert status == 0, output
    [_, encoded] = String.split(output, "REPORT:")
    report = :erlang.binary_to_term(Base.decode64!(encoded))

    # the handle imported twice is opened once, and closed with its last user
    assert report.opened == 3
    assert report.after_one == 3
    assert report.after_both == 2
    assert report.too_big =~ "fewer than data_size"

    {ref_y, _} = R.forward(:min_gru, p.xs, dims)
    assert R.error_ratio(R.decode_f32(report.y), ref_y, R.scale([ref_y])) <= 1.0
    assert R.error_ratio(download!(y), ref_y, R.scale([ref_y])) <= 1.0
  end
end
