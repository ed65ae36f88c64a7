#include "engine/tiling.h"

#include <algorithm>
#include <numeric>

namespace shardkeep::internal {
namespace {

bool Overlap(const Box& a, const Box& b) {
  for (size_t d = 0; d < a.rank(); ++d) {
    if (a.origin[d] >= b.origin[d] + b.shape[d] ||
        b.origin[d] >= a.origin[d] + a.shape[d]) {
      return false;
    }
  }
  return true;
}

// The dimension along which the boxes' origins take the most values: the
// sweep along it keeps the fewest boxes open at once.
size_t SweepDimension(size_t rank, const std::vector<const Box*>& boxes) {
  size_t best = 0, best_count = 0;
  std::vector<uint64_t> origins(boxes.size());
  for (size_t d = 0; d < rank; ++d) {
    for (size_t i = 0; i < boxes.size(); ++i) origins[i] = boxes[i]->origin[d];
    std::sort(origins.begin(), origins.end());
    const size_t count = std::unique(origins.begin(), origins.end()) - origins.begin();
    if (count > best_count) best = d, best_count = count;
  }
  return best;
}

}  // namespace

std::optional<TilingFault> FindTilingFault(const std::vector<uint64_t>& shape,
                                           const std::vector<const Box*>& boxes,
                                           size_t* most_open) {
  const uint64_t total = Box{std::vector<uint64_t>(shape.size(), 0), shape}.NumElements();
  // Empty boxes cover nothing and overlap nothing.
  std::vector<size_t> order;
  for (size_t i = 0; i < boxes.size(); ++i) {
    if (boxes[i]->NumElements() != 0) order.push_back(i);
  }
  const size_t dim = SweepDimension(shape.size(), boxes);
  // A rank-0 leaf has one element; every non-empty box is all of it.
  auto origin = [&](size_t i) { return shape.empty() ? 0 : boxes[i]->origin[dim]; };
  auto end = [&](size_t i) {
    return shape.empty() ? 1 : boxes[i]->origin[dim] + boxes[i]->shape[dim];
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return origin(a) < origin(b); });
  std::vector<size_t> open;  // boxes whose extent along `dim` is not yet passed
  // Disjoint boxes inside the shape hold at most `total` elements, so the
  // sum cannot overflow before an overlap is found.
  uint64_t covered = 0;
  if (most_open != nullptr) *most_open = 0;
  for (size_t i : order) {
    std::erase_if(open, [&](size_t j) { return end(j) <= origin(i); });
    for (size_t j : open) {
      if (Overlap(*boxes[i], *boxes[j])) {
        return TilingFault{std::make_pair(std::min(i, j), std::max(i, j)), 0, total};
      }
    }
    open.push_back(i);
    if (most_open != nullptr) *most_open = std::max(*most_open, open.size());
    covered += boxes[i]->NumElements();
  }
  if (covered != total) return TilingFault{std::nullopt, covered, total};
  return std::nullopt;
}

}  // namespace shardkeep::internal
