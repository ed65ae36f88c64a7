// The safetensors format (Hugging Face): an 8-byte little-endian header
// length N, N bytes of JSON naming each tensor's dtype, shape and byte
// range, then the tensors' bytes, row-major and little-endian. Pure
// encode/decode, no I/O, for the reader (CheckpointReader::OpenSafetensors),
// the command line's export and C++ programs. Files come from untrusted
// places: the decoder checks every bound (docs/INTEROP.md) and names the
// file in its errors.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/dtype.h"
#include "shardkeep/status.h"

namespace shardkeep {

// The safetensors library refuses headers above 100 MB; so does shardkeep,
// before reading them.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<uint64_t> shape;
  uint64_t offset = 0;  // of its first byte in the file (not the data area)
  uint64_t length = 0;  // elements × itemsize
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + N: where the data area begins
  std::vector<SafetensorsTensor> tensors;  // in the header's order
  std::map<std::string, std::string> metadata;  // "__metadata__", if any
};

// The header length N from the file's first 8 bytes, checked against the
// file size and kMaxSafetensorsHeaderBytes.
Result<uint64_t> DecodeSafetensorsHeaderLength(std::string_view first_8_bytes,
                                               uint64_t file_size,
                                               const std::string& file);

// Decodes the N header bytes of a file of `file_size` bytes: a JSON object
// whose "__metadata__" maps strings to strings and whose every other key
// names a tensor {"dtype", "shape", "data_offsets": [begin, end]}. Checks
// known dtypes, rank ≤ 64, end - begin == elements × itemsize (overflow
// checked), every range inside the data area, and no two ranges
// overlapping. Errors are Corruption naming `file` and the tensor.
Result<SafetensorsHeader> DecodeSafetensorsHeader(std::string_view header_json,
                                                  uint64_t file_size,
                                                  const std::string& file);

// "BF16", "F8_E4M3", ... for the dtypes safetensors names; nullopt for the
// others (int4, complex128, most float8 variants).
std::optional<std::string_view> SafetensorsDTypeName(DType dtype);
// Inverse; Corruption-free: nullopt for a name shardkeep cannot hold
// (unknown, or packed sub-byte types such as "F4").
std::optional<DType> DTypeFromSafetensorsName(std::string_view name);

// The file's header for `tensors`, laid out back to back in their order
// (SafetensorsTensor::offset is set by this function), padded with spaces
// to a multiple of 8 bytes as the safetensors library writes it. Returns
// the 8 length bytes followed by the JSON.
std::string EncodeSafetensorsHeader(std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata);

}  // namespace shardkeep
