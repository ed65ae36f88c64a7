#include "storage/s3/s3_location.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>

#include "storage/object_prefix.h"

namespace shardkeep::s3 {
namespace {

using IniFile = std::map<std::string, std::map<std::string, std::string>>;

std::string_view Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

// The AWS shared files are INI: "[section]" lines, "key = value" lines,
// comments from '#' or ';' at the start of a line. Indented lines belong
// to nested settings ("s3 =" followed by "  addressing_style = path"),
// which shardkeep does not use.
IniFile ParseIni(std::string_view content) {
  IniFile ini;
  std::string section;
  std::istringstream lines{std::string(content)};
  for (std::string raw; std::getline(lines, raw);) {
    if (!raw.empty() && (raw[0] == ' ' || raw[0] == '\t')) continue;
    const std::string_view line = Trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = std::string(Trim(line.substr(1, line.size() - 2)));
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos || section.empty()) continue;
    ini[section][std::string(Trim(line.substr(0, equals)))] =
        std::string(Trim(line.substr(equals + 1)));
  }
  return ini;
}

bool IsLowerAlnum(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
}

bool LooksLikeIpv4(std::string_view name) {
  int dots = 0;
  for (char c : name) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots == 3;
}

// Empty when `bucket` is a valid name, else the rule it breaks.
std::string BucketNameProblem(std::string_view bucket) {
  if (bucket.size() < 3 || bucket.size() > 63) {
    return "a bucket name has 3 to 63 characters";
  }
  for (char c : bucket) {
    if (!IsLowerAlnum(c) && c != '.' && c != '-' && c != '_') {
      return "a bucket name holds only a-z, 0-9, '.', '-' and '_'";
    }
  }
  if (!IsLowerAlnum(bucket.front()) || !IsLowerAlnum(bucket.back())) {
    return "a bucket name starts and ends with a letter or digit";
  }
  if (bucket.find("..") != std::string_view::npos) {
    return "a bucket name has no '..'";
  }
  if (LooksLikeIpv4(bucket)) return "a bucket name is not an IP address";
  return "";
}

// A value from the highest-precedence source that has one.
std::optional<std::string> FirstOf(
    std::initializer_list<std::optional<std::string>> candidates) {
  for (const auto& candidate : candidates) {
    if (candidate.has_value() && !candidate->empty()) return candidate;
  }
  return std::nullopt;
}

std::optional<std::string> Lookup(const IniFile& ini,
                                  const std::string& section,
                                  const std::string& key) {
  const auto s = ini.find(section);
  if (s == ini.end()) return std::nullopt;
  const auto k = s->second.find(key);
  if (k == s->second.end()) return std::nullopt;
  return k->second;
}

// A profile's settings from both shared files. The credentials file wins
// for credentials, as in the AWS CLI.
struct Profile {
  std::string name;
  std::string credentials_path;
  std::string config_path;
  IniFile credentials;
  IniFile config;
  bool found = false;

