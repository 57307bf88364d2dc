// Weight storage in huge-page chunks (ops/common/weight_arena.h says why).
#include "common/weight_arena.h"

#include <cstdlib>
#include <mutex>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace sd {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t v, size_t m) { return (v + m - 1) / m * m; }

// One aligned block; freed when the last packing in it goes (the packings hold it through shared_ptr aliasing).
struct Chunk {
  uint8_t* base;
  size_t size;
  explicit Chunk(size_t bytes) : size(bytes) {
    base = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, size));
    if (base == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    madvise(base, size, MADV_HUGEPAGE);  // advice: refused (THP "never", no kernel support), ordinary pages stay
#endif
  }
  ~Chunk() { std::free(base); }
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;
};

std::mutex g_mutex;
std::weak_ptr<Chunk> g_current;  // the chunk packings are appended to, while any packing keeps it
size_t g_used = 0;               // bytes of it handed out

}  // namespace

std::shared_ptr<uint8_t> AllocateWeightStorage(size_t bytes) {
  bytes = RoundUp(bytes == 0 ? 1 : bytes, 64);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::shared_ptr<Chunk> chunk = g_current.lock();
  if (chunk == nullptr || g_used + bytes > chunk->size) {
    chunk = std::make_shared<Chunk>(bytes > kWeightChunk ? RoundUp(bytes, kHugePage) : kWeightChunk);
    g_current = chunk;
    g_used = 0;
  }
  uint8_t* const data = chunk->base + g_used;
  g_used += bytes;
  return std::shared_ptr<uint8_t>(chunk, data);
}

}  // namespace sd
