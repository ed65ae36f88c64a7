#include "storage/gcs/crc32c.h"

#include <array>
#include <cstring>

#include "storage/http/base64.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace shardkeep::gcs {
namespace {

constexpr uint32_t kPolynomial = 0x82f63b78;  // reflected Castagnoli

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    }
    table[i] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t Portable(const unsigned char* p, size_t n, uint32_t crc) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// The SSE 4.2 instruction computes this very polynomial: 8 bytes a cycle or
// so, where the table does one; objects are checkpoint data files of GBs.
__attribute__((target("sse4.2"))) uint32_t Hardware(const unsigned char* p,
                                                    size_t n, uint32_t crc) {
  uint64_t wide = crc;
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = _mm_crc32_u64(wide, word);
  }
  uint32_t narrow = static_cast<uint32_t>(wide);
  for (; n > 0; ++p, --n) narrow = _mm_crc32_u8(narrow, *p);
  return narrow;
}

bool HasSse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

uint32_t Crc32c(std::string_view bytes, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  crc = ~crc;
#if defined(__x86_64__)
  if (HasSse42()) return ~Hardware(p, bytes.size(), crc);
#endif
  return ~Portable(p, bytes.size(), crc);
}

std::string Crc32cBase64(uint32_t crc) {
  const char big_endian[4] = {static_cast<char>(crc >> 24), static_cast<char>(crc >> 16),
                              static_cast<char>(crc >> 8), static_cast<char>(crc)};
  return http::Base64Encode(std::string_view(big_endian, 4));
}

}  // namespace shardkeep::gcs
