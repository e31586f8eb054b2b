// Programmatic dependent launch (sm_90 and later): a kernel launched with
// cudaLaunchAttributeProgrammaticStreamSerialization may start while the
// kernel before it in the stream still runs, and waits for that kernel's
// completion and memory with griddepcontrol.wait; the kernel before lets it
// start early with griddepcontrol.launch_dependents. Both are no-ops on
// older GPUs, where the launch attribute is not set either.
#pragma once

namespace exphil::kernels {

// Waits until the grid this one depends on has finished and its writes are
// visible. A dependent kernel calls it before it reads or writes any global
// memory, so that what starts early is only the launch.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel in the stream, if launched as a dependent, start.
__device__ __forceinline__ void allow_dependent_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

}  // namespace exphil::kernels
