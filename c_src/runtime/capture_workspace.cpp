#include "capture_workspace.hpp"

#include <map>
#include <mutex>
#include <new>
#include <string>

#include "cuda_status.hpp"

namespace exphil::runtime {
namespace {

// Sizes are rounded up to this, so that a block freed by one graph fits the
// next capture of a similar shape instead of starting another allocation.
constexpr std::size_t kBlockGranularity = std::size_t{1} << 20;

// A device block; the node of the cache's free list, and the data of the
// user object that owns it while a graph does.
struct Block {
  int device = -1;
  void* d_ptr = nullptr;
  std::size_t bytes = 0;
  Block* next = nullptr;
};

// Blocks no graph owns, of every device. Returning one allocates nothing
// and calls no CUDA, as a user-object destructor must.
class BlockCache {
 public:
  // Never destroyed: destructors of graphs that outlive static destruction
  // still return their blocks here.
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;
    return *cache;
  }

  // The smallest free block of `device` holding `bytes` and at most twice
  // that (a small workspace does not tie up a large block that the next
  // large capture would then allocate again), unlinked; null if none.
  Block* take(int device, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    Block** best = nullptr;
    for (Block** link = &free_; *link; link = &(*link)->next) {
      const Block* b = *link;
      if (b->device == device && b->bytes >= bytes && b->bytes <= 2 * bytes &&
          (!best || b->bytes < (*best)->bytes))
        best = link;
    }
    if (!best) return nullptr;
    Block* b = *best;
    *best = b->next;
    b->next = nullptr;
    return b;
  }

  void put(Block* b) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    b->next = free_;
    free_ = b;
  }

  // Every block allocated, owned by a graph or free: the cache's total.
  void allocated(int device, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    allocated_[device] += bytes;
  }
  std::size_t allocated(int device) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = allocated_.find(device);
    return it == allocated_.end() ? 0 : it->second;
  }

 private:
  std::mutex mutex_;
  Block* free_ = nullptr;
  std::map<int, std::size_t> allocated_;
};

// The user object's destructor: runs on a CUDA thread once no graph holds
// the block and their launches have finished.
void CUDART_CB return_block(void* block) noexcept {
  BlockCache::instance().put(static_cast<Block*>(block));
}

// cudaMalloc while this thread captures: refused in the global and
// thread-local capture modes, so relaxed for this call alone.
cudaError_t malloc_during_capture(void** d_ptr, std::size_t bytes) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t e = cudaThreadExchangeStreamCaptureMode(&mode);
  if (e != cudaSuccess) return e;
  e = cudaMalloc(d_ptr, bytes);
  const cudaError_t restored = cudaThreadExchangeStreamCaptureMode(&mode);
  return e != cudaSuccess ? e : restored;
}

std::string call_name(const char* call, const char* what) {
  return std::string(call) + " (" + what + ", during graph capture)";
}

}  // namespace

Status capture_workspace(int device, cudaStream_t stream, std::size_t bytes, void** out,
                         const char* what) {
  *out = nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamGetCaptureInfo(stream, &capture, nullptr, &graph);
  if (e != cudaSuccess) return cuda_status(e, call_name("cudaStreamGetCaptureInfo", what).c_str());
  if (capture != cudaStreamCaptureStatusActive || !graph)
    return cuda_status(cudaErrorStreamCaptureInvalidated,
                       call_name("cudaStreamGetCaptureInfo", what).c_str());

  const std::size_t rounded = (bytes + kBlockGranularity - 1) / kBlockGranularity * kBlockGranularity;
  Block* block = BlockCache::instance().take(device, rounded);
  if (!block) {
    block = new (std::nothrow) Block;
    if (!block) return {StatusCode::out_of_memory, std::string("host memory for ") + what};
    block->device = device;
    block->bytes = rounded;
    e = malloc_during_capture(&block->d_ptr, rounded);
    if (e != cudaSuccess) {
      delete block;
      return cuda_status(e, call_name("cudaMalloc", what).c_str());
    }
    BlockCache::instance().allocated(device, rounded);
  }

  cudaUserObject_t owner = nullptr;
  e = cudaUserObjectCreate(&owner, block, return_block, 1, cudaUserObjectNoDestructorSync);
  if (e != cudaSuccess) {
    BlockCache::instance().put(block);
    return cuda_status(e, call_name("cudaUserObjectCreate", what).c_str());
  }
  e = cudaGraphRetainUserObject(graph, owner, 1, cudaGraphUserObjectMove);
  if (e != cudaSuccess) {
    cudaUserObjectRelease(owner, 1);  // its destructor returns the block
    return cuda_status(e, call_name("cudaGraphRetainUserObject", what).c_str());
  }
  *out = block->d_ptr;
  return {};
}

std::size_t capture_blocks_bytes(int device) noexcept {
  try {
    return BlockCache::instance().allocated(device);
  } catch (...) {  // std::mutex::lock: not in practice
    return 0;
  }
}

}  // namespace exphil::runtime
