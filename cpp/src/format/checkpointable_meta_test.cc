#include "format/checkpointable_meta.h"

#include <fstream>
#include <functional>
#include <sstream>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"
#include "testing/test_files.h"

namespace shardkeep::format {
namespace {

using json = nlohmann::json;
const std::string kFile = "ckpt/state/meta.json";

std::string ReadTestFile(const std::string& name) {
  return testdata::Read("format/" + name);
}

json Leaf(int i) { return {{"type", "leaf"}, {"leaf", i}}; }

// The pytree in cpp/testdata/format/golden_meta.json:
//   {"a": f32[4,6], "b": {"c": (bf16[8,1024] sharded, inf)}, "lr": 0.5,
//    "name": "demo", "nothing": None, "step": 1200, "x/y": int4[]}
// That file was written by hand from docs/FORMAT.md (leaf field order,
// null/[] conventions, two-space indentation; the opaque "tree" and
// "sharding" objects have sorted keys), not by the encoder; the encoder's
// output is required to equal it byte for byte.
CheckpointableMeta GoldenMeta() {
  CheckpointableMeta m;
  m.kind = "pytree";
  m.tree = {{"type", "dict"},
            {"keys", {"a", "b", "lr", "name", "nothing", "step", "x/y"}},
            {"children",
             {Leaf(0),
              {{"type", "dict"},
               {"keys", {"c"}},
               {"children",
                {{{"type", "tuple"}, {"children", {Leaf(1), Leaf(2)}}}}}},
              Leaf(3), Leaf(4), Leaf(5), Leaf(6), Leaf(7)}}};
  auto leaf = [](std::string path, LeafKind kind, std::string dtype,
                 std::vector<uint64_t> shape, json value = nullptr) {
    LeafMeta l;
    l.path = std::move(path);
    l.kind = kind;
    l.dtype = std::move(dtype);
    l.shape = std::move(shape);
    l.value = std::move(value);
    return l;
  };
  m.leaves = {
      leaf("a", LeafKind::kArray, "float32", {4, 6}),
      leaf("b/c/0", LeafKind::kArray, "bfloat16", {8, 1024}),
      leaf("b/c/1", LeafKind::kScalar, "float64", {}, "inf"),
      leaf("lr", LeafKind::kScalar, "float64", {}, 0.5),
      leaf("name", LeafKind::kString, "", {}, "demo"),
      leaf("nothing", LeafKind::kNone, "", {}),
      leaf("step", LeafKind::kScalar, "int64", {}, 1200),
      leaf("x~1y", LeafKind::kArray, "int4", {}),
  };
  m.leaves[1].sharding = {{"mesh_axes", {"data", "model"}},
                          {"spec", {"data", nullptr}}};
  return m;
}

void ExpectSameMeta(const CheckpointableMeta& a, const CheckpointableMeta& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.tree, b.tree);
  ASSERT_EQ(a.leaves.size(), b.leaves.size());
  for (size_t i = 0; i < a.leaves.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(a.leaves[i].path, b.leaves[i].path);
    EXPECT_EQ(a.leaves[i].kind, b.leaves[i].kind);
    EXPECT_EQ(a.leaves[i].dtype, b.leaves[i].dtype);
    EXPECT_EQ(a.leaves[i].shape, b.leaves[i].shape);
    EXPECT_EQ(a.leaves[i].sharding, b.leaves[i].sharding);
    EXPECT_EQ(a.leaves[i].value, b.leaves[i].value);
  }
}

void ExpectCorruption(const std::string& text, const std::string& what) {
  auto r = DecodeCheckpointableMeta(text, kFile);
  ASSERT_FALSE(r.ok()) << text;
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_EQ(r.status().message().rfind(kFile + ": ", 0), 0u)
      << r.status().message();
  EXPECT_NE(r.status().message().find(what), std::string::npos)
      << r.status().message();
}

// The golden document with leaf `i` edited by `edit`.
std::string WithLeaf(size_t i, const std::function<void(json&)>& edit) {
  json j = json::parse(ReadTestFile("golden_meta.json"));
  edit(j["leaves"][i]);
  return j.dump();
}

TEST(CheckpointableMetaGolden, EncoderMatchesGoldenByteForByte) {
  const std::string golden = ReadTestFile("golden_meta.json");
  ASSERT_FALSE(golden.empty()) << "missing cpp/testdata/format/golden_meta.json";
  EXPECT_EQ(EncodeCheckpointableMeta(GoldenMeta()), golden);
}

TEST(CheckpointableMetaGolden, DecoderReadsGolden) {
  SK_ASSERT_OK_AND_ASSIGN(
      auto m, DecodeCheckpointableMeta(ReadTestFile("golden_meta.json"), kFile));
  ExpectSameMeta(m, GoldenMeta());
}

TEST(CheckpointableMeta, JsonAndBytesKinds) {
  for (const char* kind : {"json", "bytes"}) {
    CheckpointableMeta m;
    m.kind = kind;
    const std::string text = EncodeCheckpointableMeta(m);
    EXPECT_EQ(text, std::string("{\n  \"kind\": \"") + kind + "\"\n}\n");
    SK_ASSERT_OK_AND_ASSIGN(auto d, DecodeCheckpointableMeta(text, kFile));
    EXPECT_EQ(d.kind, kind);
    EXPECT_TRUE(d.leaves.empty());
  }
}

TEST(CheckpointableMeta, EmptyPytreeAndLargeShapes) {
  CheckpointableMeta m;
  m.kind = "pytree";
  m.tree = {{"type", "dict"}, {"keys", json::array()},
            {"children", json::array()}};
  SK_ASSERT_OK_AND_ASSIGN(
      auto d, DecodeCheckpointableMeta(EncodeCheckpointableMeta(m), kFile));
  ExpectSameMeta(d, m);

  LeafMeta big;
  big.path = "w";
  big.dtype = "uint8";
  big.shape = {uint64_t{1} << 40, 0, 3};
  m.tree = Leaf(0);
  m.leaves = {big};
  SK_ASSERT_OK_AND_ASSIGN(
      d, DecodeCheckpointableMeta(EncodeCheckpointableMeta(m), kFile));
  ExpectSameMeta(d, m);
}

TEST(CheckpointableMeta, MissingOptionalFieldsTakeDefaults) {
  const std::string text = R"({"kind": "pytree",
    "tree": {"type": "list", "children": [{"type": "leaf", "leaf": 0},
             {"type": "leaf", "leaf": 1}, {"type": "leaf", "leaf": 2}]},
    "leaves": [{"path": "", "kind": "array", "dtype": "float32", "shape": [2]},
               {"path": "s", "kind": "scalar", "dtype": "bool", "value": true},
               {"path": "n", "kind": "none"}], "future_field": 1})";
  SK_ASSERT_OK_AND_ASSIGN(auto m, DecodeCheckpointableMeta(text, kFile));
  ASSERT_EQ(m.leaves.size(), 3u);
  EXPECT_TRUE(m.leaves[0].sharding.is_null());
  EXPECT_TRUE(m.leaves[1].shape.empty());
  EXPECT_EQ(m.leaves[1].value, true);
  EXPECT_EQ(m.leaves[2].kind, LeafKind::kNone);
  EXPECT_EQ(m.leaves[2].dtype, "");
}

