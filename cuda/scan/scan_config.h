// Compile-time constants shared by the scan kernels and their planner.
//
// The EXPHIL_SCAN_* macros exist so that the benchmark can be built with
// other values to compare layouts on a GPU (bench/README section in the top
// README); the library is built with the defaults.
#pragma once

#ifndef EXPHIL_SCAN_FORWARD_STEPS
#define EXPHIL_SCAN_FORWARD_STEPS 4
#endif
#ifndef EXPHIL_SCAN_BACKWARD_STEPS
#define EXPHIL_SCAN_BACKWARD_STEPS 2
#endif
#ifndef EXPHIL_SCAN_FORWARD_MIN_BLOCKS
#define EXPHIL_SCAN_FORWARD_MIN_BLOCKS 2
#endif
#ifndef EXPHIL_SCAN_BACKWARD_MIN_BLOCKS
#define EXPHIL_SCAN_BACKWARD_MIN_BLOCKS 1
#endif

namespace exphil::kernels {

// Upper bound on threads per block; the kernels are compiled for it.
inline constexpr int kScanMaxBlockThreads = 256;
// Resident blocks per SM the compiler must allow (caps registers at
// 65536 / (256 * n)). The forward fits two without spilling; the backward
// holds inputs, grad_y, coefficients, rebuilt states and the next tile's
// loads per step, and spills if capped at 128 registers.
inline constexpr int kForwardMinBlocksPerSM = EXPHIL_SCAN_FORWARD_MIN_BLOCKS;
inline constexpr int kBackwardMinBlocksPerSM = EXPHIL_SCAN_BACKWARD_MIN_BLOCKS;
// Channels per thread on the vectorised path: 16-byte loads for f32, 8-byte
// loads for f16/bf16.
inline constexpr int kScanVectorWidth = 4;
// Below this many channels (B x H) per SM the vector path is not used: the
// call is latency-bound, and one channel per thread shortens each thread's
// serial work by the vector width.
inline constexpr int kScalarChannelsPerSM = 64;
// Steps per thread in a tile (L): all of a thread's loads for a tile are in
// flight together, and its coefficients stay in registers. The backward
// also holds the next tile's loads, so it takes fewer steps to stay within
// 255 registers without spilling.
inline constexpr int kForwardStepsPerThread = EXPHIL_SCAN_FORWARD_STEPS;
inline constexpr int kBackwardStepsPerThread = EXPHIL_SCAN_BACKWARD_STEPS;
// A segment split (segments > 1) reads the inputs twice; it pays only when a
// segment still spans several tiles.
inline constexpr int kMinTilesPerSegment = 4;
// Segments are combined sequentially by each apply block; keep that short.
inline constexpr int kMaxSegments = 256;

}  // namespace exphil::kernels
