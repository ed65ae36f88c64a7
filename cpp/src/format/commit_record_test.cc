#include "format/commit_record.h"

#include <xxhash.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"
#include "testing/test_files.h"

namespace shardkeep::format {
namespace {

const std::string kFile = "ckpts/000001200/_SHARDKEEP";

std::string ReadTestFile(const std::string& name) {
  return testdata::Read("format/" + name);
}

// The record in cpp/testdata/format/golden_SHARDKEEP. That file was
// written by hand from docs/FORMAT.md (field names, order, types, two-space
// indentation, final newline), not by the encoder, its "checksum" computed
// with Python's xxhash; the encoder's output is required to equal it byte
// for byte. The meta and value checksums are arbitrary (there are no files).
CommitRecord GoldenRecord() {
  CommitRecord r;
  r.step = 1200;
  r.created_ns = 1700000000000000000;
  r.committed_ns = 1700000000123456789;
  r.process_count = 2;
  // Deliberately not alphabetical: the order must survive.
  r.checkpointables = {{"params", "pytree", 0x9c2f5e1a7b3d4680, std::nullopt},
                       {"opt_state", "pytree", 0x5a0b1c2d3e4f6071, std::nullopt},
                       {"dataset", "bytes", 0x0f1e2d3c4b5a6978, 0x8899aabbccddeeff},
                       {"config", "json", 0x0123456789abcdef, 0xfedcba9876543210}};
  r.index_files["params"] = {"index/p0.idx", "index/p1.idx"};
  r.index_files["opt_state"] = {"index/p0.idx", "index/p1.idx"};
  r.custom_metadata = {{"run", "demo"}, {"seed", 7}};
  r.metrics = {{"loss", 0.25}};
  return r;
}

// cpp/testdata/format/golden_v1_SHARDKEEP: the golden record as format
// version 1 wrote it, without checksums.
CommitRecord GoldenV1Record() {
  CommitRecord r = GoldenRecord();
  r.version = 1;
  for (CheckpointableEntry& e : r.checkpointables) e.meta_checksum = e.value_checksum = std::nullopt;
  return r;
}

void ExpectSameRecord(const CommitRecord& a, const CommitRecord& b) {
  EXPECT_EQ(a.version, b.version);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.created_ns, b.created_ns);
  EXPECT_EQ(a.committed_ns, b.committed_ns);
  EXPECT_EQ(a.process_count, b.process_count);
  EXPECT_EQ(a.data_folder, b.data_folder);
  ASSERT_EQ(a.checkpointables.size(), b.checkpointables.size());
  for (size_t i = 0; i < a.checkpointables.size(); ++i) {
    EXPECT_EQ(a.checkpointables[i].name, b.checkpointables[i].name);
    EXPECT_EQ(a.checkpointables[i].kind, b.checkpointables[i].kind);
    EXPECT_EQ(a.checkpointables[i].meta_checksum, b.checkpointables[i].meta_checksum);
    EXPECT_EQ(a.checkpointables[i].value_checksum, b.checkpointables[i].value_checksum);
  }
  EXPECT_EQ(a.index_files, b.index_files);
  EXPECT_EQ(a.custom_metadata, b.custom_metadata);
  EXPECT_EQ(a.metrics, b.metrics);
}

// Decodes `text` and expects `code` with a message naming kFile and
// containing `what`.
void ExpectError(const std::string& text, StatusCode code,
                 const std::string& what) {
  auto r = DecodeCommitRecord(text, kFile);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), code) << r.status().ToString();
  EXPECT_EQ(r.status().message().rfind(kFile + ": ", 0), 0u)
      << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos)
      << r.status().message();
}

// `j` as a record whose own checksum holds: "checksum" moved last and
// sealed, as a writer that made these changes would leave it.
std::string Sealed(nlohmann::ordered_json j) {
  j.erase("checksum");
  j["checksum"] = std::string(16, '0');
  std::string text = j.dump();
  SealCommitRecord(text);
  return text;
}

