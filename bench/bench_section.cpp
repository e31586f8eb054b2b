#include "bench_section.hpp"

#include <algorithm>
#include <cmath>

#include "bench_kernels.h"

namespace exphil::bench {

std::size_t SectionContext::rotation(double set_bytes) const {
  return static_cast<std::size_t>(
      std::clamp(std::ceil(2.0 * static_cast<double>(l2_bytes) / set_bytes), 2.0, 64.0));
}

void SectionContext::add_target(const std::string& what, bool met, double us) const {
  targets->push_back((met ? "MET    " : "MISSED ") + what + ": " + std::to_string(us) + " us");
}

Tensor DeviceTensors::make(DType dtype, std::initializer_list<int64_t> shape, float lo, float hi,
                           uint64_t seed, cudaStream_t stream) {
  std::size_t count = 1;
  for (int64_t d : shape) count *= static_cast<std::size_t>(d);
  memory_.push_back(std::make_unique<DeviceMemory>(count * dtype_size(dtype)));
  const Tensor t = make_tensor(memory_.back()->get(), dtype, shape);
  if (hi > lo) check_cuda(fill_uniform(t.data, dtype, count, lo, hi, seed, stream), "fill");
  return t;
}

const char* direction_name(Direction d) {
  return d == Direction::forward ? "fwd" : d == Direction::backward ? "bwd" : "fwd+bwd";
}

Timing time_calls(const SectionContext& c, std::size_t sets, int kernels, double bytes,
                  const Enqueue& call) {
  Timing t;
  const int reps = c.quick ? 30 : 200;
  const int per_graph = 20;
  const int graphs = std::max<int>(1, static_cast<int>((sets + per_graph - 1) / per_graph));
  t.events_us = median_event_us(c.stream, 10, reps, call);
  t.graph_us = median_graph_us(c.stream, graphs, per_graph, std::max(c.quick ? 20 : 100, 2 * graphs),
                               call);
  t.host_us = median_host_us(c.stream, reps, call);
  t.copy_share = bytes / (t.graph_us * 1e3) / c.copy_gbps;
  t.floor_us = std::max(bytes / (c.copy_gbps * 1e3), kernels * c.launch_floor_us);
  return t;
}

}  // namespace exphil::bench
