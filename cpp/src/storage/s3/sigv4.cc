#include "storage/s3/sigv4.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <array>
#include <ctime>
#include <map>
#include <optional>

namespace shardkeep::s3 {
namespace {

constexpr std::string_view kAlgorithm = "AWS4-HMAC-SHA256";

using Digest = std::array<unsigned char, 32>;

std::string Hex(const unsigned char* bytes, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * size);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 0xf];
  }
  return out;
}

// Empty when libcrypto fails, which it does only when out of memory.
std::optional<Digest> HmacSha256(std::string_view key, std::string_view data) {
  Digest digest{};
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(),
           digest.data(), &size) == nullptr ||
      size != digest.size()) {
    return std::nullopt;
  }
  return digest;
}

std::string_view AsView(const Digest& digest) {
  return {reinterpret_cast<const char*>(digest.data()), digest.size()};
}

bool HasControlCharacter(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// Trims the value and turns each run of spaces or tabs into one space.
std::string CanonicalHeaderValue(std::string_view value) {
  std::string out;
  bool pending_space = false;
  for (char c : value) {
    if (c == ' ' || c == '\t') {
      pending_space = !out.empty();
      continue;
    }
    if (pending_space) out += ' ';
    pending_space = false;
    out += c;
  }
  return out;
}

bool IsReservedHeader(const std::string& lower_name) {
  return lower_name == "host" || lower_name == "x-amz-date" ||
         lower_name == "x-amz-content-sha256" ||
         lower_name == "x-amz-security-token" ||
         lower_name == "authorization";
}

Status CheckRequest(const HttpRequestToSign& request,
                    const SigningContext& context) {
  if (request.method.empty() || request.host.empty()) {
    return InvalidArgumentError("SigV4: a request needs a method and a host");
  }
  if (HasControlCharacter(request.method) ||
      HasControlCharacter(request.host)) {
    return InvalidArgumentError(
        "SigV4: control character in the method or host of a request to " +
        request.host);
  }
  if (context.credentials.access_key_id.empty() ||
      context.credentials.secret_access_key.empty()) {
    return InvalidArgumentError(
        "SigV4: missing access key id or secret access key for a request to " +
        request.host);
  }
  if (context.region.empty() || context.service.empty()) {
    return InvalidArgumentError("SigV4: missing region or service for " +
                                request.host);
  }
  if (request.payload_sha256.empty() ||
      HasControlCharacter(request.payload_sha256)) {
    return InvalidArgumentError("SigV4: malformed payload hash for a request to " +
                                request.host);
  }
  for (const auto& [name, value] : request.headers) {
    if (name.empty() || HasControlCharacter(name) ||
        HasControlCharacter(value) || name.find(':') != std::string::npos) {
      return InvalidArgumentError("SigV4: malformed header '" + name +
                                  "' in a request to " + request.host);
    }
    if (IsReservedHeader(Lower(name))) {
      return InvalidArgumentError("SigV4: header '" + name +
                                  "' is set by the signer, not the caller");
    }
  }
  return Status::Ok();
}

std::string CanonicalUri(std::string_view path) {
  if (path.empty()) return "/";
  return UriEncode(path, /*keep_slash=*/true);
}

std::string CanonicalQuery(const http::HeaderList& query) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (const auto& [name, value] : query) {
    encoded.emplace_back(UriEncode(name, false), UriEncode(value, false));
  }
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [name, value] : encoded) {
    if (!out.empty()) out += '&';
    out += name;
    out += '=';
    out += value;
  }
  return out;
}

// Date stamps of the request time: "20130524T000000Z" and "20130524".
std::pair<std::string, std::string> AmzDate(
    std::chrono::system_clock::time_point time) {
  const std::time_t seconds = std::chrono::system_clock::to_time_t(time);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buffer[17];
  std::strftime(buffer, sizeof(buffer), "%Y%m%dT%H%M%SZ", &utc);
  const std::string full(buffer);
  return {full, full.substr(0, 8)};
}

