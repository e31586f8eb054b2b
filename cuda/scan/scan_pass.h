// The two passes of a segmented scan (see scan_forward.cuh).
#pragma once

namespace exphil::kernels {

enum class ScanPass : int {
  aggregate = 0,  // reduce each segment to an affine map in the workspace
  apply = 1,      // run each segment from its entering state, write outputs
};

}  // namespace exphil::kernels
