// DiffCheckpoints: the indexes first (chunks with the same box and checksum
// are identical without being read), then the remaining boxes read from
// both sides in the stored dtype and compared element by element.
#include "shardkeep/diff.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "engine/copy.h"
#include "shardkeep/checkpoint.h"

namespace shardkeep {
namespace {

std::string TypeOf(const LeafInfo& leaf) {
  const std::string dtype = leaf.dtype ? std::string(DTypeName(*leaf.dtype)) : "";
  switch (leaf.kind) {
    case LeafKind::kArray: {
      std::string dims;
      for (uint64_t d : leaf.shape) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      return dtype + "[" + dims + "]";
    }
    case LeafKind::kScalar: return "scalar " + dtype;
    case LeafKind::kString: return "string";
    default: return "None";
  }
}

// The elements of `bytes` as doubles, for float and integer dtypes.
bool ToDoubles(const uint8_t* bytes, DType dtype, uint64_t n, std::vector<double>& out) {
  out.resize(n);
  if (IsCastableFloat(dtype)) {
    internal::CastElements(bytes, dtype, reinterpret_cast<uint8_t*>(out.data()),
                           DType::kFloat64, n);
    return true;
  }
  if (dtype == DType::kUInt64) {  // past int64: converted on its own
    for (uint64_t i = 0; i < n; ++i) {
      uint64_t v;
      std::memcpy(&v, bytes + i * 8, 8);
      out[i] = static_cast<double>(v);
    }
    return true;
  }
  if (!IsInteger(dtype)) return false;
  std::vector<int64_t> wide(n);
  internal::CastElements(bytes, dtype, reinterpret_cast<uint8_t*>(wide.data()), DType::kInt64,
                         n);
  for (uint64_t i = 0; i < n; ++i) out[i] = static_cast<double>(wide[i]);
  return true;
}

// Running totals of one leaf's differing elements.
struct Differences {
  uint64_t elements = 0;
  bool numeric = true;
  bool measured = false;  // some differing pair had a finite difference
  double max_abs = 0, max_rel = 0;

  void Add(const uint8_t* a, const uint8_t* b, DType dtype, uint64_t n) {
    const size_t item = DTypeSize(dtype);
    std::vector<double> da, db;
    numeric = numeric && ToDoubles(a, dtype, n, da) && ToDoubles(b, dtype, n, db);
    for (uint64_t i = 0; i < n; ++i) {
      if (std::memcmp(a + i * item, b + i * item, item) == 0) continue;
      ++elements;
      if (!numeric) continue;
      const double diff = std::fabs(da[i] - db[i]);
      if (!std::isfinite(diff)) continue;
      measured = true;
      max_abs = std::max(max_abs, diff);
      const double scale = std::max(std::fabs(da[i]), std::fabs(db[i]));
      if (scale > 0) max_rel = std::max(max_rel, diff / scale);
    }
  }

  void Into(LeafDiff& out) const {
    out.differing_elements = elements;
    out.change = elements == 0 ? LeafChange::kIdentical : LeafChange::kDiffers;
    const bool known = numeric && (measured || elements == 0);
    out.max_abs_diff = known ? max_abs : std::nan("");
    out.max_rel_diff = known ? max_rel : std::nan("");
  }
};

bool SameStoredBytes(const LeafChunk& a, const LeafChunk& b) {
  return a.box == b.box && a.codec == b.codec && a.range.length == b.range.length &&
         a.range.checksum && b.range.checksum && *a.range.checksum == *b.range.checksum;
}

class Differ {
 public:
  Differ(CheckpointReader& a, CheckpointReader& b, const DiffOptions& options)
      : a_(a), b_(b) {
    read_options_.io_threads = options.threads;
  }

  Status Run(DiffReport& report) {
    std::map<std::string, std::string> kinds_b;
    for (const auto& entry : b_.Info().checkpointables) kinds_b[entry.name] = entry.kind;
    std::set<std::string> in_a;
    for (const auto& entry : a_.Info().checkpointables) {
      in_a.insert(entry.name);
      auto other = kinds_b.find(entry.name);
      if (other == kinds_b.end()) {
        SK_RETURN_IF_ERROR(OneSided(a_, entry.name, entry.kind, LeafChange::kOnlyInA, report));
      } else if (other->second != entry.kind) {
        report.leaves.push_back({entry.name, "", LeafChange::kChangedType, entry.kind,
                                 other->second});
      } else if (entry.kind == "pytree") {
        SK_RETURN_IF_ERROR(Pytrees(entry.name, report));
      } else {
        SK_RETURN_IF_ERROR(Values(entry.name, entry.kind, report));
      }
    }
    for (const auto& entry : b_.Info().checkpointables) {
      if (in_a.count(entry.name) == 0) {
        SK_RETURN_IF_ERROR(OneSided(b_, entry.name, entry.kind, LeafChange::kOnlyInB, report));
      }
    }
    for (const LeafDiff& leaf : report.leaves) report.bytes_read += leaf.bytes_read;
    return Status::Ok();
  }

