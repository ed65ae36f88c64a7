// A coordinator that forwards to functions given at construction; the
// Python front bridges these to JAX's coordination service.
#include "shardkeep/coordinator.h"

namespace shardkeep {
namespace {

class CallbackCoordinator final : public Coordinator {
 public:
  CallbackCoordinator(int process_index, int process_count,
                      CoordinatorFunctions functions)
      : process_index_(process_index),
        process_count_(process_count),
        functions_(std::move(functions)) {}

  int process_index() const override { return process_index_; }
  int process_count() const override { return process_count_; }
  Status Barrier(const std::string& key, double timeout_s) override {
    return functions_.barrier(key, timeout_s);
  }
  Status KeyValueSet(const std::string& key, const std::string& value) override {
    return functions_.set(key, value);
  }
  Result<std::string> KeyValueGet(const std::string& key, double timeout_s) override {
    return functions_.get(key, timeout_s);
  }
  Result<std::optional<std::string>> KeyValueTryGet(const std::string& key) override {
    return functions_.try_get(key);
  }
  Result<std::vector<std::string>> KeyValueList(const std::string& prefix) override {
    return functions_.list(prefix);
  }
  Status KeyValueDelete(const std::string& key) override { return functions_.remove(key); }

 private:
  const int process_index_;
  const int process_count_;
  const CoordinatorFunctions functions_;
};

}  // namespace

std::shared_ptr<Coordinator> NewCallbackCoordinator(int process_index,
                                                    int process_count,
                                                    CoordinatorFunctions functions) {
  return std::make_shared<CallbackCoordinator>(process_index, process_count,
                                               std::move(functions));
}

}  // namespace shardkeep
