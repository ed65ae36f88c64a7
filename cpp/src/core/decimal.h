// Names and records that hold numbers (step folders, slice folders, index
// files, process lists, key-tree positions) spell them as plain ASCII
// digits: no sign, no spaces. This is the one parser of them; it never
// throws, as the core's code does not, and bounds the value.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace shardkeep {

// The number a non-empty run of ASCII digits spells; nullopt for any other
// string or for a value past `max`.
std::optional<int64_t> DecimalValue(std::string_view digits, int64_t max);

}  // namespace shardkeep
