#include "device_placement.hpp"

#include <string>

#include "cuda_status.hpp"
#include "device_registry.hpp"
#include "format.hpp"
#include "pointer_query.hpp"

namespace exphil::runtime {

Status locate_device(const CallTensors& tensors, int& device) {
  int count = 0;
  DeviceRegistry& registry = DeviceRegistry::instance();
  EXPHIL_RETURN_IF_ERROR(registry.device_count(count));
  if (count == 0) return registry.require_device(0);  // no_device, with the driver's reason

  device = -1;
  const char* first_name = nullptr;
  for (const CallTensor& t : tensors) {
    PointerInfo info;
    EXPHIL_RETURN_IF_ERROR(query_pointer(t.data, info));
    const std::string where = std::string("argument '") + t.name + "': ";
    if (info.kind != PointerInfo::Kind::device && info.kind != PointerInfo::Kind::managed)
      return {StatusCode::invalid_argument, where + "expected device memory, got " +
                                                pointer_kind_name(info.kind) + " at " +
                                                pointer_string(t.data)};
    if (device < 0) {
      device = info.device;
      first_name = t.name;
    } else if (info.device != device) {
      return {StatusCode::invalid_argument,
              where + "expected memory on device " + std::to_string(device) + " (where '" +
                  first_name + "' is), got memory on device " + std::to_string(info.device)};
    }
    const auto begin = reinterpret_cast<uintptr_t>(t.data);
    const uintptr_t allocation_end = info.range_begin + info.range_size;
    if (info.range_size != 0 && (begin < info.range_begin || t.bytes > allocation_end - begin))
      return {StatusCode::invalid_argument,
              where + "expected " + std::to_string(t.bytes) + " bytes at " +
                  pointer_string(t.data) + " inside one allocation, but its allocation ends " +
                  std::to_string(allocation_end - begin) + " bytes after that address"};
  }
  return registry.require_device(device);
}

Status resolve_stream(int device, Stream requested, cudaStream_t& stream, bool& capturing) {
  if (requested) {
    stream = requested;  // exphil_stream is cudaStream_t
  } else {
    EXPHIL_RETURN_IF_ERROR(DeviceRegistry::instance().stream(device, stream));
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(stream, &capture);
  if (e != cudaSuccess) return cuda_status(e, "cudaStreamIsCapturing (argument 'stream')");
  capturing = capture != cudaStreamCaptureStatusNone;
  // While a stream is captured into a graph (XLA's command buffers, CUDA
  // graphs), querying its device is refused and would invalidate the
  // capture; a stream of another device then fails at launch instead.
  if (!requested || capturing) return {};
  int stream_device = -1;
  e = cudaStreamGetDevice(stream, &stream_device);
  if (e != cudaSuccess) return cuda_status(e, "cudaStreamGetDevice (argument 'stream')");
  if (stream_device != device)
    return {StatusCode::invalid_argument,
            "argument 'stream': expected a stream of device " + std::to_string(device) +
                " (where the tensors are), got a stream of device " +
                std::to_string(stream_device)};
  return {};
}

}  // namespace exphil::runtime
