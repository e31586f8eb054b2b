// The C ABI of libexphil.so on a GPU: every op through exphil.h against the
// reference (attention in both precisions of f32), and the device-side
// checks: host, pinned and out-of-allocation memory rejected by name,
// managed memory and caller streams accepted.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

#include "abi_calls.hpp"
#include "attention_harness.hpp"
#include "exphil/exphil.h"
#include "scan_harness.hpp"

using Catch::Matchers::Contains;
using namespace exphil;
using namespace exphil::test;

namespace {

Status from_abi(exphil_status s) {
  return s == EXPHIL_OK ? Status() : Status(static_cast<StatusCode>(s), exphil_last_error());
}

ScanRunner abi_runner(exphil_stream stream) {
  ScanRunner r;
  r.forward = [=](const ScanForwardArgs& a) {
    return from_abi(abi_scan_forward(a.op, a.inputs, a.h0, a.y, a.h_final, stream));
  };
  r.backward = [=](const ScanBackwardArgs& a) {
    return from_abi(abi_scan_backward(a.op, a.inputs, a.h0, a.y, a.grad_y, a.grad_h_final,
                                      a.grad_inputs, a.grad_h0, stream));
  };
  r.synchronize = [=] {
    if (stream) {
      if (cudaStreamSynchronize(stream) != cudaSuccess) throw std::runtime_error("cudaStreamSynchronize");
    } else if (exphil_synchronize(0) != EXPHIL_OK) {
      throw std::runtime_error(std::string("exphil_synchronize: ") + exphil_last_error());
    }
  };
  return r;
}

exphil_tensor tensor(void* data, int32_t dtype, int64_t b, int64_t t, int64_t h) {
  exphil_tensor x{};
  x.data = data;
  x.dtype = dtype;
  x.rank = 3;
  x.shape[0] = b; x.shape[1] = t; x.shape[2] = h;
  return x;
}

}  // namespace

TEST_CASE("every op through the C ABI matches the reference", "[gpu][abi]") {
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  for (ScanOp op : kAbiScanOps) {
    for (DType dtype : {DType::f32, DType::f16, DType::bf16}) {
      for (exphil_stream s : {static_cast<exphil_stream>(nullptr), stream}) {
        ScanCase c = stateful_case(op, dtype, {2, 300, 33});
        const ScanCheck check = run_scan_case(c, abi_runner(s), test_seed());
        INFO(describe_case(c) << (s ? " on a caller stream" : " on the managed stream") << "\n"
                              << check.describe());
        CHECK(check.ok());
      }
    }
  }
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

// exphil_attention_options.precision reaches the kernels: tf32x3 within f32's
// tolerance and not the exact path's bytes.
TEST_CASE("attention through the C ABI, f32 exact and tf32x3, matches the reference",
          "[gpu][abi]") {
  AttentionRun exact = attention_run(DType::f32, 64, {2, 4, 2, 100, 130}, AttentionMask::causal);
  AttentionRun tf32x3 = exact;
  tf32x3.options.precision = AttentionPrecision::tf32x3;
  const uint64_t seed = test_seed();
  const AttentionCheck e = check_attention(exact, attention_abi_runner(), seed);
  const AttentionCheck t = check_attention(tf32x3, attention_abi_runner(), seed);
  INFO(describe(exact) << " seed=" << seed << "\nexact: " << e.report() << "\ntf32x3: " << t.report());
  CHECK(e.failures.empty());
  CHECK(t.failures.empty());
  CHECK(t.outputs.o != e.outputs.o);
  CHECK(t.outputs.grad_k != e.outputs.grad_k);
}

TEST_CASE("memory that is not on the device is rejected by name", "[gpu][abi]") {
  const std::size_t bytes = 2 * 5 * 4 * sizeof(float);
  void* device = nullptr;
  void* device_out = nullptr;
  REQUIRE(cudaMalloc(&device, bytes) == cudaSuccess);
  REQUIRE(cudaMalloc(&device_out, bytes) == cudaSuccess);
  void* pinned = nullptr;
  REQUIRE(cudaMallocHost(&pinned, bytes) == cudaSuccess);
  void* pageable = std::malloc(bytes);
  REQUIRE(pageable);

  const exphil_tensor gate = tensor(device, EXPHIL_F32, 2, 5, 4);
  const exphil_tensor y = tensor(device_out, EXPHIL_F32, 2, 5, 4);

  SECTION("pageable host memory") {
    const exphil_tensor candidate = tensor(pageable, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected device memory, got not CUDA memory"));
  }
  SECTION("pinned host memory") {
    const exphil_tensor candidate = tensor(pinned, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected device memory, got pinned host memory"));
  }
  SECTION("a tensor running past the end of its allocation") {
    const exphil_tensor candidate = tensor(static_cast<char*>(device) + 16, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) ==
          EXPHIL_ERROR_INVALID_ARGUMENT);
    CHECK_THAT(exphil_last_error(), Contains("argument 'candidate': expected 160 bytes"));
    CHECK_THAT(exphil_last_error(), Contains("its allocation ends 144 bytes after that address"));
  }
  SECTION("managed memory is accepted") {
    void* managed = nullptr;
    REQUIRE(cudaMallocManaged(&managed, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(managed, 0, bytes) == cudaSuccess);
    REQUIRE(cudaMemset(device, 0, bytes) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);  // the library's stream does not wait for the legacy one
    const exphil_tensor candidate = tensor(managed, EXPHIL_F32, 2, 5, 4);
    CHECK(exphil_min_gru_forward(&gate, &candidate, nullptr, &y, nullptr, nullptr) == EXPHIL_OK);
    CHECK(exphil_synchronize(0) == EXPHIL_OK);
    CHECK(cudaFree(managed) == cudaSuccess);
  }

  std::free(pageable);
  CHECK(cudaFreeHost(pinned) == cudaSuccess);
  CHECK(cudaFree(device) == cudaSuccess);
  CHECK(cudaFree(device_out) == cudaSuccess);
}

TEST_CASE("device memory from the library is usable and freed only whole", "[gpu][abi]") {
  void* p = nullptr;
  REQUIRE(exphil_device_alloc(0, 1000, &p) == EXPHIL_OK);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, p) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);
  CHECK(attr.device == 0);
  REQUIRE(cudaMemset(p, 0x5a, 1000) == cudaSuccess);
  unsigned char back[1000];
  REQUIRE(cudaMemcpy(back, p, sizeof back, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(back[0] == 0x5a);
  CHECK(back[999] == 0x5a);

  CHECK(exphil_device_free(static_cast<char*>(p) + 16) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("not the start of its allocation"));
  int on_host = 0;
  CHECK(exphil_device_free(&on_host) == EXPHIL_ERROR_INVALID_ARGUMENT);
  CHECK_THAT(exphil_last_error(), Contains("argument 'ptr'"));

  CHECK(exphil_device_free(p) == EXPHIL_OK);
}

