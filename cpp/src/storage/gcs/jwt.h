// JSON Web Tokens signed RS256 (RFC 7519, RFC 7515): the assertion that a
// service account trades at Google's token endpoint for an access token.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "shardkeep/status.h"

struct evp_pkey_st;  // OpenSSL's EVP_PKEY, kept out of this header

namespace shardkeep::gcs {

// An RSA private key, parsed once when a key file is loaded so that a bad
// key is reported then, not at the first request. Copies share the key;
// signing from several threads at once is safe.
class RsaPrivateKey {
 public:
  // The key of an unencrypted PEM block, "PRIVATE KEY" (PKCS #8, what
  // Google's key files hold) or "RSA PRIVATE KEY". InvalidArgument when
  // `pem` is anything else (an encrypted key is refused, never prompted
  // for); the message never quotes the key.
  static Result<RsaPrivateKey> FromPem(std::string_view pem);

  // The RSASSA-PKCS1-v1_5 signature of SHA-256(`data`).
  Result<std::string> SignSha256(std::string_view data) const;

 private:
  explicit RsaPrivateKey(std::shared_ptr<evp_pkey_st> key) : key_(std::move(key)) {}
  std::shared_ptr<evp_pkey_st> key_;
};

// "header.claims.signature", each part base64url without padding, signed
// RS256 over the first two; `header_json` and `claims_json` are sent as
// given.
Result<std::string> SignJwtRs256(const RsaPrivateKey& key,
                                 std::string_view header_json,
                                 std::string_view claims_json);

}  // namespace shardkeep::gcs
