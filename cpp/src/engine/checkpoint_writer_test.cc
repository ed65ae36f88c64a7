// CheckpointWriter: checkpoints built from key paths read back through
// CheckpointReader bit-exactly, the trees it derives, and the errors for
// each kind of bad input.
#include "shardkeep/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <atomic>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>

#include <nlohmann/json.hpp>

#include "testing/payloads.h"
#include "testing/simulated_group.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using json = nlohmann::json;

template <typename T>
std::vector<uint8_t> BytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

class CheckpointWriterTest : public ::testing::Test {
 protected:
  std::shared_ptr<Storage> storage_ = NewMemoryStorage();

  // The checkpoint's tree and leaves, after a commit.
  PytreeInfo Tree(const std::string& path, const std::string& name = "state") {
    auto reader = CheckpointReader::Open(storage_, path);
    EXPECT_TRUE(reader.ok()) << reader.status().ToString();
    if (!reader.ok()) return {};
    auto tree = (*reader)->Pytree(name);
    EXPECT_TRUE(tree.ok()) << tree.status().ToString();
    return tree.ok() ? *tree : PytreeInfo{};
  }

  // Commits a checkpoint whose "state" holds `paths` as float32 [2] leaves.
  PytreeInfo CommitLeaves(const std::vector<std::string>& paths) {
    CheckpointWriter writer(storage_, "tree");
    auto state = writer.AddPytree("state");
    EXPECT_TRUE(state.ok());
    for (const std::string& path : paths) {
      SK_EXPECT_OK((*state)->AddArray(path, DType::kFloat32, {2}));
      SK_EXPECT_OK((*state)->AddShard(path, DType::kFloat32, Box{{0}, {2}},
                                      BytesOf(std::vector<float>{1, 2})));
    }
    SK_EXPECT_OK(writer.Commit(Options()));
    return Tree("tree");
  }
};

