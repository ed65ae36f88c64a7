// Google credentials for Cloud Storage, found the way Google's own client
// libraries find them ("Application Default Credentials"), and the OAuth2
// access tokens they are traded for.
//
// Discovery, first found wins:
//  1. CredentialsOptions::anonymous, then CredentialsOptions::credentials_file;
//  2. GOOGLE_APPLICATION_CREDENTIALS (a key file's path);
//  3. gcloud's application_default_credentials.json, in $CLOUDSDK_CONFIG
//     when set, else in $HOME/.config/gcloud (absent is fine; present and
//     broken is an error);
//  4. the metadata server of GCE and TPU VMs and of GKE workload identity
//     (GCE_METADATA_HOST, else metadata.google.internal), probed once per
//     process and host;
//  5. anonymous.
//
// Key files are {"type": "service_account", ...} (a JWT signed with the
// account's key is traded for a token) or {"type": "authorized_user", ...}
// (gcloud's refresh token is). No error message and no Principal() ever
// holds a private key, a client secret, a refresh token, a JWT assertion or
// an access token.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "shardkeep/status.h"
#include "storage/http/http_transport.h"

namespace shardkeep::gcs {

// Where the environment is read from, injectable for tests.
struct CredentialsEnvironment {
  std::function<std::optional<std::string>(const std::string&)> getenv;
  // The file's bytes; NotFound when it does not exist.
  std::function<Result<std::string>(const std::string&)> read_file;
};
// The process's environment and filesystem; HOME comes from getenv.
CredentialsEnvironment ProcessCredentialsEnvironment();

struct TokenClock {
  std::function<double()> wall_s;     // seconds since the Unix epoch (JWT iat/exp, token expiry)
  std::function<double()> now_s;      // monotonic, for retry deadlines
  std::function<void(double)> sleep_s;
  std::function<double()> uniform01;  // [0,1)
};
TokenClock RealTokenClock();

struct CredentialsOptions {
  std::optional<std::string> credentials_file;  // a key file named by the caller: wins over everything
  bool anonymous = false;                       // no credentials at all (emulators, public buckets)
  double timeout_s = 600;                       // bounds each token request, retries included
};

class Credentials {
 public:
  virtual ~Credentials() = default;
  // The Authorization header's value ("Bearer ya29...."), fetched on first
  // use and refreshed when less than 5 minutes of its lifetime are left
  // (half of it, for a token issued for less than 10 minutes) (a token
  // cached per Credentials object, which the caller shares process-wide);
  // "" for anonymous access. Thread-safe: concurrent callers
  // wait for one refresh, not one each, and share its outcome, failure
  // included.
  virtual Result<std::string> Authorization() = 0;
  // Drops the cached token, so the next Authorization() fetches a new one
  // (after a 401).
  virtual void Invalidate() = 0;
  // Who is asking, for error messages: "service account
  // sk@p.iam.gserviceaccount.com (key file /k.json)", "gcloud user
  // credentials (client id 7645...apps.googleusercontent.com, key file
  // /h/.config/gcloud/application_default_credentials.json)", "the VM's
  // service account sk@p.iam.gserviceaccount.com (metadata server
  // metadata.google.internal)", "anonymous". Never a token, key or secret.
  virtual std::string Principal() const = 0;
};

// Finds credentials as described at the top of this file. InvalidArgument
// naming the file (and the field) when a key file that discovery reaches is
// missing, unreadable, not JSON, of another type, lacks a field, or holds a
// key that does not parse. Only the metadata probe talks to the network
// here; tokens are fetched by the first Authorization().
Result<std::shared_ptr<Credentials>> FindCredentials(const CredentialsOptions& options,
                                                     const CredentialsEnvironment& environment,
                                                     std::shared_ptr<http::HttpTransport> transport,
                                                     TokenClock clock = RealTokenClock());

// Forgets which metadata servers were probed, so that the next
// FindCredentials probes again: for tests, whose fake transports answer
// differently from one test to the next.
void ForgetMetadataServerProbes();

}  // namespace shardkeep::gcs
