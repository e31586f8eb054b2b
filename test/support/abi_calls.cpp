#include "abi_calls.hpp"

namespace exphil::test {

exphil_status abi_scan_forward(ScanOp op, const exphil_tensor* const* x, const exphil_tensor* h0,
                               const exphil_tensor* y, const exphil_tensor* h_final,
                               exphil_stream stream) {
  switch (op) {
    case ScanOp::linear_scan: return exphil_linear_scan_forward(x[0], x[1], h0, y, h_final, stream);
    case ScanOp::min_gru: return exphil_min_gru_forward(x[0], x[1], h0, y, h_final, stream);
    case ScanOp::min_lstm: return exphil_min_lstm_forward(x[0], x[1], x[2], h0, y, h_final, stream);
    case ScanOp::liquid: return exphil_liquid_forward(x[0], x[1], h0, y, h_final, stream);
    case ScanOp::min_gru_activated:  // no C ABI entry point (scan.hpp, kAbiScanOps)
    case ScanOp::min_lstm_activated:
    case ScanOp::diag_linear:
    case ScanOp::elu_gru: break;
  }
  return EXPHIL_ERROR_INTERNAL;
}

exphil_status abi_scan_backward(ScanOp op, const exphil_tensor* const* x, const exphil_tensor* h0,
                                const exphil_tensor* y, const exphil_tensor* gy,
                                const exphil_tensor* gf, const exphil_tensor* const* gx,
                                const exphil_tensor* g0, exphil_stream stream) {
  switch (op) {
    case ScanOp::linear_scan:
      return exphil_linear_scan_backward(x[0], x[1], h0, y, gy, gf, gx[0], gx[1], g0, stream);
    case ScanOp::min_gru:
      return exphil_min_gru_backward(x[0], x[1], h0, y, gy, gf, gx[0], gx[1], g0, stream);
    case ScanOp::min_lstm:
      return exphil_min_lstm_backward(x[0], x[1], x[2], h0, y, gy, gf, gx[0], gx[1], gx[2], g0,
                                      stream);
    case ScanOp::liquid:
      return exphil_liquid_backward(x[0], x[1], h0, y, gy, gf, gx[0], gx[1], g0, stream);
    case ScanOp::min_gru_activated:  // no C ABI entry point (scan.hpp, kAbiScanOps)
    case ScanOp::min_lstm_activated:
    case ScanOp::diag_linear:
    case ScanOp::elu_gru: break;
  }
  return EXPHIL_ERROR_INTERNAL;
}

}  // namespace exphil::test