TEST_F(CheckpointWriterTest, WritesWhatTheReaderReadsBitExactly) {
  std::vector<float> kernel(6 * 4);
  std::iota(kernel.begin(), kernel.end(), -3.25f);
  const std::vector<uint16_t> bias = {0x3f80, 0xc000, 0x7fc0, 0x0001};  // bfloat16 bits
  const int32_t count = 7;

  CheckpointWriter writer(storage_, "run/000100");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  const std::string sharding = R"({"mesh_axes": ["data"], "spec": ["data", null]})";
  SK_ASSERT_OK(state->AddArray("params/dense/kernel", DType::kFloat32, {6, 4}, sharding));
  SK_ASSERT_OK(state->AddArray("params/dense/bias", DType::kBFloat16, {4}));
  SK_ASSERT_OK(state->AddArray("opt/count", DType::kInt32, {}));
  SK_ASSERT_OK(state->AddInt("step", 100));
  SK_ASSERT_OK(state->AddFloat("lr", 0.125));
  SK_ASSERT_OK(state->AddFloat("inf", -INFINITY));
  SK_ASSERT_OK(state->AddBool("flag", true));
  SK_ASSERT_OK(state->AddString("name", "tiny/model"));
  SK_ASSERT_OK(state->AddNone("nothing"));
  // Three row blocks, borrowed; the bias and the count handed over.
  for (uint64_t row = 0; row < 6; row += 2) {
    SK_ASSERT_OK(state->AddShard("params/dense/kernel", DType::kFloat32,
                                 Box{{row, 0}, {2, 4}}, kernel.data() + row * 4,
                                 2 * 4 * sizeof(float)));
  }
  SK_ASSERT_OK(state->AddShard("params/dense/bias", DType::kBFloat16, Box{{0}, {4}},
                               BytesOf(bias)));
  SK_ASSERT_OK(state->AddShard("opt/count", DType::kInt32, Box{{}, {}},
                               BytesOf(std::vector<int32_t>{count})));
  SK_ASSERT_OK(writer.AddJson("config", R"({"layers": 2})"));
  SK_ASSERT_OK(writer.AddBytes("tokenizer", std::string("vo\0cab", 6)));
  writer.SetStep(100);
  SK_ASSERT_OK(writer.SetCustomMetadata(R"({"model": "tiny"})"));
  SK_ASSERT_OK(writer.SetMetrics(R"({"loss": 0.5})"));
  SK_ASSERT_OK(writer.Commit(Options()));

  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "run/000100"));
  const CheckpointInfo& info = reader->Info();
  EXPECT_EQ(info.step, 100);
  EXPECT_EQ(info.process_count, 1);
  ASSERT_EQ(info.checkpointables.size(), 3u);
  EXPECT_EQ(info.checkpointables[0].name, "state");
  EXPECT_EQ(info.checkpointables[1].kind, "json");
  EXPECT_EQ(info.checkpointables[2].kind, "bytes");
  EXPECT_EQ(info.custom_metadata_json, R"({"model":"tiny"})");
  EXPECT_EQ(info.metrics_json, R"({"loss":0.5})");

  SK_ASSERT_OK_AND_ASSIGN(PytreeInfo tree, reader->Pytree("state"));
  std::vector<std::string> paths;
  for (const LeafInfo& leaf : tree.leaves) paths.push_back(leaf.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"params/dense/kernel", "params/dense/bias",
                                             "opt/count", "step", "lr", "inf", "flag",
                                             "name", "nothing"}));
  const LeafInfo& kernel_info = *tree.Find("params/dense/kernel");
  EXPECT_EQ(kernel_info.dtype, DType::kFloat32);
  EXPECT_EQ(kernel_info.shape, (std::vector<uint64_t>{6, 4}));
  EXPECT_EQ(json::parse(kernel_info.sharding_json), json::parse(sharding));
  EXPECT_EQ(tree.Find("params/dense/bias")->sharding_json, "null");
  EXPECT_EQ(tree.Find("step")->kind, LeafKind::kScalar);
  EXPECT_EQ(tree.Find("step")->dtype, DType::kInt64);
  EXPECT_EQ(tree.Find("step")->value_json, "100");
  EXPECT_EQ(tree.Find("lr")->dtype, DType::kFloat64);
  EXPECT_EQ(tree.Find("lr")->value_json, "0.125");
  EXPECT_EQ(tree.Find("inf")->value_json, "\"-inf\"");
  EXPECT_EQ(tree.Find("flag")->dtype, DType::kBool);
  EXPECT_EQ(tree.Find("flag")->value_json, "true");
  EXPECT_EQ(tree.Find("name")->kind, LeafKind::kString);
  EXPECT_EQ(tree.Find("name")->value_json, "\"tiny/model\"");
  EXPECT_EQ(tree.Find("nothing")->kind, LeafKind::kNone);

  const json expected_tree = json::parse(R"({"type": "dict", "keys": ["params", "opt", "step",
      "lr", "inf", "flag", "name", "nothing"], "children": [
    {"type": "dict", "keys": ["dense"], "children": [
      {"type": "dict", "keys": ["kernel", "bias"], "children": [
        {"type": "leaf", "leaf": 0}, {"type": "leaf", "leaf": 1}]}]},
    {"type": "dict", "keys": ["count"], "children": [{"type": "leaf", "leaf": 2}]},
    {"type": "leaf", "leaf": 3}, {"type": "leaf", "leaf": 4}, {"type": "leaf", "leaf": 5},
    {"type": "leaf", "leaf": 6}, {"type": "leaf", "leaf": 7}, {"type": "leaf", "leaf": 8}]})");
  EXPECT_EQ(json::parse(tree.tree_json), expected_tree);

  std::vector<float> kernel_back(kernel.size());
  SK_ASSERT_OK(reader->ReadLeaf("state", "params/dense/kernel", DType::kFloat32,
                                kernel_back.data(), Options()));
  EXPECT_EQ(std::memcmp(kernel_back.data(), kernel.data(), kernel.size() * 4), 0);
  std::vector<uint16_t> bias_back(4);
  SK_ASSERT_OK(reader->ReadLeaf("state", "params/dense/bias", DType::kBFloat16,
                                bias_back.data(), Options()));
  EXPECT_EQ(bias_back, bias);
  int32_t count_back = 0;
  SK_ASSERT_OK(reader->ReadLeaf("state", "opt/count", DType::kInt32, &count_back, Options()));
  EXPECT_EQ(count_back, count);
  SK_ASSERT_OK_AND_ASSIGN(std::string config, reader->ReadValue("config"));
  EXPECT_EQ(config, R"({"layers": 2})");
  SK_ASSERT_OK_AND_ASSIGN(std::string tokenizer, reader->ReadValue("tokenizer"));
  EXPECT_EQ(tokenizer, std::string("vo\0cab", 6));
}

