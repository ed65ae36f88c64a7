#include "storage/s3/s3_location.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <tuple>

#include "testing/status_matchers.h"

namespace shardkeep::s3 {
namespace {

constexpr char kSecret[] = "SECRETwJalrXUtnFEMIK7MDENG";
constexpr char kToken[] = "TOKENAQoDYXdzEPTexample";

// A machine without any AWS configuration, to which a test adds variables
// and files.
class FakeMachine {
 public:
  std::map<std::string, std::string> env = {{"HOME", "/home/u"}};
  std::map<std::string, std::string> files;
  std::set<std::string> unreadable;

  ConfigEnvironment Environment() const {
    ConfigEnvironment environment;
    environment.get_env = [this](const std::string& name) {
      const auto it = env.find(name);
      return it == env.end() ? std::nullopt
                             : std::optional<std::string>(it->second);
    };
    environment.read_file =
        [this](const std::string& path) -> Result<std::optional<std::string>> {
      if (unreadable.count(path) > 0) {
        return StorageError("reading " + path + ": Permission denied");
      }
      const auto it = files.find(path);
      if (it == files.end()) return std::optional<std::string>();
      return std::optional<std::string>(it->second);
    };
    return environment;
  }

  Result<S3Config> Resolve(const S3Overrides& overrides = {},
                           const std::string& bucket = "bucket") const {
    return ResolveS3Config(bucket, overrides, Environment());
  }
};

void ExpectNoSecrets(const std::string& text) {
  EXPECT_EQ(text.find(kSecret), std::string::npos) << text;
  EXPECT_EQ(text.find(kToken), std::string::npos) << text;
}

TEST(ParseS3UrlTest, SplitsBucketAndPrefix) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases =
      {
          {"s3://bucket/a/b/c", "bucket", "a/b/c"},
          {"s3://bucket/a/b/", "bucket", "a/b"},
          {"s3://bucket", "bucket", ""},
          {"s3://bucket/", "bucket", ""},
          {"s3://my.bucket-1/ckpt", "my.bucket-1", "ckpt"},
          {"s3://gcs_bucket/x y/z", "gcs_bucket", "x y/z"},
      };
  for (const auto& [url, bucket, prefix] : cases) {
    SK_ASSERT_OK_AND_ASSIGN(S3Url parsed, ParseS3Url(url));
    EXPECT_EQ(parsed.bucket, bucket) << url;
    EXPECT_EQ(parsed.prefix, prefix) << url;
  }
}

TEST(ParseS3UrlTest, RejectsBadUrlsNamingThem) {
  for (const char* url :
       {"s3:/bucket/x", "gs://bucket/x", "s3://", "s3:///x", "s3://ab/x",
        "s3://Bucket/x", "s3://-bucket/x", "s3://bucket-/x",
        "s3://bu..cket/x", "s3://192.168.1.1/x", "s3://bu$ket/x",
        "s3://bucket//x", "s3://bucket/a//b", "s3://bucket/a/../b",
        "s3://bucket/./b",
        "s3://aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}) {
    const Status status = ParseS3Url(url).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << url;
    EXPECT_NE(status.message().find(std::string("'") + url + "'"),
              std::string::npos)
        << status.ToString();
  }
}

TEST(ResolveS3ConfigTest, EnvironmentCredentialsAndAwsVirtualHosting) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  machine.env["AWS_SESSION_TOKEN"] = kToken;
  machine.env["AWS_DEFAULT_REGION"] = "eu-west-1";
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  EXPECT_EQ(config.credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(config.credentials.secret_access_key, kSecret);
  EXPECT_EQ(config.credentials.session_token, kToken);
  EXPECT_EQ(config.region, "eu-west-1");
  EXPECT_EQ(config.endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_FALSE(config.path_style);

  const S3ObjectAddress object = AddressObject(config, "bucket", "ck/a b");
  EXPECT_EQ(object.base_url, "https://bucket.s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(object.host, "bucket.s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(object.path, "/ck/a b");
  EXPECT_EQ(AddressObject(config, "bucket", "").path, "/");

  machine.env["AWS_REGION"] = "ap-south-1";  // wins over AWS_DEFAULT_REGION
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve());
  EXPECT_EQ(config.region, "ap-south-1");

  // The region becomes part of a host name.
  machine.env["AWS_REGION"] = "evil.com/x";
  const Status status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'evil.com/x'"), std::string::npos)
      << status.ToString();
}

TEST(ResolveS3ConfigTest, DefaultsToUsEast1AndPathStyleForDottedBuckets) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKID";
  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  EXPECT_EQ(config.region, "us-east-1");
  EXPECT_EQ(config.credentials.session_token, "");
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve({}, "my.bucket"));
  EXPECT_TRUE(config.path_style);
  const S3ObjectAddress object = AddressObject(config, "my.bucket", "k");
  EXPECT_EQ(object.base_url, "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(object.path, "/my.bucket/k");
}

TEST(ResolveS3ConfigTest, CustomEndpointsArePathStyleAndS3VariableWins) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKID";
  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  machine.env["AWS_ENDPOINT_URL"] = "http://general:1";
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  EXPECT_EQ(config.endpoint, "http://general:1");

  machine.env["AWS_ENDPOINT_URL_S3"] = "http://127.0.0.1:8333/";
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve());
  EXPECT_EQ(config.endpoint, "http://127.0.0.1:8333");
  EXPECT_TRUE(config.path_style);
  const S3ObjectAddress object = AddressObject(config, "bucket", "ck/_SHARDKEEP");
  EXPECT_EQ(object.base_url, "http://127.0.0.1:8333");
  EXPECT_EQ(object.host, "127.0.0.1:8333");
  EXPECT_EQ(object.path, "/bucket/ck/_SHARDKEEP");
  EXPECT_EQ(AddressObject(config, "bucket", "").path, "/bucket");

