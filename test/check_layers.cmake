# The bindings use the public C++ API only: every quoted #include of the C
# ABI (c_src/c_abi/), the NIF (c_src/nif/) and the XLA FFI handlers
# (c_src/xla_ffi/) names a header of include/exphil/, of XLA's FFI, or of
# the binding's own folder, never the runtime's internals in c_src/.
# Run with -DSOURCE_DIR=<repository root>.
file(GLOB nif_files "${SOURCE_DIR}/c_src/nif/*.cpp" "${SOURCE_DIR}/c_src/nif/*.hpp")
file(GLOB ffi_files "${SOURCE_DIR}/c_src/xla_ffi/*.cpp" "${SOURCE_DIR}/c_src/xla_ffi/*.hpp")
file(GLOB c_files "${SOURCE_DIR}/c_src/c_abi/*.cpp" "${SOURCE_DIR}/c_src/c_abi/*.hpp")
set(checked 0)
foreach(file IN LISTS nif_files ffi_files c_files)
  get_filename_component(folder "${file}" DIRECTORY)
  file(STRINGS "${file}" includes REGEX "^#include \"")
  foreach(line IN LISTS includes)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" header "${line}")
    if(header MATCHES "^exphil/" OR header MATCHES "^xla/ffi/")
      continue()
    endif()
    if(header MATCHES "/" OR NOT EXISTS "${folder}/${header}")
      message(FATAL_ERROR "${file} includes \"${header}\": a binding may include the public "
                          "headers (exphil/...) and its own folder's only")
    endif()
  endforeach()
  math(EXPR checked "${checked} + 1")
endforeach()
if(checked LESS 20)
  message(FATAL_ERROR "checked only ${checked} files: is SOURCE_DIR the repository root?")
endif()
message(STATUS "${checked} files of the C ABI, the NIF and the XLA FFI handlers include public headers and their own")
