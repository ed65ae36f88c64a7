#include "storage/gcs/gcs_errors.h"

#include <nlohmann/json.hpp>

#include "format/json_parse.h"

namespace shardkeep::gcs {
namespace {

std::string Describe(const GcsFailure& failure) {
  std::string out = failure.operation + " gs://" + failure.bucket;
  if (!failure.object.empty()) out += "/" + failure.object;
  if (failure.transport != http::Transport::kAnswered) {
    return out + ": " + http::TransportFailureText(failure.transport, failure.transport_detail);
  }
  out += ": HTTP " + std::to_string(failure.http_status);
  if (failure.error) {
    if (!failure.error->reason.empty()) {
      out.append(" ").append(http::Printable(failure.error->reason));
    }
    if (!failure.error->message.empty()) {
      out.append(": ").append(http::Printable(failure.error->message));
    }
  }
  return out;
}

bool ReasonIs(const GcsFailure& failure, std::string_view reason) {
  return failure.error && failure.error->reason == reason;
}

}  // namespace

std::optional<GcsErrorBody> DecodeGcsError(const std::string& body) {
  Result<nlohmann::json> parsed =
      format::ParseJsonObject<nlohmann::json>(body, "GCS error");
  if (!parsed.ok()) return std::nullopt;
  const nlohmann::json* error = nullptr;
  if (auto it = parsed->find("error"); it != parsed->end() && it->is_object()) {
    error = &*it;
  } else {
    return std::nullopt;
  }
  GcsErrorBody out;
  if (auto it = error->find("message"); it != error->end() && it->is_string()) {
    out.message = it->get<std::string>();
  }
  if (auto it = error->find("errors");
      it != error->end() && it->is_array() && !it->empty() && (*it)[0].is_object()) {
    const nlohmann::json& first = (*it)[0];
    if (auto r = first.find("reason"); r != first.end() && r->is_string()) {
      out.reason = r->get<std::string>();
    }
  }
  return out;
}

bool IsRetryable(http::Transport transport, int http_status) {
  if (const std::optional<bool> transient = http::TransientTransport(transport)) {
    return *transient;
  }
  return http_status == 408 || http_status == 429 || (http_status >= 500 && http_status != 501);
}

bool IsRetryable(const GcsFailure& failure) {
  return IsRetryable(failure.transport, failure.http_status);
}

Status ToStatus(const GcsFailure& failure) {
  const std::string what = Describe(failure);
  if (failure.transport != http::Transport::kAnswered) return StorageError(what);
  const int status = failure.http_status;
  const std::string who = failure.principal.empty() ? "anonymous" : failure.principal;
  // GCS says "The specified bucket does not exist." in the message only.
  if (status == 404 && (failure.object.empty() ||
                        (failure.error && failure.error->message.find(
                                              "bucket does not exist") !=
                                              std::string::npos))) {
    // Not "nothing stored here": a manager resuming a run would start from
    // scratch on a mistyped bucket name.
    return InvalidArgumentError(what + "; the bucket '" + failure.bucket +
                                "' does not exist (or " + who +
                                " may not see it): check the URL");
  }
  if (status == 404) return NotFoundError(what);
  if (status == 412) {
    return AlreadyExistsError(what + "; the object exists already (another writer came first)");
  }
  if (status == 401) {
    return InvalidArgumentError(what + "; the credentials of " + who +
                                " were refused: check them, or where they are found "
                                "(docs/GCS.md)");
  }
  if (status == 403) {
    if (ReasonIs(failure, "quotaExceeded") || ReasonIs(failure, "storageQuotaExceeded")) {
      return OutOfSpaceError(what);
    }
    return InvalidArgumentError(what + "; " + who + " lacks permission for " +
                                failure.operation + " on bucket '" + failure.bucket + "'");
  }
  return StorageError(what);
}

}  // namespace shardkeep::gcs
