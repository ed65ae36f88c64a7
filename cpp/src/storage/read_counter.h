// A process-wide count of the bytes the storage backends have read: what
// the file backend's reads and the S3 backend's GETs returned, whatever
// asked for them (a load, a verify, a copy, the commit protocol). It is how
// tests and benchmarks tell how much of a checkpoint each process fetched
// from storage (load-and-broadcast must fetch one copy per job, not one per
// replica). Bytes of memory-mapped files are not counted: a mapping never
// goes through a backend. The in-memory test backend is not counted either.
#pragma once

#include <cstdint>

namespace shardkeep {

// Every byte counted so far in this process. Monotonic; thread-safe.
uint64_t StorageBytesRead();

// Adds `bytes` read by a backend (backends only).
void CountStorageBytesRead(uint64_t bytes);

}  // namespace shardkeep
