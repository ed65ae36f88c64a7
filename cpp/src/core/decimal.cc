#include "core/decimal.h"

namespace shardkeep {

std::optional<int64_t> DecimalValue(std::string_view digits, int64_t max) {
  if (digits.empty()) return std::nullopt;
  int64_t value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    const int digit = c - '0';
    if (value > (max - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
  }
  return value;
}

}  // namespace shardkeep
