#include "pointer_query.hpp"

#include <mutex>
#include <string>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda_status.hpp"

namespace exphil::runtime {

namespace {

using PointerGetAttributes = CUresult (*)(unsigned int, CUpointer_attribute*, void**, CUdeviceptr);

struct DriverEntry {
  PointerGetAttributes fn = nullptr;
  Status status;
};

const DriverEntry& pointer_get_attributes() {
  static std::once_flag once;
  static DriverEntry entry;
  std::call_once(once, [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuPointerGetAttributes", &fn, 12000,
                                                           cudaEnableDefault, &found);
    if (e != cudaSuccess) {
      entry.status = cuda_status(e, "cudaGetDriverEntryPointByVersion(cuPointerGetAttributes)");
    } else if (found != cudaDriverEntryPointSuccess || !fn) {
      entry.status = {StatusCode::cuda_error,
                      "the CUDA driver does not provide cuPointerGetAttributes"};
    } else {
      entry.fn = reinterpret_cast<PointerGetAttributes>(fn);
    }
  });
  return entry;
}

}  // namespace

Status query_pointer(const void* p, PointerInfo& info) {
  const DriverEntry& entry = pointer_get_attributes();
  if (!entry.fn) return entry.status;

  unsigned int memory_type = 0;
  int device = -1;
  unsigned int is_managed = 0;
  CUdeviceptr range_begin = 0;
  size_t range_size = 0;
  CUpointer_attribute attributes[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
      CU_POINTER_ATTRIBUTE_IS_MANAGED, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void* values[] = {&memory_type, &device, &is_managed, &range_begin, &range_size};
  // For an address the driver does not know, this succeeds and leaves the
  // values at their defaults (memory type 0).
  const CUresult r = entry.fn(5, attributes, values, reinterpret_cast<CUdeviceptr>(p));
  if (r == CUDA_ERROR_INVALID_VALUE) {
    info = PointerInfo{};
    return {};
  }
  if (r != CUDA_SUCCESS)
    return {StatusCode::cuda_error,
            "cuPointerGetAttributes failed with CUresult " + std::to_string(static_cast<int>(r))};

  info.device = device;
  info.range_begin = static_cast<uintptr_t>(range_begin);
  info.range_size = range_size;
  if (is_managed) {
    info.kind = PointerInfo::Kind::managed;
  } else if (memory_type == CU_MEMORYTYPE_DEVICE) {
    info.kind = PointerInfo::Kind::device;
  } else if (memory_type == CU_MEMORYTYPE_HOST) {
    info.kind = PointerInfo::Kind::host;
  } else {
    info.kind = PointerInfo::Kind::unknown;
  }
  return {};
}

const char* pointer_kind_name(PointerInfo::Kind kind) noexcept {
  switch (kind) {
    case PointerInfo::Kind::host: return "pinned host memory";
    case PointerInfo::Kind::device: return "device memory";
    case PointerInfo::Kind::managed: return "managed memory";
    case PointerInfo::Kind::unknown: break;
  }
  return "not CUDA memory (a plain host address?)";
}

}  // namespace exphil::runtime
