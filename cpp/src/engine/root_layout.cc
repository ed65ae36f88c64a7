// The names a checkpoint root's layout gives its folders (declared in
// shardkeep/checkpoint_root.h): one spelling, which the Python front asks
// for instead of knowing it.

#include <limits>
#include <string>
#include <string_view>

#include "core/decimal.h"
#include "shardkeep/checkpoint_root.h"

namespace shardkeep {

std::string TemporaryFolderOf(const std::string& path) { return path + kTemporarySuffix; }

std::string StepFolderName(int64_t step, int width) {
  std::string digits = std::to_string(step);
  if (width > static_cast<int>(digits.size())) digits.insert(0, width - digits.size(), '0');
  return digits;
}

std::optional<int64_t> StepOfFolderName(std::string_view name) {
  return DecimalValue(name, std::numeric_limits<int64_t>::max());
}

std::string SliceFolderName(int process) {
  // Appended, not "p" + to_string(): GCC 12 warns (-Wrestrict) on that.
  std::string name = "p";
  name += std::to_string(process);
  return name;
}

std::optional<int> SliceOfFolderName(std::string_view name) {
  if (!name.starts_with('p')) return std::nullopt;
  const std::optional<int64_t> process =
      DecimalValue(name.substr(1), std::numeric_limits<int>::max());
  if (!process) return std::nullopt;
  return static_cast<int>(*process);
}

}  // namespace shardkeep
