// Base64 (RFC 4648) as object stores use it: standard with padding for
// digests in headers (Content-MD5, x-goog-hash), URL-safe without padding
// for the parts of a JSON Web Token.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shardkeep::http {

std::string Base64Encode(std::string_view bytes);
std::string Base64UrlEncode(std::string_view bytes);  // '-' '_', no '='
// Standard alphabet with padding; nullopt for anything else.
std::optional<std::string> Base64Decode(std::string_view text);

}  // namespace shardkeep::http
