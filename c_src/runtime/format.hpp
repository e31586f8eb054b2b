// Text for error messages: shapes and addresses as users write them.
#pragma once

#include <cstdint>
#include <string>

#include "exphil/tensor.hpp"

namespace exphil::runtime {

using exphil::shape_string;  // "[2, 32, 256]" (exphil/tensor.hpp)
// "0x7f3a00000000"
std::string pointer_string(const void* p);

}  // namespace exphil::runtime