// Typed PRNG key data and registered kinds keep their names; both fields
// are left out when empty (the golden file has neither).
TEST(CheckpointableMeta, PrngImplAndRegisteredKindRoundTrip) {
  CheckpointableMeta m = GoldenMeta();
  m.registered_kind = "train_state";
  m.leaves[0].prng_impl = "threefry2x32";
  const std::string text = EncodeCheckpointableMeta(m);
  SK_ASSERT_OK_AND_ASSIGN(CheckpointableMeta back,
                          DecodeCheckpointableMeta(text, "meta.json"));
  EXPECT_EQ(back.registered_kind, "train_state");
  EXPECT_EQ(back.leaves[0].prng_impl, "threefry2x32");
  EXPECT_EQ(back.leaves[1].prng_impl, "");
  EXPECT_EQ(EncodeCheckpointableMeta(back), text);
  ExpectCorruption(R"({"kind": "json", "registered_kind": 3})", "registered_kind");
}

TEST(CheckpointableMeta, LeafKindNames) {
  EXPECT_EQ(LeafKindName(LeafKind::kArray), "array");
  EXPECT_EQ(LeafKindName(LeafKind::kScalar), "scalar");
  EXPECT_EQ(LeafKindName(LeafKind::kString), "string");
  EXPECT_EQ(LeafKindName(LeafKind::kNone), "none");
}

