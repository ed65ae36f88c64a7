#include "engine/decoded_meta_cache.h"

#include <gtest/gtest.h>

#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep::internal {
namespace {

std::string MetaWithLeaf(const std::string& name) {
  return testdata::PytreeMetaJson({{name, "float32", {4, 2}}});
}

TEST(DecodedMetaCacheTest, TheSameTextDecodesOnce) {
  const std::string json = MetaWithLeaf("cached_w");
  SK_ASSERT_OK_AND_ASSIGN(auto first, DecodeMetaCached(json, "state/meta.json"));
  SK_ASSERT_OK_AND_ASSIGN(auto again, DecodeMetaCached(std::string(json), "state/meta.json"));
  EXPECT_EQ(first.get(), again.get());  // the kept document, not a new decode
  ASSERT_EQ(first->leaves.size(), 1u);
  EXPECT_EQ(first->leaves[0].path, "cached_w");
}

TEST(DecodedMetaCacheTest, ARememberedDecodingIsUsedForItsText) {
  const std::string json = MetaWithLeaf("remembered_w");
  SK_ASSERT_OK_AND_ASSIGN(format::CheckpointableMeta decoded,
                          format::DecodeCheckpointableMeta(json, "state/meta.json"));
  auto kept = std::make_shared<const format::CheckpointableMeta>(std::move(decoded));
  RememberDecodedMeta(json, kept);
  SK_ASSERT_OK_AND_ASSIGN(auto got, DecodeMetaCached(json, "state/meta.json"));
  EXPECT_EQ(got.get(), kept.get());
}

TEST(DecodedMetaCacheTest, AnotherTextIsDecodedAfresh) {
  SK_ASSERT_OK_AND_ASSIGN(auto a, DecodeMetaCached(MetaWithLeaf("a"), "state/meta.json"));
  SK_ASSERT_OK_AND_ASSIGN(auto b, DecodeMetaCached(MetaWithLeaf("b"), "state/meta.json"));
  EXPECT_NE(a.get(), b.get());
  EXPECT_EQ(a->leaves[0].path, "a");
  EXPECT_EQ(b->leaves[0].path, "b");
}

TEST(DecodedMetaCacheTest, OnlyTheLastFewAreKept) {
  SK_ASSERT_OK_AND_ASSIGN(auto old, DecodeMetaCached(MetaWithLeaf("old"), "m"));
  for (int i = 0; i < 8; ++i) {
    SK_ASSERT_OK(DecodeMetaCached(MetaWithLeaf("other" + std::to_string(i)), "m").status());
  }
  SK_ASSERT_OK_AND_ASSIGN(auto decoded_again, DecodeMetaCached(MetaWithLeaf("old"), "m"));
  EXPECT_NE(old.get(), decoded_again.get());
  EXPECT_EQ(decoded_again->leaves[0].path, "old");
}

TEST(DecodedMetaCacheTest, ErrorsAreNotKeptAndNameTheFile) {
  for (int i = 0; i < 2; ++i) {
    const auto decoded = DecodeMetaCached("{\"kind\": \"pytree\", \"leaves\": 3}", "ema/meta.json");
    EXPECT_EQ(decoded.status().code(), StatusCode::kCorruption) << decoded.status().ToString();
    EXPECT_NE(decoded.status().message().find("ema/meta.json"), std::string::npos)
        << decoded.status().ToString();
  }
}

}  // namespace
}  // namespace shardkeep::internal
