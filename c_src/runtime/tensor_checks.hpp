// Checks of tensor descriptors shared by every op. Each failure message names
// the argument, what was expected and what came; the caller prefixes the op.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "exphil/status.hpp"
#include "exphil/tensor.hpp"

namespace exphil::runtime {

// "argument 'name': ", the start of every message about one argument.
std::string arg_prefix(const char* name);

// The message of a tensor that may be f32 or the dtype of `source` (`seq`)
// and is `got`: "argument 'name': expected dtype f32 or bf16 (the dtype of
// 'x'), got f16", with "f32 or" left out when `seq` is f32 itself.
std::string f32_or_dtype_message(const char* name, DType seq, const char* source, DType got);

// Descriptor present, dtype known, rank == expected_rank (CallTensors::add
// checks the data pointer).
// `layout` describes the expected dimensions, e.g. "[B, T, H]".
Status check_descriptor(const char* name, const Tensor* t, int expected_rank, const char* layout);

// Every dimension >= 1 and the byte size representable; writes the size.
Status check_extent(const char* name, const Tensor& t, std::size_t& bytes);

// Same dims as `expected` (described as `expected_desc` in the message).
Status check_shape(const char* name, const Tensor& t, const int64_t* expected,
                   const char* expected_desc);

// Data pointer aligned to one element.
Status check_element_alignment(const char* name, const Tensor& t);

class CallTensors;

// What accepting a checked descriptor takes for most ops: its extent,
// element alignment, and its place among the call's tensors; `data` is then
// its pointer.
Status accept_tensor(CallTensors& tensors, const char* name, const Tensor& t, bool output, const void*& data);

// The tensors of one call, for the overlap and device-placement checks.
struct CallTensor {
  const char* name = nullptr;
  const void* data = nullptr;
  std::size_t bytes = 0;
  bool output = false;
};

class CallTensors {
 public:
  static constexpr int kMax = 24;  // the selective-scan backward has 20

  // Refuses null data, except an output's under allow_unallocated_outputs;
  // fails (internal) if an op has more tensors than kMax.
  Status add(const char* name, const void* data, std::size_t bytes, bool output);
  // Outputs must not overlap each other or any input (an unallocated output
  // overlaps nothing).
  Status check_no_overlaps() const;

  // can_implement: outputs may be descriptors without memory yet, so that a
  // binding checks a call before it allocates them.
  void allow_unallocated_outputs() noexcept { unallocated_outputs_ = true; }

  const CallTensor* begin() const noexcept { return items_; }
  const CallTensor* end() const noexcept { return items_ + size_; }

 private:
  CallTensor items_[kMax];
  int size_ = 0;
  bool unallocated_outputs_ = false;
};

}  // namespace exphil::runtime
