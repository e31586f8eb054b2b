// The GRU / LSTM section of exphil_bench (bench_gated_rnn.cpp): issue 30's
// shapes, 1 and 2 layers, with and without the input projection, forward
// and forward + backward, against the floor and a one-launch-per-step
// baseline. Its cuDNN peer is bench/peers/cudnn_rnn.py; bench/run_gated_rnn.sh
// runs both and compares.
#pragma once

#include "bench_section.hpp"

namespace exphil::bench {

// `small`: the batch-1 shapes only (B1 T32 H256, B1 T1 H256), as
// cudnn_rnn.py --small. `layouts`: instead, one layer's kernels in each
// layout the launch options can ask for, against the automatic plan.
// `exact_f32`: f32 only, the projections' products as f32 FMAs rather than
// TF32, beside cudnn_rnn.py --exact-f32. `f32_tensor_cores`: f32 only, every
// call at GatedRnnPrecision::tf32, beside cudnn_rnn.py's default (TF32).
void bench_gated_rnn(const SectionContext& context, bool small, bool layouts, bool exact_f32,
                     bool f32_tensor_cores);

}  // namespace exphil::bench