  for (const char* bad : {"127.0.0.1:8333", "ftp://h", "http://", "http://h/p",
                          "http://user@h"}) {
    machine.env["AWS_ENDPOINT_URL_S3"] = bad;
    const Status status = machine.Resolve().status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    ExpectNoSecrets(status.ToString());
  }
}

TEST(ResolveS3ConfigTest, ProfilesFromTheSharedFiles) {
  FakeMachine machine;
  machine.files["/home/u/.aws/credentials"] =
      "# comment\n"
      "[default]\n"
      "aws_access_key_id = AKIDDEFAULT\n"
      "aws_secret_access_key = default-secret\n"
      "\n"
      "[work]\n"
      "aws_access_key_id=AKIDWORK\n"
      "aws_secret_access_key = " + std::string(kSecret) + "\n"
      "aws_session_token = " + kToken + "\n";
  machine.files["/home/u/.aws/config"] =
      "[default]\n"
      "region = eu-central-1\n"
      "[profile work]\n"
      "region = us-west-2\n"
      "endpoint_url = https://minio.internal:9000\n"
      "s3 =\n"
      "  addressing_style = virtual\n"
      "[work]\n"
      "region = ignored: config sections of named profiles say 'profile'\n";
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  EXPECT_EQ(config.credentials.access_key_id, "AKIDDEFAULT");
  EXPECT_EQ(config.region, "eu-central-1");
  EXPECT_FALSE(config.path_style);

  machine.env["AWS_PROFILE"] = "work";
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve());
  EXPECT_EQ(config.credentials.access_key_id, "AKIDWORK");
  EXPECT_EQ(config.credentials.secret_access_key, kSecret);
  EXPECT_EQ(config.credentials.session_token, kToken);
  EXPECT_EQ(config.region, "us-west-2");
  EXPECT_EQ(config.endpoint, "https://minio.internal:9000");
  EXPECT_TRUE(config.path_style);

  // The environment's credentials, region and endpoint beat the profile's.
  machine.env["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  machine.env["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  machine.env["AWS_REGION"] = "sa-east-1";
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve());
  EXPECT_EQ(config.credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(config.credentials.session_token, "");  // not mixed with work's
  EXPECT_EQ(config.region, "sa-east-1");
}

TEST(ResolveS3ConfigTest, FileLocationsFollowTheirVariables) {
  FakeMachine machine;
  machine.env["AWS_SHARED_CREDENTIALS_FILE"] = "/etc/creds";
  machine.env["AWS_CONFIG_FILE"] = "/etc/conf";
  machine.files["/home/u/.aws/credentials"] =
      "[default]\naws_access_key_id = AKIDHOME\naws_secret_access_key = s\n";
  machine.files["/etc/creds"] =
      "[default]\naws_access_key_id = AKIDETC\naws_secret_access_key = s\n";
  machine.files["/etc/conf"] = "[default]\nregion = me-south-1\n";
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  EXPECT_EQ(config.credentials.access_key_id, "AKIDETC");
  EXPECT_EQ(config.region, "me-south-1");
}

