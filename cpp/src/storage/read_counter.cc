#include "storage/read_counter.h"

#include <atomic>

namespace shardkeep {
namespace {

// Relaxed: a counter read between operations, ordering nothing else.
std::atomic<uint64_t> bytes_read{0};

}  // namespace

uint64_t StorageBytesRead() { return bytes_read.load(std::memory_order_relaxed); }

void CountStorageBytesRead(uint64_t bytes) {
  bytes_read.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace shardkeep