TEST(CheckpointableMetaErrors, Document) {
  ExpectCorruption("", "expected a JSON document");
  ExpectCorruption("{", "expected a JSON document");
  ExpectCorruption("[]", "expected a JSON object");
  ExpectCorruption("{}", "expected \"kind\" to be a string");
  ExpectCorruption(R"({"kind": 3})", "\"kind\"");
  ExpectCorruption(R"({"kind": "pytree", "leaves": []})", "\"tree\"");
  ExpectCorruption(R"({"kind": "pytree", "tree": [], "leaves": []})", "\"tree\"");
  ExpectCorruption(R"({"kind": "pytree", "tree": {}})", "\"leaves\"");
  ExpectCorruption(R"({"kind": "pytree", "tree": {}, "leaves": {}})", "\"leaves\"");
  ExpectCorruption(R"({"kind": "pytree", "tree": {}, "leaves": [3]})",
                   "leaf 0: expected an object");
  ExpectCorruption(R"({"kind": "pytree", "tree": )" + std::string(5000, '[') +
                       std::string(5000, ']') + "}",
                   "nested deeper");
}

TEST(CheckpointableMeta, BracketsInsideStringsDoNotCountAsNesting) {
  // A key path may hold any characters, escaped quotes included.
  const std::string brackets = std::string(600, '[') + "\\\"" + std::string(600, '{');
  const json meta = {{"kind", "pytree"},
                     {"tree", {{"type", "dict"}, {"keys", {brackets}},
                               {"children", {Leaf(0)}}}},
                     {"leaves", json::array({{{"path", brackets}, {"kind", "none"}}})}};
  SK_ASSERT_OK_AND_ASSIGN(format::CheckpointableMeta decoded,
                          format::DecodeCheckpointableMeta(meta.dump(), "meta.json"));
  ASSERT_EQ(decoded.leaves.size(), 1u);
  EXPECT_EQ(decoded.leaves[0].path, brackets);
}

