// How long to wait before retrying a request to a store: the schedule every
// object-store client (S3, GCS) follows, a pure function of the retry's
// number, the time left and a random draw, so schedules test exactly.
#pragma once

#include <functional>
#include <optional>

namespace shardkeep::http {

struct BackoffPolicy {
  double initial_s = 0.05;  // upper bound of the first wait
  double max_s = 5.0;       // no wait exceeds this
};

// The wait before retry number `retry` (1 for the first): "full jitter",
// uniform in [0, min(max_s, initial_s * 2^(retry-1))), drawn from
// `uniform01`, which returns values in [0, 1). Returns nullopt when the
// wait would not end before `remaining_s` (the time left of the caller's
// timeout_s), so the caller gives up and reports the last failure.
std::optional<double> BackoffBeforeRetry(
    const BackoffPolicy& policy, int retry, double remaining_s,
    const std::function<double()>& uniform01);

}  // namespace shardkeep::http
