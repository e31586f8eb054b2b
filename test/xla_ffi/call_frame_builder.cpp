#include "call_frame_builder.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

namespace exphil::test {

namespace {

std::size_t element_bytes(XLA_FFI_DataType type) {
  switch (type) {
    case XLA_FFI_DataType_F64:
    case XLA_FFI_DataType_S64: return 8;
    case XLA_FFI_DataType_F16:
    case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_S8:
    case XLA_FFI_DataType_U8: return 1;
    default: return 4;
  }
}

}  // namespace

CallFrameBuilder::Buffer CallFrameBuilder::make_buffer(XLA_FFI_DataType type,
                                                      std::vector<int64_t> dims) {
  std::size_t elements = 1;
  for (int64_t d : dims) elements *= static_cast<std::size_t>(d);
  Buffer b{type, std::move(dims), nullptr};
  // new[] memory is aligned for any scalar, 16 bytes on x86-64: what the
  // attention kernels ask of their tensors.
  if (elements > 0) b.data = std::make_unique<unsigned char[]>(elements * element_bytes(type));
  return b;
}

CallFrameBuilder& CallFrameBuilder::operand(XLA_FFI_DataType type, std::vector<int64_t> dims) {
  operands_.push_back(make_buffer(type, std::move(dims)));
  return *this;
}

CallFrameBuilder& CallFrameBuilder::result(XLA_FFI_DataType type, std::vector<int64_t> dims) {
  results_.push_back(make_buffer(type, std::move(dims)));
  return *this;
}

CallFrameBuilder& CallFrameBuilder::operands(int count, XLA_FFI_DataType type,
                                             const std::vector<int64_t>& dims) {
  for (int i = 0; i < count; ++i) operand(type, dims);
  return *this;
}

CallFrameBuilder& CallFrameBuilder::results(int count, XLA_FFI_DataType type,
                                            const std::vector<int64_t>& dims) {
  for (int i = 0; i < count; ++i) result(type, dims);
  return *this;
}

CallFrameBuilder& CallFrameBuilder::attribute(const std::string& name, bool value) {
  return scalar(name, XLA_FFI_DataType_PRED, &value, sizeof value);
}

CallFrameBuilder& CallFrameBuilder::attribute(const std::string& name, int32_t value) {
  return scalar(name, XLA_FFI_DataType_S32, &value, sizeof value);
}

CallFrameBuilder& CallFrameBuilder::attribute(const std::string& name, int64_t value) {
  return scalar(name, XLA_FFI_DataType_S64, &value, sizeof value);
}

CallFrameBuilder& CallFrameBuilder::attribute(const std::string& name, float value) {
  return scalar(name, XLA_FFI_DataType_F32, &value, sizeof value);
}

CallFrameBuilder& CallFrameBuilder::attribute(const std::string& name, double value) {
  return scalar(name, XLA_FFI_DataType_F64, &value, sizeof value);
}

CallFrameBuilder& CallFrameBuilder::scalar(const std::string& name, XLA_FFI_DataType type,
                                           const void* value, std::size_t size) {
  Attribute a{name, type, {}};
  std::memcpy(a.value, value, size);
  attributes_.push_back(std::move(a));
  return *this;
}

HandlerOutcome CallFrameBuilder::call(exphil_xla_ffi_handler* handler) {
  std::vector<XLA_FFI_Buffer> operand_views;
  std::vector<XLA_FFI_Buffer> result_views;
  for (Buffer& b : operands_)
    operand_views.push_back({XLA_FFI_Buffer_STRUCT_SIZE, nullptr, b.type, b.data.get(),
                             static_cast<int64_t>(b.dims.size()), b.dims.data()});
  for (Buffer& b : results_)
    result_views.push_back({XLA_FFI_Buffer_STRUCT_SIZE, nullptr, b.type, b.data.get(),
                            static_cast<int64_t>(b.dims.size()), b.dims.data()});
  std::vector<XLA_FFI_ArgType> arg_types(operand_views.size(), XLA_FFI_ArgType_BUFFER);
  std::vector<XLA_FFI_RetType> ret_types(result_views.size(), XLA_FFI_RetType_BUFFER);
  std::vector<void*> args;
  std::vector<void*> rets;
  for (XLA_FFI_Buffer& b : operand_views) args.push_back(&b);
  for (XLA_FFI_Buffer& b : result_views) rets.push_back(&b);

  // XLA passes attributes sorted by name.
  std::vector<Attribute*> sorted;
  for (Attribute& a : attributes_) sorted.push_back(&a);
  std::sort(sorted.begin(), sorted.end(),
            [](const Attribute* x, const Attribute* y) { return x->name < y->name; });
  std::vector<XLA_FFI_ByteSpan> name_spans;
  std::vector<XLA_FFI_Scalar> scalars;
  name_spans.reserve(sorted.size());
  scalars.reserve(sorted.size());
  std::vector<XLA_FFI_AttrType> attr_types(sorted.size(), XLA_FFI_AttrType_SCALAR);
  std::vector<XLA_FFI_ByteSpan*> names;
  std::vector<void*> attrs;
  for (Attribute* a : sorted) {
    name_spans.push_back({a->name.data(), a->name.size()});
    scalars.push_back({a->type, a->value});
    names.push_back(&name_spans.back());
    attrs.push_back(&scalars.back());
  }

  XLA_FFI_CallFrame frame = {};
  frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
  frame.api = api_;
  frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
  frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(args.size()),
                arg_types.data(), args.data()};
  frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(rets.size()),
                ret_types.data(), rets.data()};
  frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, static_cast<int64_t>(attrs.size()),
                 attr_types.data(), names.data(), attrs.data()};

  HandlerOutcome outcome;
  XLA_FFI_Error* error = handler(&frame);
  if (!error) return outcome;
  XLA_FFI_Error_GetDetails_Args details = {};
  details.struct_size = XLA_FFI_Error_GetDetails_Args_STRUCT_SIZE;
  details.error = error;
  api_->XLA_FFI_Error_GetDetails(&details);
  outcome.ok = false;
  outcome.code = details.errc;
  outcome.message = details.message ? details.message : "";
  XLA_FFI_Error_Destroy_Args destroy = {XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, error};
  api_->XLA_FFI_Error_Destroy(&destroy);
  return outcome;
}

}  // namespace exphil::test
