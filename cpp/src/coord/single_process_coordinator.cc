// The coordinator of a job with one process: barriers are immediate and the
// key-value store is a local map.
#include <map>
#include <mutex>

#include "shardkeep/coordinator.h"

namespace shardkeep {
namespace {

class SingleProcessCoordinator final : public Coordinator {
 public:
  int process_index() const override { return 0; }
  int process_count() const override { return 1; }
  Status Barrier(const std::string&, double) override { return Status::Ok(); }
  Status KeyValueSet(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!values_.emplace(key, value).second) {
      return AlreadyExistsError("key '" + key + "' is already set");
    }
    return Status::Ok();
  }
  Result<std::string> KeyValueGet(const std::string& key, double) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    // Nobody else could ever set it, so waiting would only delay the error.
    if (it == values_.end()) return TimeoutError("key '" + key + "' was never set");
    return it->second;
  }
  Result<std::optional<std::string>> KeyValueTryGet(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return std::optional<std::string>();
    return std::optional<std::string>(it->second);
  }
  Result<std::vector<std::string>> KeyValueList(const std::string& prefix) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> keys;
    for (auto it = values_.lower_bound(prefix);
         it != values_.end() && it->first.starts_with(prefix); ++it) {
      keys.push_back(it->first);
    }
    return keys;
  }
  Status KeyValueDelete(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    values_.erase(key);
    return Status::Ok();
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> values_;
};

}  // namespace

std::shared_ptr<Coordinator> NewSingleProcessCoordinator() {
  return std::make_shared<SingleProcessCoordinator>();
}

}  // namespace shardkeep
