// What the CUDA driver knows about an address: which kind of memory, which
// device owns it, and the allocation it lies in.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exphil/status.hpp"

namespace exphil::runtime {

struct PointerInfo {
  enum class Kind { unknown, host, device, managed };
  Kind kind = Kind::unknown;  // unknown: not a CUDA allocation (pageable host memory)
  int device = -1;
  uintptr_t range_begin = 0;  // the allocation containing the address
  std::size_t range_size = 0;
};

// Asks the driver (cuPointerGetAttributes, reached through the runtime's
// driver entry point, so the library has no link-time libcuda dependency).
// The CUDA runtime must already be initialised (DeviceRegistry does that).
Status query_pointer(const void* p, PointerInfo& info);

const char* pointer_kind_name(PointerInfo::Kind kind) noexcept;

}  // namespace exphil::runtime
