#include "storage/s3/s3_xml.h"

#include <expat.h>

#include <algorithm>
#include <charconv>
#include <memory>
#include <type_traits>
#include <utility>

namespace shardkeep::s3 {
namespace {

// The documents are small and shallow, so each is parsed into a tree first
// and the decoders below walk it; names lose their namespace.
struct Element {
  std::string name;
  std::string text;  // character data directly inside, untrimmed
  std::vector<Element> children;

  const Element* Child(std::string_view child_name) const {
    for (const Element& c : children) {
      if (c.name == child_name) return &c;
    }
    return nullptr;
  }
};

struct ParseState {
  XML_Parser parser = nullptr;
  Element root;
  bool have_root = false;
  // Pointers stay valid: an element's siblings are only appended after it
  // has been closed and popped.
  std::vector<Element*> open;
  size_t elements = 0;
  std::string refusal;  // why a handler stopped the parser
};

void Refuse(ParseState* state, std::string why) {
  if (state->refusal.empty()) state->refusal = std::move(why);
  XML_StopParser(state->parser, XML_FALSE);
}

// With a namespace separator expat names elements "<uri> <local>".
std::string_view LocalName(const XML_Char* name) {
  std::string_view full(name);
  const size_t space = full.rfind(' ');
  return space == std::string_view::npos ? full : full.substr(space + 1);
}

void XMLCALL OnStart(void* user, const XML_Char* name, const XML_Char**) {
  auto* state = static_cast<ParseState*>(user);
  if (++state->elements > kMaxXmlElements) {
    return Refuse(state, "more than " + std::to_string(kMaxXmlElements) +
                             " elements");
  }
  if (state->open.size() >= static_cast<size_t>(kMaxXmlDepth)) {
    return Refuse(state, "elements nested deeper than " +
                             std::to_string(kMaxXmlDepth));
  }
  Element* element;
  if (state->open.empty()) {
    state->have_root = true;
    element = &state->root;
  } else {
    element = &state->open.back()->children.emplace_back();
  }
  element->name = LocalName(name);
  state->open.push_back(element);
}

void XMLCALL OnEnd(void* user, const XML_Char*) {
  auto* state = static_cast<ParseState*>(user);
  // A stopped parser may still report the end of the element it refused.
  if (state->refusal.empty() && !state->open.empty()) state->open.pop_back();
}

void XMLCALL OnText(void* user, const XML_Char* text, int length) {
  auto* state = static_cast<ParseState*>(user);
  if (!state->open.empty()) state->open.back()->text.append(text, length);
}

void XMLCALL OnDoctype(void* user, const XML_Char*, const XML_Char*,
                       const XML_Char*, int) {
  Refuse(static_cast<ParseState*>(user), "a document type declaration");
}

Status Malformed(const std::string& what, const std::string& why) {
  return CorruptionError(what + ": malformed S3 XML response: " + why);
}

Result<Element> ParseTree(std::string_view body, const std::string& what) {
  if (body.size() > kMaxXmlBytes) {
    return Malformed(what, std::to_string(body.size()) +
                               " bytes, more than the cap of " +
                               std::to_string(kMaxXmlBytes));
  }
  std::unique_ptr<std::remove_pointer_t<XML_Parser>, void (*)(XML_Parser)>
      parser(XML_ParserCreateNS(nullptr, ' '), XML_ParserFree);
  if (!parser) {
    return ResourceExhaustedError(what + ": no memory for an XML parser");
  }
  ParseState state;
  state.parser = parser.get();
  XML_SetUserData(parser.get(), &state);
  XML_SetElementHandler(parser.get(), OnStart, OnEnd);
  XML_SetCharacterDataHandler(parser.get(), OnText);
  XML_SetStartDoctypeDeclHandler(parser.get(), OnDoctype);
  const bool parsed = XML_Parse(parser.get(), body.data(),
                                static_cast<int>(body.size()),
                                XML_TRUE) == XML_STATUS_OK;
  if (!parsed) {
    const std::string why =
        state.refusal.empty()
            ? XML_ErrorString(XML_GetErrorCode(parser.get()))
            : "refused " + state.refusal;
    return Malformed(
        what, why + " at line " +
                  std::to_string(XML_GetCurrentLineNumber(parser.get())) +
                  " column " +
                  std::to_string(XML_GetCurrentColumnNumber(parser.get())) +
                  ", after " + std::to_string(state.elements) + " elements");
  }
  if (!state.have_root) return Malformed(what, "no root element");
  return std::move(state.root);
}

Result<Element> ParseRoot(std::string_view body, const std::string& what,
                          std::string_view root_name) {
  SK_ASSIGN_OR_RETURN(Element root, ParseTree(body, what));
  if (root.name != root_name) {
    return Malformed(what, "root element <" + root.name + ">, expected <" +
                               std::string(root_name) + ">");
  }
  return root;
}

// The text of a child element, or "" when there is none.
std::string TextOf(const Element& parent, std::string_view name) {
  const Element* child = parent.Child(name);
  return child == nullptr ? std::string() : child->text;
}

Result<std::string> RequiredText(const Element& parent, std::string_view name,
                                 const std::string& what) {
  std::string text = TextOf(parent, name);
  if (text.empty()) {
    return Malformed(what, "<" + parent.name + "> without a non-empty <" +
                               std::string(name) + ">");
  }
  return text;
}

Result<uint64_t> ParseCount(const std::string& text, std::string_view name,
                            const std::string& what) {
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    std::string why = "<";
    why.append(name).append("> is '").append(text.substr(0, 64));
    return Malformed(what, why + "', not a non-negative integer");
  }
  return value;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(const std::string& text,
                                  const std::string& what) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      // S3 encodes a space as '+' (and a '+' as %2B).
      out.push_back(text[i] == '+' ? ' ' : text[i]);
      continue;
    }
    const int high = i + 2 < text.size() ? HexDigit(text[i + 1]) : -1;
    const int low = high < 0 ? -1 : HexDigit(text[i + 2]);
    if (low < 0) {
      return Malformed(what, "bad percent-encoding in '" +
                                 text.substr(0, 64) + "'");
    }
    out.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return out;
}

