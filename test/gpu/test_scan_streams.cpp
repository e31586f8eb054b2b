// Work runs on the stream it is given: a caller's stream (waited on with
// cudaStreamSynchronize alone), or the managed stream of the device.
#include <catch2/catch.hpp>

#include <initializer_list>

#include <cuda_runtime_api.h>

#include "cpp_runner.hpp"
#include "exphil/runtime.hpp"
#include "scan_harness.hpp"

using namespace exphil;
using namespace exphil::test;

namespace {

// Every op, forward and backward, through `runner` on each shape.
void check_every_op(const ScanRunner& runner, DType dtype, std::initializer_list<ShapeCase> shapes) {
  for (ScanOp op : kAllScanOps) {
    for (const ShapeCase shape : shapes) {
      ScanCase c = stateful_case(op, dtype, shape);
      const ScanCheck check = run_scan_case(c, runner, test_seed());
      INFO(describe_case(c) << "\n" << check.describe());
      CHECK(check.ok());
    }
  }
}

}  // namespace

TEST_CASE("ops run on a caller-provided stream", "[gpu][scan]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  check_every_op(cpp_runner(stream), DType::bf16, {ShapeCase{1, 32, 256}, ShapeCase{1, 9000, 64}});
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

TEST_CASE("the managed stream is one per device, non-blocking, and synchronizable", "[gpu][scan]") {
  Stream a = nullptr, b = nullptr;
  REQUIRE(managed_stream(0, a).ok());
  REQUIRE(managed_stream(0, b).ok());
  CHECK(a == b);
  unsigned int flags = 0;
  REQUIRE(cudaStreamGetFlags(a, &flags) == cudaSuccess);
  CHECK((flags & cudaStreamNonBlocking) != 0);
  CHECK(synchronize(0).ok());
  int count = 0;
  REQUIRE(device_count(count).ok());
  const Status bad = synchronize(count);
  CHECK(bad.code() == StatusCode::invalid_argument);
}

TEST_CASE("a caller's earlier failed CUDA call does not fail the next op", "[gpu][scan][api-error]") {
  // Leaves cudaErrorInvalidValue as this thread's last error.
  REQUIRE(cudaMemcpy(nullptr, nullptr, 1, cudaMemcpyDeviceToDevice) != cudaSuccess);
  check_every_op(cpp_runner(), DType::f32, {ShapeCase{1, 32, 64}});
}
