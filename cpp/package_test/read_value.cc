// Opens a committed checkpoint by URL and prints the size of one value
// checkpointable: read_value URL NAME.
#include <cstdio>

#include "shardkeep/checkpoint.h"
#include "shardkeep/storage.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: read_value URL NAME\n");
    return 2;
  }
  shardkeep::Result<shardkeep::StorageLocation> where = shardkeep::ResolveStorage(argv[1]);
  if (!where.ok()) {
    std::fprintf(stderr, "%s\n", where.status().ToString().c_str());
    return 1;
  }
  auto reader = shardkeep::CheckpointReader::Open(where->storage, where->path);
  if (!reader.ok()) {
    std::fprintf(stderr, "%s\n", reader.status().ToString().c_str());
    return 1;
  }
  shardkeep::Result<std::string> value = (*reader)->ReadValue(argv[2]);
  if (!value.ok()) {
    std::fprintf(stderr, "%s\n", value.status().ToString().c_str());
    return 1;
  }
  std::printf("%zu\n", value->size());
  return 0;
}
