"""Checks mlir_form.md's module with JAX's MLIR/StableHLO and XLA (no GPU needed).

    JAX_PLATFORMS=cpu python3 mix_stub/upstream/exla/jax_check_mlir_form.py

1. Parses and verifies the module the patched EXLA emits, prints MLIR's own
   printing of it (compare with mlir_form.md).
2. Checks that StableHLO rejects operand_layouts without result_layouts and a
   layout that is not a permutation (why the Spec validates both).
3. Converts it to HLO and prints the custom-call line, which shows XLA's
   operand_layout_constraints and result layout.
4. Prints what jax.ffi.ffi_call emits for the same call, for comparison.
It does not run the custom call (no handler is registered for "my_target").
"""

import numpy as np

import jax
import jax.numpy as jnp
from jax._src.interpreters import mlir
from jax._src.lib.mlir import ir

OPERAND_LAYOUTS = "[dense<[2, 1, 0]> : tensor<3xindex>, dense<[1, 0]> : tensor<2xindex>]"
RESULT_LAYOUTS = OPERAND_LAYOUTS

# The module as the patched EXLA prints it (EXLA.MLIR.Module.as_string/1).
EXLA_MODULE = f"""module {{
  func.func public @main(%arg0: tensor<2x3x4xf32>, %arg1: tensor<2x4xf32>) -> (tensor<2x3x4xf32>, tensor<2x4xf32>) {{
    %0:2 = stablehlo.custom_call @my_target(%arg0, %arg1) {{api_version = 4 : i32, backend_config = {{mask = 1 : i32}}, operand_layouts = {OPERAND_LAYOUTS}, result_layouts = {RESULT_LAYOUTS}}} : (tensor<2x3x4xf32>, tensor<2x4xf32>) -> (tensor<2x3x4xf32>, tensor<2x4xf32>)
    return %0#0, %0#1 : tensor<2x3x4xf32>, tensor<2x4xf32>
  }}
}}
"""

# The same op in generic form, built from the exact attribute strings that
# Value.custom_call passes to EXLA.NIF.mlir_op/6.
GENERIC_MODULE = f"""module {{
  func.func public @main(%arg0: tensor<2x3x4xf32>, %arg1: tensor<2x4xf32>) -> (tensor<2x3x4xf32>, tensor<2x4xf32>) {{
    %0:2 = "stablehlo.custom_call"(%arg0, %arg1) {{call_target_name = "my_target", api_version = 4 : i32, backend_config = {{mask = 1 : i32}}, operand_layouts = {OPERAND_LAYOUTS}, result_layouts = {RESULT_LAYOUTS}}} : (tensor<2x3x4xf32>, tensor<2x4xf32>) -> (tensor<2x3x4xf32>, tensor<2x4xf32>)
    "func.return"(%0#0, %0#1) : (tensor<2x3x4xf32>, tensor<2x4xf32>) -> ()
  }}
}}
"""

# Scalars and rank-1 tensors.
SMALL_MODULE = """module {
  func.func public @main(%arg0: tensor<f32>, %arg1: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.custom_call"(%arg0, %arg1) {call_target_name = "my_target", api_version = 4 : i32, operand_layouts = [dense<> : tensor<0xindex>, dense<[0]> : tensor<1xindex>], result_layouts = [dense<[0]> : tensor<1xindex>]} : (tensor<f32>, tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}
"""


def parse(text):
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        assert module.operation.verify()
        return module.operation.get_asm(enable_debug_info=False)


def expect_error(label, text):
    try:
        parse(text)
    except Exception as e:  # noqa: BLE001
        print(f"[{label}] rejected as expected: {str(e).splitlines()[0][:200]}")
        msg = str(e)
        for line in msg.splitlines():
            if "layout" in line.lower():
                print("    " + line.strip()[:300])
                break
        return
    raise SystemExit(f"[{label}] was accepted, expected an error")


print("jax", jax.__version__)
printed = parse(EXLA_MODULE)
print("== MLIR's printing of the EXLA module:\n" + printed)
assert parse(GENERIC_MODULE) == printed, "generic form prints differently"
print("== generic form (EXLA's attribute strings) prints identically: OK")
print("== scalars / rank 1:\n" + parse(SMALL_MODULE))

expect_error(
    "operand_layouts only",
    EXLA_MODULE.replace(f", result_layouts = {RESULT_LAYOUTS}", ""),
)
expect_error(
    "not a permutation",
    EXLA_MODULE.replace("operand_layouts = [dense<[2, 1, 0]>", "operand_layouts = [dense<[1, 1, 0]>"),
)

try:
    from jax._src.lib import xla_client

    comp = xla_client._xla.mlir.mlir_module_to_xla_computation(
        EXLA_MODULE, use_tuple_args=False, return_tuple=False
    )
    hlo = comp.as_hlo_text()
    print("== HLO custom-call:")
    for line in hlo.splitlines():
        if "custom-call" in line:
            print(line.strip())
except Exception as e:  # noqa: BLE001
    print(f"== HLO conversion not available here: {type(e).__name__}: {e}")

x = jnp.zeros((2, 3, 4), jnp.float32)
y = jnp.zeros((2, 4), jnp.float32)


def f(x, y):
    out = (jax.ShapeDtypeStruct((2, 3, 4), jnp.float32), jax.ShapeDtypeStruct((2, 4), jnp.float32))
    return jax.ffi.ffi_call("my_target", out)(x, y, mask=np.int32(1))


text = jax.jit(f).lower(x, y).as_text()
print("== jax.ffi.ffi_call emits:")
for line in text.splitlines():
    if "custom_call" in line:
        print(line.strip())
try:
    comp = xla_client._xla.mlir.mlir_module_to_xla_computation(
        text, use_tuple_args=False, return_tuple=False
    )
    print("== ... which XLA converts to:")
    for line in comp.as_hlo_text().splitlines():
        if "custom-call(" in line:
            print(line.strip())
except Exception as e:  # noqa: BLE001
    print(f"== HLO conversion not available here: {type(e).__name__}: {e}")
print("ALL CHECKS PASSED")