Result<SigV4Signature> Sign(const HttpRequestToSign& request,
                            const SigningContext& context,
                            bool add_content_sha256) {
  SK_RETURN_IF_ERROR(CheckRequest(request, context));
  const auto [amz_date, date_stamp] = AmzDate(context.time);

  http::HeaderList headers_to_add = {{"x-amz-date", amz_date}};
  if (add_content_sha256) {
    headers_to_add.emplace_back("x-amz-content-sha256",
                                request.payload_sha256);
  }
  if (!context.credentials.session_token.empty()) {
    headers_to_add.emplace_back("x-amz-security-token",
                                context.credentials.session_token);
  }

  // Sorted by lower-case name; repeated names keep their order of arrival.
  std::map<std::string, std::vector<std::string>> canonical_headers;
  canonical_headers["host"].push_back(CanonicalHeaderValue(request.host));
  for (const http::HeaderList* list :
       {&request.headers, static_cast<const http::HeaderList*>(&headers_to_add)}) {
    for (const auto& [name, value] : *list) {
      canonical_headers[Lower(name)].push_back(CanonicalHeaderValue(value));
    }
  }
  std::string header_lines;
  std::string signed_headers;
  for (const auto& [name, values] : canonical_headers) {
    header_lines += name + ':';
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) header_lines += ',';
      header_lines += values[i];
    }
    header_lines += '\n';
    if (!signed_headers.empty()) signed_headers += ';';
    signed_headers += name;
  }

  SigV4Signature result;
  result.canonical_request = request.method + '\n' +
                             CanonicalUri(request.path) + '\n' +
                             CanonicalQuery(request.query) + '\n' +
                             header_lines + '\n' + signed_headers + '\n' +
                             request.payload_sha256;
  const std::string scope = date_stamp + '/' + context.region + '/' +
                            context.service + "/aws4_request";
  result.string_to_sign = std::string(kAlgorithm) + '\n' + amz_date + '\n' +
                          scope + '\n' +
                          Sha256Hex(result.canonical_request);

  // The signing key, then the signature: an HMAC chain starting from the
  // secret.
  std::optional<Digest> digest =
      HmacSha256("AWS4" + context.credentials.secret_access_key, date_stamp);
  for (const std::string_view step :
       {std::string_view(context.region), std::string_view(context.service),
        std::string_view("aws4_request"),
        std::string_view(result.string_to_sign)}) {
    if (!digest) break;
    digest = HmacSha256(AsView(*digest), step);
  }
  if (!digest) {
    return ResourceExhaustedError(
        "SigV4: libcrypto could not compute an HMAC-SHA256 for a request to " +
        request.host);
  }
  const Digest& signature = *digest;
  result.signature = Hex(signature.data(), signature.size());

  headers_to_add.emplace_back(
      "authorization", std::string(kAlgorithm) +
                           " Credential=" + context.credentials.access_key_id +
                           '/' + scope + ", SignedHeaders=" + signed_headers +
                           ", Signature=" + result.signature);
  result.headers_to_add = std::move(headers_to_add);
  return result;
}

}  // namespace

std::string UriEncode(std::string_view text, bool keep_slash) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    const bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                            (c >= '0' && c <= '9') || c == '-' || c == '.' ||
                            c == '_' || c == '~' || (keep_slash && c == '/');
    if (unreserved) {
      out += c;
    } else {
      out += '%';
      out += kDigits[u >> 4];
      out += kDigits[u & 0xf];
    }
  }
  return out;
}

std::string Sha256Hex(std::string_view data) {
  // A digest of memory fails only when libcrypto cannot allocate; the
  // zero digest left then makes the server reject the request.
  Digest digest{};
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest.data(), &size, EVP_sha256(),
             nullptr);
  return Hex(digest.data(), digest.size());
}

Result<SigV4Signature> SignRequest(const HttpRequestToSign& request,
                                   const SigningContext& context) {
  return Sign(request, context, /*add_content_sha256=*/false);
}

Result<SigV4Signature> SignS3Request(const HttpRequestToSign& request,
                                     const SigningContext& context) {
  return Sign(request, context, /*add_content_sha256=*/true);
}

}  // namespace shardkeep::s3