TEST(CheckpointableMetaErrors, LeafFields) {
  // Each error names the leaf by index and path.
  ExpectCorruption(WithLeaf(3, [](json& l) { l.erase("path"); }),
                   "leaf 3: expected \"path\" to be a string");
  ExpectCorruption(WithLeaf(3, [](json& l) { l["path"] = 7; }), "leaf 3");
  ExpectCorruption(WithLeaf(3, [](json& l) { l["path"] = "a"; }),
                   "leaf 3 (\"a\"): duplicate leaf path");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["kind"] = "tensor"; }),
                   "leaf 0 (\"a\"): expected \"kind\" to be array, scalar");
  ExpectCorruption(WithLeaf(0, [](json& l) { l.erase("kind"); }),
                   "leaf 0 (\"a\"): expected \"kind\"");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["dtype"] = "float33"; }),
                   "leaf 0 (\"a\"): expected a known dtype, found \"float33\"");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["dtype"] = nullptr; }),
                   "known dtype");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["dtype"] = 4; }),
                   "\"dtype\" to be a string");
  ExpectCorruption(WithLeaf(3, [](json& l) { l.erase("dtype"); }),
                   "leaf 3 (\"lr\"): expected a known dtype");
  ExpectCorruption(WithLeaf(0, [](json& l) { l.erase("shape"); }),
                   "expected \"shape\" for an array leaf");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["shape"] = {4, -6}; }),
                   "non-negative integers");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["shape"] = {4, 6.0}; }),
                   "non-negative integers");
  ExpectCorruption(WithLeaf(0, [](json& l) { l["shape"] = "4x6"; }),
                   "at most 64 extents");
  ExpectCorruption(
      WithLeaf(0, [](json& l) { l["shape"] = std::vector<int>(65, 1); }),
      "at most 64 extents");
  ExpectCorruption(WithLeaf(3, [](json& l) { l.erase("value"); }),
                   "leaf 3 (\"lr\"): expected a \"value\"");
  ExpectCorruption(WithLeaf(3, [](json& l) { l["value"] = "1.5"; }),
                   "a bool, a number");
  ExpectCorruption(WithLeaf(3, [](json& l) { l["value"] = json::array(); }),
                   "a bool, a number");
  ExpectCorruption(WithLeaf(4, [](json& l) { l["value"] = 3; }),
                   "leaf 4 (\"name\"): expected \"value\" to be a string");
}

// The golden document with its tree edited by `edit`.
std::string WithTree(const std::function<void(json&)>& edit) {
  json j = json::parse(ReadTestFile("golden_meta.json"));
  edit(j["tree"]);
  return j.dump();
}

TEST(CheckpointableMetaErrors, TreeLeafNumbers) {
  // The golden tree: {"a": 0, "b": {"c": (1, 2)}, "lr": 3, ..., "x/y": 7}.
  ExpectCorruption(WithTree([](json& t) { t["children"][0]["leaf"] = -1; }),
                   "tree node /tree/children/0: expected \"leaf\" to be an integer "
                   "in [0, 8), found -1");
  ExpectCorruption(WithTree([](json& t) { t["children"][0]["leaf"] = 8; }),
                   "in [0, 8), found 8");
  ExpectCorruption(WithTree([](json& t) { t["children"][0]["leaf"] = 0.0; }),
                   "found 0.0");
  ExpectCorruption(WithTree([](json& t) { t["children"][0].erase("leaf"); }),
                   "found none");
  ExpectCorruption(WithTree([](json& t) { t["children"][6]["leaf"] = 2; }),
                   "tree node /tree/children/6: leaf 2 is already used by node "
                   "/tree/children/1/children/0/children/1");
  // A leaf no node refers to (leaf 7 dropped with its key).
  ExpectCorruption(WithTree([](json& t) {
                     t["children"].erase(6);
                     t["keys"].erase(6);
                   }),
                   "leaf 7 is not referenced by any node of \"tree\"");
}

