#include "storage/gcs/jwt.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "storage/http/base64.h"

namespace shardkeep::gcs {
namespace {

// An encrypted key would otherwise make OpenSSL ask for its passphrase on
// the terminal; refusing it ends the read with an error instead.
int NoPassphrase(char*, int, int, void*) { return 0; }

// Failures leave entries in OpenSSL's per-thread error queue, where the
// next unrelated OpenSSL call on this thread could mistake them for its own.
Status ClearedError(Status status) {
  ERR_clear_error();
  return status;
}

}  // namespace

Result<RsaPrivateKey> RsaPrivateKey::FromPem(std::string_view pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  if (bio == nullptr) return ClearedError(InternalError("BIO_new_mem_buf failed"));
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr);
  if (key == nullptr) {
    return ClearedError(InvalidArgumentError(
        "not an unencrypted PEM private key (\"-----BEGIN PRIVATE KEY-----\")"));
  }
  std::shared_ptr<evp_pkey_st> owned(key, &EVP_PKEY_free);
  if (EVP_PKEY_base_id(key) != EVP_PKEY_RSA) {
    return InvalidArgumentError("not an RSA private key (RS256 needs one)");
  }
  return RsaPrivateKey(std::move(owned));
}

Result<std::string> RsaPrivateKey::SignSha256(std::string_view data) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  size_t length = 0;
  if (context == nullptr ||
      EVP_DigestSignInit(context.get(), nullptr, EVP_sha256(), nullptr, key_.get()) != 1 ||
      EVP_DigestSign(context.get(), nullptr, &length,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1) {
    return ClearedError(InternalError("RS256 signing failed to start"));
  }
  std::string signature(length, '\0');
  if (EVP_DigestSign(context.get(), reinterpret_cast<unsigned char*>(signature.data()),
                     &length, reinterpret_cast<const unsigned char*>(data.data()),
                     data.size()) != 1) {
    return ClearedError(InternalError("RS256 signing failed"));
  }
  signature.resize(length);
  return signature;
}

Result<std::string> SignJwtRs256(const RsaPrivateKey& key, std::string_view header_json,
                                 std::string_view claims_json) {
  std::string signed_part =
      http::Base64UrlEncode(header_json) + "." + http::Base64UrlEncode(claims_json);
  SK_ASSIGN_OR_RETURN(std::string signature, key.SignSha256(signed_part));
  return signed_part + "." + http::Base64UrlEncode(signature);
}

}  // namespace shardkeep::gcs
