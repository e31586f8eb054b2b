// The extern "C" surface of libexphil.so (include/exphil/exphil.h): thin
// wrappers over the C++ API that record the failure message per thread.
#include <string>

#include "exphil/exphil.h"
#include "exphil/runtime.hpp"
#include "exphil/scan.hpp"
#include "exphil/attention.hpp"
#include "exphil/gated_rnn.hpp"
#include "exphil/selective_scan.hpp"

namespace {

thread_local std::string t_last_error;
// Set instead when the message could not be stored (no host memory).
thread_local const char* t_last_error_fallback = nullptr;

void record_failure(const exphil::Status& status) noexcept {
  try {
    t_last_error = status.message().empty() ? "out of host memory" : status.message();
    t_last_error_fallback = nullptr;
  } catch (...) {
    t_last_error_fallback = "out of host memory (the error message was lost)";
  }
}

template <class F>
exphil_status c_call(F&& f) noexcept {
  try {
    const exphil::Status status = f();
    if (!status.ok()) record_failure(status);
    return static_cast<exphil_status>(status.code());
  } catch (...) {
    t_last_error_fallback = "internal error: exception at the C ABI boundary";
    return EXPHIL_ERROR_INTERNAL;
  }
}

exphil_status forward(exphil::ScanOp op, const exphil_tensor* const* inputs,
                      const exphil_tensor* h0, const exphil_tensor* y,
                      const exphil_tensor* h_final, exphil_stream stream) noexcept {
  return c_call([&] {
    exphil::ScanForwardArgs args;
    args.op = op;
    for (int i = 0; i < exphil::scan_input_count(op); ++i) args.inputs[i] = inputs[i];
    args.h0 = h0;
    args.y = y;
    args.h_final = h_final;
    return exphil::scan_forward(args, stream);
  });
}

exphil_status backward(exphil::ScanOp op, const exphil_tensor* const* inputs,
                       const exphil_tensor* h0, const exphil_tensor* y,
                       const exphil_tensor* grad_y, const exphil_tensor* grad_h_final,
                       const exphil_tensor* const* grad_inputs, const exphil_tensor* grad_h0,
                       exphil_stream stream) noexcept {
  return c_call([&] {
    exphil::ScanBackwardArgs args;
    args.op = op;
    for (int i = 0; i < exphil::scan_input_count(op); ++i) {
      args.inputs[i] = inputs[i];
      args.grad_inputs[i] = grad_inputs[i];
    }
    args.h0 = h0;
    args.y = y;
    args.grad_y = grad_y;
    args.grad_h_final = grad_h_final;
    args.grad_h0 = grad_h0;
    return exphil::scan_backward(args, stream);
  });
}

exphil::SelectiveScanInputs selective_scan_inputs(
    const exphil_tensor* x, const exphil_tensor* dt, const exphil_tensor* A,
    const exphil_tensor* B, const exphil_tensor* C, const exphil_tensor* dt_bias,
    const exphil_tensor* D, const exphil_tensor* z, const exphil_tensor* h0) noexcept {
  exphil::SelectiveScanInputs in;
  in.x = x;
  in.dt = dt;
  in.A = A;
  in.B = B;
  in.C = C;
  in.dt_bias = dt_bias;
  in.D = D;
  in.z = z;
  in.h0 = h0;
  return in;
}

exphil::SelectiveScanOptions selective_scan_options(
    const exphil_selective_scan_options* options) noexcept {
  exphil::SelectiveScanOptions o;
  if (options) {
    o.softplus = options->softplus != 0;
    o.clamp = options->clamp != 0;
    o.dt_min = options->dt_min;
    o.dt_max = options->dt_max;
  }
  return o;
}

// NULL options: exact precision. Values are passed through unchecked;
// validation reports the bad ones.
exphil::GatedRnnOptions gated_rnn_options(const exphil_gated_rnn_options* options) noexcept {
  exphil::GatedRnnOptions o;
  if (options) o.precision = static_cast<exphil::GatedRnnPrecision>(options->precision);
  return o;
}

exphil::AttentionInputs attention_inputs(const exphil_tensor* q, const exphil_tensor* k,
                                         const exphil_tensor* v) noexcept {
  exphil::AttentionInputs in;
  in.q = q;
  in.k = k;
  in.v = v;
  return in;
}

// NULL options: no mask, layout BHTD, scale 1 / sqrt(d), exact. Values are passed
// through unchecked; validation reports the bad ones.
exphil::AttentionOptions attention_options(const exphil_attention_options* options) noexcept {
  exphil::AttentionOptions o;
  if (options) {
    o.mask = static_cast<exphil::AttentionMask>(options->mask);
    o.window = options->window;
    o.layout = static_cast<exphil::AttentionLayout>(options->layout);
    o.scale = options->scale;
    o.precision = static_cast<exphil::AttentionPrecision>(options->precision);
  }
  return o;
}

}  // namespace

