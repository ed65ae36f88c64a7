// CRC32C (Castagnoli), the checksum GCS keeps for every object: sent with
// each upload for the server to verify, and compared with the x-goog-hash
// of each whole-object download.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace shardkeep::gcs {

// Extends `crc` (0 to start) over `bytes`: Crc32c(a + b) ==
// Crc32c(b, Crc32c(a)).
uint32_t Crc32c(std::string_view bytes, uint32_t crc = 0);

// As GCS spells it: base64 of the four bytes, big-endian ("mnG7TA==").
std::string Crc32cBase64(uint32_t crc);

}  // namespace shardkeep::gcs
