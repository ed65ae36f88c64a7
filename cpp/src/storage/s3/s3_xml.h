// The XML documents of the S3 API that shardkeep reads and writes. Pure
// decode/encode of untrusted bytes, no I/O: the HTTP client hands each
// response body here and maps the result with s3_errors.h.
//
// Every decoder:
//   - refuses bodies over kMaxXmlBytes, element nesting deeper than
//     kMaxXmlDepth and more than kMaxXmlElements elements;
//   - refuses document type declarations (S3 never sends one, and refusing
//     them rules out entity expansion and external entities);
//   - ignores XML namespaces (AWS answers with
//     xmlns="http://s3.amazonaws.com/doc/2006-03-01/", GCS and others with
//     their own or none) and elements it does not know;
//   - returns a Corruption error that starts with `what` (the caller names
//     the request: operation, bucket, key) and says what it found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/status.h"

namespace shardkeep::s3 {

// A listing page of 1000 keys of up to 1 KiB each, URL-encoded, stays far
// below this; an answer this large is not one S3 would send.
inline constexpr size_t kMaxXmlBytes = size_t{16} << 20;
inline constexpr int kMaxXmlDepth = 16;
inline constexpr size_t kMaxXmlElements = 100000;

struct ListedObject {
  std::string key;
  uint64_t size = 0;
};

// One page of ListObjectsV2 (root element ListBucketResult).
struct ListObjectsPage {
  std::vector<ListedObject> objects;         // Contents, in server order
  std::vector<std::string> common_prefixes;  // CommonPrefixes/Prefix
  bool is_truncated = false;
  // Non-empty whenever is_truncated (the decoder checks it).
  std::string next_continuation_token;
  // As the server reported it; not checked against the counts above, since
  // S3-compatible servers disagree on whether prefixes count.
  std::optional<uint64_t> key_count;
};

// The Error document of a failed request (root element Error).
struct ErrorDocument {
  std::string code;  // never empty in a decoded document
  std::string message;
  std::string request_id;
  std::string resource;
};

// CompleteMultipartUpload's answer. S3 may answer 200 and still fail the
// request, with an Error document as the body; then `error` is set and the
// other fields are empty.
struct CompleteMultipartUploadAnswer {
  std::optional<ErrorDocument> error;
  std::string location;
  std::string bucket;
  std::string key;
  std::string etag;  // never empty when error is unset
};

struct CompletedPart {
  int part_number = 0;  // 1..10000
  std::string etag;     // as UploadPart returned it, quotes included
};

// Decodes a ListObjectsV2 page. With <EncodingType>url</EncodingType> (the
// client asks for it so that any key survives XML), keys and prefixes are
// percent-decoded.
Result<ListObjectsPage> DecodeListObjectsV2(std::string_view body,
                                            const std::string& what);

Result<ErrorDocument> DecodeErrorDocument(std::string_view body,
                                          const std::string& what);

// Returns the UploadId of InitiateMultipartUploadResult (never empty).
Result<std::string> DecodeInitiateMultipartUpload(std::string_view body,
                                                  const std::string& what);

Result<CompleteMultipartUploadAnswer> DecodeCompleteMultipartUpload(
    std::string_view body, const std::string& what);

// The CompleteMultipartUpload request body. REQUIRES nothing: part numbers
// out of 1..10000 or not strictly ascending, empty ETags and ETags with
// bytes beyond printable ASCII are InvalidArgument errors.
Result<std::string> EncodeCompleteMultipartUpload(
    const std::vector<CompletedPart>& parts);

// The DeleteObjects request body (quiet mode: the answer lists only the
// keys that failed). InvalidArgument for an empty list, more than 1000
// keys, or a key that XML 1.0 cannot carry (control characters other than
// tab, newline and carriage return), which the caller deletes singly.
Result<std::string> EncodeDeleteObjects(const std::vector<std::string>& keys);

// A key DeleteObjects could not delete.
struct DeleteError {
  std::string key;
  ErrorDocument error;
};

// DeleteObjects' answer (root element DeleteResult): its Error entries.
Result<std::vector<DeleteError>> DecodeDeleteObjects(std::string_view body,
                                                     const std::string& what);

// One page of ListMultipartUploads (root ListMultipartUploadsResult).
struct MultipartUploadsPage {
  struct Upload {
    std::string key;
    std::string upload_id;
  };
  std::vector<Upload> uploads;
  bool is_truncated = false;
  std::string next_key_marker;
  std::string next_upload_id_marker;
};

Result<MultipartUploadsPage> DecodeListMultipartUploads(
    std::string_view body, const std::string& what);

}  // namespace shardkeep::s3