TEST_F(CheckpointWriterTest, LeavesFollowTheTreeOrderNotTheDeclarationOrder) {
  PytreeInfo tree = CommitLeaves({"a/x", "b/y", "a/z"});
  ASSERT_EQ(tree.leaves.size(), 3u);
  EXPECT_EQ(tree.leaves[0].path, "a/x");
  EXPECT_EQ(tree.leaves[1].path, "a/z");
  EXPECT_EQ(tree.leaves[2].path, "b/y");
  EXPECT_EQ(json::parse(tree.tree_json)["keys"], json::parse(R"(["a", "b"])"));
}

TEST_F(CheckpointWriterTest, EscapedSegmentsBecomeTheirKeysAndDigitsStayStrings) {
  PytreeInfo tree = CommitLeaves({"x~1y/~0z", "layers/0", "/empty"});
  const json expected = json::parse(R"({"type": "dict", "keys": ["x/y", "layers", ""],
    "children": [
      {"type": "dict", "keys": ["~z"], "children": [{"type": "leaf", "leaf": 0}]},
      {"type": "dict", "keys": ["0"], "children": [{"type": "leaf", "leaf": 1}]},
      {"type": "dict", "keys": ["empty"], "children": [{"type": "leaf", "leaf": 2}]}]})");
  EXPECT_EQ(json::parse(tree.tree_json), expected);
}

TEST_F(CheckpointWriterTest, TheEmptyPathIsARootLeaf) {
  PytreeInfo tree = CommitLeaves({""});
  EXPECT_EQ(json::parse(tree.tree_json), json::parse(R"({"type": "leaf", "leaf": 0})"));
}

TEST_F(CheckpointWriterTest, AnEmptyArrayNeedsNoShard) {
  CheckpointWriter writer(storage_, "empty");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  SK_ASSERT_OK(state->AddArray("none_yet", DType::kFloat32, {3, 0}));
  SK_ASSERT_OK(writer.Commit(Options()));
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "empty"));
  SK_ASSERT_OK(reader->ReadLeaf("state", "none_yet", DType::kFloat32, nullptr, Options()));
}

TEST_F(CheckpointWriterTest, ASourceShardIsFilledChunkByChunk) {
  CheckpointWriter writer(storage_, "sourced");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  SK_ASSERT_OK(state->AddArray("w", DType::kInt32, {64, 16}));
  std::atomic<int> calls{0};
  SK_ASSERT_OK(state->AddShardSource(
      "w", DType::kInt32, Box{{0, 0}, {64, 16}}, [&](const Box& chunk, uint8_t* dst) {
        ++calls;
        int32_t* out = reinterpret_cast<int32_t*>(dst);
        for (uint64_t r = 0; r < chunk.shape[0]; ++r) {
          for (uint64_t c = 0; c < chunk.shape[1]; ++c) {
            *out++ = static_cast<int32_t>((chunk.origin[0] + r) * 16 + chunk.origin[1] + c);
          }
        }
        return Status::Ok();
      }));
  EXPECT_EQ(state->AddShardSource("w", DType::kFloat32, Box{{0, 0}, {1, 16}}, nullptr).code(),
            StatusCode::kInvalidArgument);  // the leaf is int32
  Options options;
  options.chunk_bytes = 1024;  // 16 rows of 16 int32s
  SK_ASSERT_OK(writer.Commit(options));
  EXPECT_EQ(calls.load(), 4);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "sourced"));
  std::vector<int32_t> w(64 * 16);
  SK_ASSERT_OK(reader->ReadLeaf("state", "w", DType::kInt32, w.data(), Options()));
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], static_cast<int32_t>(i));
}