TEST(ResolveS3ConfigTest, ExplicitOverridesWinOverEverything) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  machine.env["AWS_SECRET_ACCESS_KEY"] = "env-secret";
  machine.env["AWS_REGION"] = "eu-west-1";
  machine.env["AWS_ENDPOINT_URL_S3"] = "http://env:1";
  machine.files["/home/u/.aws/credentials"] =
      "[other]\naws_access_key_id = AKIDOTHER\naws_secret_access_key = o\n";
  S3Overrides overrides;
  overrides.access_key_id = "AKIDOVERRIDE";
  overrides.secret_access_key = kSecret;
  overrides.region = "us-east-2";
  overrides.endpoint_url = "https://store-b:443";
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve(overrides));
  EXPECT_EQ(config.credentials.access_key_id, "AKIDOVERRIDE");
  EXPECT_EQ(config.credentials.secret_access_key, kSecret);
  EXPECT_EQ(config.region, "us-east-2");
  EXPECT_EQ(config.endpoint, "https://store-b:443");

  // An explicit profile beats the environment's credentials, like --profile.
  S3Overrides profile_only;
  profile_only.profile = "other";
  SK_ASSERT_OK_AND_ASSIGN(config, machine.Resolve(profile_only));
  EXPECT_EQ(config.credentials.access_key_id, "AKIDOTHER");
  EXPECT_EQ(config.region, "eu-west-1");  // other settings: still the env's
}

TEST(ResolveS3ConfigTest, MissingOrHalfGivenCredentialsNameTheirSource) {
  FakeMachine machine;
  Status status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("AWS_ACCESS_KEY_ID"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("/home/u/.aws/credentials"),
            std::string::npos)
      << status.ToString();

  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("environment"), std::string::npos)
      << status.ToString();
  EXPECT_NE(status.message().find("no access key id"), std::string::npos)
      << status.ToString();
  ExpectNoSecrets(status.ToString());

  machine.env.erase("AWS_SECRET_ACCESS_KEY");
  machine.files["/home/u/.aws/credentials"] =
      "[default]\naws_access_key_id = AKIDHALF\n";
  status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("profile 'default'"), std::string::npos)
      << status.ToString();

  S3Overrides overrides;
  overrides.secret_access_key = kSecret;
  status = machine.Resolve(overrides).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("explicit options"), std::string::npos)
      << status.ToString();
  ExpectNoSecrets(status.ToString());
}

TEST(ResolveS3ConfigTest, UnknownProfileAndUnreadableFilesAreErrors) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKID";
  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  machine.env["AWS_PROFILE"] = "nosuch";
  Status status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("'nosuch'"), std::string::npos)
      << status.ToString();
  ExpectNoSecrets(status.ToString());

  machine.env["AWS_PROFILE"] = "";  // set but empty: as if unset
  SK_EXPECT_OK(machine.Resolve().status());

  machine.env.erase("AWS_PROFILE");
  machine.unreadable.insert("/home/u/.aws/config");
  status = machine.Resolve().status();
  EXPECT_EQ(status.code(), StatusCode::kStorage);
  EXPECT_NE(status.message().find("/home/u/.aws/config"), std::string::npos)
      << status.ToString();
}

TEST(ResolveS3ConfigTest, ToStringShowsNoSecrets) {
  FakeMachine machine;
  machine.env["AWS_ACCESS_KEY_ID"] = "AKIDSHOWN";
  machine.env["AWS_SECRET_ACCESS_KEY"] = kSecret;
  machine.env["AWS_SESSION_TOKEN"] = kToken;
  SK_ASSERT_OK_AND_ASSIGN(S3Config config, machine.Resolve());
  const std::string text = config.ToString();
  ExpectNoSecrets(text);
  EXPECT_NE(text.find("AKIDSHOWN"), std::string::npos) << text;
  EXPECT_NE(text.find("secret_access_key=<redacted>"), std::string::npos)
      << text;
  EXPECT_NE(text.find("session_token=<redacted>"), std::string::npos) << text;
}

TEST(ProcessConfigEnvironmentTest, ReadsFilesAndReportsMissingOnes) {
  const ConfigEnvironment environment = ProcessConfigEnvironment();
  const std::string path = ::testing::TempDir() + "s3_location_test_config";
  {
    std::ofstream file(path);
    file << "[default]\nregion = x\n";
  }
  SK_ASSERT_OK_AND_ASSIGN(std::optional<std::string> content,
                          environment.read_file(path));
  EXPECT_EQ(content, std::optional<std::string>("[default]\nregion = x\n"));
  std::remove(path.c_str());
  SK_ASSERT_OK_AND_ASSIGN(content, environment.read_file(path));
  EXPECT_FALSE(content.has_value());
  EXPECT_FALSE(environment.get_env("SHARDKEEP_SURELY_UNSET_VARIABLE"));

  // A directory where a file is expected is an error, not an empty file.
  const Status directory = environment.read_file(::testing::TempDir()).status();
  EXPECT_EQ(directory.code(), StatusCode::kStorage);
  EXPECT_NE(directory.message().find(::testing::TempDir()), std::string::npos)
      << directory.ToString();
}

}  // namespace
}  // namespace shardkeep::s3