// The golden record with one top-level field replaced (or removed when
// `value` is discarded), its checksum sealed again.
std::string WithField(const std::string& key, const nlohmann::ordered_json& value) {
  auto j = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  if (value.is_discarded()) {
    j.erase(key);
  } else {
    j[key] = value;
  }
  return Sealed(std::move(j));
}

const nlohmann::ordered_json kRemove =
    nlohmann::ordered_json(nlohmann::ordered_json::value_t::discarded);

TEST(CommitRecordGolden, EncoderMatchesGoldenByteForByte) {
  const std::string golden = ReadTestFile("golden_SHARDKEEP");
  ASSERT_FALSE(golden.empty()) << "missing cpp/testdata/format/golden_SHARDKEEP";
  EXPECT_EQ(EncodeCommitRecord(GoldenRecord()), golden);
}

// cpp/testdata/format/golden_generation_SHARDKEEP: the golden record as an
// object-store save writes it, with "data_folder" after "process_count".
TEST(CommitRecordGolden, GenerationRecordMatchesGoldenByteForByte) {
  const std::string golden = ReadTestFile("golden_generation_SHARDKEEP");
  ASSERT_FALSE(golden.empty());
  CommitRecord record = GoldenRecord();
  record.data_folder = ".shardkeep-g3f09a1c27d54be80";
  EXPECT_EQ(EncodeCommitRecord(record), golden);
  SK_ASSERT_OK_AND_ASSIGN(auto decoded, DecodeCommitRecord(golden, kFile));
  ExpectSameRecord(decoded, record);
}

TEST(CommitRecordGolden, DecoderReadsGolden) {
  SK_ASSERT_OK_AND_ASSIGN(
      auto r, DecodeCommitRecord(ReadTestFile("golden_SHARDKEEP"), kFile));
  ExpectSameRecord(r, GoldenRecord());
}

// Version 1 records still decode, and a version-1 record is written as
// version 1 wrote it (a copy of an old checkpoint keeps its format).
TEST(CommitRecordGolden, VersionOneRecordDecodesAndEncodesAsItWas) {
  const std::string golden = ReadTestFile("golden_v1_SHARDKEEP");
  ASSERT_FALSE(golden.empty());
  SK_ASSERT_OK_AND_ASSIGN(auto r, DecodeCommitRecord(golden, kFile));
  ExpectSameRecord(r, GoldenV1Record());
  EXPECT_EQ(EncodeCommitRecord(GoldenV1Record()), golden);
}

// Every single-bit flip anywhere in the record is refused as Corruption
// naming the file: inside a number or a name it would still parse.
TEST(CommitRecordChecksum, EveryFlippedBitIsRefused) {
  const std::string golden = ReadTestFile("golden_SHARDKEEP");
  for (size_t i = 0; i < golden.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = golden;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      auto r = DecodeCommitRecord(flipped, kFile);
      ASSERT_FALSE(r.ok()) << "byte " << i << " bit " << bit;
      ASSERT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
      ASSERT_EQ(r.status().message().rfind(kFile + ": ", 0), 0u) << r.status().message();
    }
  }
}

TEST(CommitRecordChecksum, MismatchNamesBothChecksums) {
  std::string text = EncodeCommitRecord(GoldenRecord());
  text[text.find("1700000000123456789")] = '2';
  ExpectError(text, StatusCode::kCorruption, "checksum mismatch: its ");
  ExpectError(text, StatusCode::kCorruption, "but its \"checksum\" says e77f595199f67995");
}