TEST_F(CheckpointWriterTest, NoLeavesIsAnEmptyDict) {
  PytreeInfo tree = CommitLeaves({});
  EXPECT_EQ(json::parse(tree.tree_json),
            json::parse(R"({"type": "dict", "keys": [], "children": []})"));
}

TEST_F(CheckpointWriterTest, AnExplicitTreeGivesListsAndTuplesTheirLeaves) {
  CheckpointWriter writer(storage_, "explicit");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  SK_ASSERT_OK(state->AddInt("layers/1/b", 2));
  SK_ASSERT_OK(state->AddInt("layers/0", 1));
  SK_ASSERT_OK(state->AddInt("pair/1", 4));
  SK_ASSERT_OK(state->AddInt("pair/0", 3));
  SK_ASSERT_OK(state->AddInt("7", 5));
  SK_ASSERT_OK(state->SetTree(R"({"type": "dict", "keys": ["layers", "pair", 7], "children": [
      {"type": "list", "children": [{"type": "leaf"},
                                    {"type": "namedtuple", "name": "m.P", "fields": ["b"],
                                     "children": [{"type": "leaf", "leaf": 99}]}]},
      {"type": "tuple", "children": [{"type": "leaf"}, {"type": "leaf"}]},
      {"type": "leaf"}]})"));
  SK_ASSERT_OK(writer.Commit(Options()));
  PytreeInfo tree = Tree("explicit");
  std::vector<std::string> paths;
  for (const LeafInfo& leaf : tree.leaves) paths.push_back(leaf.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"layers/0", "layers/1/b", "pair/0", "pair/1", "7"}));
  const json expected = json::parse(R"({"type": "dict", "keys": ["layers", "pair", 7], "children": [
      {"type": "list", "children": [{"type": "leaf", "leaf": 0},
                                    {"type": "namedtuple", "name": "m.P", "fields": ["b"],
                                     "children": [{"type": "leaf", "leaf": 1}]}]},
      {"type": "tuple", "children": [{"type": "leaf", "leaf": 2}, {"type": "leaf", "leaf": 3}]},
      {"type": "leaf", "leaf": 4}]})");
  EXPECT_EQ(json::parse(tree.tree_json), expected);
}

// The error of `status` is InvalidArgument and names each of `parts`.
void ExpectInvalid(const Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "'" << part << "' not in: " << status.ToString();
  }
}

TEST_F(CheckpointWriterTest, RefusesBadPaths) {
  CheckpointWriter writer(storage_, "bad");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  SK_ASSERT_OK(state->AddInt("a/b", 1));
  ExpectInvalid(state->AddInt("a/b", 2), {"'a/b'", "'state'", "declared twice"});
  ExpectInvalid(state->AddInt("a", 2), {"'a'", "is a prefix of leaf 'a/b'"});
  ExpectInvalid(state->AddInt("a/b/c", 2), {"'a/b/c'", "leaf 'a/b' is a prefix"});
  ExpectInvalid(state->AddInt("", 2), {"root leaf", "'a/b'"});
  ExpectInvalid(state->AddInt("x/a~2b", 2), {"'x/a~2b'", "segment 'a~2b'"});
  ExpectInvalid(state->AddInt("x~", 2), {"segment 'x~'"});
  SK_ASSERT_OK(state->AddInt("ab", 3));  // a prefix of the string, not of the path

  CheckpointWriter root_writer(storage_, "root");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * root, root_writer.AddPytree("state"));
  SK_ASSERT_OK(root->AddInt("", 1));
  ExpectInvalid(root->AddInt("a", 2), {"root leaf"});
}

