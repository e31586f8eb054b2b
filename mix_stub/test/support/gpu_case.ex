defmodule ExPhil.Native.GPUCase do
  @moduledoc "Helpers of the GPU tests: buffers from lists and back, and running one op."
  alias ExPhil.Native
  alias ExPhil.Native.Reference, as: R

  def upload!(values, shape, type \\ {:f, 32}) do
    binary = if type == {:f, 32}, do: R.encode_f32(values), else: elem(R.to_bf16(values), 1)
    {:ok, buffer} = Native.upload(binary, type, shape)
    buffer
  end

  # A buffer of `shape` filled with NaN, so unwritten elements show.
  def poisoned!(shape) do
    count = Tuple.product(shape)

    {:ok, buffer} =
      Native.upload(:binary.copy(<<0xFF, 0xFF, 0xFF, 0x7F>>, count), {:f, 32}, shape)

    buffer
  end

  def download!(tensor, type \\ {:f, 32}) do
    {:ok, binary} = Native.download(tensor)
    if type == {:f, 32}, do: R.decode_f32(binary), else: R.decode_bf16(binary)
  end

  def forward(op, inputs, opts), do: apply(Native, :"#{op}_forward", inputs ++ [opts])

  def backward(op, inputs, y, grad_y, opts),
    do: apply(Native, :"#{op}_backward", inputs ++ [y, grad_y, opts])

  @doc """
  Random f32 inputs for `op` at `dims`, uploaded, with h0, grad_y and
  grad_h_final, and the reference forward and backward.
  """
  def problem(op, {b, _t, h} = dims) do
    n = Tuple.product(dims)
    xs = op |> R.random_inputs(n) |> Enum.map(&R.to_f32/1)
    h0 = R.to_f32(R.random(b * h, -1.0, 1.0))
    gy = R.to_f32(R.random(n, -1.0, 1.0))
    gf = R.to_f32(R.random(b * h, -1.0, 1.0))
    {ry, rhf} = R.forward(op, xs, dims, h0)
    {rg, rg0} = R.backward(op, xs, dims, h0, gy, gf)

    %{
      op: op,
      dims: dims,
      xs: xs,
      h0: h0,
      gy: gy,
      gf: gf,
      buffers: Enum.map(xs, &upload!(&1, dims)),
      h0_buffer: upload!(h0, {b, h}),
      gy_buffer: upload!(gy, dims),
      gf_buffer: upload!(gf, {b, h}),
      ref_y: ry,
      ref_h_final: rhf,
      ref_grads: rg,
      ref_grad_h0: rg0,
      state_scale: R.scale([ry, rhf]),
      grad_scale: R.scale([rg0 | rg])
    }
  end

  @doc "Worst error / tolerance of forward and backward outputs of `p` (<= 1 passes)."
  def check_outputs(p, fwd, bwd) do
    ratios =
      [
        R.error_ratio(download!(fwd.y), p.ref_y, p.state_scale),
        R.error_ratio(download!(fwd.h_final), p.ref_h_final, p.state_scale),
        R.error_ratio(download!(bwd.grad_h0), p.ref_grad_h0, p.grad_scale)
      ] ++
        for {name, ref} <- Enum.zip(R.grad_names(p.op), p.ref_grads) do
          R.error_ratio(download!(Map.fetch!(bwd, name)), ref, p.grad_scale)
        end

    Enum.max(ratios)
  end
end
