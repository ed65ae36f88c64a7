// Fuzzes DecodeIndex with the chunk index bytes as given, and again with
// the trailer checksum recomputed so that mutations reach the record
// decoder instead of stopping at the checksum. Whatever decodes must
// re-encode to the same bytes.
#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "format/index.h"
#include "fuzz_check.h"

namespace {

void DecodeAndRoundTrip(const std::string& bytes) {
  auto records = shardkeep::format::DecodeIndex(bytes, "p0.idx");
  if (!records.ok()) {
    SK_FUZZ_CHECK(records.status().code() == shardkeep::StatusCode::kCorruption ||
                  records.status().code() == shardkeep::StatusCode::kIncompatible);
    return;
  }
  SK_FUZZ_CHECK(shardkeep::format::EncodeIndex(*records) == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string bytes(reinterpret_cast<const char*>(data), size);
  DecodeAndRoundTrip(bytes);
  if (bytes.size() >= 8) {
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    for (int i = 0; i < 8; ++i) {
      bytes[bytes.size() - 8 + i] = static_cast<char>(sum >> (8 * i));
    }
    DecodeAndRoundTrip(bytes);
  }
  return 0;
}