TEST(CheckpointableMetaErrors, TreeNodeShapes) {
  ExpectCorruption(WithTree([](json& t) { t["children"].erase(6); }),
                   "tree node /tree: has 7 keys but 6 children");
  ExpectCorruption(WithTree([](json& t) { t["children"][1]["keys"].push_back("d"); }),
                   "tree node /tree/children/1: has 2 keys but 1 children");
  ExpectCorruption(WithTree([](json& t) { t.erase("children"); }),
                   "tree node /tree: expected \"children\" to be an array");
  ExpectCorruption(WithTree([](json& t) { t["children"][1].erase("keys"); }),
                   "tree node /tree/children/1: expected \"keys\" to be an array");
  ExpectCorruption(WithTree([](json& t) { t["keys"][0] = 1.5; }),
                   "tree node /tree: expected keys to be strings or integers, found 1.5");
  ExpectCorruption(WithTree([](json& t) { t["keys"][1] = "a"; }),
                   "tree node /tree: duplicate key \"a\"");
  ExpectCorruption(WithTree([](json& t) { t["type"] = "set"; }),
                   "tree node /tree: expected \"type\" to be leaf, dict");
  ExpectCorruption(WithTree([](json& t) { t.erase("type"); }),
                   "tree node /tree: expected \"type\" to be a string");
  ExpectCorruption(WithTree([](json& t) { t["children"][3] = json::array(); }),
                   "tree node /tree/children/3: expected an object");
  auto namedtuple = [](json& t) {
    json& inner = t["children"][1]["children"][0];
    inner["type"] = "namedtuple";
    inner["name"] = "m.Pair";
    inner["fields"] = {"x", "y"};
  };
  SK_EXPECT_OK(DecodeCheckpointableMeta(WithTree(namedtuple), kFile).status());
  const std::string at = "tree node /tree/children/1/children/0: ";
  ExpectCorruption(WithTree([&](json& t) {
                     namedtuple(t);
                     t["children"][1]["children"][0]["fields"] = {"x"};
                   }),
                   at + "has 1 fields but 2 children");
  ExpectCorruption(WithTree([&](json& t) {
                     namedtuple(t);
                     t["children"][1]["children"][0]["fields"] = {"x", 2};
                   }),
                   at + "expected fields to be strings, found 2");
  ExpectCorruption(WithTree([&](json& t) {
                     namedtuple(t);
                     t["children"][1]["children"][0].erase("name");
                   }),
                   at + "expected \"name\" to be a string");
  // Custom nodes: integer keys are allowed, as for dicts.
  SK_EXPECT_OK(DecodeCheckpointableMeta(WithTree([](json& t) {
                                          t["type"] = "custom";
                                          t["name"] = "m.Module";
                                          t["keys"][0] = -3;
                                        }),
                                        kFile)
                   .status());
}

TEST(CheckpointableMetaErrors, LeavesOver2To63Bytes) {
  // 2^61 float64 elements are 2^64 bytes: the product wraps to 0.
  ExpectCorruption(WithLeaf(0, [](json& l) {
                     l["dtype"] = "float64";
                     l["shape"] = {uint64_t{1} << 61};
                   }),
                   "leaf 0 (\"a\"): shape [2305843009213693952] of float64 holds "
                   "more than 2^63 bytes");
  ExpectCorruption(WithLeaf(0, [](json& l) {
                     l["shape"] = {uint64_t{1} << 32, uint64_t{1} << 32, 0};
                   }),
                   "more than 2^63 bytes");
  ExpectCorruption(WithLeaf(3, [](json& l) { l["shape"] = {uint64_t{1} << 62}; }),
                   "leaf 3 (\"lr\"): shape");
  // Exactly 2^63 bytes is the largest leaf.
  SK_EXPECT_OK(DecodeCheckpointableMeta(WithLeaf(0, [](json& l) {
                                          l["dtype"] = "uint8";
                                          l["shape"] = {uint64_t{1} << 62, 2};
                                        }),
                                        kFile)
                   .status());
}

TEST(CheckpointableMeta, MaxRankAccepted) {
  const std::string text =
      WithLeaf(0, [](json& l) { l["shape"] = std::vector<int>(64, 1); });
  SK_ASSERT_OK_AND_ASSIGN(auto m, DecodeCheckpointableMeta(text, kFile));
  EXPECT_EQ(m.leaves[0].shape.size(), 64u);
}

TEST(CheckpointableMeta, NonFiniteScalarStrings) {
  for (const char* v : {"nan", "inf", "-inf"}) {
    SK_EXPECT_OK(DecodeCheckpointableMeta(
                     WithLeaf(3, [v](json& l) { l["value"] = v; }), kFile)
                     .status());
  }
}

}  // namespace
}  // namespace shardkeep::format