TEST_F(CheckpointWriterTest, RefusesBadArraysAndShards) {
  CheckpointWriter writer(storage_, "bad");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  ExpectInvalid(state->AddArray("s", DType::kFloat32, {2}, "{not json"),
                {"'s'", "sharding description", "not JSON"});
  ExpectInvalid(state->AddArray("s", DType::kFloat32, {2}, "[\"data\"]"),
                {"'s'", "null or a JSON object"});
  ExpectInvalid(state->AddArray("huge", DType::kFloat64, {uint64_t{1} << 62, 4}),
                {"'huge'", "2^63 bytes"});
  ExpectInvalid(state->AddArray("deep", DType::kInt8, std::vector<uint64_t>(65, 1)),
                {"'deep'", "rank 65"});
  SK_ASSERT_OK(state->AddArray("w", DType::kFloat32, {4, 2}));
  SK_ASSERT_OK(state->AddInt("step", 1));
  std::vector<float> data(8);
  ExpectInvalid(state->AddShard("w", DType::kFloat32, Box{{3, 0}, {2, 2}}, data.data(), 16),
                {"'w'", "[3:5, 0:2]", "outside shape [0:4, 0:2]"});
  ExpectInvalid(state->AddShard("w", DType::kFloat32, Box{{0}, {4}}, data.data(), 16),
                {"'w'", "outside shape"});
  ExpectInvalid(state->AddShard("w", DType::kBFloat16, Box{{0, 0}, {4, 2}}, data.data(), 16),
                {"'w'", "dtype bfloat16", "float32"});
  ExpectInvalid(state->AddShard("w", DType::kFloat32, Box{{0, 0}, {4, 2}}, data.data(), 16),
                {"'w'", "needs 32 bytes, got 16"});
  ExpectInvalid(state->AddShard("w", DType::kFloat32, Box{{0, 0}, {4, 2}},
                                std::vector<uint8_t>(31)),
                {"'w'", "needs 32 bytes, got 31"});
  ExpectInvalid(state->AddShard("w", DType::kFloat32, Box{{0, 0}, {4, 2}}, nullptr, 32),
                {"'w'", "no data"});
  ExpectInvalid(state->AddShard("v", DType::kFloat32, Box{{0}, {1}}, data.data(), 4),
                {"'v'", "not been declared"});
  ExpectInvalid(state->AddShard("step", DType::kInt64, Box{{}, {}}, data.data(), 8),
                {"'step'", "scalar, not an array"});
}

TEST_F(CheckpointWriterTest, StartRefusesOverlappingShards) {
  CheckpointWriter writer(storage_, "overlap");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  std::vector<float> data(8);
  SK_ASSERT_OK(state->AddArray("w", DType::kFloat32, {4, 2}));
  SK_ASSERT_OK(state->AddShard("w", DType::kFloat32, Box{{0, 0}, {3, 2}}, data.data(), 24));
  SK_ASSERT_OK(state->AddShard("w", DType::kFloat32, Box{{2, 0}, {2, 2}}, data.data(), 16));
  ExpectInvalid(writer.Commit(Options()),
                {"'w'", "shards [0:3, 0:2] and [2:4, 0:2] overlap"});
  EXPECT_FALSE(CheckpointReader::Open(storage_, "overlap").ok());
}

