// Fuzzes the S3 response decoders (storage/s3/s3_xml.h) with each input,
// and the CompleteMultipartUpload encoder with the input cut into ETags:
// whatever it accepts must be well-formed XML that gives back every ETag.
#include <expat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "storage/s3/s3_xml.h"

namespace s3 = shardkeep::s3;

namespace {

struct ETagCollector {
  std::vector<std::string> etags;
  bool in_etag = false;
};

void XMLCALL OnStart(void* user, const XML_Char* name, const XML_Char**) {
  auto* c = static_cast<ETagCollector*>(user);
  c->in_etag = std::string(name).ends_with(" ETag");
  if (c->in_etag) c->etags.emplace_back();
}
void XMLCALL OnEnd(void* user, const XML_Char*) {
  static_cast<ETagCollector*>(user)->in_etag = false;
}
void XMLCALL OnText(void* user, const XML_Char* text, int length) {
  auto* c = static_cast<ETagCollector*>(user);
  if (c->in_etag) c->etags.back().append(text, length);
}

void CheckEncoderRoundTrip(const std::string& bytes) {
  std::vector<s3::CompletedPart> parts;
  size_t start = 0;
  while (start <= bytes.size() && parts.size() < 64) {
    size_t end = bytes.find('|', start);
    if (end == std::string::npos) end = bytes.size();
    parts.push_back({static_cast<int>(parts.size()) + 1,
                     bytes.substr(start, end - start)});
    start = end + 1;
  }
  auto body = s3::EncodeCompleteMultipartUpload(parts);
  if (!body.ok()) return;
  XML_Parser parser = XML_ParserCreateNS(nullptr, ' ');
  ETagCollector collector;
  XML_SetUserData(parser, &collector);
  XML_SetElementHandler(parser, OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser, OnText);
  const bool parsed = XML_Parse(parser, body->data(),
                                static_cast<int>(body->size()),
                                XML_TRUE) == XML_STATUS_OK;
  XML_ParserFree(parser);
  SK_FUZZ_CHECK(parsed);
  SK_FUZZ_CHECK(collector.etags.size() == parts.size());
  for (size_t i = 0; i < parts.size(); ++i) {
    SK_FUZZ_CHECK(collector.etags[i] == parts[i].etag);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  if (auto page = s3::DecodeListObjectsV2(bytes, "list"); page.ok()) {
    SK_FUZZ_CHECK(!page->is_truncated ||
                  !page->next_continuation_token.empty());
    for (const auto& object : page->objects) SK_FUZZ_CHECK(!object.key.empty());
  }
  if (auto error = s3::DecodeErrorDocument(bytes, "error"); error.ok()) {
    SK_FUZZ_CHECK(!error->code.empty());
  }
  if (auto id = s3::DecodeInitiateMultipartUpload(bytes, "initiate"); id.ok()) {
    SK_FUZZ_CHECK(!id->empty());
  }
  if (auto answer = s3::DecodeCompleteMultipartUpload(bytes, "complete");
      answer.ok()) {
    SK_FUZZ_CHECK(answer->error.has_value() != !answer->etag.empty());
  }
  if (auto errors = s3::DecodeDeleteObjects(bytes, "delete"); errors.ok()) {
    for (const auto& error : *errors) {
      SK_FUZZ_CHECK(!error.key.empty() && !error.error.code.empty());
    }
  }
  if (auto page = s3::DecodeListMultipartUploads(bytes, "uploads");
      page.ok()) {
    for (const auto& upload : page->uploads) {
      SK_FUZZ_CHECK(!upload.key.empty() && !upload.upload_id.empty());
    }
  }
  CheckEncoderRoundTrip(bytes);
  return 0;
}
