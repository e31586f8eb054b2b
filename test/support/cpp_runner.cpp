#include "cpp_runner.hpp"

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "exphil/runtime.hpp"

namespace exphil::test {

ScanRunner cpp_runner(Stream stream, ScanLaunchOptions options, std::shared_ptr<ChosenLayouts> chosen) {
  ScanRunner r;
  r.forward = [=](const ScanForwardArgs& args) {
    ScanLaunchOptions o = options;
    o.chosen = chosen ? &chosen->forward : nullptr;
    return scan_forward(args, stream, &o);
  };
  r.backward = [=](const ScanBackwardArgs& args) {
    ScanLaunchOptions o = options;
    o.chosen = chosen ? &chosen->backward : nullptr;
    return scan_backward(args, stream, &o);
  };
  r.synchronize = [=] {
    if (stream) {
      const cudaError_t e = cudaStreamSynchronize(stream);
      if (e != cudaSuccess)
        throw std::runtime_error(std::string("cudaStreamSynchronize: ") + cudaGetErrorName(e));
      return;
    }
    int device = 0;
    cudaGetDevice(&device);
    const Status s = synchronize(device);
    if (!s.ok()) throw std::runtime_error("exphil::synchronize: " + s.message());
  };
  return r;
}

}  // namespace exphil::test
