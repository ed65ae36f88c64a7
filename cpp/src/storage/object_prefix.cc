#include "storage/object_prefix.h"

#include <algorithm>

namespace shardkeep {

ObjectPrefix CheckObjectPrefix(std::string_view prefix) {
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  size_t start = 0;
  while (!prefix.empty() && start <= prefix.size()) {
    const size_t end = std::min(prefix.find('/', start), prefix.size());
    const std::string_view segment = prefix.substr(start, end - start);
    if (segment.empty() || segment == "." || segment == "..") {
      return {std::string(prefix), "the key prefix has an empty, '.' or '..' segment"};
    }
    start = end + 1;
  }
  return {std::string(prefix), ""};
}

std::string ObjectKeyOf(const std::string& path) {
  size_t start = 0;
  while (start < path.size() && path[start] == '/') ++start;
  return path.substr(start);
}

std::string DirectoryPrefix(const std::string& path) {
  std::string key = ObjectKeyOf(path);
  while (!key.empty() && key.back() == '/') key.pop_back();
  return key.empty() ? key : key + "/";
}

}  // namespace shardkeep
