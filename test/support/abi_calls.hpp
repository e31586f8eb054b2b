// Calls the C ABI function of a scan op chosen at run time, so tests can
// loop over ops through exphil.h exactly as an FFI user would call it.
#pragma once

#include "exphil/exphil.h"
#include "exphil/scan.hpp"

namespace exphil::test {

exphil_status abi_scan_forward(ScanOp op, const exphil_tensor* const* inputs,
                               const exphil_tensor* h0, const exphil_tensor* y,
                               const exphil_tensor* h_final, exphil_stream stream);

exphil_status abi_scan_backward(ScanOp op, const exphil_tensor* const* inputs,
                                const exphil_tensor* h0, const exphil_tensor* y,
                                const exphil_tensor* grad_y, const exphil_tensor* grad_h_final,
                                const exphil_tensor* const* grad_inputs,
                                const exphil_tensor* grad_h0, exphil_stream stream);

}  // namespace exphil::test