extern "C" {

const char* exphil_version(void) { return exphil::version(); }

const char* exphil_last_error(void) {
  return t_last_error_fallback ? t_last_error_fallback : t_last_error.c_str();
}

const char* exphil_status_name(int status) {
  switch (status) {
    case EXPHIL_OK: return "EXPHIL_OK";
    case EXPHIL_ERROR_INVALID_ARGUMENT: return "EXPHIL_ERROR_INVALID_ARGUMENT";
    case EXPHIL_ERROR_NO_DEVICE: return "EXPHIL_ERROR_NO_DEVICE";
    case EXPHIL_ERROR_OUT_OF_MEMORY: return "EXPHIL_ERROR_OUT_OF_MEMORY";
    case EXPHIL_ERROR_CUDA: return "EXPHIL_ERROR_CUDA";
    case EXPHIL_ERROR_NOT_SUPPORTED: return "EXPHIL_ERROR_NOT_SUPPORTED";
    case EXPHIL_ERROR_INTERNAL: return "EXPHIL_ERROR_INTERNAL";
  }
  return "EXPHIL_UNKNOWN_STATUS";
}

exphil_status exphil_device_count(int* count) {
  return c_call([&] {
    if (!count)
      return exphil::Status(exphil::StatusCode::invalid_argument,
                            "exphil_device_count: argument 'count' is NULL");
    return exphil::device_count(*count);
  });
}

exphil_status exphil_synchronize(int device) {
  return c_call([&] { return exphil::synchronize(device); });
}

exphil_status exphil_device_alloc(int device, size_t bytes, void** ptr) {
  return c_call([&] {
    if (!ptr)
      return exphil::Status(exphil::StatusCode::invalid_argument,
                            "exphil_device_alloc: argument 'ptr' is NULL");
    *ptr = nullptr;
    return exphil::device_alloc(device, bytes, *ptr);
  });
}

exphil_status exphil_device_free(void* ptr) {
  return c_call([&] { return exphil::device_free(ptr); });
}

exphil_status exphil_linear_scan_forward(const exphil_tensor* a, const exphil_tensor* b,
                                         const exphil_tensor* h0, const exphil_tensor* y,
                                         const exphil_tensor* h_final, exphil_stream stream) {
  const exphil_tensor* inputs[] = {a, b};
  return forward(exphil::ScanOp::linear_scan, inputs, h0, y, h_final, stream);
}

exphil_status exphil_linear_scan_backward(const exphil_tensor* a, const exphil_tensor* b,
                                          const exphil_tensor* h0, const exphil_tensor* y,
                                          const exphil_tensor* grad_y,
                                          const exphil_tensor* grad_h_final,
                                          const exphil_tensor* grad_a, const exphil_tensor* grad_b,
                                          const exphil_tensor* grad_h0, exphil_stream stream) {
  const exphil_tensor* inputs[] = {a, b};
  const exphil_tensor* grads[] = {grad_a, grad_b};
  return backward(exphil::ScanOp::linear_scan, inputs, h0, y, grad_y, grad_h_final, grads,
                  grad_h0, stream);
}

exphil_status exphil_min_gru_forward(const exphil_tensor* gate, const exphil_tensor* candidate,
                                     const exphil_tensor* h0, const exphil_tensor* y,
                                     const exphil_tensor* h_final, exphil_stream stream) {
  const exphil_tensor* inputs[] = {gate, candidate};
  return forward(exphil::ScanOp::min_gru, inputs, h0, y, h_final, stream);
}

exphil_status exphil_min_gru_backward(const exphil_tensor* gate, const exphil_tensor* candidate,
                                      const exphil_tensor* h0, const exphil_tensor* y,
                                      const exphil_tensor* grad_y,
                                      const exphil_tensor* grad_h_final,
                                      const exphil_tensor* grad_gate,
                                      const exphil_tensor* grad_candidate,
                                      const exphil_tensor* grad_h0, exphil_stream stream) {
  const exphil_tensor* inputs[] = {gate, candidate};
  const exphil_tensor* grads[] = {grad_gate, grad_candidate};
  return backward(exphil::ScanOp::min_gru, inputs, h0, y, grad_y, grad_h_final, grads, grad_h0,
                  stream);
}

exphil_status exphil_min_lstm_forward(const exphil_tensor* forget, const exphil_tensor* input,
                                      const exphil_tensor* candidate, const exphil_tensor* h0,
                                      const exphil_tensor* y, const exphil_tensor* h_final,
                                      exphil_stream stream) {
  const exphil_tensor* inputs[] = {forget, input, candidate};
  return forward(exphil::ScanOp::min_lstm, inputs, h0, y, h_final, stream);
}

exphil_status exphil_min_lstm_backward(
    const exphil_tensor* forget, const exphil_tensor* input, const exphil_tensor* candidate,
    const exphil_tensor* h0, const exphil_tensor* y, const exphil_tensor* grad_y,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_forget,
    const exphil_tensor* grad_input, const exphil_tensor* grad_candidate,
    const exphil_tensor* grad_h0, exphil_stream stream) {
  const exphil_tensor* inputs[] = {forget, input, candidate};
  const exphil_tensor* grads[] = {grad_forget, grad_input, grad_candidate};
  return backward(exphil::ScanOp::min_lstm, inputs, h0, y, grad_y, grad_h_final, grads, grad_h0,
                  stream);
}

exphil_status exphil_liquid_forward(const exphil_tensor* tau, const exphil_tensor* target,
                                    const exphil_tensor* h0, const exphil_tensor* y,
                                    const exphil_tensor* h_final, exphil_stream stream) {
  const exphil_tensor* inputs[] = {tau, target};
  return forward(exphil::ScanOp::liquid, inputs, h0, y, h_final, stream);
}

exphil_status exphil_liquid_backward(const exphil_tensor* tau, const exphil_tensor* target,
                                     const exphil_tensor* h0, const exphil_tensor* y,
                                     const exphil_tensor* grad_y,
                                     const exphil_tensor* grad_h_final,
                                     const exphil_tensor* grad_tau,
                                     const exphil_tensor* grad_target,
                                     const exphil_tensor* grad_h0, exphil_stream stream) {
  const exphil_tensor* inputs[] = {tau, target};
  const exphil_tensor* grads[] = {grad_tau, grad_target};
  return backward(exphil::ScanOp::liquid, inputs, h0, y, grad_y, grad_h_final, grads, grad_h0,
                  stream);
}

exphil_status exphil_selective_scan_forward(
    const exphil_tensor* x, const exphil_tensor* dt, const exphil_tensor* A,
    const exphil_tensor* B, const exphil_tensor* C, const exphil_tensor* dt_bias,
    const exphil_tensor* D, const exphil_tensor* z, const exphil_tensor* h0,
    const exphil_selective_scan_options* options, const exphil_tensor* y,
    const exphil_tensor* h_final, exphil_stream stream) {
  return c_call([&] {
    exphil::SelectiveScanForwardArgs args;
    args.in = selective_scan_inputs(x, dt, A, B, C, dt_bias, D, z, h0);
    args.options = selective_scan_options(options);
    args.y = y;
    args.h_final = h_final;
    return exphil::selective_scan_forward(args, stream);
  });
}

exphil_status exphil_selective_scan_backward(
    const exphil_tensor* x, const exphil_tensor* dt, const exphil_tensor* A,
    const exphil_tensor* B, const exphil_tensor* C, const exphil_tensor* dt_bias,
    const exphil_tensor* D, const exphil_tensor* z, const exphil_tensor* h0,
    const exphil_selective_scan_options* options, const exphil_tensor* grad_y,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_x, const exphil_tensor* grad_dt,
    const exphil_tensor* grad_A, const exphil_tensor* grad_B, const exphil_tensor* grad_C,
    const exphil_tensor* grad_dt_bias, const exphil_tensor* grad_D, const exphil_tensor* grad_z,
    const exphil_tensor* grad_h0, exphil_stream stream) {
  return c_call([&] {
    exphil::SelectiveScanBackwardArgs args;
    args.in = selective_scan_inputs(x, dt, A, B, C, dt_bias, D, z, h0);
    args.options = selective_scan_options(options);
    args.grad_y = grad_y;
    args.grad_h_final = grad_h_final;
    args.grad_x = grad_x;
    args.grad_dt = grad_dt;
    args.grad_A = grad_A;
    args.grad_B = grad_B;
    args.grad_C = grad_C;
    args.grad_dt_bias = grad_dt_bias;
    args.grad_D = grad_D;
    args.grad_z = grad_z;
    args.grad_h0 = grad_h0;
    return exphil::selective_scan_backward(args, stream);
  });
}

exphil_status exphil_attention_forward(const exphil_tensor* q, const exphil_tensor* k,
                                       const exphil_tensor* v,
                                       const exphil_attention_options* options,
                                       const exphil_tensor* o, const exphil_tensor* lse,
                                       exphil_stream stream) {
  return c_call([&] {
    exphil::AttentionForwardArgs args;
    args.in = attention_inputs(q, k, v);
    args.options = attention_options(options);
    args.o = o;
    args.lse = lse;
    return exphil::attention_forward(args, stream);
  });
}

exphil_status exphil_attention_backward(const exphil_tensor* q, const exphil_tensor* k,
                                        const exphil_tensor* v, const exphil_tensor* o,
                                        const exphil_tensor* lse, const exphil_tensor* grad_o,
                                        const exphil_attention_options* options,
                                        const exphil_tensor* grad_q, const exphil_tensor* grad_k,
                                        const exphil_tensor* grad_v, exphil_stream stream) {
  return c_call([&] {
    exphil::AttentionBackwardArgs args;
    args.in = attention_inputs(q, k, v);
    args.options = attention_options(options);
    args.o = o;
    args.lse = lse;
    args.grad_o = grad_o;
    args.grad_q = grad_q;
    args.grad_k = grad_k;
    args.grad_v = grad_v;
    return exphil::attention_backward(args, stream);
  });
}

// The GRU's, the LSTM's and the sLSTM's functions fill one args type (the
// cell chooses which states exist; the others stay NULL).
exphil_status exphil_gru_forward(const exphil_tensor* wx, const exphil_tensor* R,
                                 const exphil_tensor* bias, const exphil_tensor* h0,
                                 const exphil_tensor* y, const exphil_tensor* h_final,
                                 const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnForwardArgs a;
    a.cell = exphil::GatedRnnCell::gru;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0;
    a.y = y, a.h_final = h_final;
    return exphil::gated_rnn_forward(a, stream);
  });
}