// The checksum is found from the end whatever the white space, and covers
// the bytes as written: any formatting whose checksum was sealed decodes.
TEST(CommitRecordChecksum, FormattingIsFree) {
  auto j = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  std::string compact = j.dump();
  SealCommitRecord(compact);
  SK_ASSERT_OK_AND_ASSIGN(auto r, DecodeCommitRecord(compact, kFile));
  ExpectSameRecord(r, GoldenRecord());
  std::string spaced = j.dump(7);
  spaced.replace(spaced.rfind('}'), 1, "\r\n\t}\n\n ");
  SealCommitRecord(spaced);
  SK_ASSERT_OK_AND_ASSIGN(r, DecodeCommitRecord(spaced, kFile));
  ExpectSameRecord(r, GoldenRecord());
  // The checksum is XXH3-64 of the bytes with its own digits read as zeros.
  const size_t digits = compact.size() - 18;
  std::string zeroed = compact;
  zeroed.replace(digits, 16, std::string(16, '0'));
  char expected[17];
  std::snprintf(expected, sizeof(expected), "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(zeroed.data(), zeroed.size())));
  EXPECT_EQ(compact.substr(digits, 16), expected);
}

TEST(CommitRecordChecksum, VersionTwoNeedsItsChecksumLast) {
  auto j = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  j.erase("checksum");
  ExpectError(j.dump(), StatusCode::kCorruption,
              "record ends with its \"checksum\" member");
  // Not last: another member follows it.
  j["checksum"] = std::string(16, '0');
  j["later"] = 1;
  ExpectError(j.dump(), StatusCode::kCorruption, "ends with its \"checksum\"");
  // Upper-case digits are not the form.
  std::string upper = EncodeCommitRecord(GoldenRecord());
  upper.replace(upper.size() - 20, 16, "7812631E1CB3CDAE");
  ExpectError(upper, StatusCode::kCorruption, "ends with its \"checksum\"");
  // A key that merely ends in "checksum" (an escaped quote before it).
  auto k = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  k.erase("checksum");
  k["x\"checksum"] = std::string(16, '0');
  std::string escaped = k.dump();
  SealCommitRecord(escaped);
  ExpectError(escaped, StatusCode::kCorruption, "ends with its \"checksum\"");
}

TEST(CommitRecordChecksum, VersionTwoEntriesNeedTheirChecksums) {
  auto j = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  auto without = [&](const char* name, const char* key) {
    auto copy = j;
    copy["checkpointables"][name].erase(key);
    return Sealed(copy);
  };
  ExpectError(without("params", "meta_checksum"), StatusCode::kCorruption,
              "checkpointable \"params\": expected \"meta_checksum\" to be 16 lower-case "
              "hexadecimal digits");
  ExpectError(without("config", "value_checksum"), StatusCode::kCorruption,
              "checkpointable \"config\": expected \"value_checksum\"");
  ExpectError(without("dataset", "value_checksum"), StatusCode::kCorruption,
              "\"dataset\": expected \"value_checksum\"");
  for (const nlohmann::ordered_json& bad :
       {nlohmann::ordered_json("9c2f5e1a7b3d468"), nlohmann::ordered_json("9C2F5E1A7B3D4680"),
        nlohmann::ordered_json("0x9c2f5e1a7b3d46"), nlohmann::ordered_json(12345),
        nlohmann::ordered_json(nullptr)}) {
    auto copy = j;
    copy["checkpointables"]["params"]["meta_checksum"] = bad;
    ExpectError(Sealed(copy), StatusCode::kCorruption, "\"meta_checksum\" to be 16");
  }
}

TEST(CommitRecordChecksum, ListedChecksumOfAFile) {
  const std::string meta = R"({"kind": "json"})";
  SK_EXPECT_OK(CheckListedChecksum(meta, FileChecksum(meta), "c/config/meta.json"));
  SK_EXPECT_OK(CheckListedChecksum(meta, std::nullopt, "c/config/meta.json"));  // version 1
  const Status bad = CheckListedChecksum(meta, FileChecksum(meta) ^ 1, "c/config/meta.json");
  EXPECT_EQ(bad.code(), StatusCode::kCorruption);
  EXPECT_EQ(bad.message().rfind("c/config/meta.json: checksum mismatch: its 16 bytes", 0), 0u)
      << bad.message();
  EXPECT_NE(bad.message().find("_SHARDKEEP"), std::string::npos) << bad.message();
}

TEST(CommitRecord, RoundTripWithNullStepAndDefaults) {
  CommitRecord r;
  r.checkpointables = {{"state", "pytree", 7, std::nullopt}};
  r.index_files["state"] = {"index/p0.idx"};
  SK_ASSERT_OK_AND_ASSIGN(auto d,
                          DecodeCommitRecord(EncodeCommitRecord(r), kFile));
  ExpectSameRecord(d, r);
  EXPECT_FALSE(d.step.has_value());
  EXPECT_TRUE(d.custom_metadata.is_object());
  EXPECT_TRUE(d.metrics.is_object());
}

TEST(CommitRecord, CheckpointableOrderIsDocumentOrder) {
  const std::string text = R"({"format": "shardkeep", "version": 1,
    "created_ns": 1, "committed_ns": 2, "process_count": 1,
    "checkpointables": {"zeta": {"kind": "pytree"}, "alpha": {"kind": "json"},
                        "mid": {"kind": "my.kind-2"}},
    "index_files": {"zeta": ["index/p0.idx"]}})";
  SK_ASSERT_OK_AND_ASSIGN(auto r, DecodeCommitRecord(text, kFile));
  ASSERT_EQ(r.checkpointables.size(), 3u);
  EXPECT_EQ(r.checkpointables[0].name, "zeta");
  EXPECT_EQ(r.checkpointables[1].name, "alpha");
  EXPECT_EQ(r.checkpointables[2].name, "mid");
  EXPECT_EQ(r.checkpointables[2].kind, "my.kind-2");  // user kinds kept
  // Absent step, custom_metadata and metrics take their defaults.
  EXPECT_FALSE(r.step.has_value());
  EXPECT_EQ(r.custom_metadata, nlohmann::json::object());
  EXPECT_EQ(r.metrics, nlohmann::json::object());
}

