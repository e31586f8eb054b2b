// exphil::can_implement: a call checked before its outputs have memory, with
// no device. Outputs described without data pass; everything the call itself
// checks without the device still fails the same way, with its message.
// Runs without a GPU: the inputs point at fake, distinct addresses.
#include <catch2/catch.hpp>

#include <cstdint>
#include <initializer_list>

#include "exphil/attention.hpp"
#include "exphil/gated_rnn.hpp"
#include "exphil/scan.hpp"
#include "exphil/selective_scan.hpp"

using Catch::Matchers::Contains;
using exphil::DType;
using exphil::StatusCode;
using exphil::Tensor;

namespace {

// Fake device addresses, 1 MiB apart.
void* fake_address(int i) { return reinterpret_cast<void*>((uintptr_t{1} << 32) + (static_cast<uintptr_t>(i) << 20)); }

Tensor input(int i, std::initializer_list<int64_t> shape, DType dtype = DType::f32) {
  return exphil::make_tensor(fake_address(i), dtype, shape);
}

// An output not allocated yet: a descriptor without data.
Tensor unallocated(std::initializer_list<int64_t> shape, DType dtype = DType::f32) {
  return exphil::make_tensor(nullptr, dtype, shape);
}

void expect_invalid(const exphil::Status& s, const char* text) {
  CHECK(s.code() == StatusCode::invalid_argument);
  CHECK_THAT(s.message(), Contains(text));
}

}  // namespace

TEST_CASE("can_implement: a scan with its outputs not yet allocated", "[can_implement]") {
  Tensor gate = input(0, {2, 5, 4}), candidate = input(1, {2, 5, 4});
  Tensor y = unallocated({2, 5, 4}), h_final = unallocated({2, 4});
  exphil::ScanForwardArgs args;
  args.op = exphil::ScanOp::min_gru;
  args.inputs[0] = &gate;
  args.inputs[1] = &candidate;
  args.y = &y;
  args.h_final = &h_final;
  CHECK(exphil::can_implement(args).ok());

  SECTION("an input's shape against the first's") {
    Tensor other = input(1, {2, 6, 4});
    args.inputs[1] = &other;
    expect_invalid(exphil::can_implement(args),
                   "min_gru forward: argument 'candidate': expected shape [2, 5, 4]");
  }
  SECTION("an output's dtype, though it has no memory") {
    Tensor half = unallocated({2, 5, 4}, DType::f16);
    args.y = &half;
    expect_invalid(exphil::can_implement(args), "argument 'y': expected dtype f32");
  }
  SECTION("an input without data") {
    Tensor empty = unallocated({2, 5, 4});
    args.inputs[1] = &empty;
    expect_invalid(exphil::can_implement(args), "argument 'candidate': the data pointer is NULL");
  }
  SECTION("an output given with memory still may not overlap an input") {
    Tensor on_gate = input(0, {2, 5, 4});
    args.y = &on_gate;
    expect_invalid(exphil::can_implement(args), "argument 'y': output memory");
  }
  SECTION("the call itself still refuses an output without memory") {
    expect_invalid(exphil::scan_forward(args), "argument 'y': the data pointer is NULL");
  }
}

TEST_CASE("can_implement: a scan backward with its gradients not yet allocated", "[can_implement]") {
  Tensor a = input(0, {3, 7, 5}), b = input(1, {3, 7, 5}), y = input(2, {3, 7, 5}),
         grad_y = input(3, {3, 7, 5});
  Tensor grad_a = unallocated({3, 7, 5}), grad_b = unallocated({3, 7, 5});
  exphil::ScanBackwardArgs args;
  args.op = exphil::ScanOp::linear_scan;
  args.inputs[0] = &a;
  args.inputs[1] = &b;
  args.y = &y;
  args.grad_y = &grad_y;
  args.grad_inputs[0] = &grad_a;
  args.grad_inputs[1] = &grad_b;
  CHECK(exphil::can_implement(args).ok());

  Tensor short_grad = input(3, {3, 6, 5});
  args.grad_y = &short_grad;
  expect_invalid(exphil::can_implement(args), "linear_scan backward: argument 'grad_y'");
}

