#!/usr/bin/env python3
"""Runs the custom calls that EXLA would emit for ExPhil.Native's ops, on a
GPU, through JAX's XLA, and checks their results.

What
----
Reads the cases that `mix exphil.exla_cases` writes (mix_stub/lib/mix/tasks/
exphil.exla_cases.ex): for every op, dtype and option set, the forward and
backward custom calls of an `ExPhil.Native.Block` traced inside
`Nx.Defn.grad`, with the target, the operands and results (shapes, dtypes,
f32 scalar placeholders of absent optional operands and of their
gradients) and the attributes exactly as `ExPhil.Native.CustomCall.fields/3`
gives them. For each call it writes the StableHLO module as EXLA's
`Value.custom_call/5` builds the op (mix_stub/upstream/exla/mlir_form.md):

    %cc:2 = "stablehlo.custom_call"(%arg0, %arg1, %arg2) {backend_config =
      {has_h0 = false}, call_target_name = "exphil_min_gru_fwd",
      api_version = 4 : i32, operand_layouts = [...], result_layouts = [...]}
      : (...) -> (...)

`backend_config` only when the call has attributes; `operand_layouts` and
`result_layouts` (every one row-major, `dense<[r-1, ..., 0]> :
tensor<rxindex>`, `dense<> : tensor<0xindex>` for a scalar) only in the
pinned form, which the proposed EXLA change emits. It parses the module with
JAX's MLIR, compiles it with JAX's XLA for the GPU (the handlers of
libexphil_xla_ffi.so registered by pointer, as check_jax_ffi.py does) and
runs it.

Variants, per case (each line covers the forward and the backward call):

  a pinned      operands are the entry's parameters, results its outputs;
                layouts pinned (what the patched EXLA emits).
  a unpinned    the same without layout attributes: what EXLA emits today
                for an eager block (its operands and results are the
                entry's own, which XLA keeps row-major). Must equal
                "a pinned" bit for bit.
  b pinned      every operand produced inside the module by an op whose
                output layout XLA may choose: the transpose of a transposed
                parameter, a broadcast_in_dim of (the transpose of) a
                parameter, a slice of a larger NaN-padded parameter, or a
                reshape after a dot_general with an identity (HIGHEST
                precision: exact); each result of rank >= 2 consumed by a
                transpose. Layouts pinned: must equal "a pinned" on the same
                inputs bit for bit, and XLA's optimized HLO must show only
                row-major layouts on the custom call.
  b unpinned    "b" without layout attributes: the known hazard (a typed
                FFI handler sees dimensions, not layouts). Reported, never
                a failure: whether the results differ from "a" and which
                non-row-major layouts XLA gave the custom call. Runs after
                every other variant of every case; then again with the
                results as the module's outputs (no transposes after the
                call), "b unpinned, operands only", the operands' side alone.

The sLSTM's cases (op "slstm": exphil_slstm_{fwd,bwd}, bias, h0, c0, n0 and
m0 given or not, the final states not used) take check_slstm_case's inputs
(n0 in [1, 2]) and its float64 JAX reference, slstm_all_ref. The GRU's and
LSTM's cases (ops "gru", "lstm": exphil_{gru,lstm}_{fwd,bwd},
bias, h0 and c0 given or not, the final states used or not) take
check_jax_ffi.check_gated_case's input ranges and tolerances (GATED_TOL) and
float64 numpy references written here: the forward step by step, the
backward an exact hand-written reverse loop over the forward's own states
(gated_forward64, gated_backward64; grad_rh the gradient of h_{t-1} R +
bias). Their backward writes every result, grad_bias, grad_h0 and grad_c0
also for inputs not given (the gradient at zero): none is a placeholder.
The stacks' cases (ops "gru_stack", "lstm_stack": exphil_{gru,lstm}_stack_
{fwd,bwd}, bias, W_bias, h0 and c0 all given, none, or W_bias alone) take
the same ranges and tolerances and the stack of those references
(stack_reference); y_lower's cotangent is always absent (the Nx op keeps
y_lower to itself).
The targets are registered by pointer as check_jax_ffi.py does.

Edifice's cases (op "edifice": a forward and a backward block of a pair of
native Edifice ops, as ExPhil.Native.Edifice.native_block/3 makes them, its
GRU and LSTM scans among them) take
check_edifice_ffi.py's inputs and float64 references of Edifice's math, and
its comparisons; the backward's y (or o) is the reference forward of its own
inputs, rounded to the dtype, as Edifice passes its forward's output.

Inputs are random (seeded by --seed and the case's name), generated with
check_jax_ffi.py's generators and ranges (tau > 0, A < 0, dt away from the
clamp's edges, ...). "b" uses the same inputs as "a" except that an operand
built by a broadcast is constant along the broadcast axis; "a pinned" is
run again on those inputs for the bitwise comparison. Results are compared
with check_jax_ffi.py's JAX references, evaluated in float64 on the same
rounded inputs, with its tolerances (check_jax_ffi.py's docstring); the
backward takes the forward's outputs (y, or o and lse) from the kernel, as
under EXLA. Gradients that are placeholders are not compared; they must be
f32 scalars. Every case also checks that its attributes agree with the
options it was traced with, and that placeholders stand exactly for the
operands whose has_* attribute is false.

Run (README.md beside this file has the exact commands): the cases where
Elixir is, then, on the GPU machine (jax with its CUDA plugin, the library
built), from the repository root:

    (cd mix_stub && MIX_ENV=test mix exphil.exla_cases ../.gpu/exla_cases.json)
    python3 test/xla_ffi/exla_form/check_exla_form.py \\
        --lib /tmp/b/c_src/xla_ffi/libexphil_xla_ffi.so --cases .gpu/exla_cases.json

Options: --only SUBSTRING (case names), --seed N, --from N (skip the first
N cases), --max-seconds S (start no case after S seconds: the rest count as
not run, and fail), --autotune (leave XLA's GEMM autotuning on; off by
default, since the "b" dots are identities and autotuning them costs
seconds per module), --verbose (tracebacks).

Prints one line per case and variant, then the unpinned findings, then
`N passed, M failed` (a, pinned and unpinned, and b pinned; a case that
did not run counts as failed). Exit status 0 only when nothing failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import platform
import re
import sys
import time
import traceback
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[2]
sys.path.insert(0, str(HERE.parent))  # test/xla_ffi: check_jax_ffi

# Imported in main(), after the arguments: check_jax_ffi imports JAX (and
# enables float64 for the references).
cj = ce = jax = jnp = ref = None

F32_NP = np.dtype(np.float32)
STRATEGIES = ("transpose", "dot", "slice", "broadcast")


# ---------------------------------------------------------------------------
# The module text
# ---------------------------------------------------------------------------
def np_dtype(name):
    return np.dtype(cj.DTYPES[name])


def ttype(shape, dtype):
    return "tensor<" + "".join(f"{d}x" for d in shape) + dtype + ">"


def row_major(rank):
    return list(range(rank - 1, -1, -1))


def layouts_attr(shapes):
    """EXLA's attr_layouts of the row-major layouts of `shapes`."""
    items = []
    for shape in shapes:
        r = len(shape)
        if r == 0:
            items.append("dense<> : tensor<0xindex>")
        else:
            items.append("dense<[" + ", ".join(map(str, row_major(r))) + f"]> : tensor<{r}xindex>")
    return "[" + ", ".join(items) + "]"


def custom_call_text(call, operand_values, pinned):
    """The op as EXLA's Value.custom_call/5 builds it: the attributes are its
    keyword list (Keyword.put puts backend_config first), each value the
    string it passes to mlirParseAttribute; the op in generic form."""
    operands, results = call["operands"], call["results"]
    attrs = []
    if call["attributes"]:
        attrs.append("backend_config = {"
                     + ", ".join(f"{name} = {text}" for name, text in call["attributes"]) + "}")
    attrs.append(f'call_target_name = "{call["target"]}"')
    attrs.append("api_version = 4 : i32")
    if pinned:
        attrs.append("operand_layouts = " + layouts_attr([o["shape"] for o in operands]))
        attrs.append("result_layouts = " + layouts_attr([r["shape"] for r in results]))
    in_types = ", ".join(ttype(o["shape"], o["dtype"]) for o in operands)
    out_types = [ttype(r["shape"], r["dtype"]) for r in results]
    lhs = "%cc" if len(results) == 1 else f"%cc:{len(results)}"
    out = out_types[0] if len(out_types) == 1 else "(" + ", ".join(out_types) + ")"
    return (f'{lhs} = "stablehlo.custom_call"({", ".join(operand_values)}) '
            f'{{{", ".join(attrs)}}} : ({in_types}) -> {out}')


def result_refs(call):
    n = len(call["results"])
    return ["%cc"] if n == 1 else [f"%cc#{i}" for i in range(n)]


class Module:
    """A func.func public @main being written: its parameters (with the
    arrays they take) and its body."""

    def __init__(self):
        self.params, self.args, self.body, self.returns = [], [], [], []
        self.count = 0

    def param(self, array, dtype):
        name = f"%arg{len(self.params)}"
        self.params.append(f"{name}: {ttype(array.shape, dtype)}")
        self.args.append(np.array(array, order="C"))  # not ascontiguousarray: scalars stay 0-d
        return name

    def value(self, rhs):
        name = f"%v{self.count}"
        self.count += 1
        self.body.append(f"{name} = {rhs}")
        return name

    def text(self):
        types = ", ".join(t for _, t in self.returns)
        values = ", ".join(v for v, _ in self.returns)
        lines = ["module {",
                 f"  func.func public @main({', '.join(self.params)}) -> ({types}) {{"]
        lines += [f"    {line}" for line in self.body]
        lines.append(f'    "func.return"({values}) : ({types}) -> ()')
        lines += ["  }", "}", ""]
        return "\n".join(lines)


