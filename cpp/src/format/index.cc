#include "format/index.h"

#include <xxhash.h>

#include <cstring>

namespace shardkeep::format {
namespace {

constexpr size_t kHeaderSize = 16;   // magic + record count
constexpr size_t kTrailerSize = 8;   // XXH3-64 of everything before it
constexpr size_t kFixedRecordSize = 4 * 4 + 4 * 8;  // before origin/shape
constexpr uint32_t kMaxRank = 64;
constexpr uint64_t kMaxBytes = uint64_t{1} << 63;

// Explicit little-endian writes and reads, independent of host byte order
// and of struct layout.
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// A bounds-checked cursor over the record area [begin, end).
class Reader {
 public:
  Reader(const char* begin, const char* end) : p_(begin), end_(end) {}
  size_t remaining() const { return static_cast<size_t>(end_ - p_); }
  // REQUIRES: remaining() >= 4 / 8.
  uint32_t U32() { uint32_t v = GetU32(p_); p_ += 4; return v; }
  uint64_t U64() { uint64_t v = GetU64(p_); p_ += 8; return v; }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace

std::string EncodeIndex(const std::vector<ChunkRecord>& records) {
  std::string out(kIndexMagic, sizeof(kIndexMagic));
  PutU64(&out, records.size());
  for (const ChunkRecord& r : records) {
    // REQUIRES: r.box.origin.size() == r.box.shape.size(); a missing
    // origin entry is written as 0 rather than read out of bounds.
    const size_t rank = r.box.rank();
    PutU32(&out, r.leaf);
    PutU32(&out, static_cast<uint32_t>(rank));
    PutU32(&out, r.data_file);
    PutU32(&out, static_cast<uint32_t>(r.codec));
    PutU64(&out, r.offset);
    PutU64(&out, r.stored_length);
    PutU64(&out, r.raw_length);
    PutU64(&out, r.checksum);
    for (size_t d = 0; d < rank; ++d) {
      PutU64(&out, d < r.box.origin.size() ? r.box.origin[d] : 0);
    }
    for (size_t d = 0; d < rank; ++d) PutU64(&out, r.box.shape[d]);
  }
  PutU64(&out, XXH3_64bits(out.data(), out.size()));
  return out;
}

Result<std::vector<ChunkRecord>> DecodeIndex(std::string_view bytes,
                                             const std::string& file) {
  auto corrupt = [&file](const std::string& what) {
    return CorruptionError(file + ": " + what);
  };
  const size_t size = bytes.size();
  if (size < kHeaderSize + kTrailerSize) {
    return corrupt("expected a chunk index of at least " +
                   std::to_string(kHeaderSize + kTrailerSize) +
                   " bytes, found " + std::to_string(size));
  }
  // The last magic byte is the layout version: report a newer one as such.
  if (std::memcmp(bytes.data(), kIndexMagic, sizeof(kIndexMagic) - 1) != 0) {
    return corrupt("expected the chunk index magic \"SKIDX\\0\\0\\1\"");
  }
  const auto layout = static_cast<unsigned char>(bytes[7]);
  if (layout != static_cast<unsigned char>(kIndexMagic[7])) {
    if (layout > static_cast<unsigned char>(kIndexMagic[7])) {
      return IncompatibleError(
          file + ": chunk index layout version " + std::to_string(layout) +
          " was written by a newer shardkeep; this reader supports 1");
    }
    return corrupt("expected chunk index layout version 1, found " +
                   std::to_string(layout));
  }
  const uint64_t stored_sum = GetU64(bytes.data() + size - kTrailerSize);
  const uint64_t actual_sum = XXH3_64bits(bytes.data(), size - kTrailerSize);
  if (stored_sum != actual_sum) {
    return corrupt("trailer checksum mismatch (file truncated or damaged)");
  }

  // The checksum only proves the file is what some writer produced; the
  // structure is still checked as if hostile.
  const uint64_t count = GetU64(bytes.data() + 8);
  Reader in(bytes.data() + kHeaderSize, bytes.data() + size - kTrailerSize);
  // Bound the count by the bytes present before allocating anything.
  if (count > in.remaining() / kFixedRecordSize) {
    return corrupt("record count " + std::to_string(count) +
                   " does not fit in " + std::to_string(size) + " bytes");
  }
  std::vector<ChunkRecord> records;
  records.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    auto bad = [&](const std::string& what) {
      return corrupt("record " + std::to_string(i) + ": " + what);
    };
    if (in.remaining() < kFixedRecordSize) return bad("truncated");
    ChunkRecord r;
    r.leaf = in.U32();
    const uint32_t rank = in.U32();
    r.data_file = in.U32();
    const uint32_t codec = in.U32();
    r.offset = in.U64();
    r.stored_length = in.U64();
    r.raw_length = in.U64();
    r.checksum = in.U64();
    if (rank > kMaxRank) {
      return bad("expected rank <= " + std::to_string(kMaxRank) + ", found " +
                 std::to_string(rank));
    }
    if (codec > static_cast<uint32_t>(Codec::kZstdBytePlanes)) {
      return bad("expected codec 0 (raw), 1 (zstd) or 2 (zstd of byte planes), found " +
                 std::to_string(codec));
    }
    r.codec = static_cast<Codec>(codec);
    // No file or leaf is larger than 2^63 bytes: bounding every length
    // here keeps the sums and products readers form from them in range.
    if (r.offset >= kMaxBytes || r.stored_length > kMaxBytes - r.offset) {
      return bad("expected offset + stored_length <= 2^63, found offset " +
                 std::to_string(r.offset) + " and stored_length " +
                 std::to_string(r.stored_length));
    }
    if (r.raw_length > kMaxBytes) {
      return bad("expected raw_length <= 2^63, found " +
                 std::to_string(r.raw_length));
    }
    if (r.codec == Codec::kRaw && r.stored_length != r.raw_length) {
      return bad("expected stored_length == raw_length for a raw chunk");
    }
    if (in.remaining() < 16 * static_cast<size_t>(rank)) {
      return bad("truncated box");
    }
    r.box.origin.resize(rank);
    r.box.shape.resize(rank);
    for (uint32_t d = 0; d < rank; ++d) r.box.origin[d] = in.U64();
    for (uint32_t d = 0; d < rank; ++d) r.box.shape[d] = in.U64();
    // Keep every later box computation (end = origin + shape, element
    // counts) free of overflow, so readers need not re-check.
    bool has_zero = false;
    uint64_t elements = 1;
    bool elements_overflow = false;
    for (uint32_t d = 0; d < rank; ++d) {
      const uint64_t o = r.box.origin[d], s = r.box.shape[d];
      if (o + s < o) {
        return bad("origin + shape overflows 64 bits in dimension " +
                   std::to_string(d));
      }
      has_zero |= (s == 0);
      elements_overflow |= __builtin_mul_overflow(elements, s, &elements);
    }
    if (elements_overflow && !has_zero) {
      return bad("element count of box " + r.box.ToString() +
                 " overflows 64 bits");
    }
    records.push_back(std::move(r));
  }
  if (in.remaining() != 0) {
    return corrupt("expected the trailer after " + std::to_string(count) +
                   " records, found " + std::to_string(in.remaining()) +
                   " extra bytes");
  }
  return records;
}

std::string IndexFileName(int process_index) {
  return "index/p" + std::to_string(process_index) + ".idx";
}

std::string DataFileName(int process_index, uint32_t data_file) {
  return "data/p" + std::to_string(process_index) + "-" +
         std::to_string(data_file) + ".bin";
}

}  // namespace shardkeep::format
