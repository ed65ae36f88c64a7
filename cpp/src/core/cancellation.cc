#include "shardkeep/cancellation.h"

namespace shardkeep {
namespace {

thread_local CancellationScope* innermost = nullptr;

}  // namespace

CancellationScope::CancellationScope(CancellationToken token)
    : token_(std::move(token)), outer_(innermost) {
  innermost = this;
}

CancellationScope::~CancellationScope() { innermost = outer_; }

CancellationToken CancellationScope::Current() {
  return innermost ? innermost->token_ : CancellationToken();
}

}  // namespace shardkeep
