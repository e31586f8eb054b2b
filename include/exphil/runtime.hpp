// Library-wide calls: version, devices, the managed streams.
#pragma once

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil {

// EXPHIL_VERSION_STRING of the build.
const char* version() noexcept;

// Number of CUDA devices; 0 (and an ok status) without a GPU or driver.
Status device_count(int& count) noexcept;

// The library's non-blocking stream for `device`, created on first use.
Status managed_stream(int device, Stream& stream) noexcept;

// Waits for the managed stream of `device`; ok at once if it never existed.
Status synchronize(int device) noexcept;

}  // namespace exphil