  std::optional<std::string> Get(const std::string& key) const {
    const std::string config_section =
        name == "default" ? name : "profile " + name;
    return FirstOf({Lookup(credentials, name, key),
                    Lookup(config, config_section, key)});
  }
};

Result<IniFile> ReadIni(const ConfigEnvironment& environment,
                        const std::string& path) {
  if (path.empty()) return IniFile{};
  SK_ASSIGN_OR_RETURN(std::optional<std::string> content,
                      environment.read_file(path));
  if (!content.has_value()) return IniFile{};
  return ParseIni(*content);
}

Result<Profile> LoadProfile(const S3Overrides& overrides,
                            const ConfigEnvironment& environment) {
  Profile profile;
  profile.name = FirstOf({overrides.profile, environment.get_env("AWS_PROFILE"),
                          std::string("default")})
                     .value();
  const std::optional<std::string> home = environment.get_env("HOME");
  const std::string aws_dir = home ? *home + "/.aws/" : "";
  profile.credentials_path =
      FirstOf({environment.get_env("AWS_SHARED_CREDENTIALS_FILE"),
               home ? std::optional(aws_dir + "credentials") : std::nullopt})
          .value_or("");
  profile.config_path =
      FirstOf({environment.get_env("AWS_CONFIG_FILE"),
               home ? std::optional(aws_dir + "config") : std::nullopt})
          .value_or("");
  SK_ASSIGN_OR_RETURN(profile.credentials,
                      ReadIni(environment, profile.credentials_path));
  SK_ASSIGN_OR_RETURN(profile.config, ReadIni(environment, profile.config_path));
  profile.found =
      profile.credentials.count(profile.name) > 0 ||
      profile.config.count(profile.name == "default"
                               ? profile.name
                               : "profile " + profile.name) > 0;
  return profile;
}

std::string ProfileSource(const Profile& profile) {
  return "profile '" + profile.name + "' (" + profile.credentials_path +
         ", " + profile.config_path + ")";
}

// Key id and secret, both or neither; a key id without a secret is an
// error naming where it came from.
Result<std::optional<AwsCredentials>> CredentialsFrom(
    const std::string& source, std::optional<std::string> key_id,
    std::optional<std::string> secret, std::optional<std::string> token) {
  const bool has_key = key_id.has_value() && !key_id->empty();
  const bool has_secret = secret.has_value() && !secret->empty();
  if (!has_key && !has_secret) return std::optional<AwsCredentials>();
  if (has_key != has_secret) {
    return InvalidArgumentError(
        std::string("S3 credentials from ") + source + " have " +
        (has_key ? "an access key id but no secret access key"
                 : "a secret access key but no access key id"));
  }
  return std::optional<AwsCredentials>(
      AwsCredentials{*key_id, *secret, token.value_or("")});
}

Result<AwsCredentials> ResolveCredentials(const S3Overrides& overrides,
                                          const ConfigEnvironment& environment,
                                          const Profile& profile) {
  SK_ASSIGN_OR_RETURN(
      std::optional<AwsCredentials> from_overrides,
      CredentialsFrom("the explicit options", overrides.access_key_id,
                      overrides.secret_access_key, overrides.session_token));
  if (from_overrides) return *from_overrides;
  if (!overrides.profile.has_value()) {
    SK_ASSIGN_OR_RETURN(
        std::optional<AwsCredentials> from_environment,
        CredentialsFrom("the environment (AWS_ACCESS_KEY_ID, "
                        "AWS_SECRET_ACCESS_KEY)",
                        environment.get_env("AWS_ACCESS_KEY_ID"),
                        environment.get_env("AWS_SECRET_ACCESS_KEY"),
                        environment.get_env("AWS_SESSION_TOKEN")));
    if (from_environment) return *from_environment;
  }
  SK_ASSIGN_OR_RETURN(
      std::optional<AwsCredentials> from_profile,
      CredentialsFrom(ProfileSource(profile),
                      profile.Get("aws_access_key_id"),
                      profile.Get("aws_secret_access_key"),
                      profile.Get("aws_session_token")));
  if (from_profile) return *from_profile;
  return InvalidArgumentError(
      "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
      "or aws_access_key_id and aws_secret_access_key in " +
      ProfileSource(profile));
}

// "http(s)://host[:port]" with any trailing '/' removed.
Result<std::string> NormaliseEndpoint(std::string endpoint) {
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  const size_t scheme_end = endpoint.find("://");
  const std::string scheme =
      scheme_end == std::string::npos ? "" : endpoint.substr(0, scheme_end);
  const std::string host =
      scheme_end == std::string::npos ? "" : endpoint.substr(scheme_end + 3);
  if ((scheme != "http" && scheme != "https") || host.empty() ||
      host.find_first_of("/?#@ ") != std::string::npos) {
    return InvalidArgumentError("S3 endpoint '" + endpoint +
                                "' is not http(s)://host[:port]");
  }
  return endpoint;
}

}  // namespace

Result<S3Url> ParseS3Url(std::string_view url) {
  constexpr std::string_view kScheme = "s3://";
  const auto invalid = [&](const std::string& why) {
    return InvalidArgumentError("invalid S3 URL '" + std::string(url) +
                                "': " + why);
  };
  if (url.substr(0, kScheme.size()) != kScheme) {
    return invalid("it does not start with s3://");
  }
  std::string_view rest = url.substr(kScheme.size());
  const size_t slash = rest.find('/');
  S3Url parsed;
  parsed.bucket = std::string(rest.substr(0, slash));
  const std::string problem = BucketNameProblem(parsed.bucket);
  if (!problem.empty()) return invalid(problem);
  ObjectPrefix prefix = CheckObjectPrefix(
      slash == std::string_view::npos ? "" : rest.substr(slash + 1));
  if (!prefix.problem.empty()) return invalid(prefix.problem);
  parsed.prefix = std::move(prefix.prefix);
  return parsed;
}