TEST(CommitRecord, UnknownFieldsAreIgnored) {
  auto j = nlohmann::ordered_json::parse(EncodeCommitRecord(GoldenRecord()));
  j["added_in_a_later_release"] = {{"x", 1}};
  j["checkpointables"]["params"]["also_new"] = true;
  SK_ASSERT_OK_AND_ASSIGN(auto r, DecodeCommitRecord(Sealed(j), kFile));
  ExpectSameRecord(r, GoldenRecord());
}

TEST(CommitRecord, NegativeAndLargeIntegers) {
  CommitRecord r = GoldenRecord();
  r.step = -1;
  r.created_ns = INT64_MIN;
  r.committed_ns = INT64_MAX;
  SK_ASSERT_OK_AND_ASSIGN(auto d,
                          DecodeCommitRecord(EncodeCommitRecord(r), kFile));
  ExpectSameRecord(d, r);
  ExpectError(WithField("created_ns", uint64_t{1} << 63),
              StatusCode::kCorruption, "\"created_ns\" to be a signed 64-bit integer");
}

TEST(CommitRecord, InvalidUtf8InMetadataDoesNotThrow) {
  CommitRecord r = GoldenRecord();
  r.custom_metadata = {{"note", std::string("bad \xff byte")}};
  const std::string text = EncodeCommitRecord(r);  // must not throw
  SK_EXPECT_OK(DecodeCommitRecord(text, kFile).status());
}

TEST(CommitRecordErrors, NotJsonOrNotObject) {
  ExpectError("", StatusCode::kCorruption, "expected a JSON document");
  ExpectError("{\"format\": ", StatusCode::kCorruption, "expected a JSON document");
  ExpectError("\xff\xfe", StatusCode::kCorruption, "expected a JSON document");
  ExpectError("[1, 2]", StatusCode::kCorruption, "expected a JSON object");
  ExpectError("\"shardkeep\"", StatusCode::kCorruption, "JSON object");
}

TEST(CommitRecordErrors, TooDeeplyNested) {
  const std::string deep = R"({"format": "shardkeep", "version": 1, "x": )" +
                           std::string(100000, '[') + std::string(100000, ']') +
                           "}";
  ExpectError(deep, StatusCode::kCorruption, "nested deeper");
}

TEST(CommitRecordErrors, ForeignFormat) {
  ExpectError(WithField("format", "orbax"), StatusCode::kCorruption,
              "expected \"format\": \"shardkeep\"");
  ExpectError(WithField("format", kRemove), StatusCode::kCorruption, "format");
  ExpectError(WithField("format", 1), StatusCode::kCorruption, "format");
}

