#include "engine/meta_agreement.h"

#include <gtest/gtest.h>

#include "testing/payloads.h"

namespace shardkeep::internal {
namespace {

std::vector<CheckpointablePayload> Parts(const std::string& w_dtype) {
  return {testdata::PytreePayload("state", {{"w", w_dtype, {4, 4}}}),
          testdata::BytesPayload("dataset", "x")};
}

TEST(MetaAgreementTest, DigestListsEachCheckpointableWithItsKindAndHash) {
  const std::string digest = MetaDigest(Parts("float32"));
  EXPECT_TRUE(digest.starts_with("state pytree ")) << digest;
  EXPECT_NE(digest.find("\ndataset bytes "), std::string::npos) << digest;
  EXPECT_EQ(digest, MetaDigest(Parts("float32")));
  EXPECT_NE(digest, MetaDigest(Parts("bfloat16")));
}

TEST(MetaAgreementTest, AgreementIsEmpty) {
  const std::string digest = MetaDigest(Parts("float32"));
  EXPECT_EQ(DescribeDisagreement({digest, digest, digest}), "");
  EXPECT_EQ(DescribeDisagreement({digest}), "");
}

TEST(MetaAgreementTest, ProcessesThatDifferAlikeAreNamedTogether) {
  const std::string ours = MetaDigest(Parts("float32"));
  const std::string other_meta = MetaDigest(Parts("int8"));
  std::vector<CheckpointablePayload> fewer = Parts("float32");
  fewer.pop_back();
  const std::string other_list = MetaDigest(fewer);
  EXPECT_EQ(DescribeDisagreement({ours, other_meta, ours, other_meta, other_list}),
            "process 4 differs from process 0 in the checkpointables to save "
            "('state' instead of 'state', 'dataset'); processes 1, 3 differ from "
            "process 0 in the meta.json of 'state'");
}

}  // namespace
}  // namespace shardkeep::internal
