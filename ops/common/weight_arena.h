// Storage for weights a kernel packs once, at its creation, and then reads on every call: 64-byte aligned, from
// chunks in 2 MB transparent huge pages where the OS offers them (Linux THP in "madvise" or "always" mode; elsewhere,
// or when refused, ordinary pages).
//
// Why: a model's packed weights are read once per call, each from L3 or DRAM. On 4 KB pages the core walks the page
// table for every 4 KB of them (all-MiniLM-L6-v2's widened int8 weights: ~5,300 pages, beyond Zen 4's 3,072-entry
// L2 TLB) and its hardware prefetchers stop at each page's end; on 2 MB pages neither happens. MiniLM's
// RowwiseInt8MatMul nodes ran 6-8% faster in the model, its encode ~2% (bench/results/rowwise_int8_wide.md).
//
// Packings share a chunk, in creation order (a session creates its kernels together, so one model's weights are
// mostly contiguous). A chunk's memory is returned when the last packing in it is freed; space freed inside a chunk
// is not reused, so a process that keeps creating and dropping sessions holds at most one chunk (kWeightChunk) per
// packing still alive. Only the 2 MB pages a packing touches are backed by memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace sd {

constexpr size_t kWeightChunk = size_t{8} << 20;  // a larger packing gets a chunk of its own, rounded up to 2 MB

// `bytes` of uninitialised, 64-byte aligned storage, valid while the returned pointer (or a copy) lives. Thread-safe.
// Throws std::bad_alloc when no memory is left.
std::shared_ptr<uint8_t> AllocateWeightStorage(size_t bytes);

}  // namespace sd