TEST(CommitRecordErrors, Version) {
  ExpectError(WithField("version", 4), StatusCode::kIncompatible,
              "written by a newer shardkeep (format version 4), this reader "
              "supports versions up to 3");
  // A newer version is refused before its other fields are looked at.
  ExpectError(R"({"format": "shardkeep", "version": 7, "checkpointables": 3})",
              StatusCode::kIncompatible, "version 7");
  ExpectError(WithField("version", 0), StatusCode::kCorruption, "version");
  ExpectError(WithField("version", "1"), StatusCode::kCorruption, "version");
  ExpectError(WithField("version", 1.0), StatusCode::kCorruption, "version");
  ExpectError(WithField("version", kRemove), StatusCode::kCorruption,
              "missing \"version\"");
}

TEST(CommitRecordErrors, MissingOrMistypedFields) {
  for (const char* key : {"created_ns", "committed_ns", "process_count"}) {
    SCOPED_TRACE(key);
    ExpectError(WithField(key, kRemove), StatusCode::kCorruption, key);
    ExpectError(WithField(key, "12"), StatusCode::kCorruption, key);
    ExpectError(WithField(key, 1.5), StatusCode::kCorruption, key);
  }
  ExpectError(WithField("step", "12"), StatusCode::kCorruption, "step");
  ExpectError(WithField("process_count", 0), StatusCode::kCorruption,
              "process_count");
  ExpectError(WithField("process_count", int64_t{1} << 31),
              StatusCode::kCorruption, "process_count");
  ExpectError(WithField("checkpointables", kRemove), StatusCode::kCorruption,
              "checkpointables");
  ExpectError(WithField("checkpointables", nlohmann::ordered_json::array()),
              StatusCode::kCorruption, "checkpointables");
  ExpectError(WithField("index_files", kRemove), StatusCode::kCorruption,
              "index_files");
  ExpectError(WithField("custom_metadata", "x"), StatusCode::kCorruption,
              "custom_metadata");
  ExpectError(WithField("metrics", nlohmann::ordered_json::array()),
              StatusCode::kCorruption, "metrics");
}

TEST(CommitRecordErrors, HostileCheckpointableNames) {
  for (const std::string& name : std::vector<std::string>{"", ".", "..", ".hidden", "a/b", "../x", "a\\b", "a b", "_SHARDKEEP",
        "caf\xc3\xa9", std::string(256, 'a'), std::string("a\0b", 3)}) {
    SCOPED_TRACE(name);
    nlohmann::ordered_json cps = {{name, {{"kind", "pytree"}}}};
    ExpectError(WithField("checkpointables", cps), StatusCode::kCorruption,
                "checkpointable name");
  }
}

TEST(CommitRecordErrors, BadKinds) {
  for (const nlohmann::ordered_json& kind :
       {nlohmann::ordered_json(1), nlohmann::ordered_json(""),
        nlohmann::ordered_json("../x"), nlohmann::ordered_json(nullptr)}) {
    nlohmann::ordered_json cps = {{"params", {{"kind", kind}}}};
    ExpectError(WithField("checkpointables", cps), StatusCode::kCorruption,
                "checkpointable \"params\": expected \"kind\"");
  }
  ExpectError(WithField("checkpointables", {{"params", 3}}),
              StatusCode::kCorruption, "expected an object");
}

TEST(CommitRecordErrors, BadIndexPaths) {
  for (const nlohmann::ordered_json& path :
       {nlohmann::ordered_json("index/p01.idx"), nlohmann::ordered_json("index/p.idx"),
        nlohmann::ordered_json("index/p-1.idx"), nlohmann::ordered_json("/index/p0.idx"),
        nlohmann::ordered_json("index/p0.idx/../../x"),
        nlohmann::ordered_json("index/../p0.idx"), nlohmann::ordered_json("index/p0.idx "),
        nlohmann::ordered_json("index/p1234567890.idx"), nlohmann::ordered_json(0)}) {
    SCOPED_TRACE(path.dump());
    ExpectError(WithField("index_files",
                          {{"params", nlohmann::ordered_json::array({path})}}),
                StatusCode::kCorruption, "index/p<N>.idx");
  }
  // Beyond process_count (2) or repeated.
  ExpectError(WithField("index_files", {{"params", {"index/p2.idx"}}}),
              StatusCode::kCorruption, "beyond process_count 2");
  ExpectError(
      WithField("index_files", {{"params", {"index/p1.idx", "index/p1.idx"}}}),
      StatusCode::kCorruption, "repeated");
  ExpectError(WithField("index_files", {{"params", "index/p0.idx"}}),
              StatusCode::kCorruption, "expected an array");
  ExpectError(WithField("index_files", {{"ghost", {"index/p0.idx"}}}),
              StatusCode::kCorruption, "\"ghost\", which is not a checkpointable");
}