exphil_status exphil_gru_backward(const exphil_tensor* wx, const exphil_tensor* R,
                                  const exphil_tensor* y, const exphil_tensor* grad_y,
                                  const exphil_tensor* bias, const exphil_tensor* h0,
                                  const exphil_tensor* grad_h_final, const exphil_tensor* grad_wx,
                                  const exphil_tensor* grad_R, const exphil_tensor* grad_bias,
                                  const exphil_tensor* grad_h0, const exphil_tensor* grad_rh,
                                  const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnBackwardArgs a;
    a.cell = exphil::GatedRnnCell::gru;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0, a.y = y;
    a.grad_y = grad_y, a.grad_h_final = grad_h_final;
    a.grad_wx = grad_wx, a.grad_R = grad_R, a.grad_bias = grad_bias, a.grad_h0 = grad_h0;
    a.grad_rh = grad_rh;
    return exphil::gated_rnn_backward(a, stream);
  });
}

exphil_status exphil_gru_stack_forward(const exphil_tensor* wx, const exphil_tensor* R,
                                       const exphil_tensor* W, const exphil_tensor* bias,
                                       const exphil_tensor* W_bias, const exphil_tensor* h0,
                                       const exphil_tensor* y, const exphil_tensor* y_lower,
                                       const exphil_tensor* h_final,
                                       const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnStackForwardArgs a;
    a.cell = exphil::GatedRnnCell::gru;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.W = W, a.bias = bias, a.W_bias = W_bias, a.h0 = h0;
    a.y = y, a.y_lower = y_lower, a.h_final = h_final;
    return exphil::gated_rnn_stack_forward(a, stream);
  });
}

