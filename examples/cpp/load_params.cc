// Loads the parameters of a checkpoint written by Python and computes
// something from them, with the C++ API alone (no Python, no JAX):
//
//   load_params CKPT [CHECKPOINTABLE [PREFIX]]
//
// CKPT is a local path or an s3:// URL. CHECKPOINTABLE is the pytree to
// read: by default "params" when the checkpoint has one (what a
// CheckpointManager save of {"params": ..., "opt_state": ...} writes, as in
// examples/demo), else "state" (what shardkeep.save writes). PREFIX keeps
// only the leaves whose key path starts with it ("params/" within "state").
//
// For every leaf it prints one tab-separated line:
//   array   PATH  DTYPE  SHAPE  elements=N  l2=L2  sum=SUM
//   scalar  PATH  DTYPE  VALUE           (bool/int/float leaves)
//   string  PATH  "VALUE"
//   none    PATH
// and at the end `total<TAB>parameters=N<TAB>arrays=M`. Floating leaves are
// read cast to float32, integer leaves cast to int64; the norms and sums
// are accumulated in double. Leaves of other dtypes (bool, int4, float8,
// complex) are counted but have no l2/sum ("l2=-").
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "shardkeep/checkpoint.h"
#include "shardkeep/contents.h"
#include "shardkeep/storage.h"

namespace {

using shardkeep::DType;

std::string ShapeString(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

uint64_t ElementCount(const std::vector<uint64_t>& shape) {
  uint64_t count = 1;
  for (uint64_t extent : shape) count *= extent;
  return count;
}

struct Stats {
  double l2 = 0;
  double sum = 0;
};

// Reads a whole leaf in `as` (float32 or int64: the reader casts) and
// accumulates its squares and sum.
template <typename T>
shardkeep::Status Accumulate(shardkeep::CheckpointReader& reader, const std::string& name,
                             const shardkeep::LeafInfo& leaf, DType as, Stats& stats) {
  std::vector<T> values(ElementCount(leaf.shape));
  shardkeep::Options options;
  // Statistics do not need every bit: float64 and int64 leaves may be
  // narrowed to float32.
  options.allow_lossy_cast = true;
  shardkeep::Status read = reader.ReadLeaf(name, leaf.path, as, values.data(), options);
  if (!read.ok()) return read;
  double squares = 0;
  for (T v : values) {
    const double x = static_cast<double>(v);
    squares += x * x;
    stats.sum += x;
  }
  stats.l2 = std::sqrt(squares);
  return shardkeep::Status::Ok();
}

int Fail(const shardkeep::Status& status) {
  std::fprintf(stderr, "load_params: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: load_params CKPT [CHECKPOINTABLE [PREFIX]]\n");
    return 2;
  }
  // A local path or an s3:// URL (credentials and endpoint from the
  // environment, as the AWS tools read them).
  auto where = shardkeep::ResolveStorage(argv[1]);
  if (!where.ok()) return Fail(where.status());
  auto reader = shardkeep::CheckpointReader::Open(where->storage, where->path);
  if (!reader.ok()) return Fail(reader.status());

  std::string name = argc > 2 ? argv[2] : "state";
  if (argc <= 2) {
    for (const shardkeep::CheckpointableInfo& part : (*reader)->Info().checkpointables) {
      if (part.name == "params") name = "params";
    }
  }
  const std::string prefix = argc > 3 ? argv[3] : "";

  // The tree's leaves by key path, with dtypes and shapes; this also
  // proves that every array leaf's stored chunks tile it.
  auto tree = (*reader)->Pytree(name);
  if (!tree.ok()) return Fail(tree.status());

  uint64_t parameters = 0, arrays = 0;
  for (const shardkeep::LeafInfo& leaf : tree->leaves) {
    if (leaf.path.compare(0, prefix.size(), prefix) != 0) continue;
    const char* path = leaf.path.c_str();
    switch (leaf.kind) {
      case shardkeep::LeafKind::kScalar:
        std::printf("scalar\t%s\t%s\t%s\n", path,
                    std::string(shardkeep::DTypeName(*leaf.dtype)).c_str(),
                    leaf.value_json.c_str());
        continue;
      case shardkeep::LeafKind::kString:
        std::printf("string\t%s\t%s\n", path, leaf.value_json.c_str());
        continue;
      case shardkeep::LeafKind::kNone:
        std::printf("none\t%s\n", path);
        continue;
      case shardkeep::LeafKind::kArray:
        break;
    }
    const DType dtype = *leaf.dtype;
    Stats stats;
    bool computed = true;
    shardkeep::Status read;
    if (shardkeep::IsCastableFloat(dtype)) {
      read = Accumulate<float>(**reader, name, leaf, DType::kFloat32, stats);
    } else if (shardkeep::IsInteger(dtype)) {
      read = Accumulate<int64_t>(**reader, name, leaf, DType::kInt64, stats);
    } else {
      computed = false;
    }
    if (!read.ok()) return Fail(read);
    const uint64_t elements = ElementCount(leaf.shape);
    parameters += elements;
    ++arrays;
    std::printf("array\t%s\t%s\t%s\telements=%" PRIu64, path,
                std::string(shardkeep::DTypeName(dtype)).c_str(),
                ShapeString(leaf.shape).c_str(), elements);
    if (computed) {
      std::printf("\tl2=%.17g\tsum=%.17g\n", stats.l2, stats.sum);
    } else {
      std::printf("\tl2=-\tsum=-\n");
    }
  }
  std::printf("total\tparameters=%" PRIu64 "\tarrays=%" PRIu64 "\n", parameters, arrays);
  return 0;
}