 private:
  static Status OneSided(CheckpointReader& reader, const std::string& name,
                         const std::string& kind, LeafChange change, DiffReport& report) {
    auto add = [&](std::string path, std::string type) {
      LeafDiff leaf{name, std::move(path), change};
      (change == LeafChange::kOnlyInA ? leaf.type_a : leaf.type_b) = std::move(type);
      report.leaves.push_back(std::move(leaf));
    };
    if (kind != "pytree") {
      add("", kind);
      return Status::Ok();
    }
    SK_ASSIGN_OR_RETURN(PytreeInfo tree, reader.Pytree(name));
    for (const LeafInfo& leaf : tree.leaves) add(leaf.path, TypeOf(leaf));
    return Status::Ok();
  }

  Status Values(const std::string& name, const std::string& kind, DiffReport& report) {
    SK_ASSIGN_OR_RETURN(std::string a, a_.ReadValue(name));
    SK_ASSIGN_OR_RETURN(std::string b, b_.ReadValue(name));
    LeafDiff leaf{name, "", a == b ? LeafChange::kIdentical : LeafChange::kDiffers, kind, kind};
    leaf.bytes_read = a.size() + b.size();
    report.leaves.push_back(std::move(leaf));
    return Status::Ok();
  }

  Status Pytrees(const std::string& name, DiffReport& report) {
    SK_ASSIGN_OR_RETURN(PytreeInfo tree_a, a_.Pytree(name));
    SK_ASSIGN_OR_RETURN(PytreeInfo tree_b, b_.Pytree(name));
    for (const LeafInfo& leaf_a : tree_a.leaves) {
      LeafDiff out{name, leaf_a.path, LeafChange::kOnlyInA, TypeOf(leaf_a)};
      if (const LeafInfo* leaf_b = tree_b.Find(leaf_a.path)) {
        out.type_b = TypeOf(*leaf_b);
        SK_RETURN_IF_ERROR(Leaves(name, leaf_a, *leaf_b, out));
      }
      report.leaves.push_back(std::move(out));
    }
    for (const LeafInfo& leaf_b : tree_b.leaves) {
      if (tree_a.Find(leaf_b.path) == nullptr) {
        LeafDiff out{name, leaf_b.path, LeafChange::kOnlyInB};
        out.type_b = TypeOf(leaf_b);
        report.leaves.push_back(std::move(out));
      }
    }
    return Status::Ok();
  }

  Status Leaves(const std::string& name, const LeafInfo& a, const LeafInfo& b, LeafDiff& out) {
    if (out.type_a != out.type_b) {
      out.change = LeafChange::kChangedType;
      return Status::Ok();
    }
    if (a.kind != LeafKind::kArray) {
      out.change = a.value_json == b.value_json ? LeafChange::kIdentical : LeafChange::kDiffers;
      return Status::Ok();
    }
    SK_ASSIGN_OR_RETURN(std::vector<LeafChunk> chunks_a, a_.Chunks(name, a.index));
    SK_ASSIGN_OR_RETURN(std::vector<LeafChunk> chunks_b, b_.Chunks(name, b.index));
    std::map<std::vector<uint64_t>, const LeafChunk*> b_by_origin;
    for (const LeafChunk& chunk : chunks_b) b_by_origin[chunk.box.origin] = &chunk;
    Differences differences;
    for (const LeafChunk& chunk : chunks_a) {
      auto match = b_by_origin.find(chunk.box.origin);
      if (match != b_by_origin.end() && SameStoredBytes(chunk, *match->second)) continue;
      SK_RETURN_IF_ERROR(CompareBox(name, a, b, chunk.box, differences, out.bytes_read));
    }
    differences.Into(out);
    return Status::Ok();
  }

  // Reads `box` of both leaves in their stored dtype and compares it.
  Status CompareBox(const std::string& name, const LeafInfo& a, const LeafInfo& b,
                    const Box& box, Differences& differences, uint64_t& bytes_read) {
    const DType dtype = *a.dtype;
    const uint64_t bytes = box.NumElements() * DTypeSize(dtype);
    std::vector<uint8_t> from_a(bytes), from_b(bytes);
    SK_RETURN_IF_ERROR(a_.Read(name, {{a.index, dtype, box, from_a.data()}}, read_options_));
    SK_RETURN_IF_ERROR(b_.Read(name, {{b.index, dtype, box, from_b.data()}}, read_options_));
    differences.Add(from_a.data(), from_b.data(), dtype, box.NumElements());
    bytes_read += 2 * bytes;
    return Status::Ok();
  }

  CheckpointReader& a_;
  CheckpointReader& b_;
  Options read_options_;
};

}  // namespace

std::string_view LeafChangeName(LeafChange change) {
  switch (change) {
    case LeafChange::kIdentical: return "identical";
    case LeafChange::kDiffers: return "differs";
    case LeafChange::kChangedType: return "changed";
    case LeafChange::kOnlyInA: return "only in A";
    default: return "only in B";
  }
}

bool DiffReport::identical() const {
  for (const LeafDiff& leaf : leaves) {
    if (leaf.change != LeafChange::kIdentical) return false;
  }
  return true;
}

Result<DiffReport> DiffCheckpoints(std::shared_ptr<Storage> a_storage, const std::string& a,
                                   std::shared_ptr<Storage> b_storage, const std::string& b,
                                   const DiffOptions& options) {
  SK_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader_a,
                      CheckpointReader::Open(std::move(a_storage), a));
  SK_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader_b,
                      CheckpointReader::Open(std::move(b_storage), b));
  DiffReport report;
  SK_RETURN_IF_ERROR(Differ(*reader_a, *reader_b, options).Run(report));
  return report;
}

}  // namespace shardkeep
