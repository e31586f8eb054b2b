// Builds the XLA_FFI_CallFrame XLA would pass a handler for a custom call
// (buffers, scalar attributes sorted by name, execute stage) and calls the
// handler with it, so the handlers' decoding and checks run on the CPU. Data
// pointers are host memory: the handlers never read it, and the library
// rejects it (or finds no device) before any kernel could.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exphil/xla_ffi.h"
#include "xla/ffi/api/c_api.h"

namespace exphil::test {

// What a handler returned.
struct HandlerOutcome {
  bool ok = true;
  XLA_FFI_Error_Code code = XLA_FFI_Error_Code_OK;
  std::string message;
};

class CallFrameBuilder {
 public:
  // `api` makes and reads the errors (the fake runtime's).
  explicit CallFrameBuilder(const XLA_FFI_Api* api) : api_(api) {}

  // A buffer of the given element type and shape; host memory of its size,
  // or a NULL data pointer when it has zero elements.
  CallFrameBuilder& operand(XLA_FFI_DataType type, std::vector<int64_t> dims);
  CallFrameBuilder& result(XLA_FFI_DataType type, std::vector<int64_t> dims);
  // `count` operands or results of the same type and shape.
  CallFrameBuilder& operands(int count, XLA_FFI_DataType type, const std::vector<int64_t>& dims);
  CallFrameBuilder& results(int count, XLA_FFI_DataType type, const std::vector<int64_t>& dims);

  // Scalar attributes: PRED, S32, S64, F32 and F64 (MLIR i1, i32, i64, f32,
  // f64).
  CallFrameBuilder& attribute(const std::string& name, bool value);
  CallFrameBuilder& attribute(const std::string& name, int32_t value);
  CallFrameBuilder& attribute(const std::string& name, int64_t value);
  CallFrameBuilder& attribute(const std::string& name, float value);
  CallFrameBuilder& attribute(const std::string& name, double value);

  // Calls `handler` and destroys the error it returned, if any.
  HandlerOutcome call(exphil_xla_ffi_handler* handler);

 private:
  struct Buffer {
    XLA_FFI_DataType type;
    std::vector<int64_t> dims;
    std::unique_ptr<unsigned char[]> data;
  };
  struct Attribute {
    std::string name;
    XLA_FFI_DataType type;
    alignas(8) unsigned char value[8];  // a bool, int32_t, int64_t, float or double
  };

  static Buffer make_buffer(XLA_FFI_DataType type, std::vector<int64_t> dims);
  CallFrameBuilder& scalar(const std::string& name, XLA_FFI_DataType type, const void* value,
                           std::size_t size);

  const XLA_FFI_Api* api_;
  std::vector<Buffer> operands_;
  std::vector<Buffer> results_;
  std::vector<Attribute> attributes_;
};

}  // namespace exphil::test
