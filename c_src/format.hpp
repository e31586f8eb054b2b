// Text for error messages: shapes and addresses as users write them.
#pragma once

#include <cstdint>
#include <string>

namespace exphil::runtime {

// "[2, 32, 256]"
std::string shape_string(const int64_t* dims, int rank);
// "0x7f3a00000000"
std::string pointer_string(const void* p);

}  // namespace exphil::runtime