TEST_F(CheckpointWriterTest, StartRefusesShardsThatLeaveElementsOutInOneProcess) {
  CheckpointWriter writer(storage_, "gap");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  std::vector<float> data = {1, 2, 3, 4, 5, 6, 7, 8};
  SK_ASSERT_OK(state->AddArray("w", DType::kFloat32, {4, 2}));
  SK_ASSERT_OK(state->AddArray("unwritten", DType::kFloat32, {3}));
  SK_ASSERT_OK(state->AddShard("w", DType::kFloat32, Box{{0, 0}, {3, 2}}, data.data(), 24));
  SK_ASSERT_OK(state->AddShard("unwritten", DType::kFloat32, Box{{0}, {3}}, data.data(), 12));
  ExpectInvalid(writer.Commit(Options()), {"'w'", "gap", "cover 6 of its 8 elements"});
  EXPECT_FALSE(CheckpointReader::Open(storage_, "gap").ok());
  // The refused writer is unchanged: the missing row completes it.
  SK_ASSERT_OK(state->AddShard("w", DType::kFloat32, Box{{3, 0}, {1, 2}}, data.data() + 6, 8));
  SK_ASSERT_OK(writer.Commit(Options()));
  std::vector<float> back(8, -1.0f);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "gap"));
  SK_ASSERT_OK(reader->ReadLeaf("state", "w", DType::kFloat32, back.data(), Options()));
  EXPECT_EQ(back, data);
}

TEST_F(CheckpointWriterTest, RefusesBadTrees) {
  auto start_with_tree = [&](const std::string& tree) {
    CheckpointWriter writer(storage_, "trees");
    auto state = writer.AddPytree("state");
    EXPECT_TRUE(state.ok());
    SK_EXPECT_OK((*state)->AddInt("a/0", 1));
    SK_EXPECT_OK((*state)->AddInt("a/1", 2));
    Status set = (*state)->SetTree(tree);
    return set.ok() ? writer.Commit(Options()) : set;
  };
  ExpectInvalid(start_with_tree("[1, "), {"tree of checkpointable 'state'", "not JSON"});
  ExpectInvalid(start_with_tree(R"({"type": "dict", "keys": ["a"], "children": [
      {"type": "list", "children": [{"type": "leaf"}, {"type": "leaf"}, {"type": "leaf"}]}]})"),
      {"/children/0/children/2", "'a/2' is not a declared leaf"});
  ExpectInvalid(start_with_tree(R"({"type": "dict", "keys": ["a"], "children": [
      {"type": "list", "children": [{"type": "leaf"}]}]})"),
      {"no leaf node for declared leaf 'a/1'"});
  ExpectInvalid(start_with_tree(R"({"type": "dict", "keys": ["a", "a"], "children": [
      {"type": "list", "children": [{"type": "leaf"}, {"type": "leaf"}]},
      {"type": "list", "children": [{"type": "leaf"}, {"type": "leaf"}]}]})"),
      {"/children/1/children/0", "second node for leaf 'a/0'"});
  ExpectInvalid(start_with_tree(R"({"type": "set", "children": []})"),
      {"node /", "unknown node type \"set\""});
  ExpectInvalid(start_with_tree(R"({"type": "dict", "keys": ["a"], "children": []})"),
      {"\"keys\", an array as long as \"children\""});
  // Caught by the format's own decoder once the leaves are numbered.
  ExpectInvalid(start_with_tree(R"({"type": "namedtuple", "fields": ["a"], "children": [
      {"type": "list", "children": [{"type": "leaf"}, {"type": "leaf"}]}]})"),
      {"would not load", "\"name\""});
  EXPECT_FALSE(CheckpointReader::Open(storage_, "trees").ok());
}

TEST_F(CheckpointWriterTest, RefusesBadCheckpointablesAndRecordFields) {
  CheckpointWriter writer(storage_, "bad");
  ExpectInvalid(writer.AddPytree(".hidden").status(), {"'.hidden'", "[A-Za-z0-9_.-]"});
  ExpectInvalid(writer.AddBytes("a/b", "x"), {"'a/b'"});
  SK_ASSERT_OK(writer.AddPytree("state").status());
  ExpectInvalid(writer.AddJson("state", "{}"), {"'state'", "added twice"});
  ExpectInvalid(writer.AddJson("config", "{nope"), {"value of checkpointable 'config'",
                                                    "not JSON"});
  ExpectInvalid(writer.SetCustomMetadata("[1]"), {"custom metadata", "JSON object"});
  ExpectInvalid(writer.SetMetrics("1"), {"metrics", "JSON object"});
}

