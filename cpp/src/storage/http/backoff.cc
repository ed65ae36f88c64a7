#include "storage/http/backoff.h"

#include <algorithm>
#include <cmath>

namespace shardkeep::http {

std::optional<double> BackoffBeforeRetry(
    const BackoffPolicy& policy, int retry, double remaining_s,
    const std::function<double()>& uniform01) {
  // Beyond 2^60 the cap has long taken over; this keeps ldexp finite.
  const int doublings = std::clamp(retry - 1, 0, 60);
  const double ceiling =
      std::min(policy.max_s, std::ldexp(policy.initial_s, doublings));
  const double wait = uniform01() * ceiling;
  if (!(wait < remaining_s)) return std::nullopt;
  return wait;
}

}  // namespace shardkeep::http
