// Byte planes: an array of `count` elements of `width` bytes each, stored
// as `width` planes of `count` bytes, plane j holding byte j of every
// element in element order (docs/FORMAT.md §5, codec 2).
//
// Why: in a float array the sign-and-exponent bytes take few values and the
// low mantissa bytes look random. Interleaved, they defeat an entropy coder;
// split into planes, the exponent planes compress to about a third and the
// mantissa planes are stored raw at memory speed.
#pragma once

#include <cstdint>

namespace shardkeep::internal {

// Codec 2 compresses a chunk in blocks of this many elements, each block's
// planes one zstd frame: a full block's planes are 128 KiB each, zstd's
// largest block, and a block stays in a core's cache between its
// decompression and the join (about 20% faster than joining a whole
// chunk's planes from memory), with scratch memory of one block.
inline constexpr uint64_t kBytePlaneBlockElements = 128 << 10;

// planes[j * count + i] = elements[i * width + j]. The buffers must not overlap.
void SplitBytePlanes(const uint8_t* elements, uint64_t count, uint32_t width, uint8_t* planes);

// The inverse: elements[i * width + j] = planes[j * count + i].
void JoinBytePlanes(const uint8_t* planes, uint64_t count, uint32_t width, uint8_t* elements);

}  // namespace shardkeep::internal