// One rule for checkpointable names (format::CheckCheckpointableName): the
// writer and Save refuse the same names with the same error (Python's
// sk.save asks the same function, test_roundtrip.py), and every name they
// accept commits and reads back.
TEST_F(CheckpointWriterTest, WriterAndSaveRefuseTheSameNames) {
  const std::vector<std::string> bad = {"",    ".hidden",    "a/b", "a b",
                                        "..",  "_SHARDKEEP", "\xc3\xa9",
                                        std::string(256, 'x')};
  for (const std::string& name : bad) {
    SCOPED_TRACE("name '" + name + "'");
    CheckpointWriter writer(storage_, "names");
    const Status by_writer = writer.AddBytes(name, "x");
    SaveRequest request;
    request.path = "names";
    request.parts.push_back(testdata::PytreePayload(name, {{"w", "float32", {2}}}));
    const Status by_save =
        Save(storage_, NewSingleProcessCoordinator(), std::move(request), Options());
    EXPECT_EQ(by_writer.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(by_save.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(by_writer.message(), by_save.message());
    EXPECT_NE(by_writer.message().find("[A-Za-z0-9_.-]"), std::string::npos);
  }
  const std::vector<std::string> good = {"_opt", "-x", "a.b", "state", std::string(255, 'y')};
  for (const std::string& name : good) {
    SCOPED_TRACE("name '" + name + "'");
    CheckpointWriter writer(storage_, "good");
    writer.SetForce(true);
    SK_ASSERT_OK(writer.AddBytes(name, "x"));
    SK_ASSERT_OK(writer.Commit(Options()));
    SK_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CheckpointReader> reader,
                            CheckpointReader::Open(storage_, "good"));
    ASSERT_EQ(reader->Info().checkpointables.size(), 1u);
    EXPECT_EQ(reader->Info().checkpointables[0].name, name);
  }
}

TEST_F(CheckpointWriterTest, AWriterStartsOneSave) {
  CheckpointWriter writer(storage_, "once");
  SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
  SK_ASSERT_OK(state->AddInt("step", 1));
  SK_ASSERT_OK(writer.Commit(Options()));
  ExpectInvalid(writer.Commit(Options()), {"once", "already started"});
  ExpectInvalid(state->AddInt("late", 2), {"'state'", "already started"});
  ExpectInvalid(writer.AddBytes("late", "x"), {"already started"});
}

TEST_F(CheckpointWriterTest, ReplacesACommittedCheckpointOnlyWithForce) {
  for (int64_t step : {1, 2, 3}) {
    CheckpointWriter writer(storage_, "replaced");
    SK_ASSERT_OK_AND_ASSIGN(PytreeBuilder * state, writer.AddPytree("state"));
    SK_ASSERT_OK(state->AddInt("step", step));
    writer.SetForce(step == 3);
    Status committed = writer.Commit(Options());
    if (step == 2) {
      EXPECT_EQ(committed.code(), StatusCode::kAlreadyExists) << committed.ToString();
    } else {
      SK_EXPECT_OK(committed);
    }
  }
  EXPECT_EQ(Tree("replaced").Find("step")->value_json, "3");
}

// Each simulated process writes its own row block through its own
// coordinator; every process declares the same leaves.
TEST_F(CheckpointWriterTest, ProcessesEachWriteTheirShards) {
  constexpr int kProcesses = 2;
  std::vector<float> w(4 * 3);
  std::iota(w.begin(), w.end(), 0.5f);
  SimulatedGroup group(kProcesses);
  std::vector<Status> results(kProcesses);
  std::vector<std::thread> processes;
  for (int p = 0; p < kProcesses; ++p) {
    processes.emplace_back([&, p] {
      CheckpointWriter writer(storage_, "multi");
      writer.SetCoordinator(group.Member(p));
      writer.SetOperationId("multi-1");
      writer.SetStep(5);
      auto state = writer.AddPytree("state");
      if (!state.ok()) return void(results[p] = state.status());
      results[p] = (*state)->AddArray("w", DType::kFloat32, {4, 3});
      if (results[p].ok()) {
        results[p] = (*state)->AddShard("w", DType::kFloat32,
                                        Box{{uint64_t(2 * p), 0}, {2, 3}}, w.data() + 6 * p,
                                        6 * sizeof(float));
      }
      if (results[p].ok()) results[p] = writer.Commit(Options());
    });
  }
  for (std::thread& t : processes) t.join();
  for (const Status& status : results) SK_ASSERT_OK(status);

  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "multi"));
  EXPECT_EQ(reader->Info().process_count, kProcesses);
  std::vector<float> back(w.size());
  SK_ASSERT_OK(reader->ReadLeaf("state", "w", DType::kFloat32, back.data(), Options()));
  EXPECT_EQ(back, w);
}

