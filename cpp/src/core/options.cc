#include "shardkeep/options.h"

#include <algorithm>
#include <thread>

namespace shardkeep {

int Options::ResolvedIoThreads() const {
  if (io_threads > 0) return io_threads;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cores, 1, 16);
}

}  // namespace shardkeep