ConfigEnvironment ProcessConfigEnvironment() {
  ConfigEnvironment environment;
  environment.get_env = [](const std::string& name) {
    const char* value = std::getenv(name.c_str());
    return value == nullptr ? std::nullopt
                            : std::optional<std::string>(value);
  };
  environment.read_file =
      [](const std::string& path) -> Result<std::optional<std::string>> {
    errno = 0;
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) {
      if (errno == ENOENT || errno == ENOTDIR) {
        return std::optional<std::string>();
      }
      return ErrnoError("opening AWS configuration file " + path, errno);
    }
    std::string content;
    char buffer[4096];
    size_t got = 0;
    while ((got = std::fread(buffer, 1, sizeof(buffer), file)) > 0) {
      content.append(buffer, got);
    }
    const int read_errno = std::ferror(file) ? errno : 0;
    std::fclose(file);
    if (read_errno != 0) {
      return ErrnoError("reading AWS configuration file " + path, read_errno);
    }
    return std::optional<std::string>(std::move(content));
  };
  return environment;
}

std::string S3Config::ToString() const {
  return "S3Config{endpoint=" + endpoint + ", region=" + region +
         ", path_style=" + (path_style ? "true" : "false") +
         ", access_key_id=" + credentials.access_key_id +
         ", secret_access_key=" +
         (credentials.secret_access_key.empty() ? "<unset>" : "<redacted>") +
         ", session_token=" +
         (credentials.session_token.empty() ? "<unset>" : "<redacted>") + "}";
}

Result<S3Config> ResolveS3Config(const std::string& bucket,
                                 const S3Overrides& overrides,
                                 const ConfigEnvironment& environment) {
  SK_ASSIGN_OR_RETURN(Profile profile, LoadProfile(overrides, environment));
  const bool profile_named =
      FirstOf({overrides.profile, environment.get_env("AWS_PROFILE")})
          .has_value();
  if (profile_named && !profile.found) {
    return InvalidArgumentError("AWS profile '" + profile.name +
                                "' is in neither " + profile.credentials_path +
                                " nor " + profile.config_path);
  }

  S3Config config;
  SK_ASSIGN_OR_RETURN(config.credentials,
                      ResolveCredentials(overrides, environment, profile));
  config.region = FirstOf({overrides.region, environment.get_env("AWS_REGION"),
                           environment.get_env("AWS_DEFAULT_REGION"),
                           profile.Get("region"), std::string("us-east-1")})
                      .value();
  if (config.region.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-") !=
      std::string::npos) {
    return InvalidArgumentError("S3 region '" + config.region +
                                "' holds characters other than a-z, 0-9, '-'");
  }
  const std::optional<std::string> custom_endpoint =
      FirstOf({overrides.endpoint_url, environment.get_env("AWS_ENDPOINT_URL_S3"),
               environment.get_env("AWS_ENDPOINT_URL"),
               profile.Get("endpoint_url")});
  if (custom_endpoint) {
    SK_ASSIGN_OR_RETURN(config.endpoint, NormaliseEndpoint(*custom_endpoint));
    config.path_style = true;
  } else {
    config.endpoint = "https://s3." + config.region + ".amazonaws.com";
    config.path_style = bucket.find_first_of("._") != std::string::npos;
  }
  return config;
}

S3ObjectAddress AddressObject(const S3Config& config,
                              const std::string& bucket,
                              const std::string& key) {
  const size_t scheme_end = config.endpoint.find("://");
  const std::string scheme = config.endpoint.substr(0, scheme_end + 3);
  const std::string endpoint_host = config.endpoint.substr(scheme_end + 3);
  S3ObjectAddress address;
  if (config.path_style) {
    address.host = endpoint_host;
    address.path = "/" + bucket + (key.empty() ? "" : "/" + key);
  } else {
    address.host = bucket + "." + endpoint_host;
    address.path = "/" + key;
  }
  address.base_url = scheme + address.host;
  return address;
}

}  // namespace shardkeep::s3
