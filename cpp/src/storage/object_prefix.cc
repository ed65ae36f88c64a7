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

std::vector<std::string> ChildNames(const std::string& prefix,
                                    const std::vector<std::string>& keys,
                                    const std::vector<std::string>& common_prefixes) {
  std::vector<std::string> names;
  for (const std::string& key : keys) {
    if (key.size() > prefix.size()) names.push_back(key.substr(prefix.size()));
  }
  for (const std::string& common : common_prefixes) {
    std::string name = common.substr(std::min(prefix.size(), common.size()));
    while (!name.empty() && name.back() == '/') name.pop_back();
    if (!name.empty()) names.push_back(std::move(name));
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

}  // namespace shardkeep
