// Compile-time constants shared by the selective-scan kernels and their
// planner. See selective_scan_forward.cuh for the layout they describe.
#pragma once

namespace exphil::kernels {

// A block's channels: one warp's lanes, so loads of x, dt, z and y for one
// step are one coalesced row, and the sums of dB and dC over channels are
// warp reductions.
inline constexpr int kSsChannelsPerBlock = 32;
// States of one channel held by one thread, in registers.
inline constexpr int kSsStatesPerThread = 4;
// Warps per block, each holding 4 states of the block's 32 channels: up to
// 64 states in one block. Wider N is split across state groups whose sums
// over n are added by a finalize kernel.
inline constexpr int kSsMaxSlices = 16;
// Blocks have at least 4 warps, even for N < 16 (the extra states are
// padding): a thread then stages at most a quarter of a tile's rows, which
// keeps the staging registers of the forward's prefetch small.
inline constexpr int kSsMinSlices = 4;
inline constexpr int kSsMaxBlockThreads = kSsChannelsPerBlock * kSsMaxSlices;
inline constexpr int kSsMaxStates = 256;
// Steps staged in shared memory at once. The backward stages 16 steps and
// walks them as two tiles of 8 whose states and decays it keeps in
// registers (2 * 4 * 8 floats per thread).
inline constexpr int kSsForwardTile = 16;
inline constexpr int kSsBackwardStage = 16;
inline constexpr int kSsBackwardTile = 8;
// The backward keeps the state at the start of every 16-step stage of its
// chunk in shared memory; this bounds the chunk length (with 4 warps: 256
// steps). With the rest of a block's arrays it stays within
// kSsMaxSharedBytes, under the 99 KB per block that sm_86/sm_89 allow
// (selective_scan_shared_memory.h).
inline constexpr int kSsCheckpointBytes = 32 * 1024;
inline constexpr int kSsMaxSharedBytes = 96 * 1024;
// Chunks add a pass over the inputs; below this many steps per chunk they
// cost more than the parallelism they bring.
inline constexpr int kSsMinChunkSteps = 64;
// gridDim.y limit.
inline constexpr int kSsMaxChunks = 65535;

}  // namespace exphil::kernels
