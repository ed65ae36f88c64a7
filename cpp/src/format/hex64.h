// 64-bit values as 16 lower-case hexadecimal digits: checksums in the commit
// record, lease sequence numbers and generation names. Fixed width, so that
// names sort by value and a reader can refuse any other spelling.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shardkeep::format {

inline constexpr size_t kHex64Digits = 16;

inline std::string Hex64(uint64_t value) {
  constexpr char kDigits[] = "0123456789abcdef";
  std::string out(kHex64Digits, '0');
  for (size_t i = kHex64Digits; i-- > 0; value >>= 4) out[i] = kDigits[value & 0xf];
  return out;
}

// The value of exactly 16 lower-case hexadecimal digits; nullopt for any
// other text (upper case, a sign, spaces or another length).
inline std::optional<uint64_t> ParseHex64(std::string_view digits) {
  if (digits.size() != kHex64Digits) return std::nullopt;
  uint64_t value = 0;
  for (char c : digits) {
    uint64_t digit;
    if (c >= '0' && c <= '9') {
      digit = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      digit = static_cast<uint64_t>(c - 'a' + 10);
    } else {
      return std::nullopt;
    }
    value = value << 4 | digit;
  }
  return value;
}

}  // namespace shardkeep::format
