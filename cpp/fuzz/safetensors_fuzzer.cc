// Fuzzes the safetensors header decoder on whole files (length, header,
// data). Every tensor it accepts lies inside the file, no two overlap, and
// re-encoding the tensors gives a header that decodes to the same tensors.
#include <cstdint>
#include <string>
#include <string_view>

#include "shardkeep/safetensors.h"
#include "fuzz_check.h"

using namespace shardkeep;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto length = DecodeSafetensorsHeaderLength(bytes.substr(0, 8), size, "f");
  if (!length.ok()) return 0;
  SK_FUZZ_CHECK(8 + *length <= size);
  auto header = DecodeSafetensorsHeader(bytes.substr(8, *length), size, "f");
  if (!header.ok()) return 0;
  uint64_t data_bytes = 0;
  for (const SafetensorsTensor& t : header->tensors) {
    SK_FUZZ_CHECK(t.offset >= header->data_start);
    SK_FUZZ_CHECK(t.length <= size && t.offset <= size - t.length);
    data_bytes += t.length;  // no overlap: the sum fits in the file
    SK_FUZZ_CHECK(data_bytes <= size);
  }
  std::vector<SafetensorsTensor> tensors = header->tensors;
  const std::string encoded = EncodeSafetensorsHeader(tensors, header->metadata);
  const uint64_t encoded_size = encoded.size() + data_bytes;
  auto again = DecodeSafetensorsHeader(std::string_view(encoded).substr(8), encoded_size, "f");
  SK_FUZZ_CHECK(again.ok());
  SK_FUZZ_CHECK(again->tensors.size() == tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SK_FUZZ_CHECK(again->tensors[i].name == tensors[i].name);
    SK_FUZZ_CHECK(again->tensors[i].dtype == tensors[i].dtype);
    SK_FUZZ_CHECK(again->tensors[i].shape == tensors[i].shape);
    SK_FUZZ_CHECK(again->tensors[i].offset == tensors[i].offset);
  }
  SK_FUZZ_CHECK(again->metadata == header->metadata);
  return 0;
}