exphil_status exphil_lstm_stack_forward(const exphil_tensor* wx, const exphil_tensor* R,
                                        const exphil_tensor* W, const exphil_tensor* bias,
                                        const exphil_tensor* W_bias, const exphil_tensor* h0,
                                        const exphil_tensor* c0, const exphil_tensor* y,
                                        const exphil_tensor* y_lower, const exphil_tensor* h_final,
                                        const exphil_tensor* c_final,
                                        const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnStackForwardArgs a;
    a.cell = exphil::GatedRnnCell::lstm;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.W = W, a.bias = bias, a.W_bias = W_bias, a.h0 = h0, a.c0 = c0;
    a.y = y, a.y_lower = y_lower, a.h_final = h_final, a.c_final = c_final;
    return exphil::gated_rnn_stack_forward(a, stream);
  });
}

exphil_status exphil_gru_stack_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W, const exphil_tensor* y,
    const exphil_tensor* y_lower, const exphil_tensor* grad_y, const exphil_tensor* bias,
    const exphil_tensor* W_bias, const exphil_tensor* h0, const exphil_tensor* grad_y_lower,
    const exphil_tensor* grad_h_final, const exphil_tensor* grad_wx, const exphil_tensor* grad_R,
    const exphil_tensor* grad_W, const exphil_tensor* grad_bias, const exphil_tensor* grad_W_bias,
    const exphil_tensor* grad_h0, const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnStackBackwardArgs a;
    a.cell = exphil::GatedRnnCell::gru;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.W = W, a.y = y, a.y_lower = y_lower, a.grad_y = grad_y;
    a.bias = bias, a.W_bias = W_bias, a.h0 = h0;
    a.grad_y_lower = grad_y_lower, a.grad_h_final = grad_h_final;
    a.grad_wx = grad_wx, a.grad_R = grad_R, a.grad_W = grad_W, a.grad_bias = grad_bias;
    a.grad_W_bias = grad_W_bias, a.grad_h0 = grad_h0;
    return exphil::gated_rnn_stack_backward(a, stream);
  });
}

