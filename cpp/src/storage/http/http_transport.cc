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

std::string TransportFailureText(Transport transport, const std::string& detail) {
  std::string out = TransportName(transport);
  if (!detail.empty()) out.append(": ").append(Printable(detail));
  return out;
}

Status CheckRangedRead(const HttpResponse& response, const std::string& url,
                       uint64_t offset, uint64_t size) {
  const bool whole_object = response.status == 200 && offset == 0;
  if (response.status != 416 && (response.status == 206 || whole_object) &&
      response.dst_bytes == size) {
    return Status::Ok();
  }
  return CorruptionError(url + ": reading " + std::to_string(size) + " bytes at offset " +
                         std::to_string(offset) + " got " +
                         (response.status == 416
                              ? std::string("none (it ends before)")
                              : std::to_string(response.dst_bytes) + " (HTTP " +
                                    std::to_string(response.status) + ")"));
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