def build(call, arrays, variant, pinned, strategies=None, transpose_results=True):
    """(module text, parameter arrays, how to read each output back).
    Variant "a": operands are parameters, results outputs. Variant "b":
    operands through `strategies` (one per operand), results of rank >= 2
    through a transpose (unless not `transpose_results`)."""
    m = Module()
    values = []
    for o, x, how in zip(call["operands"], arrays, strategies or ["param"] * len(arrays)):
        dt = o["dtype"]
        shape = tuple(o["shape"])
        r = len(shape)
        if variant == "a" or how == "param":
            values.append(m.param(x, dt))
        elif how == "transpose":
            perm = row_major(r)  # the parameter holds x with its axes reversed
            p = m.param(np.transpose(x, perm), dt)
            inv = [int(i) for i in np.argsort(perm)]
            values.append(m.value(
                f"stablehlo.transpose {p}, dims = {inv} : "
                f"({ttype([shape[i] for i in perm], dt)}) -> {ttype(shape, dt)}"))
        elif how == "slice":
            big = np.full([s + 2 for s in shape], np.nan, np.float64).astype(x.dtype)
            big[tuple(slice(1, 1 + s) for s in shape)] = x
            p = m.param(big, dt)
            ranges = ", ".join(f"1:{1 + s}" for s in shape)
            values.append(m.value(
                f"stablehlo.slice {p} [{ranges}] : ({ttype(big.shape, dt)}) -> {ttype(shape, dt)}"))
        elif how == "dot":
            n = shape[-1]
            rows = int(np.prod(shape[:-1]))
            xt = x.reshape(rows, n).T  # [n, rows]
            eye = np.eye(n).astype(x.dtype)
            p = m.param(xt, dt)
            q = m.param(eye, dt)
            d = m.value(
                f"stablehlo.dot_general {p}, {q}, contracting_dims = [0] x [0], "
                f"precision = [HIGHEST, HIGHEST] : ({ttype(xt.shape, dt)}, {ttype(eye.shape, dt)}) "
                f"-> {ttype((rows, n), dt)}")
            values.append(m.value(
                f"stablehlo.reshape {d} : ({ttype((rows, n), dt)}) -> {ttype(shape, dt)}"))
        elif how == "broadcast":
            axis = broadcast_axis(r)
            kept = [i for i in range(r) if i != axis]
            x0 = np.take(x, 0, axis=axis)
            if not np.array_equal(np.broadcast_to(np.expand_dims(x0, axis), shape), x, equal_nan=True):
                raise AssertionError(f"{o['name']}: not constant along axis {axis}")
            # The parameter holds x0 with its axes reversed; XLA requires
            # broadcast dimensions in increasing order, so a transpose first.
            p = m.param(np.transpose(x0, row_major(r - 1)), dt)
            if r - 1 >= 2:
                p = m.value(f"stablehlo.transpose {p}, dims = {row_major(r - 1)} : "
                            f"({ttype(x0.shape[::-1], dt)}) -> {ttype(x0.shape, dt)}")
            values.append(m.value(
                f"stablehlo.broadcast_in_dim {p}, dims = {kept} : "
                f"({ttype(x0.shape, dt)}) -> {ttype(shape, dt)}"))
        else:
            raise AssertionError(how)
    m.body.append(custom_call_text(call, values, pinned))
    readers = []
    for res, v in zip(call["results"], result_refs(call)):
        shape = tuple(res["shape"])
        r = len(shape)
        if variant == "b" and transpose_results and r >= 2:
            perm = row_major(r)
            t = m.value(f"stablehlo.transpose {v}, dims = {perm} : "
                        f"({ttype(shape, res['dtype'])}) -> {ttype([shape[i] for i in perm], res['dtype'])}")
            m.returns.append((t, ttype([shape[i] for i in perm], res["dtype"])))
            inv = [int(i) for i in np.argsort(perm)]
            readers.append(lambda a, inv=inv: np.transpose(a, inv))
        else:
            m.returns.append((v, ttype(shape, res["dtype"])))
            readers.append(lambda a: a)
    return m.text(), m.args, readers


def broadcast_axis(rank):
    return 1 if rank >= 3 else 0


def assign_strategies(call, offset, derived):
    """One way to produce each operand in variant "b": rank >= 2 operands
    cycle through STRATEGIES (from `offset`), rank 1 is sliced, scalars
    (placeholders) are parameters. Operands that are the forward's outputs
    (`derived`) are not broadcast (they are not constant along any axis)."""
    out, j = [], 0
    for o in call["operands"]:
        r = len(o["shape"])
        if o["placeholder"] or r == 0:
            out.append("param")
        elif r == 1:
            out.append("slice")
        else:
            how = STRATEGIES[(j + offset) % len(STRATEGIES)]
            j += 1
            if how == "broadcast" and o["name"] in derived:
                how = "transpose"
            out.append(how)
    return out


# ---------------------------------------------------------------------------
# XLA through JAX
# ---------------------------------------------------------------------------
class Xla:
    """Parses a module with JAX's MLIR context, compiles it with the GPU
    client JAX uses, runs it. Different JAX versions name these calls
    differently: the first way that works is kept."""

    def __init__(self, autotune):
        from jax._src.interpreters import mlir as jmlir
        from jax._src.lib import xla_client as xc
        from jax._src.lib.mlir import ir
        self.jmlir, self.xc, self.ir = jmlir, xc, ir
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        if not gpus:
            raise RuntimeError(f"no GPU device: JAX sees {jax.devices()}")
        self.device = gpus[0]
        try:
            self.client = self.device.client
        except AttributeError:
            from jax.extend.backend import get_backend
            self.client = get_backend("gpu")
        self.overrides = [] if autotune else [("xla_gpu_autotune_level", "0")]
        self.compile_way = None
        self.run_way = None
        self.cache = {}
        self.notes = []

    def _options(self):
        try:
            from jax._src import compiler
            options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
        except Exception:  # noqa: BLE001 - older or newer signature: plain options
            options = self.xc.CompileOptions()
        if self.overrides:
            options.env_option_overrides = list(self.overrides)
        return options

    def _devices(self):
        for owner in (self.xc, getattr(self.xc, "_xla", None)):
            cls = getattr(owner, "DeviceList", None) if owner is not None else None
            if cls is not None:
                return cls((self.device,))
        try:
            from jax._src.lib import _jax
            return _jax.DeviceList((self.device,))
        except Exception:  # noqa: BLE001
            return None

    def _ways(self, module, text):
        c = self.client
        yield "client.compile_and_load(module)", lambda: c.compile_and_load(
            module, executable_devices=self._devices(), compile_options=self._options())
        yield "client.compile_and_load(bytecode)", lambda: c.compile_and_load(
            self.jmlir.module_to_bytecode(module), self._devices(), self._options())
        yield "client.compile_and_load(text)", lambda: c.compile_and_load(
            text, self._devices(), self._options())
        yield "client.compile(bytecode)", lambda: c.compile(
            self.jmlir.module_to_bytecode(module), compile_options=self._options())

    def compile(self, text):
        if text in self.cache:
            return self.cache[text]
        ir = self.ir
        with self.jmlir.make_ir_context() as ctx, ir.Location.unknown(ctx):
            module = ir.Module.parse(text)
            if module.operation.verify() is False:
                raise RuntimeError("the module does not verify")
            exe = self._compile(module, text)
        self.cache[text] = exe
        return exe

    def _compile(self, module, text):
        ways = list(self._ways(module, text))
        if self.compile_way is not None:
            ways = [w for w in ways if w[0] == self.compile_way]
        errors = []
        for name, fn in ways:
            try:
                exe = fn()
            except (TypeError, AttributeError) as e:
                if self.compile_way is not None:
                    raise
                errors.append(f"{name}: {type(e).__name__}: {e}")
                continue
            except Exception as e:  # noqa: BLE001
                if self.overrides and "autotune" in str(e).lower():
                    self.notes.append(f"this XLA refused xla_gpu_autotune_level=0 ({first_line(str(e))}); "
                                      "autotuning stays on")
                    self.overrides = []
                    return self._compile(module, text)
                raise
            if self.compile_way is None:
                self.compile_way = name
            return exe
        raise RuntimeError("no way to compile a module with this JAX: " + " | ".join(errors))

    def run(self, exe, arrays):
        args = [jax.device_put(a, self.device) for a in arrays]
        if self.run_way in (None, "execute_sharded"):
            try:
                res = exe.execute_sharded(args)
                outs = [per_device[0] for per_device in res.disassemble_into_single_device_arrays()]
                self.run_way = "execute_sharded"
                return [np.asarray(o) for o in outs]
            except (TypeError, AttributeError):
                if self.run_way is not None:
                    raise
        outs = exe.execute(args)
        self.run_way = "execute"
        return [np.asarray(o) for o in outs]

    def hlo(self, exe):
        """The optimized HLO text, or None where this JAX does not give it."""
        for name in ("hlo_modules", "get_hlo_modules"):
            fn = getattr(exe, name, None)
            if fn is None:
                continue
            try:
                return "\n".join(m.to_string() for m in fn())
            except Exception:  # noqa: BLE001
                continue
        return None