exphil_status exphil_lstm_stack_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* W, const exphil_tensor* y,
    const exphil_tensor* y_lower, const exphil_tensor* grad_y, const exphil_tensor* bias,
    const exphil_tensor* W_bias, const exphil_tensor* h0, const exphil_tensor* c0,
    const exphil_tensor* grad_y_lower, const exphil_tensor* grad_h_final,
    const exphil_tensor* grad_c_final, const exphil_tensor* grad_wx, const exphil_tensor* grad_R,
    const exphil_tensor* grad_W, const exphil_tensor* grad_bias, const exphil_tensor* grad_W_bias,
    const exphil_tensor* grad_h0, const exphil_tensor* grad_c0,
    const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnStackBackwardArgs a;
    a.cell = exphil::GatedRnnCell::lstm;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.W = W, a.y = y, a.y_lower = y_lower, a.grad_y = grad_y;
    a.bias = bias, a.W_bias = W_bias, a.h0 = h0, a.c0 = c0;
    a.grad_y_lower = grad_y_lower, a.grad_h_final = grad_h_final, a.grad_c_final = grad_c_final;
    a.grad_wx = grad_wx, a.grad_R = grad_R, a.grad_W = grad_W, a.grad_bias = grad_bias;
    a.grad_W_bias = grad_W_bias, a.grad_h0 = grad_h0, a.grad_c0 = grad_c0;
    return exphil::gated_rnn_stack_backward(a, stream);
  });
}

