#include "storage/process_faults.h"

#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

class ProcessFaultsTest : public ::testing::Test {
 protected:
  void TearDown() override { DisarmProcessFaults(); }
};

TEST_F(ProcessFaultsTest, FailsTheNthMatchingCallOnly) {
  std::shared_ptr<Storage> base = NewMemoryStorage();
  SK_ASSERT_OK(ArmProcessFaults(
      {{.op = "WriteAll", .path_regex = "/b$", .nth = 2, .times = 1}}));
  std::shared_ptr<Storage> storage = WithProcessFaults(base);
  SK_ASSERT_OK(storage->WriteAll("d/b", "1", false));  // 1st match
  SK_ASSERT_OK(storage->WriteAll("d/a", "1", false));  // no match
  const Status failed = storage->WriteAll("d/b", "2", false);  // 2nd match
  EXPECT_EQ(failed.code(), StatusCode::kStorage);
  EXPECT_NE(failed.message().find("injected failure of WriteAll d/b"),
            std::string::npos);
  SK_ASSERT_OK(storage->WriteAll("d/b", "3", false));  // 3rd: times = 1
  SK_ASSERT_OK_AND_ASSIGN(std::string content, base->ReadAll("d/b"));
  EXPECT_EQ(content, "3");
  EXPECT_EQ(ProcessFaultCounts()["WriteAll"], 4);
}

TEST_F(ProcessFaultsTest, RulesApplyToStoragesWrappedBeforeArming) {
  SK_ASSERT_OK(ArmProcessFaults({}));
  std::shared_ptr<Storage> storage = WithProcessFaults(NewMemoryStorage());
  SK_ASSERT_OK(storage->CreateDir("d"));
  SK_ASSERT_OK(ArmProcessFaults({{.op = "*", .nth = 1, .times = -1}}));
  EXPECT_FALSE(storage->CreateDir("d").ok());
  EXPECT_FALSE(storage->List("d").ok());
  DisarmProcessFaults();
  SK_EXPECT_OK(storage->CreateDir("d"));
}

TEST_F(ProcessFaultsTest, AnInvalidRegexArmsNothing) {
  const Status status = ArmProcessFaults({{.op = "*", .path_regex = "(", .nth = 1}});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  std::shared_ptr<Storage> storage = WithProcessFaults(NewMemoryStorage());
  SK_EXPECT_OK(storage->CreateDir("d"));
}

TEST_F(ProcessFaultsTest, KillsTheProcessAtTheChosenCall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        (void)ArmProcessFaults({{.op = "Rename", .nth = 2,
                                 .action = FaultRule::Action::kKill}});
        std::shared_ptr<Storage> storage = WithProcessFaults(NewMemoryStorage());
        (void)storage->CreateDir("a");
        (void)storage->Rename("a", "b");
        (void)storage->Rename("b", "c");
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "SIGKILL before Rename b");
}

TEST_F(ProcessFaultsTest, KillsDuringACall) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        (void)ArmProcessFaults({{.op = "CreateDir", .nth = 1,
                                 .action = FaultRule::Action::kKillDuring,
                                 .max_delay_us = 1000}});
        std::shared_ptr<Storage> storage = WithProcessFaults(NewMemoryStorage());
        (void)storage->CreateDir("a");
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "SIGKILL during CreateDir a");
}

}  // namespace
}  // namespace shardkeep