// Runs one save of `kProcesses` simulated processes; `declare(p, state)`
// adds process p's leaves and shards. Returns each process's outcome.
std::vector<Status> SaveFromProcesses(
    std::shared_ptr<Storage> storage, const std::string& path,
    const std::function<Status(int, PytreeBuilder&)>& declare) {
  constexpr int kProcesses = 2;
  SimulatedGroup group(kProcesses);
  std::vector<Status> results(kProcesses);
  std::vector<std::thread> processes;
  for (int p = 0; p < kProcesses; ++p) {
    processes.emplace_back([&, p] {
      CheckpointWriter writer(storage, path);
      writer.SetCoordinator(group.Member(p));
      writer.SetOperationId(path);
      auto state = writer.AddPytree("state");
      results[p] = state.ok() ? declare(p, **state) : state.status();
      if (results[p].ok()) results[p] = writer.Commit(Options());
    });
  }
  for (std::thread& t : processes) t.join();
  return results;
}

TEST_F(CheckpointWriterTest, ProcessesThatDeclareDifferentLeavesDoNotCommit) {
  std::vector<float> w(4);
  std::vector<Status> results =
      SaveFromProcesses(storage_, "differ", [&](int p, PytreeBuilder& state) {
        SK_RETURN_IF_ERROR(state.AddArray("w", DType::kFloat32, {4u + p}));
        return state.AddShard("w", DType::kFloat32, Box{{0}, {2}}, w.data() + 2 * p,
                              2 * sizeof(float));
      });
  for (const Status& status : results) EXPECT_FALSE(status.ok());
  EXPECT_NE(results[0].message().find("meta.json"), std::string::npos)
      << results[0].ToString();
  EXPECT_FALSE(CheckpointReader::Open(storage_, "differ").ok());
}

// Coverage across processes cannot be checked by one process before the
// save; the save commits and the reader refuses the leaf, naming it.
TEST_F(CheckpointWriterTest, AGapBetweenProcessesIsCaughtByTheReader) {
  std::vector<float> w(4);
  std::vector<Status> results =
      SaveFromProcesses(storage_, "gap", [&](int p, PytreeBuilder& state) {
        SK_RETURN_IF_ERROR(state.AddArray("w", DType::kFloat32, {4}));
        SK_RETURN_IF_ERROR(state.AddInt("step", 1));
        if (p == 1) return Status::Ok();  // the rows [2, 4) are nobody's
        return state.AddShard("w", DType::kFloat32, Box{{0}, {2}}, w.data(), 8);
      });
  for (const Status& status : results) SK_ASSERT_OK(status);
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage_, "gap"));
  Status read = reader->Pytree("state").status();
  EXPECT_EQ(read.code(), StatusCode::kCorruption) << read.ToString();
  EXPECT_NE(read.message().find("leaf 'w'"), std::string::npos) << read.ToString();
  EXPECT_NE(read.message().find("cover 2 of its 4"), std::string::npos) << read.ToString();
}

}  // namespace
}  // namespace shardkeep