exphil_status exphil_lstm_forward(const exphil_tensor* wx, const exphil_tensor* R,
                                  const exphil_tensor* bias, const exphil_tensor* h0,
                                  const exphil_tensor* c0, const exphil_tensor* y,
                                  const exphil_tensor* h_final, const exphil_tensor* c_final,
                                  const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnForwardArgs a;
    a.cell = exphil::GatedRnnCell::lstm;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0, a.c0 = c0;
    a.y = y, a.h_final = h_final, a.c_final = c_final;
    return exphil::gated_rnn_forward(a, stream);
  });
}

exphil_status exphil_lstm_backward(const exphil_tensor* wx, const exphil_tensor* R,
                                   const exphil_tensor* y, const exphil_tensor* grad_y,
                                   const exphil_tensor* bias, const exphil_tensor* h0,
                                   const exphil_tensor* c0, const exphil_tensor* grad_h_final,
                                   const exphil_tensor* grad_c_final, const exphil_tensor* grad_wx,
                                   const exphil_tensor* grad_R, const exphil_tensor* grad_bias,
                                   const exphil_tensor* grad_h0, const exphil_tensor* grad_c0,
                                   const exphil_tensor* grad_rh,
                                   const exphil_gated_rnn_options* options, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnBackwardArgs a;
    a.cell = exphil::GatedRnnCell::lstm;
    a.options = gated_rnn_options(options);
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0, a.c0 = c0, a.y = y;
    a.grad_y = grad_y, a.grad_h_final = grad_h_final, a.grad_c_final = grad_c_final;
    a.grad_wx = grad_wx, a.grad_R = grad_R, a.grad_bias = grad_bias;
    a.grad_h0 = grad_h0, a.grad_c0 = grad_c0, a.grad_rh = grad_rh;
    return exphil::gated_rnn_backward(a, stream);
  });
}

exphil_status exphil_slstm_forward(const exphil_tensor* wx, const exphil_tensor* R,
                                   const exphil_tensor* bias, const exphil_tensor* h0,
                                   const exphil_tensor* c0, const exphil_tensor* n0,
                                   const exphil_tensor* m0, const exphil_tensor* y,
                                   const exphil_tensor* h_final, const exphil_tensor* c_final,
                                   const exphil_tensor* n_final, const exphil_tensor* m_final,
                                   exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnForwardArgs a;
    a.cell = exphil::GatedRnnCell::slstm;
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0, a.c0 = c0, a.n0 = n0, a.m0 = m0;
    a.y = y, a.h_final = h_final, a.c_final = c_final, a.n_final = n_final, a.m_final = m_final;
    return exphil::gated_rnn_forward(a, stream);
  });
}

exphil_status exphil_slstm_backward(
    const exphil_tensor* wx, const exphil_tensor* R, const exphil_tensor* y, const exphil_tensor* grad_y,
    const exphil_tensor* bias, const exphil_tensor* h0, const exphil_tensor* c0, const exphil_tensor* n0,
    const exphil_tensor* m0, const exphil_tensor* grad_h_final, const exphil_tensor* grad_c_final,
    const exphil_tensor* grad_n_final, const exphil_tensor* grad_m_final, const exphil_tensor* grad_wx,
    const exphil_tensor* grad_R, const exphil_tensor* grad_bias, const exphil_tensor* grad_h0,
    const exphil_tensor* grad_c0, const exphil_tensor* grad_n0, const exphil_tensor* grad_m0,
    const exphil_tensor* grad_rh, exphil_stream stream) {
  return c_call([&] {
    exphil::GatedRnnBackwardArgs a;
    a.cell = exphil::GatedRnnCell::slstm;
    a.wx = wx, a.R = R, a.bias = bias, a.h0 = h0, a.c0 = c0, a.n0 = n0, a.m0 = m0, a.y = y;
    a.grad_y = grad_y, a.grad_h_final = grad_h_final, a.grad_c_final = grad_c_final;
    a.grad_n_final = grad_n_final, a.grad_m_final = grad_m_final;
    a.grad_wx = grad_wx, a.grad_R = grad_R, a.grad_bias = grad_bias, a.grad_h0 = grad_h0;
    a.grad_c0 = grad_c0, a.grad_n0 = grad_n0, a.grad_m0 = grad_m0, a.grad_rh = grad_rh;
    return exphil::gated_rnn_backward(a, stream);
  });
}

}  // extern "C"
