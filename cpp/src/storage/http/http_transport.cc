#include "storage/http/http_transport.h"

namespace shardkeep::http {

const char* TransportName(Transport transport) {
  switch (transport) {
    case Transport::kAnswered: return "answered";
    case Transport::kConnectFailed: return "could not connect";
    case Transport::kConnectionReset: return "connection reset";
    case Transport::kTimedOut: return "timed out";
    case Transport::kResolveFailed: return "host name does not resolve";
    case Transport::kTlsFailed: return "TLS handshake failed";
  }
  return "unknown transport failure";
}

std::optional<std::string> FindHeader(const HttpResponse& response,
                                      std::string_view name) {
  for (const auto& [key, value] : response.headers) {
    if (key == name) return value;
  }
  return std::nullopt;
}

}  // namespace shardkeep::http
