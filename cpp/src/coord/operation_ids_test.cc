#include "shardkeep/operation_ids.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "testing/simulated_group.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using testing::Has;

// The processes of a simulated job, each with its own record of verdicts.
struct Job {
  explicit Job(int processes) : group(processes) {
    for (int p = 0; p < processes; ++p) {
      ids.push_back(std::make_unique<OperationIds>(group.Member(p)));
    }
  }

  // Agree(kind, subject) on processes `who`, each on its own thread.
  std::vector<Result<std::string>> Agree(const std::vector<int>& who, const std::string& kind,
                                         const std::string& subject, double timeout_s) {
    std::vector<std::future<Result<std::string>>> calls;
    for (int p : who) {
      calls.push_back(std::async(std::launch::async, [this, p, kind, subject, timeout_s] {
        return ids[p]->Agree(kind, subject, timeout_s);
      }));
    }
    std::vector<Result<std::string>> agreed;
    for (auto& call : calls) agreed.push_back(call.get());
    return agreed;
  }

  SimulatedGroup group;
  std::vector<std::unique_ptr<OperationIds>> ids;
};

// The one id every result holds (a test failure if they differ or failed).
std::string Same(const std::vector<Result<std::string>>& agreed) {
  std::set<std::string> ids;
  for (const Result<std::string>& id : agreed) {
    EXPECT_TRUE(id.ok()) << id.status().ToString();
    if (id.ok()) ids.insert(*id);
  }
  EXPECT_EQ(ids.size(), 1u);
  return ids.empty() ? "" : *ids.begin();
}

TEST(OperationIdsTest, EveryProcessJoiningAgreesOnOneIdAndLeavesNoKeys) {
  Job job(4);
  const std::string id = Same(job.Agree({0, 1, 2, 3}, "save", "/ckpt/7", 10));
  EXPECT_TRUE(id.starts_with("shardkeep/op/save/")) << id;
  EXPECT_TRUE(id.ends_with("/0.0")) << id;
  // Once every process has read the "go", its verdict and arrivals go.
  EXPECT_EQ(job.group.KeyCount(), 0u);
}

TEST(OperationIdsTest, RepeatedOccurrencesOfOneSubjectGetNewIds) {
  Job job(3);
  std::set<std::string> seen;
  for (int i = 0; i < 12; ++i) {
    const std::string subject = "/ckpt/" + std::to_string(i % 3);
    const std::string id = Same(job.Agree({0, 1, 2}, "save", subject, 10));
    EXPECT_TRUE(seen.insert(id).second) << id << " was agreed twice";
    EXPECT_TRUE(id.ends_with("/" + std::to_string(i / 3) + ".0")) << id;
  }
  // Kinds name different operations even for one subject.
  EXPECT_FALSE(seen.count(Same(job.Agree({0, 1, 2}, "exchange", "/ckpt/0", 10))));
  EXPECT_EQ(job.group.KeyCount(), 0u);
}

TEST(OperationIdsTest, ProcessThatNeverComesVoidsTheCallNamingIt) {
  Job job(3);
  for (const Result<std::string>& id : job.Agree({0, 1}, "save", "/ckpt/lone", 0.3)) {
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), StatusCode::kTimeout);
    EXPECT_TRUE(Has(id.status().message(),
                    "save of '/ckpt/lone': processes [2] did not join it within 0.3 s"
                    " (processes [0, 1] did)"));
  }
  // Without the primary, the others name it.
  for (const Result<std::string>& id : job.Agree({1}, "exchange", "x", 0.2)) {
    EXPECT_EQ(id.status().code(), StatusCode::kTimeout);
    EXPECT_TRUE(Has(id.status().message(), "processes [0, 2] did not join it"));
  }
}

TEST(OperationIdsTest, LateProcessSkipsTheVoidAttemptAndTheNextCallAgrees) {
  Job job(3);
  for (const Result<std::string>& id : job.Agree({0, 1}, "save", "/ckpt/1", 0.2)) {
    EXPECT_EQ(id.status().code(), StatusCode::kTimeout);
  }
  // Process 2 comes late to the first call, the others make their next:
  // attempt 0 is void, so all meet at attempt 1 of the same occurrence.
  const std::string id = Same(job.Agree({0, 1, 2}, "save", "/ckpt/1", 10));
  EXPECT_TRUE(id.ends_with("/0.1")) << id;
  // And the occurrence after that is the next one, on every process.
  EXPECT_TRUE(Same(job.Agree({0, 1, 2}, "save", "/ckpt/1", 10)).ends_with("/1.0"));
}

TEST(OperationIdsTest, SingleProcessJobHasNothingToAgree) {
  SimulatedGroup group(1);
  OperationIds ids(group.Member(0));
  SK_ASSERT_OK_AND_ASSIGN(std::string id, ids.Agree("save", "/ckpt", 1));
  EXPECT_EQ(id, "");
}

TEST(OperationIdsTest, DeadProcessFailsItsOwnCall) {
  Job job(2);
  job.group.Kill(1);
  const std::vector<Result<std::string>> agreed = job.Agree({0, 1}, "save", "/c", 0.2);
  EXPECT_EQ(agreed[0].status().code(), StatusCode::kTimeout);
  EXPECT_EQ(agreed[1].status().code(), StatusCode::kCancelled);
}

}  // namespace
}  // namespace shardkeep
