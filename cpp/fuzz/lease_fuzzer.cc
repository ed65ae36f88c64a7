// Fuzzes DecodeLease. A lease that decodes must encode to a document that
// decodes to the same lease.
#include <cstdint>
#include <string>

#include "format/lease.h"
#include "fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using shardkeep::format::DecodeLease;
  using shardkeep::format::EncodeLease;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto lease = DecodeLease(bytes, "lease");
  if (!lease.ok()) return 0;
  auto again = DecodeLease(EncodeLease(*lease), "lease");
  SK_FUZZ_CHECK(again.ok());
  SK_FUZZ_CHECK(EncodeLease(*again) == EncodeLease(*lease));
  return 0;
}