TEST_CASE("can_implement: a selective scan with its outputs not yet allocated", "[can_implement]") {
  Tensor x = input(0, {2, 5, 3}), dt = input(1, {2, 5, 3}), A = input(2, {3, 4}),
         B = input(3, {2, 5, 4}), C = input(4, {2, 5, 4});
  Tensor y = unallocated({2, 5, 3}), h_final = unallocated({2, 3, 4});
  exphil::SelectiveScanForwardArgs args;
  args.in.x = &x;
  args.in.dt = &dt;
  args.in.A = &A;
  args.in.B = &B;
  args.in.C = &C;
  args.y = &y;
  args.h_final = &h_final;
  CHECK(exphil::can_implement(args).ok());

  Tensor wide_B = input(3, {2, 5, 5});
  args.in.B = &wide_B;
  expect_invalid(exphil::can_implement(args), "selective_scan forward: argument 'B'");
}

TEST_CASE("can_implement: attention with its outputs not yet allocated", "[can_implement]") {
  Tensor q = input(0, {1, 2, 4, 32}), k = input(1, {1, 1, 6, 32}), v = input(2, {1, 1, 6, 32});
  Tensor o = unallocated({1, 2, 4, 32}), lse = unallocated({1, 2, 4});
  exphil::AttentionForwardArgs args;
  args.in.q = &q;
  args.in.k = &k;
  args.in.v = &v;
  args.o = &o;
  args.lse = &lse;
  CHECK(exphil::can_implement(args).ok());

  Tensor narrow_v = input(2, {1, 1, 6, 16});
  args.in.v = &narrow_v;
  expect_invalid(exphil::can_implement(args), "attention forward: argument 'v'");

  args.in.v = &v;
  Tensor bf16_o = unallocated({1, 2, 4, 32}, DType::bf16);
  args.o = &bf16_o;
  expect_invalid(exphil::can_implement(args), "attention forward: argument 'o'");
}

TEST_CASE("can_implement: GRU and LSTM sequences, with their own rules", "[can_implement]") {
  // B 2, T 5, H 4: wx [2, 5, 12] for the GRU's three gates.
  Tensor wx = input(0, {2, 5, 12}), R = input(1, {4, 12}), h0 = input(2, {2, 4});
  Tensor y = unallocated({2, 5, 4}), h_final = unallocated({2, 4});
  exphil::GatedRnnForwardArgs args;
  args.cell = exphil::GatedRnnCell::gru;
  args.wx = &wx;
  args.R = &R;
  args.h0 = &h0;
  args.y = &y;
  args.h_final = &h_final;
  CHECK(exphil::can_implement(args).ok());

  SECTION("R is [H, 3H], 3H the last dimension of wx") {
    Tensor wrong = input(1, {3, 12});
    args.R = &wrong;
    expect_invalid(exphil::can_implement(args),
                   "gru forward: argument 'R': expected shape [H, 3H] with 3H = 12 (the last dimension of "
                   "'wx'), 3 times H, got [3, 12]");
  }
  SECTION("a GRU has no cell state") {
    Tensor c0 = input(3, {2, 4});
    args.c0 = &c0;
    expect_invalid(exphil::can_implement(args), "argument 'c0': expected NULL: a GRU has no cell state");
  }
  SECTION("the weights take f32 or the sequence dtype, one for both") {
    Tensor wx16 = input(0, {2, 5, 12}, DType::bf16), y16 = unallocated({2, 5, 4}, DType::bf16);
    Tensor R16 = input(1, {4, 12}, DType::bf16), bias32 = input(4, {12});
    args.wx = &wx16;
    args.y = &y16;
    args.R = &R16;
    CHECK(exphil::can_implement(args).ok());
    args.bias = &bias32;
    expect_invalid(exphil::can_implement(args), "argument 'bias': expected dtype bf16 (the dtype of 'R'), got f32");
  }
  SECTION("the states take f32 or the sequence dtype, one for all") {
    Tensor wx16 = input(0, {2, 5, 12}, DType::bf16), y16 = unallocated({2, 5, 4}, DType::bf16);
    Tensor hf16 = unallocated({2, 4}, DType::bf16);
    args.wx = &wx16;
    args.y = &y16;
    args.h_final = &hf16;
    expect_invalid(exphil::can_implement(args),
                   "argument 'h_final': expected dtype f32 (the dtype of 'h0'), got bf16");
  }
  SECTION("with f32 sequences, the weights and states take f32 alone (no \"f32 or f32\")") {
    Tensor R16 = input(1, {4, 12}, DType::bf16);
    args.R = &R16;
    expect_invalid(exphil::can_implement(args), "argument 'R': expected dtype f32 (the dtype of 'wx'), got bf16");
  }
  SECTION("an LSTM's wx has four gates") {
    args.cell = exphil::GatedRnnCell::lstm;
    expect_invalid(exphil::can_implement(args), "lstm forward: argument 'R': expected shape [H, 4H] with 4H = 12");
  }
  SECTION("precision tf32 is for f32 sequences, and only exact (0) and tf32 (1) exist") {
    args.options.precision = exphil::GatedRnnPrecision::tf32;
    CHECK(exphil::can_implement(args).ok());
    Tensor wx16 = input(0, {2, 5, 12}, DType::bf16), y16 = unallocated({2, 5, 4}, DType::bf16);
    args.wx = &wx16;
    args.y = &y16;
    expect_invalid(exphil::can_implement(args),
                   "gru forward: argument 'options': precision 1 (tf32) applies to f32 sequences; expected "
                   "precision 0 (exact) with wx of dtype bf16");
    args.wx = &wx;
    args.y = &y;
    args.options.precision = static_cast<exphil::GatedRnnPrecision>(2);
    expect_invalid(exphil::can_implement(args),
                   "argument 'options': expected precision 0 (exact) or 1 (tf32), got 2");
  }
}

