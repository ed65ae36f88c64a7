#include "format/key_tree.h"

#include <gtest/gtest.h>

namespace shardkeep::format {
namespace {

TreeKey D(std::string name) { return {std::move(name), false}; }
TreeKey L(std::string name) { return {std::move(name), true}; }

nlohmann::json Leaf(int n) { return {{"type", "leaf"}, {"leaf", n}}; }

TEST(KeyTreeTest, NestsDictsAndListsKeysInFirstEntryOrderLeavesInEntryOrder) {
  Result<nlohmann::json> tree = TreeFromKeys(
      {{{D("b"), L("1")}}, {{D("a")}}, {{D("b"), L("0")}}, {{D("c")}, KeyedValue::kEmptyList}},
      "ckpt");
  ASSERT_TRUE(tree.ok()) << tree.status().message();
  const nlohmann::json expected = {
      {"type", "dict"},
      {"keys", {"b", "a", "c"}},
      {"children",
       {{{"type", "list"}, {"children", {Leaf(2), Leaf(0)}}},
        Leaf(1),
        {{"type", "list"}, {"children", nlohmann::json::array()}}}}};
  EXPECT_EQ(*tree, expected);
}

TEST(KeyTreeTest, OneEntryWithoutKeysIsTheWholeTreeAndNoEntryAnEmptyDict) {
  EXPECT_EQ(*TreeFromKeys({{{}}}, "x"), Leaf(0));
  Result<nlohmann::json> empty = TreeFromKeys({}, "x");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ((*empty)["type"], "dict");
  EXPECT_TRUE((*empty)["keys"].empty());
}

TEST(KeyTreeTest, RefusesConflictingPlacesNamingThemByEscapedKeyPath) {
  auto message = [](std::vector<KeyedEntry> entries) {
    Result<nlohmann::json> tree = TreeFromKeys(entries, "f.distcp");
    EXPECT_EQ(tree.status().code(), StatusCode::kCorruption);
    return tree.status().message();
  };
  EXPECT_EQ(message({{{D("a/b")}}, {{D("a/b")}}}), "f.distcp: two leaves at 'a~1b'");
  EXPECT_EQ(message({{{D("a")}}, {{D("a"), D("b")}}}), "f.distcp: 'a' is both a leaf and a node");
  EXPECT_EQ(message({{{D("a"), L("0")}}, {{D("a"), D("k")}}}),
            "f.distcp: 'a' is used both as a list and as a dict");
  EXPECT_EQ(message({{{D("layers"), L("1")}}}),
            "f.distcp: list 'layers' has positions ['1'], not 0..0");
  EXPECT_EQ(message({{{L("0")}}, {{L("01")}}}),
            "f.distcp: list '<root>' has positions ['0', '01'], not 0..1");
  EXPECT_EQ(message({{{}}, {{D("a")}}}), "f.distcp: a leaf at the root beside other leaves");
}

}  // namespace
}  // namespace shardkeep::format
