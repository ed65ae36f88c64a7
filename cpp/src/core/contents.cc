#include "shardkeep/contents.h"

#include "shardkeep/box.h"

namespace shardkeep {

std::string_view LeafKindName(LeafKind kind) {
  switch (kind) {
    case LeafKind::kArray: return "array";
    case LeafKind::kScalar: return "scalar";
    case LeafKind::kString: return "string";
    case LeafKind::kNone: return "none";
  }
  return "unknown";
}

uint64_t LeafInfo::nbytes() const {
  if (kind != LeafKind::kArray || !dtype) return 0;
  // The decoder has checked that every array leaf fits in 2^63 bytes.
  return CheckedByteSize(shape, DTypeSize(*dtype)).value_or(0);
}

const LeafInfo* PytreeInfo::Find(std::string_view path) const {
  for (const LeafInfo& leaf : leaves) {
    if (leaf.path == path) return &leaf;
  }
  return nullptr;
}

std::string EscapeKey(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

std::string UnescapeKey(std::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] == '~' && i + 1 < segment.size() &&
        (segment[i + 1] == '0' || segment[i + 1] == '1')) {
      out += segment[++i] == '0' ? '~' : '/';
    } else {
      out += segment[i];
    }
  }
  return out;
}

}  // namespace shardkeep