TEST(CommitRecord, DataFolderRoundTripsAndIsAbsentByDefault) {
  CommitRecord r = GoldenRecord();
  EXPECT_EQ(EncodeCommitRecord(r).find("data_folder"), std::string::npos);
  r.data_folder = ".shardkeep-g0123456789abcdef";
  const std::string text = EncodeCommitRecord(r);
  EXPECT_NE(text.find("\"data_folder\": \".shardkeep-g0123456789abcdef\""),
            std::string::npos) << text;
  SK_ASSERT_OK_AND_ASSIGN(auto decoded, DecodeCommitRecord(text, kFile));
  ExpectSameRecord(decoded, r);
}

TEST(CommitRecordErrors, HostileDataFolders) {
  for (const nlohmann::ordered_json& folder :
       {nlohmann::ordered_json("../x"), nlohmann::ordered_json("/etc"),
        nlohmann::ordered_json("."), nlohmann::ordered_json(""),
        nlohmann::ordered_json("state"), nlohmann::ordered_json(".shardkeep-g"),
        nlohmann::ordered_json(".shardkeep-g0123456789abcde"),    // 15 digits
        nlohmann::ordered_json(".shardkeep-g0123456789abcdef0"),  // 17
        nlohmann::ordered_json(".shardkeep-g0123456789ABCDEF"),
        nlohmann::ordered_json(".shardkeep-g0123456789abcdef/.."),
        nlohmann::ordered_json(".shardkeep-g../../../../etc/x"),
        nlohmann::ordered_json("x/.shardkeep-g0123456789abcdef"),
        nlohmann::ordered_json(std::string(".shardkeep-g0123456789abcde\0", 28)),
        nlohmann::ordered_json(nullptr), nlohmann::ordered_json(7),
        nlohmann::ordered_json::array({".shardkeep-g0123456789abcdef"})}) {
    SCOPED_TRACE(folder.dump());
    ExpectError(WithField("data_folder", folder), StatusCode::kCorruption,
                "expected \"data_folder\"");
  }
}

TEST(CommitRecord, GenerationFolderNames) {
  EXPECT_TRUE(IsGenerationFolderName(".shardkeep-g0123456789abcdef"));
  EXPECT_TRUE(IsGenerationFolderName(".shardkeep-gffffffffffffffff"));
  EXPECT_FALSE(IsGenerationFolderName(".shardkeep-g0123456789abcdeg"));
  EXPECT_FALSE(IsGenerationFolderName(".shardkeep-tmp"));
  EXPECT_FALSE(IsGenerationFolderName("state"));
}

TEST(CommitRecord, SafeNames) {
  EXPECT_TRUE(IsSafeCheckpointableName("state"));
  EXPECT_TRUE(IsSafeCheckpointableName("opt_state.v2-final"));
  EXPECT_TRUE(IsSafeCheckpointableName("_hidden_ok"));
  EXPECT_TRUE(IsSafeCheckpointableName(std::string(255, 'x')));
  EXPECT_FALSE(IsSafeCheckpointableName(std::string(256, 'x')));
  EXPECT_FALSE(IsSafeCheckpointableName(""));
  EXPECT_FALSE(IsSafeCheckpointableName(".."));
  EXPECT_FALSE(IsSafeCheckpointableName("a/b"));
  EXPECT_FALSE(IsSafeCheckpointableName("_SHARDKEEP"));
}

}  // namespace
}  // namespace shardkeep::format