SHAPE_RE = re.compile(r"\b(pred|bf16|[fsu]\d+)\[([0-9,]*)\]\{([0-9,]*)")
DEF_RE = re.compile(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(\S+)")
CALL_RE = re.compile(r"\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*?)\s*custom-call\((.*?)\),\s*custom_call_target=")


def custom_call_layouts(hlo, target):
    """(shapes seen, the non-row-major ones) on the custom call to `target`
    in XLA's optimized HLO: its results' and operands' shapes with their
    minor-to-major layouts (an operand printed by name only takes the shape
    of its definition in the same computation). None where not found."""
    try:
        lines = (hlo or "").splitlines()
        at = next(i for i, line in enumerate(lines)
                  if "custom-call(" in line and f'custom_call_target="{target}"' in line)
        start = max([j for j in range(at) if lines[j].rstrip().endswith("{")], default=-1)
        end = next((j for j in range(at, len(lines)) if lines[j].strip() == "}"), len(lines))
        defined = {}
        for line in lines[start + 1:end]:
            m = DEF_RE.match(line)
            if m:
                defined[m.group(1)] = m.group(2)
        m = CALL_RE.match(lines[at])
        if m is None:
            return None
        seen = [("result", s) for s in SHAPE_RE.findall(m.group(1))]
        inline = SHAPE_RE.findall(m.group(2))
        if inline:
            seen += [(f"operand {k}", s) for k, s in enumerate(inline)]
        else:
            for k, name in enumerate(n.strip().lstrip("%") for n in m.group(2).split(",") if n.strip()):
                seen += [(f"operand {k}", s) for s in SHAPE_RE.findall(defined.get(name, ""))]
        odd = [f"{where} {t}[{d}]{{{lay}}}" for where, (t, d, lay) in seen
               if lay and [int(i) for i in lay.split(",")] != row_major(len(d.split(",")) if d else 0)]
        return len(seen), odd
    except Exception:  # noqa: BLE001 - a report, never a reason to fail
        return None


# ---------------------------------------------------------------------------
# Inputs and references (check_jax_ffi.py's generators and references)
# ---------------------------------------------------------------------------
def f64(a):
    return jnp.asarray(np.asarray(a).astype(np.float64))


def rounded(values, name):
    """float64 values rounded to dtype `name`, as an array of that dtype."""
    return np.asarray(values, np.float64).astype(np_dtype(name))


def needs(call, name):
    """Whether `call` takes operand `name` (present, not a placeholder)."""
    return any(o["name"] == name and not o["placeholder"] for o in call["operands"])


def scan_generate(case, rng):
    op, dt, s = case["op"], case["dtype"], case["shape"]
    shape = (s["batch"], s["steps"], s["hidden"])
    state = (s["batch"], s["hidden"])
    names = ref.SCAN_OPS[op]
    data = {n: np.asarray(v) for n, v in zip(names, cj.scan_inputs(op, rng, shape, cj.DTYPES[dt]))}
    if case["options"]["h0"]:
        data["h0"] = rounded(rng.standard_normal(state), "f32")
    data["grad_y"] = rounded(rng.standard_normal(shape), dt)
    if needs(case["backward"], "grad_h_final"):
        data["grad_h_final"] = rounded(rng.standard_normal(state), "f32")
    return data


@functools.lru_cache(maxsize=None)
def scan_reference_fn(op, has_h0):
    def f(inputs, h0, gy, ghf):
        if has_h0:
            (y, hf), vjp = jax.vjp(lambda i, s: ref.scan_ref(op, i, s), inputs, h0)
            gi, gh0 = vjp((gy, ghf))
            return y, hf, gi, gh0
        (y, hf), vjp = jax.vjp(lambda i: ref.scan_ref(op, i, None), inputs)
        (gi,) = vjp((gy, ghf))
        return y, hf, gi, None
    return jax.jit(f)


def scan_reference(case, data):
    op, s = case["op"], case["shape"]
    names = ref.SCAN_OPS[op]
    has_h0 = "h0" in data
    ghf = data.get("grad_h_final")
    y, hf, gi, gh0 = scan_reference_fn(op, has_h0)(
        tuple(f64(data[n]) for n in names),
        f64(data["h0"]) if has_h0 else jnp.zeros((), jnp.float64),
        f64(data["grad_y"]),
        f64(ghf) if ghf is not None else jnp.zeros((s["batch"], s["hidden"]), jnp.float64))
    fwd = {"y": y, "h_final": hf}
    bwd = {f"grad_{n}": g for n, g in zip(names, gi)}
    if has_h0:
        bwd["grad_h0"] = gh0
    return ({k: np.asarray(v) for k, v in fwd.items()}, {k: np.asarray(v) for k, v in bwd.items()})


SELECTIVE_OPTIONAL = (("dt_bias", "dt_bias"), ("D", "d"), ("z", "z"), ("h0", "h0"))  # operand, option


def selective_clamp(case):
    clamp = case["options"]["clamp"]
    return None if clamp is None else tuple(float(np.float32(c)) for c in clamp)


def selective_generate(case, rng):
    """check_jax_ffi.check_selective_case's distributions."""
    dt_name, s, opts = case["dtype"], case["shape"], case["options"]
    b, t, d, n = s["batch"], s["steps"], s["channels"], s["states"]
    dtype = cj.DTYPES[dt_name]
    nrm = rng.standard_normal
    softplus, clamp = opts["softplus"], selective_clamp(case)
    x = cj.np_round(nrm((b, t, d)), dtype)
    if softplus:
        dt = cj.np_round(rng.normal(-2.5, 1.0, (b, t, d)), dtype)
        dt_bias = cj.np_round(rng.normal(0.0, 0.3, d), jnp.float32) if opts["dt_bias"] else None
    else:
        dt = cj.np_round(rng.uniform(1e-3, 0.1, (b, t, d)), dtype)
        dt_bias = cj.np_round(rng.uniform(0.0, 0.02, d), jnp.float32) if opts["dt_bias"] else None
    dt = cj.keep_dt_clear_of_clamp(dt, dt_bias, softplus, clamp, dtype)
    data = {
        "x": x, "dt": dt,
        "A": -np.exp(rng.uniform(math.log(0.5), math.log(8.0), (d, n))),
        "B": nrm((b, t, n)), "C": nrm((b, t, n)),
        "grad_y": nrm((b, t, d)),
    }
    types = {"x": dt_name, "dt": dt_name, "A": "f32", "B": dt_name, "C": dt_name, "grad_y": dt_name}
    if dt_bias is not None:
        data["dt_bias"], types["dt_bias"] = dt_bias, "f32"
    if opts["d"]:
        data["D"], types["D"] = nrm(d), "f32"
    if opts["z"]:
        data["z"], types["z"] = nrm((b, t, d)), dt_name
    if opts["h0"]:
        data["h0"], types["h0"] = nrm((b, d, n)), "f32"
    if needs(case["backward"], "grad_h_final"):
        data["grad_h_final"], types["grad_h_final"] = nrm((b, d, n)), "f32"
    return {k: rounded(v, types[k]) for k, v in data.items()}


@functools.lru_cache(maxsize=None)
def selective_reference_fn(softplus, clamp, present):
    names = ("x", "dt", "A", "B", "C") + present

    def f(values, gy, ghf):
        def fn(*v):
            kw = dict(zip(names, v))
            return ref.selective_scan_ref(kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"],
                                          dt_bias=kw.get("dt_bias"), D=kw.get("D"), z=kw.get("z"),
                                          h0=kw.get("h0"), softplus=softplus, clamp=clamp)
        (y, hf), vjp = jax.vjp(fn, *values)
        return y, hf, vjp((gy, ghf))
    return jax.jit(f)


def selective_reference(case, data):
    s = case["shape"]
    present = tuple(name for name, _ in SELECTIVE_OPTIONAL if name in data)
    names = ("x", "dt", "A", "B", "C") + present
    ghf = data.get("grad_h_final")
    y, hf, grads = selective_reference_fn(case["options"]["softplus"], selective_clamp(case), present)(
        tuple(f64(data[n]) for n in names), f64(data["grad_y"]),
        f64(ghf) if ghf is not None else jnp.zeros((s["batch"], s["channels"], s["states"]), jnp.float64))
    return ({"y": np.asarray(y), "h_final": np.asarray(hf)},
            {f"grad_{n}": np.asarray(g) for n, g in zip(names, grads)})


def attention_options(case):
    o = case["options"]
    scale = None if o["scale"] is None else float(np.float32(o["scale"]))
    return dict(mask=o["mask"], window=o["window"] or 0, layout=o["layout"], scale=scale)


def attention_generate(case, rng):
    dt, s, o = case["dtype"], case["shape"], case["options"]
    if o["layout"] == "bhtd":
        qs, ks = (s["batch"], s["q_heads"], s["steps"], s["width"]), (s["batch"], s["kv_heads"], s["keys"], s["width"])
    else:
        qs, ks = (s["batch"], s["steps"], s["q_heads"], s["width"]), (s["batch"], s["keys"], s["kv_heads"], s["width"])
    nrm = rng.standard_normal
    return {"q": rounded(nrm(qs), dt), "k": rounded(nrm(ks), dt), "v": rounded(nrm(ks), dt),
            "grad_o": rounded(nrm(qs), dt)}


@functools.lru_cache(maxsize=None)
def attention_reference_fn(mask, window, layout, scale):
    def f(q, k, v, go):
        def fn(q, k, v):
            return ref.attention_ref(q, k, v, mask=mask, window=window, layout=layout, scale=scale)
        o, vjp, lse = jax.vjp(fn, q, k, v, has_aux=True)
        return o, lse, vjp(go)
    return jax.jit(f)


def attention_reference(case, data):
    kw = attention_options(case)
    o, lse, (gq, gk, gv) = attention_reference_fn(kw["mask"], kw["window"], kw["layout"], kw["scale"])(
        f64(data["q"]), f64(data["k"]), f64(data["v"]), f64(data["grad_o"]))
    return ({"o": np.asarray(o), "lse": np.asarray(lse)},
            {"grad_q": np.asarray(gq), "grad_k": np.asarray(gk), "grad_v": np.asarray(gv)})


def compared(case, direction, outs, refs, data):
    """check_jax_ffi's comparisons of the non-placeholder results `outs`
    with the references `refs` (both {name: array})."""
    dt = case["dtype"]
    results = [r for r in case[direction]["results"] if not r["placeholder"]]
    missing = [r["name"] for r in results if r["name"] not in refs]
    if missing:
        return [cj.Metric("reference", False, math.inf, math.inf, f"no reference for {missing}")]
    metrics = []
    if case["op"] == "edifice":
        return edifice_compared(case, direction, outs, refs, data, results)
    if case["op"] in GATED_CELLS:
        return gated_compared(case, direction, outs, refs, data, results)
    if case["op"] in STACK_CELLS:
        return stack_compared(case, direction, outs, refs, data, results)
    if case["op"] == "attention":
        tol = cj.ATTN_TOL[dt]
        if direction == "forward":
            return [cj.compare("o", outs["o"], refs["o"], tol["o"], cj.DTYPES[dt]),
                    cj.compare("lse", outs["lse"], refs["lse"], tol["lse"], jnp.float32)]
        kw = attention_options(case)
        s = kw["scale"] if kw["scale"] else 1.0 / math.sqrt(case["shape"]["width"])
        terms = abs(s) * cj.amax(data["grad_o"]) * cj.amax(data["v"]) * max(cj.amax(data["q"]), cj.amax(data["k"]))
        return [cj.compare(r["name"], outs[r["name"]], refs[r["name"]], tol["grad"], cj.DTYPES[dt], terms)
                for r in results]
    # Scans share a scale per direction (check_jax_ffi.check_scan_case); the
    # selective scan's is each tensor's own.
    scale = None
    if case["op"] != "selective_scan":
        scale = max(cj.amax(refs[r["name"]]) for r in results)
    for r in results:
        metrics.append(cj.compare(r["name"], outs[r["name"]], refs[r["name"]], cj.SCAN_TOL[r["dtype"]],
                                  cj.DTYPES[r["dtype"]], scale))
    return metrics


# ---------------------------------------------------------------------------
# GRU, LSTM and sLSTM (exphil/gated_rnn.hpp; targets
# exphil_{gru,lstm,slstm}_{fwd,bwd})
# ---------------------------------------------------------------------------
GATED_CELLS = {"gru": 3, "lstm": 4, "slstm": 4}  # cell -> gates
# The optional operands of each cell, in the targets' order, with the
# options that give them; then the final states' cotangents (final_state).
GATED_OPTIONAL = {"gru": ("bias", "h0"), "lstm": ("bias", "h0", "c0"),
                  "slstm": ("bias", "h0", "c0", "n0", "m0")}
GATED_FINALS = {"gru": ("h_final",), "lstm": ("h_final", "c_final"),
                "slstm": ("h_final", "c_final", "n_final", "m_final")}
# Initial states' ranges: [-1, 1], but the sLSTM's n0 in [1, 2]
# (check_jax_ffi.check_slstm_case's: |n| > 1, so max(|n|, 1) never ties).
GATED_STATE_RANGE = {"n0": (1.0, 2.0)}


def sigmoid64(x):
    return 1.0 / (1.0 + np.exp(-x))


def gated_forward64(cell, wx, R, bias=None, h0=None, c0=None):
    """The GRU (gates r, z, n: n = tanh(wx_n + r (h R + b)_n), h = (1 - z) n
    + z h_prev) or LSTM (i, f, g, o: c = f c_prev + i g, h = o tanh(c)) of
    exphil/gated_rnn.hpp over wx [B, T, G*H] with R [H, G*H], in numpy
    float64; the pre-activations of the recurrence are rh = h_prev R +
    bias. An absent bias, h0 or c0 is zeros. Returns {y, h_final, c_final
    (LSTM)} and the steps' values the backward takes."""
    wx, R = np.asarray(wx, np.float64), np.asarray(R, np.float64)
    b, t, gh = wx.shape
    h = R.shape[0]
    if gh != GATED_CELLS[cell] * h or R.shape != (h, gh):
        raise ValueError(f"{cell}: wx {wx.shape} and R {R.shape} disagree")
    bias = np.zeros(gh) if bias is None else np.asarray(bias, np.float64)
    hp = np.zeros((b, h)) if h0 is None else np.asarray(h0, np.float64)
    cp = np.zeros((b, h)) if c0 is None else np.asarray(c0, np.float64)
    y = np.empty((b, t, h))
    steps = []
    for k in range(t):
        rh = hp @ R + bias
        a = wx[:, k]
        if cell == "gru":
            r = sigmoid64(a[:, :h] + rh[:, :h])
            z = sigmoid64(a[:, h:2 * h] + rh[:, h:2 * h])
            n = np.tanh(a[:, 2 * h:] + r * rh[:, 2 * h:])
            hn = (1.0 - z) * n + z * hp
            steps.append(dict(h_prev=hp, rh=rh, r=r, z=z, n=n))
        else:
            pre = a + rh
            i, f = sigmoid64(pre[:, :h]), sigmoid64(pre[:, h:2 * h])
            g, o = np.tanh(pre[:, 2 * h:3 * h]), sigmoid64(pre[:, 3 * h:])
            c = f * cp + i * g
            hn = o * np.tanh(c)
            steps.append(dict(h_prev=hp, c_prev=cp, i=i, f=f, g=g, o=o, c=c))
            cp = c
        y[:, k] = hn
        hp = hn
    out = {"y": y, "h_final": hp}
    if cell == "lstm":
        out["c_final"] = cp
    return out, steps


def gated_backward64(cell, wx, R, grad_y, bias=None, h0=None, c0=None, grad_h_final=None,
                     grad_c_final=None):
    """The exact float64 gradients of gated_forward64's y, h_final and
    c_final (cotangents grad_y and the finals', zeros where absent): a
    hand-written reverse loop over the forward's exact states. Returns the
    backward target's results grad_wx, grad_R, grad_bias, grad_h0,
    (grad_c0,) grad_rh -- grad_rh the gradient of rh = h_prev R + bias, equal
    to grad_wx but for the GRU's n gate (r times it) -- each given also for
    an absent input (at zero), and grad_R_terms and grad_bias_terms: the
    sums of the magnitudes of those sums' terms (the scale of a float sum's
    rounding, check_jax_ffi.gated_all_ref's)."""
    R = np.asarray(R, np.float64)
    fwd, steps = gated_forward64(cell, wx, R, bias, h0, c0)
    gy = np.asarray(grad_y, np.float64)
    b, t, h = gy.shape
    gh = R.shape[1]
    dh = np.zeros((b, h)) if grad_h_final is None else np.array(grad_h_final, np.float64)
    dc = np.zeros((b, h)) if grad_c_final is None else np.array(grad_c_final, np.float64)
    gwx, grh = np.empty((b, t, gh)), np.empty((b, t, gh))
    for k in range(t - 1, -1, -1):
        s = steps[k]
        dh = dh + gy[:, k]
        if cell == "gru":
            r, z, n = s["r"], s["z"], s["n"]
            da_n = dh * (1.0 - z) * (1.0 - n * n)
            da_z = dh * (s["h_prev"] - n) * z * (1.0 - z)
            da_r = da_n * s["rh"][:, 2 * h:] * r * (1.0 - r)
            gwx[:, k] = np.concatenate([da_r, da_z, da_n], axis=1)
            grh[:, k] = np.concatenate([da_r, da_z, r * da_n], axis=1)
            dh = dh * z + grh[:, k] @ R.T
        else:
            i, f, g, o, c = s["i"], s["f"], s["g"], s["o"], s["c"]
            tc = np.tanh(c)
            dc = dc + dh * o * (1.0 - tc * tc)
            d = np.concatenate([dc * g * i * (1.0 - i), dc * s["c_prev"] * f * (1.0 - f),
                                dc * i * (1.0 - g * g), dh * tc * o * (1.0 - o)], axis=1)
            gwx[:, k] = grh[:, k] = d
            dh = d @ R.T
            dc = dc * f
    h_prev = np.stack([s["h_prev"] for s in steps], axis=1)
    out = {"grad_wx": gwx, "grad_R": np.einsum("bti,btj->ij", h_prev, grh),
           "grad_bias": grh.sum(axis=(0, 1)), "grad_h0": dh}
    if cell == "lstm":
        out["grad_c0"] = dc
    out["grad_rh"] = grh
    out["grad_R_terms"] = np.einsum("bti,btj->ij", np.abs(h_prev), np.abs(grh))
    out["grad_bias_terms"] = np.abs(grh).sum(axis=(0, 1))
    return fwd, out


def operand_dtypes(case):
    """{operand name: dtype} of a case's forward and backward calls."""
    return {o["name"]: o["dtype"] for d in ("forward", "backward") for o in case[d]["operands"]}


def gated_generate(case, rng):
    """check_jax_ffi.check_gated_case's and check_slstm_case's
    distributions: wx in [-1.5, 1.5], R within 1.5 / sqrt(H), bias in
    [-0.5, 0.5], states (GATED_STATE_RANGE) and cotangents in [-1, 1]; each
    rounded to its operand's dtype."""
    cell, s, o = case["op"], case["shape"], case["options"]
    b, t, h = s["batch"], s["steps"], s["hidden"]
    gh = GATED_CELLS[cell] * h
    u = rng.uniform
    r = 1.5 / math.sqrt(h)
    data = {"wx": u(-1.5, 1.5, (b, t, gh)), "R": u(-r, r, (h, gh)), "grad_y": u(-1.0, 1.0, (b, t, h))}
    if o["bias"]:
        data["bias"] = u(-0.5, 0.5, gh)
    for name in GATED_OPTIONAL[cell][1:]:  # h0, c0, n0, m0
        if o[name]:
            data[name] = u(*GATED_STATE_RANGE.get(name, (-1.0, 1.0)), (b, h))
    for name in GATED_FINALS[cell]:
        if needs(case["backward"], f"grad_{name}"):
            data[f"grad_{name}"] = u(-1.0, 1.0, (b, h))
    types = operand_dtypes(case)
    return {k: rounded(v, types[k]) for k, v in data.items()}


def gated_reference(case, data):
    cell = case["op"]
    kw = {k: data[k].astype(np.float64) for k in
          GATED_OPTIONAL[cell] + tuple(f"grad_{n}" for n in GATED_FINALS[cell]) if k in data}
    return gated_backward64(cell, data["wx"].astype(np.float64), data["R"].astype(np.float64),
                            data["grad_y"].astype(np.float64), **kw)


def slstm_reference(case, data):
    """check_jax_ffi.slstm_all_ref (JAX, float64) on the case's inputs,
    absent states at their defaults (n0 ones), absent cotangents zeros, as
    gated_reference's results."""
    s = case["shape"]
    b, h = s["batch"], s["hidden"]
    defaults = {"h0": 0.0, "c0": 0.0, "n0": 1.0, "m0": 0.0}

    def given(name, shape, fill=0.0):
        return f64(data[name]) if name in data else jnp.full(shape, fill, jnp.float64)

    r = jax.jit(cj.slstm_all_ref)(
        f64(data["wx"]), f64(data["R"]), given("bias", (4 * h,)),
        *(given(n, (b, h), defaults[n]) for n in cj.SLSTM_STATES), f64(data["grad_y"]),
        *(given(n, (b, h)) for n in cj.SLSTM_FINALS))
    fwd = {n: np.asarray(r[n]) for n in ("y", "h_final", "c_final", "n_final", "m_final")}
    bwd = {f"grad_{k}": np.asarray(r[k]) for k in ("wx", "R", "bias", "h0", "c0", "n0", "m0", "rh")}
    bwd["grad_R_terms"], bwd["grad_bias_terms"] = np.asarray(r["R_terms"]), np.asarray(r["bias_terms"])
    return fwd, bwd


def gated_compared(case, direction, outs, refs, data, results):
    """check_jax_ffi.check_gated_case's comparisons: GATED_TOL of the case's
    dtype (of f32 results too: they are computed from rounded inputs,
    gated_tol_key); y and h_final against one scale (with h0's), c_final
    against c's, the gradients against the largest of grad_wx, grad_rh and
    the states' gradients, grad_R and grad_bias at least their terms'."""
    dt = cj.DTYPES[case["dtype"]]

    def amax_of(name):
        return cj.amax(data[name]) if name in data else 0.0

    if direction == "forward":
        scales = {"y": max(cj.amax(refs["y"]), cj.amax(refs["h_final"]), amax_of("h0"))}
        scales["h_final"] = scales["y"]
        # The sLSTM's c, n and m against at least 1 (check_slstm_case's).
        floor = 1.0 if case["op"] == "slstm" else 0.0
        for state in ("c", "n", "m"):
            if f"{state}_final" in refs:
                scales[f"{state}_final"] = max(cj.amax(refs[f"{state}_final"]), amax_of(f"{state}0"),
                                               floor)
    else:
        g = max(cj.amax(refs[n]) for n in
                ("grad_wx", "grad_rh", "grad_h0", "grad_c0", "grad_n0", "grad_m0") if n in refs)
        scales = {r["name"]: g for r in results}
        for n in ("grad_R", "grad_bias"):
            scales[n] = max(g, cj.amax(refs[n + "_terms"]))
    # A case at precision tf32 (f32 throughout) takes the tf32 line.
    tf32 = case["options"].get("precision") == "tf32"
    metrics = []
    for r in results:
        own = cj.DTYPES[r["dtype"]]
        tol = cj.GATED_TOL["tf32" if tf32 else cj.gated_tol_key(dt, own)]
        metrics.append(cj.compare(r["name"], outs[r["name"]], refs[r["name"]], tol, own, scales[r["name"]]))
    return metrics


# ---------------------------------------------------------------------------
# The stacks (ops gru_stack, lstm_stack; targets exphil_{gru,lstm}_stack_
# {fwd,bwd})
# ---------------------------------------------------------------------------
STACK_CELLS = {"gru_stack": "gru", "lstm_stack": "lstm"}
# The optional operands (the targets' spelling) and the options that give them.
STACK_OPTIONAL = {"gru_stack": (("bias", "bias"), ("W_bias", "w_bias"), ("h0", "h0")),
                  "lstm_stack": (("bias", "bias"), ("W_bias", "w_bias"), ("h0", "h0"), ("c0", "c0"))}


def stack_generate(case, rng):
    """gated_generate's distributions for the stack's operands: wx, R [L,
    H, G*H], W [K, H, G*H], the biases, the initial states [L, B, H] and the
    cotangents; each rounded to its operand's dtype."""
    op, s, o = case["op"], case["shape"], case["options"]
    L, b, t, h = s["layers"], s["batch"], s["steps"], s["hidden"]
    gh = GATED_CELLS[STACK_CELLS[op]] * h
    u = rng.uniform
    r = 1.5 / math.sqrt(h)
    data = {"wx": u(-1.5, 1.5, (b, t, gh)), "R": u(-r, r, (L, h, gh)), "W": u(-r, r, (L - 1, h, gh)),
            "grad_y": u(-1.0, 1.0, (b, t, h))}
    shapes = {"bias": (L, gh), "W_bias": (L - 1, gh), "h0": (L, b, h), "c0": (L, b, h)}
    for name, option in STACK_OPTIONAL[op]:
        if o[option]:
            data[name] = u(-0.5 if "bias" in name else -1.0, 0.5 if "bias" in name else 1.0, shapes[name])
    for name in GATED_FINALS[STACK_CELLS[op]]:
        if needs(case["backward"], f"grad_{name}"):
            data[f"grad_{name}"] = u(-1.0, 1.0, (L, b, h))
    types = operand_dtypes(case)
    return {k: rounded(v, types[k]) for k, v in data.items()}


def stack_reference(case, data):
    """The stack of gated_backward64's layers in float64: layer 0 on wx,
    layer l > 0 on y_{l-1} W[l-1] + W_bias[l-1]; the backward from the top,
    grad_W = y_{l-1}^T grad_wx_l, grad_W_bias its sum, the layer below's
    cotangent grad_wx_l W^T. The forward's results, and the backward's with
    the sums of their terms' magnitudes (grad_R, grad_bias, grad_W,
    grad_W_bias)."""
    cell = STACK_CELLS[case["op"]]
    d = {k: v.astype(np.float64) for k, v in data.items()}
    R, W = d["R"], d["W"]
    L = R.shape[0]

    def at(name, l):
        return d[name][l] if name in d else None

    inputs, fwds = [d["wx"]], []
    for l in range(L):
        fwd, _ = gated_forward64(cell, inputs[l], R[l], at("bias", l), at("h0", l), at("c0", l))
        fwds.append(fwd)
        if l + 1 < L:
            wb = at("W_bias", l)
            inputs.append(fwds[l]["y"] @ W[l] + (0.0 if wb is None else wb))
    out = {"y": fwds[-1]["y"], "y_lower": np.stack([f["y"] for f in fwds[:-1]]),
           "h_final": np.stack([f["h_final"] for f in fwds])}
    if cell == "lstm":
        out["c_final"] = np.stack([f["c_final"] for f in fwds])
    per = [None] * L
    gy = d["grad_y"]
    grads = {"W": [None] * (L - 1), "W_bias": [None] * (L - 1), "W_terms": [None] * (L - 1),
             "W_bias_terms": [None] * (L - 1)}
    for l in range(L - 1, -1, -1):
        finals = {f"grad_{n}": at(f"grad_{n}", l) for n in GATED_FINALS[cell]}
        _, g = gated_backward64(cell, inputs[l], R[l], gy, at("bias", l), at("h0", l), at("c0", l), **finals)
        per[l] = g
        if l > 0:
            below, gwx = fwds[l - 1]["y"], g["grad_wx"]
            grads["W"][l - 1] = np.einsum("bti,btj->ij", below, gwx)
            grads["W_bias"][l - 1] = gwx.sum(axis=(0, 1))
            grads["W_terms"][l - 1] = np.einsum("bti,btj->ij", np.abs(below), np.abs(gwx))
            grads["W_bias_terms"][l - 1] = np.abs(gwx).sum(axis=(0, 1))
            gy = gwx @ W[l - 1].T
    bwd = {"grad_wx": per[0]["grad_wx"], "grad_W": np.stack(grads["W"]),
           "grad_W_bias": np.stack(grads["W_bias"]), "grad_W_terms": np.stack(grads["W_terms"]),
           "grad_W_bias_terms": np.stack(grads["W_bias_terms"])}
    for name in ("R", "bias", "h0", "R_terms", "bias_terms") + (("c0",) if cell == "lstm" else ()):
        bwd[f"grad_{name}"] = np.stack([g[f"grad_{name}"] for g in per])
    return out, bwd


def stack_compared(case, direction, outs, refs, data, results):
    """gated_compared's rule for the stacks: the outputs against one scale
    (c_final its own), the gradients against the largest of grad_wx and
    the initial states', the sums over batch and time at least their
    terms'."""
    dt = cj.DTYPES[case["dtype"]]
    if direction == "forward":
        h = max(cj.amax(refs["y"]), cj.amax(refs["y_lower"]), cj.amax(refs["h_final"]),
                cj.amax(data["h0"]) if "h0" in data else 0.0)
        scales = {"y": h, "y_lower": h, "h_final": h}
        if "c_final" in refs:
            scales["c_final"] = max(cj.amax(refs["c_final"]), cj.amax(data["c0"]) if "c0" in data else 0.0)
    else:
        g = max(cj.amax(refs[n]) for n in ("grad_wx", "grad_h0", "grad_c0") if n in refs)
        scales = {r["name"]: g for r in results}
        for n in ("grad_R", "grad_bias", "grad_W", "grad_W_bias"):
            scales[n] = max(g, cj.amax(refs[n + "_terms"]))
    return [cj.compare(r["name"], outs[r["name"]], refs[r["name"]],
                       cj.GATED_TOL[cj.gated_tol_key(dt, cj.DTYPES[r["dtype"]])], cj.DTYPES[r["dtype"]],
                       scales[r["name"]]) for r in results]


# ---------------------------------------------------------------------------
# Edifice's fused ops (check_edifice_ffi.py's inputs and references)
# ---------------------------------------------------------------------------
def edifice_kind(case):
    target = case["forward"]["target"]
    if target == ce.SS_F_TARGET:
        return "selective"
    if target == ce.ATT_F_TARGET:
        return "attention"
    if target in ce.RNN_FORWARD:
        return "rnn"
    return "scan"


def scan_inputs_of(call):
    """The names of a scan call's sequence inputs: its operands before h0."""
    names = [o["name"] for o in call["operands"]]
    return names[:names.index("h0")]


def edifice_generate(case, rng):
    """As check_edifice_ffi.py draws them: scans per target kind (gates
    after the sigmoid in (0, 1), tau > 0, ...), h0 of the sequence dtype;
    the selective scan's dt below, inside, above and on [0.001, 0.1] with
    A = -(1..N) as Mamba passes it; attention normal. The values one call
    alone takes are keyed by scoped(); the backward's y (or o) is derived
    from its inputs by edifice_finish."""
    dt_name, s, kind = case["dtype"], case["shape"], edifice_kind(case)
    fwd, bwd = case["forward"], case["backward"]
    nrm = rng.standard_normal
    data = {}
    if kind == "scan":
        shape, state = (s["batch"], s["steps"], s["hidden"]), (s["batch"], s["hidden"])
        for call, op_kind in ((fwd, ce.FORWARD[fwd["target"]][0]), (bwd, ce.BACKWARD[bwd["target"]])):
            values = ce.inputs_for(op_kind, rng, shape)
            for i, v in enumerate(values):
                # a backward without b (linear scan) still needs it for its y
                names = scan_inputs_of(call)
                key = scoped(call, names[i] if i < len(names) else f"_input{i}")
                data[key] = rounded(v, dt_name)
            data[scoped(call, "h0")] = rounded(nrm(state), dt_name)
        data[scoped(bwd, "grad_y")] = rounded(nrm(shape), dt_name)
    elif kind == "selective":
        b, t, d, n = s["batch"], s["steps"], s["channels"], s["states"]
        dt = rng.uniform(0.0, 0.13, (b, t, d))
        pick = rng.random((b, t, d))
        dt = np.where(pick < 0.1, ce.SS_LO, np.where(pick > 0.9, ce.SS_HI, dt))
        data = {"x": nrm((b, t, d)), "dt": dt,
                "A": np.broadcast_to(-(np.arange(n) + 1.0), (d, n)).copy(),
                "B": nrm((b, t, n)), "C": nrm((b, t, n)), "grad_y": nrm((b, t, d))}
        data = {k: rounded(v, "f32") for k, v in data.items()}
    elif kind == "rnn":
        # check_rnn_backward's: wx in [-1.5, 1.5], R within 1.5 / sqrt(H),
        # states and cotangents in [-1, 1], all of the sequence dtype.
        cell = ce.RNN_FORWARD[fwd["target"]]
        b, t, h = s["batch"], s["steps"], s["hidden"]
        gh, r, u = cj.GATES[cell] * h, 1.5 / math.sqrt(h), rng.uniform
        data = {"wx": u(-1.5, 1.5, (b, t, gh)), "R": u(-r, r, (h, gh)), "h0": u(-1.0, 1.0, (b, h)),
                scoped(bwd, "grad_y"): u(-1.0, 1.0, (b, t, h))}
        if cell == "lstm":
            data["c0"] = u(-1.0, 1.0, (b, h))
        data = {k: rounded(v, dt_name) for k, v in data.items()}
    else:
        shape = (s["batch"], s["heads"], s["steps"], s["width"])
        data = {k: rounded(nrm(shape), dt_name) for k in ("q", "k", "v", "grad_o")}
        data["flag"] = rounded([1.0 if case["options"]["causal"] else 0.0], dt_name)
    edifice_finish(case, data)
    return data


def edifice_scan_values(call, data):
    """(sequence inputs with any left-out last one, h0) of a scan call."""
    names = scan_inputs_of(call)
    xs = [data[scoped(call, n)] for n in names]
    extra = scoped(call, f"_input{len(names)}")
    if extra in data:
        xs.append(data[extra])
    return xs, data[scoped(call, "h0")]


def edifice_finish(case, data):
    """The backward's y (o): the reference forward of its own inputs,
    rounded to the dtype, as Edifice passes its forward's output."""
    kind, bwd, dt_name = edifice_kind(case), case["backward"], case["dtype"]
    if kind == "scan":
        xs, h0 = edifice_scan_values(bwd, data)
        y = jax.jit(lambda x, h: ce.forward_ref(ce.BACKWARD[bwd["target"]], x, h))(
            [f64(x) for x in xs], f64(h0))
        data[scoped(bwd, "y")] = rounded(np.asarray(y), dt_name)
    elif kind == "rnn":
        y = rnn_forward64(case, data)
        data[scoped(bwd, "y")] = rounded(np.asarray(y), dt_name)
    elif kind == "attention":
        o = jax.jit(ce.attention_ref, static_argnums=3)(
            f64(data["q"]), f64(data["k"]), f64(data["v"]), bool(case["options"]["causal"]))
        data[scoped(bwd, "o")] = rounded(np.asarray(o), dt_name)


def rnn_forward64(case, data):
    """Edifice's GRU or LSTM forward (check_edifice_ffi.rnn_forward_ref) of
    the case's inputs, float64."""
    cell = ce.RNN_FORWARD[case["forward"]["target"]]
    c0 = f64(data["c0"]) if "c0" in data else None
    return jax.jit(lambda wx, R, h0, c0: ce.rnn_forward_ref(cell, wx, R, h0, c0)[0])(
        f64(data["wx"]), f64(data["R"]), f64(data["h0"]), c0)


def edifice_reference(case, data):
    kind, fwd, bwd = edifice_kind(case), case["forward"], case["backward"]
    if kind == "rnn":
        # Edifice's backward on the y it is given (edifice_finish's).
        cell = ce.RNN_FORWARD[fwd["target"]]
        c0 = f64(data["c0"]) if "c0" in data else None
        grads = jax.jit(lambda wx, R, h0, c0, y, g: ce.rnn_backward_ref(cell, wx, R, h0, c0, y, g))(
            f64(data["wx"]), f64(data["R"]), f64(data["h0"]), c0, f64(data[scoped(bwd, "y")]),
            f64(data[scoped(bwd, "grad_y")]))
        names = [r["name"] for r in bwd["results"]]
        return ({"y": np.asarray(rnn_forward64(case, data))},
                {n: np.asarray(g) for n, g in zip(names, grads)})
    if kind == "scan":
        xs, h0 = edifice_scan_values(fwd, data)
        y = jax.jit(lambda x, h: ce.forward_ref(ce.FORWARD[fwd["target"]][0], x, h))(
            [f64(x) for x in xs], f64(h0))
        xs, h0 = edifice_scan_values(bwd, data)
        grads, gh0 = jax.jit(lambda x, h, y, g: ce.backward_ref(ce.BACKWARD[bwd["target"]], x, h, y, g))(
            [f64(x) for x in xs], f64(h0), f64(data[scoped(bwd, "y")]), f64(data[scoped(bwd, "grad_y")]))
        names = [r["name"] for r in bwd["results"]]
        return ({"y": np.asarray(y)},
                {n: np.asarray(g) for n, g in zip(names, list(grads)[:len(names) - 1] + [gh0])})
    if kind == "selective":
        v = [f64(data[n]) for n in ("x", "dt", "A", "B", "C")]
        y = jax.jit(ce.selective_forward_ref)(*v)
        grads = jax.jit(ce.selective_backward_ref)(*v, f64(data["grad_y"]))
        return ({"y": np.asarray(y)},
                {n: np.asarray(g) for n, g in zip(("grad_x", "grad_dt", "grad_B", "grad_C"), grads)})
    causal = bool(case["options"]["causal"])
    q, k, v, g = (f64(data[n]) for n in ("q", "k", "v", "grad_o"))
    o = jax.jit(ce.attention_ref, static_argnums=3)(q, k, v, causal)
    grads = jax.jit(ce.attention_backward_ref, static_argnums=4)(q, k, v, g, causal)
    return ({"o": np.asarray(o)},
            {n: np.asarray(x) for n, x in zip(("grad_q", "grad_k", "grad_v"), grads)})


def edifice_compared(case, direction, outs, refs, data, results):
    """check_edifice_ffi.py's comparisons: scans against one scale per
    call, the selective scan per tensor, attention as check_jax_ffi.py."""
    dt = case["dtype"]
    kind = edifice_kind(case)
    if kind == "attention":
        tol = cj.ATTN_TOL[dt]
        if direction == "forward":
            return [cj.compare("o", outs["o"], refs["o"], tol["o"], cj.DTYPES[dt])]
        terms = (cj.amax(data["grad_o"]) * cj.amax(data["v"]) * max(cj.amax(data["q"]), cj.amax(data["k"]))
                 / math.sqrt(case["shape"]["width"]))
        return [cj.compare(r["name"], outs[r["name"]], refs[r["name"]], tol["grad"], cj.DTYPES[dt], terms)
                for r in results]
    if kind == "rnn":  # check_rnn_forward's and check_rnn_backward's
        states = [cj.amax(data[n]) for n in ("h0", "c0") if n in data and direction == "forward"]
        scale = max([cj.amax(refs[r["name"]]) for r in results] + states)
        return [cj.compare(r["name"], outs[r["name"]], refs[r["name"]], cj.GATED_TOL[r["dtype"]],
                           cj.DTYPES[r["dtype"]], scale) for r in results]
    scale = None if kind == "selective" else max(cj.amax(refs[r["name"]]) for r in results)
    return [cj.compare(r["name"], outs[r["name"]], refs[r["name"]], cj.SCAN_TOL[r["dtype"]],
                       cj.DTYPES[r["dtype"]], scale) for r in results]


FAMILIES = {
    "linear_scan": (scan_generate, scan_reference),
    "min_gru": (scan_generate, scan_reference),
    "min_lstm": (scan_generate, scan_reference),
    "liquid": (scan_generate, scan_reference),
    "selective_scan": (selective_generate, selective_reference),
    "attention": (attention_generate, attention_reference),
    "gru": (gated_generate, gated_reference),
    "lstm": (gated_generate, gated_reference),
    "slstm": (gated_generate, slstm_reference),
    "gru_stack": (stack_generate, stack_reference),
    "lstm_stack": (stack_generate, stack_reference),
    "edifice": (edifice_generate, edifice_reference, edifice_finish),
}


# ---------------------------------------------------------------------------
# The contract: attributes agree with the options, placeholders with has_*
# ---------------------------------------------------------------------------
def decode_attribute(text):
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    value, _, typ = text.partition(":")
    typ = typ.strip()
    if typ == "i32":
        return int(value)
    if typ == "f32":
        return float(np.float32(float(value)))
    raise ValueError(f"unexpected attribute text {text!r}")


def expected_attributes(case, direction):
    op, o = case["op"], case["options"]
    bwd = direction == "backward"
    if op == "edifice":
        # ExPhil.Native.Edifice's attributes for these targets (EDIFICE.md)
        kind = edifice_kind(case)
        if kind == "attention":
            return {"mask": 1 if o["causal"] else 0, "window": 0, "layout": 0, "scale": 0.0,
                    "precision": 0}
        if kind == "selective":
            want = {"softplus": False, "clamp": True, "dt_min": float(np.float32(0.001)),
                    "dt_max": float(np.float32(0.1))}
            return want if bwd else {**want, "input_scale": 1}
        return {}
    if op == "attention":
        codes = {"mask": {"none": 0, "causal": 1, "window": 2}, "layout": {"bhtd": 0, "bthd": 1},
                 "precision": {"exact": 0, "tf32x3": 1}}
        return {"mask": codes["mask"][o["mask"]], "window": o["window"] or 0,
                "layout": codes["layout"][o["layout"]],
                "scale": float(np.float32(o["scale"] or 0.0)),
                "precision": codes["precision"][o["precision"]]}
    want = {}
    # The Nx ops pass the GRU's, the LSTM's and their stacks' precision
    # always (exact 0, tf32 1); the sLSTM has none.
    precision = {"precision": 1 if o.get("precision") == "tf32" else 0}
    if op in STACK_CELLS:
        want = {f"has_{name}": o[option] for name, option in STACK_OPTIONAL[op]} | precision
        if bwd:
            # The Nx op keeps y_lower to itself: its cotangent is always absent.
            want["has_grad_y_lower"] = False
            want.update({f"has_grad_{name}": o["final_state"] for name in GATED_FINALS[STACK_CELLS[op]]})
        return want
    if op in GATED_CELLS:
        want = {f"has_{name}": o[name] for name in GATED_OPTIONAL[op]}
        if op != "slstm":
            want |= precision
        if bwd:
            want.update({f"has_grad_{name}": o["final_state"] for name in GATED_FINALS[op]})
        return want
    if op == "selective_scan":
        clamp = o["clamp"]
        want.update(softplus=o["softplus"], clamp=clamp is not None,
                    dt_min=float(np.float32(clamp[0] if clamp else 0.0)),
                    dt_max=float(np.float32(clamp[1] if clamp else 0.0)))
        for name, option in SELECTIVE_OPTIONAL:
            want[f"has_{name}"] = o[option]
    else:
        want["has_h0"] = o["h0"]
    if bwd:
        want["has_grad_h_final"] = o["final_state"]
    return want


def contract_problems(case):
    problems = []
    for direction in ("forward", "backward"):
        call = case[direction]
        got = {name: decode_attribute(text) for name, text in call["attributes"]}
        want = expected_attributes(case, direction)
        if got != want:
            problems.append(f"{direction} attributes {got} != {want} (from the options)")
        has = {name[4:]: v for name, v in got.items() if name.startswith("has_")}
        for o in call["operands"]:
            absent = has.get(o["name"]) is False
            if o["placeholder"] != absent:
                problems.append(f"{direction} operand {o['name']}: placeholder {o['placeholder']}, "
                                f"has_{o['name']} {has.get(o['name'])}")
        for r in call["results"]:
            # The gated RNNs' backward writes every result (grad_bias and
            # the initial states' at their defaults too): none is a placeholder.
            absent = (r["name"].startswith("grad_") and has.get(r["name"][5:]) is False
                      and case["op"] not in GATED_CELLS and case["op"] not in STACK_CELLS)
            if r["placeholder"] != absent:
                problems.append(f"{direction} result {r['name']}: placeholder {r['placeholder']}")
        for t in call["operands"] + call["results"]:
            if t["placeholder"] and (t["shape"] != [] or t["dtype"] != "f32"):
                problems.append(f"{direction} placeholder {t['name']} is {t['dtype']}{t['shape']}, not an f32 scalar")
    return problems


# ---------------------------------------------------------------------------
# Running a call
# ---------------------------------------------------------------------------
def scoped(call, name):
    """The key of a value that one call alone takes (Edifice's pairs: the
    forward and the backward target may give one name different values)."""
    return f"{call['target']}:{name}"


def data_key(call, data, name):
    return scoped(call, name) if scoped(call, name) in data else name


def operand_arrays(call, data, forward_out=None):
    arrays = []
    for o in call["operands"]:
        name = o["name"]
        if o["placeholder"]:
            x = np.zeros((), F32_NP)
        elif data_key(call, data, name) in data:
            x = data[data_key(call, data, name)]
        elif forward_out is not None and name in forward_out:
            x = forward_out[name]
        else:
            raise KeyError(f"{call['target']}: no input for operand {name}")
        if list(x.shape) != o["shape"] or x.dtype != np_dtype(o["dtype"]):
            raise AssertionError(f"{call['target']}: operand {name} is {x.dtype}{list(x.shape)}, "
                                 f"the call takes {o['dtype']}{o['shape']}")
        arrays.append(x)
    return arrays


class Call:
    """One run of one call: its results by name, the module, the layouts XLA
    gave the custom call."""

    def __init__(self, xla, call, arrays, variant, pinned, strategies=None, transpose_results=True):
        self.text, args, readers = build(call, arrays, variant, pinned, strategies, transpose_results)
        exe = xla.compile(self.text)
        outs = xla.run(exe, args)
        if len(outs) != len(call["results"]):
            raise AssertionError(f"{len(outs)} outputs, the call has {len(call['results'])} results")
        self.out = {}
        self.problems = []
        for r, read, a in zip(call["results"], readers, outs):
            a = read(a)
            if list(a.shape) != r["shape"] or a.dtype != np_dtype(r["dtype"]):
                self.problems.append(f"{r['name']} came back {a.dtype}{list(a.shape)}")
            self.out[r["name"]] = a
        self.layouts = custom_call_layouts(xla.hlo(exe), call["target"])

    def compared(self, case, direction, refs, data):
        return compared(case, direction, self.results(case, direction), refs, data)

    def results(self, case, direction):
        return {r["name"]: self.out[r["name"]] for r in case[direction]["results"] if not r["placeholder"]}


def bitwise_diff(case, direction, ours, theirs):
    """Names of the non-placeholder results that differ bit for bit, with the
    number of elements."""
    diff = []
    for r in case[direction]["results"]:
        if r["placeholder"]:
            continue
        a, b = ours.out[r["name"]], theirs.out[r["name"]]
        if a.shape != b.shape or a.dtype != b.dtype:
            diff.append(f"{r['name']} (shape/dtype)")
        elif a.tobytes() != b.tobytes():
            x, y = a.astype(np.float64), b.astype(np.float64)
            n = int(np.sum(~((x == y) | (np.isnan(x) & np.isnan(y)))))
            diff.append(f"{r['name']} ({n}/{a.size} elements)")
    return diff


def worst(metrics):
    m = max(metrics, key=lambda m: math.inf if math.isnan(m.ratio) else m.ratio)
    return f"{m.name} {m.ratio:.2g}"


def verdict(case, calls, refs, data, baseline=None, pinned=True):
    """(ok, detail) for one variant: its forward and backward `calls`
    against the references, bitwise against `baseline` calls when given,
    row-major custom-call layouts when pinned."""
    ok, parts, failures = True, [], []
    for direction, call, ref_, base in zip(("forward", "backward"), calls, refs, baseline or (None, None)):
        tag = "fwd" if direction == "forward" else "bwd"
        metrics = call.compared(case, direction, ref_, data)
        bad = [str(m) for m in metrics if not m.ok]
        parts.append(f"{tag} worst {worst(metrics)}")
        if bad:
            ok = False
            failures.append(f"{tag} out of tolerance: " + "; ".join(bad))
        if call.problems:
            ok = False
            failures.append(f"{tag}: " + "; ".join(call.problems))
        for r in case[direction]["results"]:
            if r["placeholder"] and call.out[r["name"]].shape != ():
                ok = False
                failures.append(f"{tag} placeholder {r['name']} is not a scalar")
        if base is not None:
            diff = bitwise_diff(case, direction, call, base)
            if diff:
                ok = False
                failures.append(f"{tag} differs from (a) bit for bit: " + ", ".join(diff))
        if pinned and call.layouts is not None and call.layouts[1]:
            ok = False
            failures.append(f"{tag} custom call has non-row-major layouts {call.layouts[1]}")
    detail = ", ".join(parts)
    if baseline is not None and ok:
        detail += "; bitwise equal to (a)"
    if pinned and baseline is not None:
        seen = [c.layouts for c in calls]
        if None in seen:
            detail += "; optimized HLO: custom-call layouts not found"
        elif not any(odd for _, odd in seen):
            detail += (f"; optimized HLO: every custom-call layout row-major "
                       f"(fwd {seen[0][0]}, bwd {seen[1][0]} shapes)")
    if failures:
        detail += "; FAILED: " + " | ".join(failures)
    return ok, detail


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------
class Runner:
    def __init__(self, args, xla):
        self.args, self.xla = args, xla
        self.lines = []  # (variant, name, ok)
        self.hazards = []  # (name, status, detail)
        self.later = []  # what "b unpinned" needs, per case

    def report(self, variant, name, ok, detail, seconds):
        self.lines.append((variant, name, ok))
        print(f"{'PASS' if ok else 'FAIL'} [{variant}] {name}: {detail} ({seconds:.1f} s)", flush=True)

    def failed(self, variant, name, e, t0):
        detail = f"{type(e).__name__}: {first_line(str(e))}"
        self.report(variant, name, False, detail, time.perf_counter() - t0)
        if self.args.verbose:
            traceback.print_exc()

    def case(self, case, index):
        name = case["name"]
        generate, reference, *finish = FAMILIES[case["op"]]
        fwd, bwd = case["forward"], case["backward"]
        t0 = time.perf_counter()
        try:
            problems = contract_problems(case)
            rng = np.random.default_rng([self.args.seed, zlib.crc32(name.encode())])
            d1 = generate(case, rng)
            derived = {r["name"] for r in fwd["results"]} & {o["name"] for o in bwd["operands"]}
            ways = (assign_strategies(fwd, index, set()), assign_strategies(bwd, index + 1, derived))
            d2 = dict(d1)
            for call, how in zip((fwd, bwd), ways):
                for o, h in zip(call["operands"], how):
                    if h == "broadcast":
                        key = data_key(call, d1, o["name"])
                        x = d1[key]
                        axis = broadcast_axis(x.ndim)
                        d2[key] = np.array(np.broadcast_to(np.take(x, [0], axis=axis), x.shape))
            if finish:  # values derived from the inputs, again from d2's
                finish[0](case, d2)
            ref1, ref2 = reference(case, d1), reference(case, d2)
        except Exception as e:  # noqa: BLE001
            self.failed("setup", name, e, t0)
            return

        # (a) pinned
        t0 = time.perf_counter()
        a = None
        try:
            fa = Call(self.xla, fwd, operand_arrays(fwd, d1), "a", True)
            ba = Call(self.xla, bwd, operand_arrays(bwd, d1, fa.out), "a", True)
            a = (fa, ba)
            ok, detail = verdict(case, a, ref1, d1)
            if problems:
                ok, detail = False, detail + "; FAILED: " + " | ".join(problems)
            self.report("a pinned", name, ok, detail, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            self.failed("a pinned", name, e, t0)

        # (a) unpinned: EXLA's eager form today
        t0 = time.perf_counter()
        try:
            if a is None:
                raise RuntimeError("(a) pinned did not run")
            fu = Call(self.xla, fwd, operand_arrays(fwd, d1), "a", False)
            bu = Call(self.xla, bwd, operand_arrays(bwd, d1, a[0].out), "a", False)
            ok, detail = verdict(case, (fu, bu), ref1, d1, baseline=a, pinned=False)
            self.report("a unpinned", name, ok, detail, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            self.failed("a unpinned", name, e, t0)

        # (b) pinned, against (a) pinned on the same inputs
        t0 = time.perf_counter()
        try:
            fa2 = Call(self.xla, fwd, operand_arrays(fwd, d2), "a", True)
            ba2 = Call(self.xla, bwd, operand_arrays(bwd, d2, fa2.out), "a", True)
            base = (fa2, ba2)
            self.later.append((case, ways, d2, base, ref2))
            fb = Call(self.xla, fwd, operand_arrays(fwd, d2), "b", True, ways[0])
            bb = Call(self.xla, bwd, operand_arrays(bwd, d2, fa2.out), "b", True, ways[1])
            ok, detail = verdict(case, (fb, bb), ref2, d2, baseline=base)
            detail += f"; operands fwd {'/'.join(ways[0])}, bwd {'/'.join(ways[1])}"
            self.report("b pinned", name, ok, detail, time.perf_counter() - t0)
        except Exception as e:  # noqa: BLE001
            self.failed("b pinned", name, e, t0)

    def unpinned(self, case, ways, d2, base, ref2, transpose_results=True):
        """(b) without layouts: reported, never a failure. Without
        `transpose_results`, the results are the module's outputs (the
        operands' side of the hazard alone)."""
        name = case["name"]
        fwd, bwd = case["forward"], case["backward"]
        variant = "b unpinned" if transpose_results else "b unpinned, operands only"
        t0 = time.perf_counter()
        try:
            fb = Call(self.xla, fwd, operand_arrays(fwd, d2), "b", False, ways[0], transpose_results)
            bb = Call(self.xla, bwd, operand_arrays(bwd, d2, base[0].out), "b", False, ways[1],
                      transpose_results)
            diffs, seen = [], []
            for tag, direction, call, b in (("fwd", "forward", fb, base[0]), ("bwd", "backward", bb, base[1])):
                d = bitwise_diff(case, direction, call, b)
                if d:
                    metrics = call.compared(case, direction, ref2[0 if direction == "forward" else 1], d2)
                    within = all(m.ok for m in metrics)
                    diffs.append(f"{tag} differs from (a): {', '.join(d)} "
                                 f"({'still within' if within else 'out of'} tolerance, worst {worst(metrics)})")
                if call.layouts is None:
                    seen.append(f"{tag} layouts: HLO not available")
                elif call.layouts[1]:
                    seen.append(f"{tag} XLA gave the custom call {len(call.layouts[1])} non-row-major of "
                                f"{call.layouts[0]} layouts: {', '.join(call.layouts[1])}")
                else:
                    seen.append(f"{tag} all {call.layouts[0]} layouts (results and operands) row-major")
            status = "WRONG" if diffs else "exact"
            detail = "; ".join(diffs + seen) + f"; operands fwd {'/'.join(ways[0])}, bwd {'/'.join(ways[1])}"
        except Exception as e:  # noqa: BLE001
            status, detail = "ERROR", f"{type(e).__name__}: {first_line(str(e))}"
            if self.args.verbose:
                traceback.print_exc()
        self.hazards.append((variant, name, status, detail))
        print(f"{status} [{variant}] {name}: {detail} ({time.perf_counter() - t0:.1f} s)", flush=True)


def first_line(s, limit=400):
    s = s.strip()
    s = s.splitlines()[0] if s else s
    return s if len(s) <= limit else s[:limit] + "..."


def main(argv=None):
    global cj, ce, jax, jnp, ref
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lib", default=None, help="libexphil_xla_ffi.so (default as check_jax_ffi.py: "
                   "$EXPHIL_XLA_FFI_LIB, else build-gpu/c_src/xla_ffi/libexphil_xla_ffi.so)")
    p.add_argument("--cases", default=str(REPO_ROOT / ".gpu" / "exla_cases.json"),
                   help="the JSON of mix exphil.exla_cases")
    p.add_argument("--only", default=None, help="run only cases whose name contains this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--from", dest="start", type=int, default=0, help="skip the first N cases")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="start no case after this many seconds (the rest fail as not run)")
    p.add_argument("--autotune", action="store_true", help="leave XLA's GEMM autotuning on")
    p.add_argument("--verbose", action="store_true")
    args = p.parse_args(argv)
    start = time.perf_counter()

    import check_jax_ffi  # noqa: E402 - enables float64, imports JAX
    import check_edifice_ffi  # noqa: E402 - Edifice's references
    cj, ce = check_jax_ffi, check_edifice_ffi
    jax, jnp, ref = cj.jax, cj.jnp, cj.ref

    spec = json.loads(Path(args.cases).read_text())
    if spec.get("layouts") != "row_major":
        raise SystemExit(f"{args.cases}: layouts {spec.get('layouts')!r}, expected 'row_major'")
    cases = spec["cases"][args.start:]
    if args.only:
        cases = [c for c in cases if args.only in c["name"]]

    xla = Xla(args.autotune)
    lib = cj.ex.load(args.lib)
    if any(c["op"] == "edifice" for c in cases):
        ce.register(lib)  # the targets of Edifice's ops, by pointer
    if any(c["op"] in GATED_CELLS or c["op"] in STACK_CELLS for c in cases):
        # exphil_jax registers no gated-RNN target
        cj.register_targets(cj.GATED_TARGETS + cj.STACK_TARGETS)
    print(f"check_exla_form: jax {jax.__version__}, python {platform.python_version()}, "
          f"device {xla.device.device_kind}; {len(cases)} cases from {args.cases} "
          f"(from {args.start}, only {args.only!r}); seed {args.seed}; "
          f"registered {len(cj.ex.registered_targets())} targets from {cj.ex.loaded_path()} "
          f"by pointer ({type(lib).__name__}); XLA options {xla.overrides or 'default'}", flush=True)
    if cj.ex.missing_targets():
        print(f"MISSING targets: {', '.join(cj.ex.missing_targets())}")

    runner = Runner(args, xla)
    not_run = []
    for i, case in enumerate(cases):
        if args.max_seconds is not None and time.perf_counter() - start > args.max_seconds:
            not_run = [c["name"] for c in cases[i:]]
            print(f"-- --max-seconds {args.max_seconds:g} reached: {len(not_run)} cases not run, "
                  f"from case {args.start + i} ({not_run[0]}); rerun with --from {args.start + i}")
            break
        runner.case(case, args.start + i)
        if i == 0:
            print(f"-- compiled with {xla.compile_way}, ran with {xla.run_way}", flush=True)

    print("\n== b unpinned (no layout attributes): the hazard, reported, not a failure", flush=True)
    for transpose_results in (True, False):
        for k, item in enumerate(runner.later):
            if args.max_seconds is not None and time.perf_counter() - start > args.max_seconds:
                print(f"-- --max-seconds reached: not run for {len(runner.later) - k} cases")
                break
            runner.unpinned(*item, transpose_results=transpose_results)

    for note in xla.notes:
        print(f"note: {note}")
    print("\n== summary")
    for variant in ("setup", "a pinned", "a unpinned", "b pinned"):
        rows = [ok for v, _, ok in runner.lines if v == variant]
        if rows:
            print(f"{variant:11} {sum(rows)}/{len(rows)} passed")
    failed = [(v, n) for v, n, ok in runner.lines if not ok]
    for v, n in failed:
        print(f"  FAILED [{v}] {n}")
    for variant in ("b unpinned", "b unpinned, operands only"):
        rows = [st for v, _, st, _ in runner.hazards if v == variant]
        counts = {s: rows.count(s) for s in ("WRONG", "exact", "ERROR")}
        print(f"unpinned hazards [{variant}] (not counted as failures): {counts['WRONG']} of "
              f"{len(rows)} cases wrong, {counts['ERROR']} errors, {counts['exact']} exact")
    passed = sum(1 for _, _, ok in runner.lines if ok)
    n_failed = len(failed) + len(not_run)
    if not_run:
        print(f"{len(not_run)} cases not run (counted as failed)")
    print(f"{passed} passed, {n_failed} failed", flush=True)
    return 0 if n_failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
