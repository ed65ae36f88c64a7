#include "testing/versions.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "shardkeep/checkpoint.h"
#include "testing/payloads.h"

namespace shardkeep::testdata {
namespace {

constexpr uint64_t kSide = 4;

Box WholeLeaf() { return Box{{0, 0}, {kSide, kSide}}; }

}  // namespace

Status SaveVersion(std::shared_ptr<Storage> storage, const std::string& path, float version) {
  std::vector<float> values(kSide * kSide);
  for (size_t i = 0; i < values.size(); ++i) values[i] = version + static_cast<float>(i);
  SaveRequest request;
  request.path = path;
  request.force = true;
  CheckpointablePayload part = PytreePayload("state", {{"w", "float32", {kSide, kSide}}});
  part.shards.push_back(
      {0, DType::kFloat32, WholeLeaf(), reinterpret_cast<const uint8_t*>(values.data())});
  request.parts.push_back(std::move(part));
  return Save(std::move(storage), NewSingleProcessCoordinator(), std::move(request), Options());
}

std::optional<float> CommittedVersion(const std::shared_ptr<Storage>& storage,
                                      const std::string& path) {
  auto reader = CheckpointReader::Open(storage, path);
  if (!reader.ok()) return std::nullopt;
  std::vector<float> values(kSide * kSide);
  if (!(*reader)
           ->Read("state",
                  {{0, DType::kFloat32, WholeLeaf(), reinterpret_cast<uint8_t*>(values.data())}},
                  Options())
           .ok()) {
    return std::nullopt;
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != values[0] + static_cast<float>(i)) return std::nullopt;
  }
  return values[0];
}

}  // namespace shardkeep::testdata
