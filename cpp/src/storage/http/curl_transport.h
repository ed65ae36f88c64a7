// HttpTransport over libcurl: a pool of easy handles reused across
// requests, so that each keeps its connection alive (curl_easy_reset keeps
// a handle's connections), and every request performed on the calling
// thread.
#pragma once

#include <memory>

#include "storage/http/http_transport.h"

namespace shardkeep::http {

std::shared_ptr<HttpTransport> NewCurlTransport();

}  // namespace shardkeep::http