TEST_CASE("can_implement: sLSTM sequences, their n and m states and the cells that lack them",
          "[can_implement]") {
  // B 2, T 5, H 4: wx [2, 5, 16] for the four gates i, f, z, o.
  Tensor wx = input(0, {2, 5, 16}), R = input(1, {4, 16}), h0 = input(2, {2, 4}), c0 = input(3, {2, 4});
  Tensor n0 = input(4, {2, 4}), m0 = input(5, {2, 4});
  Tensor y = unallocated({2, 5, 4}), h_final = unallocated({2, 4}), n_final = unallocated({2, 4}),
         m_final = unallocated({2, 4});
  exphil::GatedRnnForwardArgs args;
  args.cell = exphil::GatedRnnCell::slstm;
  args.wx = &wx;
  args.R = &R;
  args.h0 = &h0;
  args.c0 = &c0;
  args.n0 = &n0;
  args.m0 = &m0;
  args.y = &y;
  args.h_final = &h_final;
  args.n_final = &n_final;
  args.m_final = &m_final;
  CHECK(exphil::can_implement(args).ok());

  SECTION("the states are [B, H]") {
    Tensor wrong = input(4, {2, 5});
    args.n0 = &wrong;
    expect_invalid(exphil::can_implement(args),
                   "slstm forward: argument 'n0': expected shape [2, 4] ([B, H] from 'wx' and 'R'), got [2, 5]");
  }
  SECTION("n and m are the sLSTM's alone") {
    args.cell = exphil::GatedRnnCell::lstm;
    expect_invalid(exphil::can_implement(args),
                   "lstm forward: argument 'n0': expected NULL: only an sLSTM has the normaliser n and the "
                   "stabiliser m, this is an LSTM");
    args.n0 = args.m0 = nullptr;
    expect_invalid(exphil::can_implement(args), "argument 'n_final': expected NULL");
    args.n_final = args.m_final = nullptr;
    CHECK(exphil::can_implement(args).ok());
  }
  SECTION("the states take one dtype") {
    Tensor wx16 = input(0, {2, 5, 16}, DType::bf16), y16 = unallocated({2, 5, 4}, DType::bf16);
    Tensor m16 = input(5, {2, 4}, DType::bf16);
    args.wx = &wx16;
    args.y = &y16;
    args.m0 = &m16;
    expect_invalid(exphil::can_implement(args), "argument 'm0': expected dtype f32 (the dtype of 'h0'), got bf16");
  }
  SECTION("the backward: every state's gradient, with or without the state") {
    Tensor gy = input(6, {2, 5, 4}), yin = input(7, {2, 5, 4}), gmf = input(8, {2, 4});
    Tensor gn0 = unallocated({2, 4}), gm0 = unallocated({2, 4}), gwx = unallocated({2, 5, 16});
    exphil::GatedRnnBackwardArgs b;
    b.cell = exphil::GatedRnnCell::slstm;
    b.wx = &wx;
    b.R = &R;
    b.y = &yin;
    b.grad_y = &gy;
    b.grad_m_final = &gmf;
    b.grad_wx = &gwx;
    b.grad_n0 = &gn0;
    b.grad_m0 = &gm0;
    CHECK(exphil::can_implement(b).ok());
    b.cell = exphil::GatedRnnCell::gru;
    expect_invalid(exphil::can_implement(b), "argument 'R': expected shape [H, 3H]");
  }
  SECTION("an unknown cell is named") {
    args.cell = static_cast<exphil::GatedRnnCell>(7);
    expect_invalid(exphil::can_implement(args), "argument 'cell': expected gru (0), lstm (1) or slstm (2), got 7");
  }
}
