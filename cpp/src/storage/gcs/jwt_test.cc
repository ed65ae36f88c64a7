#include "storage/gcs/jwt.h"

#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <algorithm>
#include <memory>

#include "storage/http/base64.h"
#include "testing/status_matchers.h"

namespace shardkeep::gcs {
namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;

KeyPtr GenerateKey(int type, int rsa_bits = 2048) {
  EVP_PKEY* key = nullptr;
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> context(
      EVP_PKEY_CTX_new_id(type, nullptr), &EVP_PKEY_CTX_free);
  EXPECT_EQ(EVP_PKEY_keygen_init(context.get()), 1);
  if (type == EVP_PKEY_RSA) {
    EXPECT_EQ(EVP_PKEY_CTX_set_rsa_keygen_bits(context.get(), rsa_bits), 1);
  }
  EXPECT_EQ(EVP_PKEY_keygen(context.get(), &key), 1);
  return KeyPtr(key, &EVP_PKEY_free);
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  return std::string(data, static_cast<size_t>(size));
}

// PKCS #8 ("BEGIN PRIVATE KEY"), optionally encrypted under `passphrase`.
std::string Pkcs8Pem(EVP_PKEY* key, const char* passphrase = nullptr) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  EXPECT_EQ(PEM_write_bio_PKCS8PrivateKey(
                bio.get(), key, passphrase ? EVP_aes_128_cbc() : nullptr,
                const_cast<char*>(passphrase), passphrase ? 4 : 0, nullptr, nullptr),
            1);
  return BioText(bio.get());
}

std::string UrlDecode(std::string text) {
  std::replace(text.begin(), text.end(), '-', '+');
  std::replace(text.begin(), text.end(), '_', '/');
  while (text.size() % 4 != 0) text += '=';
  return http::Base64Decode(text).value_or("<not base64>");
}

bool VerifyRs256(EVP_PKEY* key, const std::string& signed_part, const std::string& signature) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(),
                                                                  &EVP_MD_CTX_free);
  return EVP_DigestVerifyInit(context.get(), nullptr, EVP_sha256(), nullptr, key) == 1 &&
         EVP_DigestVerify(context.get(),
                          reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(),
                          reinterpret_cast<const unsigned char*>(signed_part.data()),
                          signed_part.size()) == 1;
}

TEST(GcsJwtTest, SignsAJwtThatThePublicKeyVerifies) {
  KeyPtr key = GenerateKey(EVP_PKEY_RSA);
  SK_ASSERT_OK_AND_ASSIGN(RsaPrivateKey private_key, RsaPrivateKey::FromPem(Pkcs8Pem(key.get())));
  const std::string header = R"({"alg":"RS256","typ":"JWT"})";
  const std::string claims = R"({"iss":"a@b","n":"\u00e9?>"})";
  SK_ASSERT_OK_AND_ASSIGN(std::string jwt, SignJwtRs256(private_key, header, claims));
  const size_t first = jwt.find('.');
  const size_t second = jwt.find('.', first + 1);
  ASSERT_NE(second, std::string::npos);
  EXPECT_EQ(jwt.find_first_of("+/="), std::string::npos);
  EXPECT_EQ(UrlDecode(jwt.substr(0, first)), header);
  EXPECT_EQ(UrlDecode(jwt.substr(first + 1, second - first - 1)), claims);
  const std::string signature = UrlDecode(jwt.substr(second + 1));
  EXPECT_EQ(signature.size(), 256u);
  EXPECT_TRUE(VerifyRs256(key.get(), jwt.substr(0, second), signature));
  EXPECT_FALSE(VerifyRs256(key.get(), jwt.substr(0, second) + "x", signature));
}

TEST(GcsJwtTest, ReadsTraditionalRsaPem) {
  KeyPtr key = GenerateKey(EVP_PKEY_RSA);
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), &BIO_free);
  ASSERT_EQ(PEM_write_bio_PrivateKey_traditional(bio.get(), key.get(), nullptr, nullptr, 0,
                                                 nullptr, nullptr),
            1);
  const std::string pem = BioText(bio.get());
  ASSERT_NE(pem.find("BEGIN RSA PRIVATE KEY"), std::string::npos);
  SK_EXPECT_OK(RsaPrivateKey::FromPem(pem).status());
}

TEST(GcsJwtTest, RefusesWhatIsNotAnUnencryptedRsaKey) {
  for (const std::string& pem :
       {std::string(), std::string("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC"),
        std::string("-----BEGIN PRIVATE KEY-----\nnot base64!\n-----END PRIVATE KEY-----\n")}) {
    const Status status = RsaPrivateKey::FromPem(pem).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  }
  // An Ed25519 key signs EdDSA, not RS256.
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> context(
      EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr), &EVP_PKEY_CTX_free);
  EVP_PKEY* ed = nullptr;
  ASSERT_EQ(EVP_PKEY_keygen_init(context.get()), 1);
  ASSERT_EQ(EVP_PKEY_keygen(context.get(), &ed), 1);
  KeyPtr ed_key(ed, &EVP_PKEY_free);
  const Status not_rsa = RsaPrivateKey::FromPem(Pkcs8Pem(ed_key.get())).status();
  EXPECT_EQ(not_rsa.code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(testing::Has(not_rsa.message(), "not an RSA private key"));
  // Encrypted: refused without asking for a passphrase.
  KeyPtr rsa = GenerateKey(EVP_PKEY_RSA);
  const std::string encrypted = Pkcs8Pem(rsa.get(), "pass");
  ASSERT_NE(encrypted.find("ENCRYPTED"), std::string::npos);
  const Status locked = RsaPrivateKey::FromPem(encrypted).status();
  EXPECT_EQ(locked.code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(testing::Has(locked.message(), "MII"));
}

}  // namespace
}  // namespace shardkeep::gcs