Result<ListedObject> DecodeListedObject(const Element& contents, bool url,
                                        const std::string& what) {
  ListedObject object;
  SK_ASSIGN_OR_RETURN(object.key, RequiredText(contents, "Key", what));
  if (url) {
    SK_ASSIGN_OR_RETURN(object.key, PercentDecode(object.key, what));
  }
  SK_ASSIGN_OR_RETURN(object.size,
                      ParseCount(TextOf(contents, "Size"), "Size", what));
  return object;
}

ErrorDocument ErrorFields(const Element& error) {
  return ErrorDocument{TextOf(error, "Code"), TextOf(error, "Message"),
                       TextOf(error, "RequestId"), TextOf(error, "Resource")};
}

// ETags are quoted hex digests; anything beyond printable ASCII is refused
// rather than risking bytes the server's parser would reject or change.
bool PrintableAscii(char c) { return c >= 0x20 && c <= 0x7e; }

void AppendEscaped(std::string& out, const std::string& text) {
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c);
    }
  }
}

}  // namespace

Result<ListObjectsPage> DecodeListObjectsV2(std::string_view body,
                                            const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root, ParseRoot(body, what, "ListBucketResult"));
  const std::string encoding = TextOf(root, "EncodingType");
  if (!encoding.empty() && encoding != "url") {
    return Malformed(what, "unknown <EncodingType> '" +
                               encoding.substr(0, 64) + "'");
  }
  const bool url = encoding == "url";
  ListObjectsPage page;
  for (const Element& child : root.children) {
    if (child.name == "Contents") {
      SK_ASSIGN_OR_RETURN(ListedObject object,
                          DecodeListedObject(child, url, what));
      page.objects.push_back(std::move(object));
    } else if (child.name == "CommonPrefixes") {
      SK_ASSIGN_OR_RETURN(std::string prefix,
                          RequiredText(child, "Prefix", what));
      if (url) {
        SK_ASSIGN_OR_RETURN(prefix, PercentDecode(prefix, what));
      }
      page.common_prefixes.push_back(std::move(prefix));
    }
  }
  const std::string truncated = TextOf(root, "IsTruncated");
  if (truncated != "true" && truncated != "false") {
    return Malformed(what, "<IsTruncated> is '" + truncated.substr(0, 64) +
                               "', not true or false");
  }
  page.is_truncated = truncated == "true";
  page.next_continuation_token = TextOf(root, "NextContinuationToken");
  if (page.is_truncated && page.next_continuation_token.empty()) {
    // Without a token the listing could not go on, and stopping here would
    // silently drop the rest of it.
    return Malformed(what, "truncated listing without <NextContinuationToken>");
  }
  if (root.Child("KeyCount") != nullptr) {
    SK_ASSIGN_OR_RETURN(page.key_count,
                        ParseCount(TextOf(root, "KeyCount"), "KeyCount", what));
  }
  return page;
}

Result<ErrorDocument> DecodeErrorDocument(std::string_view body,
                                          const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root, ParseRoot(body, what, "Error"));
  SK_RETURN_IF_ERROR(RequiredText(root, "Code", what).status());
  return ErrorFields(root);
}

