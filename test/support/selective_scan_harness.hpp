// Runs one selective-scan case on the GPU, forward and backward, through the
// C++ API or the C ABI, and checks every output against the double
// reference: outputs are poisoned (NaN) before every call, so an element the
// kernels never write fails; the guard zones around every tensor must stay
// untouched; every input must come back bit for bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "exphil/exphil.h"
#include "exphil/selective_scan.hpp"
#include "scan_harness.hpp"
#include "selective_scan_problems.hpp"

namespace exphil::test {

// The gradient outputs of the backward, in the order of exphil.h.
enum class SelectiveScanGrad : int { x, dt, A, B, C, dt_bias, D, z, h0 };
inline constexpr SelectiveScanGrad kAllSelectiveScanGrads[] = {
    SelectiveScanGrad::x, SelectiveScanGrad::dt, SelectiveScanGrad::A,
    SelectiveScanGrad::B, SelectiveScanGrad::C,  SelectiveScanGrad::dt_bias,
    SelectiveScanGrad::D, SelectiveScanGrad::z,  SelectiveScanGrad::h0};

// "grad_dt_bias", ... (the argument names of exphil.h).
const char* selective_scan_grad_name(SelectiveScanGrad g);
constexpr unsigned grad_bit(SelectiveScanGrad g) { return 1u << static_cast<int>(g); }

// Whether the case has the input that `g` is the gradient of (x, dt, A, B
// and C always; the others only when present).
bool selective_scan_grad_applies(const SelectiveScanCase& c, SelectiveScanGrad g);

// One run of the harness.
struct SelectiveScanRun {
  SelectiveScanCase problem;  // shape, optional inputs and dt options
  DType dtype = DType::f32;   // of x, dt, B, C, z, y and their gradients
  bool grad_h_final = false;  // pass a random grad_h_final (else NULL)
  bool write_h_final = true;  // pass an h_final output (else NULL)
  // Gradient outputs passed as NULL (bits of grad_bit()); gradients of absent
  // inputs are always NULL, as exphil.h requires.
  unsigned omitted_grads = 0;
  long long chunk_steps = 0;  // forced steps per chunk (C++ API only); 0: the planner's
  int calls = 1;              // each direction runs this often on the same buffers
  // Shifts every tensor in the sequence dtype (x, dt, B, C, z, y, grad_y and
  // their gradients) this many elements off the 256-byte alignment of the
  // allocation: odd counts leave them unaligned to 16 bytes.
  std::size_t misalign_elements = 0;
  // Applied to the generated problem before anything else, e.g. to fix A.
  // It must keep every value representable in the dtype the GPU sees and
  // must not add or remove optional inputs (`problem` says which exist).
  std::function<void(reference::SelectiveScanProblem&)> adjust;
  std::string label;  // names `adjust` in messages
  // SelectiveScanInputScale::channel_mean (Edifice's forward): the forward
  // alone runs, as the mode has no backward.
  bool channel_mean_input_scale = false;
};

// A run of the given dtype and shape with every optional input and option
// on (dt_bias, softplus, clamp, D, z, h0, grad_h_final), so that every
// output is written, or with all of them off.
SelectiveScanRun selective_scan_run(DType dtype, int64_t batch, int64_t steps, int64_t channels,
                                    int64_t states, bool every_option);

// "f32 B2 T33 D5 N16 +bias ... +grad_h_final chunk_steps=8 [label]".
std::string describe(const SelectiveScanRun& run);

// B * T * D * N: the state updates of one forward pass, what the reference
// costs and what EXPHIL_TEST_MAX_ELEMENTS caps.
int64_t state_updates(const SelectiveScanCase& c);

// False, after printing the case, if it exceeds EXPHIL_TEST_MAX_ELEMENTS
// (max_test_elements() of scan_problems.hpp).
bool within_test_size(const SelectiveScanRun& run);

// How the harness reaches the library. forward and backward enqueue work;
// synchronize waits for it and throws if it failed.
struct SelectiveScanRunner {
  std::string name;  // for messages: "C++ API on the managed stream", ...
  std::function<Status(const SelectiveScanForwardArgs&, const SelectiveScanLaunchOptions*)> forward;
  std::function<Status(const SelectiveScanBackwardArgs&, const SelectiveScanLaunchOptions*)>
      backward;
  std::function<void()> synchronize;
  bool takes_launch_options = false;  // forced chunk_steps and the chosen layout
};

// exphil::selective_scan_forward/backward on `stream` (nullptr: the
// library's managed stream of the current device).
SelectiveScanRunner selective_scan_cpp_runner(Stream stream = nullptr);

// The current CUDA device (cudaGetDevice), where DeviceTensor allocates.
int current_device();

// Waits for a caller's `stream` (cudaStreamSynchronize); throws with the
// CUDA error, which includes any failure of the work enqueued on it.
void wait_for_stream(Stream stream);

// exphil_selective_scan_forward/backward of libexphil.so on `stream`
// (nullptr: the managed stream, waited on with exphil_synchronize). It
// passes NULL options when neither softplus nor clamp is on, as exphil.h
// allows. Inline, so that only binaries that call it need libexphil.so: the
// support library itself links the C++ runtime alone.
inline SelectiveScanRunner selective_scan_abi_runner(Stream stream = nullptr) {
  auto status = [](exphil_status s) {
    return s == EXPHIL_OK ? Status() : Status(static_cast<StatusCode>(s), exphil_last_error());
  };
  // Filled from the C++ options; NULL when they are the defaults.
  struct COptions {
    explicit COptions(const SelectiveScanOptions& o) {
      value.softplus = o.softplus ? 1 : 0;
      value.clamp = o.clamp ? 1 : 0;
      value.dt_min = o.dt_min;
      value.dt_max = o.dt_max;
    }
    const exphil_selective_scan_options* get() const {
      return value.softplus || value.clamp ? &value : nullptr;
    }
    exphil_selective_scan_options value{};
  };
  SelectiveScanRunner r;
  r.name = stream ? "C ABI on a caller stream" : "C ABI on the managed stream";
  r.forward = [=](const SelectiveScanForwardArgs& a, const SelectiveScanLaunchOptions*) {
    const COptions options(a.options);
    const SelectiveScanInputs& in = a.in;
    return status(exphil_selective_scan_forward(in.x, in.dt, in.A, in.B, in.C, in.dt_bias, in.D,
                                                in.z, in.h0, options.get(), a.y, a.h_final,
                                                stream));
  };
  r.backward = [=](const SelectiveScanBackwardArgs& a, const SelectiveScanLaunchOptions*) {
    const COptions options(a.options);
    const SelectiveScanInputs& in = a.in;
    return status(exphil_selective_scan_backward(
        in.x, in.dt, in.A, in.B, in.C, in.dt_bias, in.D, in.z, in.h0, options.get(), a.grad_y,
        a.grad_h_final, a.grad_x, a.grad_dt, a.grad_A, a.grad_B, a.grad_C, a.grad_dt_bias,
        a.grad_D, a.grad_z, a.grad_h0, stream));
  };
  r.synchronize = [=] {
    if (stream) return wait_for_stream(stream);
    if (exphil_synchronize(current_device()) != EXPHIL_OK)
      throw std::runtime_error(std::string("exphil_synchronize: ") + exphil_last_error());
  };
  r.takes_launch_options = false;
  return r;
}

// The raw bytes of one output.
struct SelectiveScanOutput {
  std::string name;
  std::vector<unsigned char> bytes;
};

struct SelectiveScanCheck {
  uint64_t seed = 0;
  std::string description;  // describe(run) and the runner
  // The layouts the library chose; all zero when the runner cannot report
  // them (the C ABI).
  SelectiveScanLaunchInfo forward_layout, backward_layout;
  // Every output written against the reference (first call), then every
  // input against what was uploaded (exactly).
  std::vector<TensorCheck> tensors;
  // Raw bytes of every output written, first call, in a fixed order.
  std::vector<SelectiveScanOutput> outputs;
  // Outputs whose bytes differed between calls of one run (calls > 1).
  std::vector<std::string> unstable_outputs;

  bool ok() const;               // all within tolerance, guards intact, calls identical
  std::string describe() const;  // the case, the layouts, one line per tensor
  double worst_ratio() const;    // of the reference comparisons (1 = at the tolerance)
};

// Names of the outputs whose bytes differ between two checks of the same run
// (bitwise determinism across runs, streams or buffers); a missing output
// counts as different.
std::vector<std::string> differing_outputs(const SelectiveScanCheck& a,
                                           const SelectiveScanCheck& b);

// Throws std::runtime_error if a call fails, std::invalid_argument if the run
// asks for launch options the runner cannot take.
SelectiveScanCheck run_selective_scan_case(const SelectiveScanRun& run,
                                           const SelectiveScanRunner& runner, uint64_t seed);

std::string describe(const SelectiveScanLaunchInfo& layout);

}  // namespace exphil::test
