// What the sections of exphil_bench share: the measurements of the run
// (device, copy bandwidth, launch floor), the direction of a row, and one
// row's timing: CUDA events around single calls, CUDA-graph replay, host
// time, and the floor (the larger of bytes / copy bandwidth and kernels x
// the launch floor), with calls rotating over input sets that exceed twice
// the L2 cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "bench_support.hpp"
#include "exphil/tensor.hpp"
#include "timing.hpp"

namespace exphil::bench {

struct SectionContext {
  cudaStream_t stream = nullptr;
  double copy_gbps = 0.0;
  double launch_floor_us = 0.0;
  std::size_t l2_bytes = 0;
  bool quick = false;
  std::vector<std::string>* targets = nullptr;  // "MET ..." / "MISSED ..." lines

  // How many input sets of `set_bytes` the calls rotate over: enough to
  // exceed twice the L2 cache, from 2 to 64.
  std::size_t rotation(double set_bytes) const;
  // Appends "MET    what: us" or "MISSED what: us" to targets.
  void add_target(const std::string& what, bool met, double us) const;
};

enum class Direction { forward, backward, both };
const char* direction_name(Direction d);
inline bool runs_forward(Direction d) { return d != Direction::backward; }
inline bool runs_backward(Direction d) { return d != Direction::forward; }

struct Timing {
  double events_us = 0, graph_us = 0, host_us = 0, floor_us = 0;
  double copy_share = 0;  // bytes / graph time, as a share of the copy bandwidth
};

// Device tensors of one input set, freed with it.
class DeviceTensors {
 public:
  // A tensor filled with a hash of (seed, index) mapped to [lo, hi), or
  // left unset where lo == hi (outputs).
  Tensor make(DType dtype, std::initializer_list<int64_t> shape, float lo, float hi, uint64_t seed,
              cudaStream_t stream);

 private:
  std::vector<std::unique_ptr<DeviceMemory>> memory_;
};

// Times `call` (which enqueues one call of input set rep % sets) that moves
// at least `bytes` in `kernels` launches.
Timing time_calls(const SectionContext& context, std::size_t sets, int kernels, double bytes,
                  const Enqueue& call);

}  // namespace exphil::bench