Result<std::string> DecodeInitiateMultipartUpload(std::string_view body,
                                                  const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root,
                      ParseRoot(body, what, "InitiateMultipartUploadResult"));
  return RequiredText(root, "UploadId", what);
}

Result<CompleteMultipartUploadAnswer> DecodeCompleteMultipartUpload(
    std::string_view body, const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root, ParseTree(body, what));
  CompleteMultipartUploadAnswer answer;
  if (root.name == "Error") {
    SK_RETURN_IF_ERROR(RequiredText(root, "Code", what).status());
    answer.error = ErrorFields(root);
    return answer;
  }
  if (root.name != "CompleteMultipartUploadResult") {
    return Malformed(what, "root element <" + root.name +
                               ">, expected <CompleteMultipartUploadResult> "
                               "or <Error>");
  }
  SK_ASSIGN_OR_RETURN(answer.etag, RequiredText(root, "ETag", what));
  answer.location = TextOf(root, "Location");
  answer.bucket = TextOf(root, "Bucket");
  answer.key = TextOf(root, "Key");
  return answer;
}

Result<std::string> EncodeCompleteMultipartUpload(
    const std::vector<CompletedPart>& parts) {
  std::string out =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<CompleteMultipartUpload "
      "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  int previous = 0;
  for (const CompletedPart& part : parts) {
    const std::string name = "part " + std::to_string(part.part_number);
    if (part.part_number < 1 || part.part_number > 10000) {
      return InvalidArgumentError(name + ": S3 part numbers are 1..10000");
    }
    if (part.part_number <= previous) {
      return InvalidArgumentError(name + " follows part " +
                                  std::to_string(previous) +
                                  "; parts must be strictly ascending");
    }
    previous = part.part_number;
    if (part.etag.empty()) return InvalidArgumentError(name + ": empty ETag");
    if (!std::all_of(part.etag.begin(), part.etag.end(), PrintableAscii)) {
      return InvalidArgumentError(name +
                                  ": ETag holds bytes beyond printable ASCII");
    }
    out += "<Part><PartNumber>" + std::to_string(part.part_number) +
           "</PartNumber><ETag>";
    AppendEscaped(out, part.etag);
    out += "</ETag></Part>";
  }
  out += "</CompleteMultipartUpload>";
  return out;
}

Result<std::string> EncodeDeleteObjects(const std::vector<std::string>& keys) {
  if (keys.empty() || keys.size() > 1000) {
    return InvalidArgumentError("DeleteObjects takes 1 to 1000 keys, not " +
                                std::to_string(keys.size()));
  }
  std::string out =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<Delete xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Quiet>true</Quiet>";
  for (const std::string& key : keys) {
    for (const char c : key) {
      const auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 && c != '\t' && c != '\n' && c != '\r') {
        return InvalidArgumentError("key '" + key.substr(0, 64) +
                                    "' holds a byte XML 1.0 cannot carry");
      }
    }
    out += "<Object><Key>";
    AppendEscaped(out, key);
    out += "</Key></Object>";
  }
  out += "</Delete>";
  return out;
}

Result<std::vector<DeleteError>> DecodeDeleteObjects(std::string_view body,
                                                     const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root, ParseRoot(body, what, "DeleteResult"));
  std::vector<DeleteError> errors;
  for (const Element& child : root.children) {
    if (child.name != "Error") continue;
    SK_ASSIGN_OR_RETURN(std::string key, RequiredText(child, "Key", what));
    SK_RETURN_IF_ERROR(RequiredText(child, "Code", what).status());
    errors.push_back(DeleteError{std::move(key), ErrorFields(child)});
  }
  return errors;
}

Result<MultipartUploadsPage> DecodeListMultipartUploads(
    std::string_view body, const std::string& what) {
  SK_ASSIGN_OR_RETURN(Element root,
                      ParseRoot(body, what, "ListMultipartUploadsResult"));
  MultipartUploadsPage page;
  for (const Element& child : root.children) {
    if (child.name != "Upload") continue;
    MultipartUploadsPage::Upload upload;
    SK_ASSIGN_OR_RETURN(upload.key, RequiredText(child, "Key", what));
    SK_ASSIGN_OR_RETURN(upload.upload_id,
                        RequiredText(child, "UploadId", what));
    page.uploads.push_back(std::move(upload));
  }
  const std::string truncated = TextOf(root, "IsTruncated");
  page.is_truncated = truncated == "true";
  page.next_key_marker = TextOf(root, "NextKeyMarker");
  page.next_upload_id_marker = TextOf(root, "NextUploadIdMarker");
  if (page.is_truncated && page.next_key_marker.empty() &&
      page.next_upload_id_marker.empty()) {
    return Malformed(what, "truncated upload listing without markers");
  }
  return page;
}

}  // namespace shardkeep::s3
