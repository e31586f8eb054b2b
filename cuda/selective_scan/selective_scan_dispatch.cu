// Run-time dispatch from the dtype to the generated launcher instances.
#include "common/dtype.cuh"
#include "selective_scan/selective_scan_instances.h"
#include "selective_scan/selective_scan_launch.h"

namespace exphil::kernels {

LaunchResult launch_selective_scan_forward(const SelectiveScanForwardParams& params,
                                           const SelectiveScanPlan& plan, float* d_workspace,
                                           cudaStream_t stream) noexcept {
  switch (params.dtype) {
    case DType::f32: return run_selective_scan_forward<float>(params, plan, d_workspace, stream);
    case DType::f16: return run_selective_scan_forward<__half>(params, plan, d_workspace, stream);
    case DType::bf16:
      return run_selective_scan_forward<__nv_bfloat16>(params, plan, d_workspace, stream);
  }
  return {cudaErrorInvalidValue, "selective scan dispatch (unknown dtype)"};
}

LaunchResult launch_selective_scan_backward(const SelectiveScanBackwardParams& params,
                                            const SelectiveScanPlan& plan, float* d_workspace,
                                            cudaStream_t stream) noexcept {
  switch (params.fwd.dtype) {
    case DType::f32: return run_selective_scan_backward<float>(params, plan, d_workspace, stream);
    case DType::f16: return run_selective_scan_backward<__half>(params, plan, d_workspace, stream);
    case DType::bf16:
      return run_selective_scan_backward<__nv_bfloat16>(params, plan, d_workspace, stream);
  }
  return {cudaErrorInvalidValue, "selective scan dispatch (unknown dtype)"};
}

}  // namespace exphil::kernels
