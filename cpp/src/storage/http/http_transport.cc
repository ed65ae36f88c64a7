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

std::optional<bool> TransientTransport(Transport transport) {
  switch (transport) {
    case Transport::kConnectFailed:
    case Transport::kConnectionReset:
    case Transport::kTimedOut:
      return true;
    case Transport::kResolveFailed:
    case Transport::kTlsFailed:
      return false;
    case Transport::kAnswered:
      break;
  }
  return std::nullopt;
}

std::string Printable(std::string_view text) {
  constexpr size_t kMax = 256;
  std::string out(text.substr(0, kMax));
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  if (text.size() > kMax) out += "...";
  return out;
}

std::optional<std::string> FindHeader(const HttpResponse& response,
                                      std::string_view name) {
  for (const auto& [key, value] : response.headers) {
    if (key == name) return value;
  }
  return std::nullopt;
}

}  // namespace shardkeep::http
