// The commit protocol with four simulated processes: threads that each save
// their own shards through their own coordinator (a SimulatedGroup member)
// onto one shared memory storage. Each process reaches the storage through
// its own FaultInjectionStorage, which records what the process modifies and
// fails, stalls or kills the process where a test says.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "testing/simulated_group.h"
#include "shardkeep/checkpoint.h"
#include "storage/fault_injection.h"
#include "testing/payloads.h"
#include "testing/status_matchers.h"

namespace shardkeep {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr int kProcesses = 4;
constexpr uint64_t kRows = 16, kCols = 8, kBlockRows = kRows / kProcesses;
constexpr char kPath[] = "root/ckpt";
constexpr char kTmp[] = "root/ckpt.shardkeep-tmp";

// The job's state: "w", 16x8 float32 split in four row blocks, process p
// holding block p; "bias", 8 float32 replicated on every process and
// written by process 0 alone.
struct TrainState {
  explicit TrainState(float seed) : w(kRows * kCols), bias(kCols) {
    for (size_t i = 0; i < w.size(); ++i) w[i] = seed + static_cast<float>(i);
    for (size_t i = 0; i < bias.size(); ++i) bias[i] = -seed - static_cast<float>(i);
  }
  std::vector<float> w, bias;
};

const uint8_t* Bytes(const float* data) {
  return reinterpret_cast<const uint8_t*>(data);
}

// A fresh SaveRequest::operation_id: every process of one save passes the
// same one. (The engine's own numbering counts StartSave calls per OS
// process, so threads simulating processes would each get another.)
std::string NextOperationId() {
  static std::atomic<int> next{0};
  return "test-" + std::to_string(next++);
}

// What process `p` asks to save: its block of w, bias on process 0, and the
// "dataset" bytes (given by all, written by the primary).
SaveRequest RequestOf(int p, const TrainState& state, const std::string& operation_id) {
  SaveRequest request;
  request.path = kPath;
  request.operation_id = operation_id;
  request.step = 3;
  CheckpointablePayload part = testdata::PytreePayload(
      "state", {{"w", "float32", {kRows, kCols}}, {"bias", "float32", {kCols}}});
  const uint64_t row = p * kBlockRows;
  part.shards.push_back({0, DType::kFloat32, Box{{row, 0}, {kBlockRows, kCols}},
                         Bytes(state.w.data() + row * kCols)});
  if (p == 0) {
    part.shards.push_back(
        {1, DType::kFloat32, Box{{0}, {kCols}}, Bytes(state.bias.data())});
  }
  request.parts.push_back(std::move(part));
  request.parts.push_back(testdata::BytesPayload("dataset", "loader-position-42"));
  return request;
}

Options TestOptions(double timeout_s) {
  Options options;
  // A chunk per row and a data file per two chunks: every process makes
  // each kind of storage call more than once. One writer thread keeps the
  // order of a process's calls, and so the fault tests, deterministic.
  options.chunk_bytes = kCols * sizeof(float);
  options.data_file_bytes = 2 * options.chunk_bytes;
  options.io_threads = 1;
  options.timeout_s = timeout_s;
  return options;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Runs `process(p)` for every process at once, each on a thread of its own;
// their statuses.
std::vector<Status> RunProcesses(const std::function<Status(int p)>& process) {
  std::vector<Status> statuses(kProcesses);
  std::vector<std::thread> threads;
  for (int p = 0; p < kProcesses; ++p) {
    threads.emplace_back([&, p] { statuses[p] = process(p); });
  }
  for (std::thread& thread : threads) thread.join();
  return statuses;
}

// The storage calls that change something; the ones a process records.
bool Modifies(std::string_view op) {
  static const std::set<std::string_view> kOps = {
      "WriteAll", "OpenForAppend", "CreateDir", "DeleteFile", "DeleteRecursive",
      "Rename"};
  return kOps.count(op) > 0;
}

// Decides the outcome of one storage call of process `p`, like a
// FaultInjectionStorage::Hook.
using Fault = std::function<Status(int p, std::string_view op, const std::string& path)>;

// Four processes' views of one shared storage.
class Job {
 public:
  Job() : shared_(NewMemoryStorage()) {
    for (int p = 0; p < kProcesses; ++p) {
      auto view = std::make_shared<FaultInjectionStorage>(shared_);
      view->FailOn([this, p](std::string_view op, const std::string& path) {
        return Before(p, op, path);
      });
      views_.push_back(std::move(view));
    }
  }

  // REQUIRES: no save running.
  void Inject(Fault fault) { fault_ = std::move(fault); }

  const std::shared_ptr<Storage>& shared() const { return shared_; }
  const std::shared_ptr<FaultInjectionStorage>& view(int p) const { return views_[p]; }

  // "<op> <path>" for each modifying call process p made, in order.
  std::vector<std::string> Modified(int p) const {
    std::lock_guard<std::mutex> lock(mu_);
    return modified_[p];
  }

  // Every process saves `state` with `group` at once; their statuses.
  std::vector<Status> SaveAll(SimulatedGroup& group, const TrainState& state,
                              const Options& options) {
    const std::string operation_id = NextOperationId();
    return RunProcesses([&](int p) {
      return Save(views_[p], group.Member(p), RequestOf(p, state, operation_id),
                  options);
    });
  }

 private:
  Status Before(int p, std::string_view op, const std::string& path) {
    if (Modifies(op)) {
      std::lock_guard<std::mutex> lock(mu_);
      modified_[p].push_back(std::string(op) + " " + path);
    }
    return fault_ ? fault_(p, op, path) : Status::Ok();
  }

  const std::shared_ptr<Storage> shared_;
  std::vector<std::shared_ptr<FaultInjectionStorage>> views_;
  Fault fault_;
  mutable std::mutex mu_;
  std::vector<std::string> modified_[kProcesses];
};

// The primary stalls 1.5 s writing _SHARDKEEP: past the others' timeout in
// tests that give them less.
void StallPrimaryCommitRecord(Job& job) {
  job.Inject([](int p, std::string_view op, const std::string& path) {
    if (p == 0 && op == "OpenForAppend" && path.ends_with("/_SHARDKEEP")) {
      std::this_thread::sleep_for(milliseconds(1500));
    }
    return Status::Ok();
  });
}

// Expects no checkpoint at kPath; returns whether there is none.
bool ExpectNothingCommitted(const std::shared_ptr<Storage>& storage) {
  const Status status = CheckpointReader::Open(storage, kPath).status();
  EXPECT_TRUE(status.code() == StatusCode::kNotFound)
      << (status.ok() ? "a failed save committed a checkpoint" : status.ToString());
  return status.code() == StatusCode::kNotFound;
}

// Opens the checkpoint at `path` and checks every element, the commit
// record and the bytes checkpointable against `state`.
void ExpectCheckpointHoldsAt(const std::shared_ptr<Storage>& storage,
                             const std::string& path, const TrainState& state) {
  SK_ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(storage, path));
  std::vector<float> w(kRows * kCols, -1.f), bias(kCols, -1.f);
  SK_ASSERT_OK(reader->Read(
      "state",
      {{0, DType::kFloat32, Box{{0, 0}, {kRows, kCols}},
        reinterpret_cast<uint8_t*>(w.data())},
       {1, DType::kFloat32, Box{{0}, {kCols}}, reinterpret_cast<uint8_t*>(bias.data())}},
      TestOptions(5)));
  EXPECT_EQ(w, state.w);
  EXPECT_EQ(bias, state.bias);
  const nlohmann::json commit = nlohmann::json::parse(reader->commit_json());
  EXPECT_EQ(commit["process_count"], kProcesses);
  EXPECT_EQ(commit["index_files"]["state"],
            nlohmann::json({"index/p0.idx", "index/p1.idx", "index/p2.idx",
                            "index/p3.idx"}));
  SK_ASSERT_OK_AND_ASSIGN(std::string value, reader->ReadValue("dataset"));
  EXPECT_EQ(value, "loader-position-42");
}

// ... at kPath, with no temporary folder left.
void ExpectCheckpointHolds(const std::shared_ptr<Storage>& storage,
                           const TrainState& state) {
  ExpectCheckpointHoldsAt(storage, kPath, state);
  SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, storage->Exists(kTmp));
  EXPECT_FALSE(tmp_left);
}

void ExpectAllOk(const std::vector<Status>& statuses) {
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_TRUE(statuses[p].ok()) << "process " << p << ": " << statuses[p].ToString();
  }
}

// After a failed save: the job, restarted (a new group, no faults), saves
// and commits over the same storage.
void ExpectRestartedJobSaves(Job& job) {
  job.Inject(nullptr);
  SimulatedGroup restarted(kProcesses);
  TrainState state(7.f);
  ExpectAllOk(job.SaveAll(restarted, state, TestOptions(0.5)));
  ExpectCheckpointHolds(job.shared(), state);
}

TEST(MultiprocessSaveTest, AllProcessesSaveTheirShards) {
  Job job;
  SimulatedGroup group(kProcesses);
  TrainState state(0.5f);
  ExpectAllOk(job.SaveAll(group, state, TestOptions(5)));
  ExpectCheckpointHolds(job.shared(), state);

  // The primary wrote the commit and every meta.json; the others wrote only
  // their own data files and index, inside the temporary folder.
  const std::vector<std::string> primary = job.Modified(0);
  for (const std::string& written :
       {std::string("OpenForAppend ") + kTmp + "/_SHARDKEEP",
        std::string("OpenForAppend ") + kTmp + "/state/meta.json",
        std::string("OpenForAppend ") + kTmp + "/dataset/meta.json",
        std::string("Rename ") + kTmp}) {
    EXPECT_EQ(std::count(primary.begin(), primary.end(), written), 1) << written;
  }
  for (int p = 1; p < kProcesses; ++p) {
    const std::string data = kTmp + std::string("/state/data/p") + std::to_string(p) + "-";
    const std::string index =
        "OpenForAppend " + std::string(kTmp) + "/state/index/p" + std::to_string(p) + ".idx";
    const std::vector<std::string> writes = job.Modified(p);
    EXPECT_FALSE(writes.empty());
    for (const std::string& write : writes) {
      EXPECT_TRUE(write.starts_with("OpenForAppend " + data) || write == index)
          << "process " << p << " wrote: " << write;
    }
  }
}

// Without an operation id each process would number its saves itself, and
// one that skipped a save would meet the others at another save's barrier:
// several processes must be given one id, and are refused at once without.
TEST(MultiprocessSaveTest, ASaveBySeveralProcessesNeedsAnOperationId) {
  Job job;
  SimulatedGroup group(kProcesses);
  TrainState state(0.5f);
  const std::vector<Status> statuses = RunProcesses([&](int p) {
    return Save(job.view(p), group.Member(p), RequestOf(p, state, ""), TestOptions(5));
  });
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
    EXPECT_NE(status.message().find("needs SaveRequest::operation_id"), std::string::npos)
        << status.ToString();
  }
  SK_ASSERT_OK_AND_ASSIGN(bool written, job.shared()->Exists(kTmp));
  EXPECT_FALSE(written);
}

// Every storage call the protocol's steps make, and the occurrences of each
// to fail: the first, the second and the last one a process makes.
// (Every file is written through OpenForAppend, so WriteAll is not one.)
const std::vector<std::string> kFaultOps = {"OpenForAppend", "Append", "Sync",
                                            "Close", "CreateDir", "SyncDir",
                                            "Rename"};

TEST(MultiprocessSaveTest, StorageFailureOnOneProcessFailsEveryProcess) {
  // How often each process makes each call in a save without faults.
  Job baseline;
  SimulatedGroup baseline_group(kProcesses);
  ExpectAllOk(baseline.SaveAll(baseline_group, TrainState(0.5f), TestOptions(5)));
  ASSERT_FALSE(HasFailure()) << "no baseline to inject faults into";

  std::set<std::string> reached;
  for (int failing : {0, 2}) {
    for (const std::string& op : kFaultOps) {
      const int calls = baseline.view(failing)->Count(op);
      for (int occurrence : std::set<int>{1, 2, calls}) {
        if (occurrence < 1 || occurrence > calls) continue;  // never reached
        SCOPED_TRACE("process " + std::to_string(failing) + " fails " + op + " #" +
                     std::to_string(occurrence));
        Job job;
        SimulatedGroup group(kProcesses);
        std::atomic<int> seen{0};
        std::atomic<bool> fired{false};
        job.Inject([&](int p, std::string_view called, const std::string& path) {
          if (p != failing || called != op || ++seen != occurrence) return Status::Ok();
          fired = true;
          return StorageError("injected " + op + " failure at " + path);
        });
        const auto start = Clock::now();
        std::vector<Status> statuses = job.SaveAll(group, TrainState(0.5f), TestOptions(5));
        EXPECT_LT(SecondsSince(start), 4.0);
        ASSERT_TRUE(fired);
        reached.insert(op);
        for (int p = 0; p < kProcesses; ++p) {
          const Status& status = statuses[p];
          ASSERT_FALSE(status.ok()) << "process " << p << " succeeded";
          if (p == failing) {
            EXPECT_EQ(status.code(), StatusCode::kStorage) << status.ToString();
            EXPECT_NE(status.message().find("injected"), std::string::npos)
                << status.ToString();
          } else {
            EXPECT_EQ(status.code(), StatusCode::kCancelled)
                << "process " << p << ": " << status.ToString();
          }
        }
        // A retry after a commit could only fail with AlreadyExists.
        if (!ExpectNothingCommitted(job.shared())) continue;
        // The failed save removed what it wrote.
        SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, job.shared()->Exists(kTmp));
        EXPECT_FALSE(tmp_left);

        // The same processes and storage try again, without faults.
        job.Inject(nullptr);
        TrainState next(100.f);
        ExpectAllOk(job.SaveAll(group, next, TestOptions(5)));
        ExpectCheckpointHolds(job.shared(), next);
      }
    }
  }
  EXPECT_EQ(reached, std::set<std::string>(kFaultOps.begin(), kFaultOps.end()));
}

// Checks that the survivors of a dead or stalled process `absent` timed out
// naming it.
void ExpectTimedOutWaitingFor(int absent, const std::vector<Status>& statuses) {
  for (int p = 0; p < kProcesses; ++p) {
    if (p == absent) continue;
    EXPECT_EQ(statuses[p].code(), StatusCode::kTimeout)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("process " + std::to_string(absent) +
                                         " did not arrive"),
              std::string::npos)
        << statuses[p].ToString();
  }
}

TEST(MultiprocessSaveTest, ProcessDeadFromTheStartTimesOutTheOthers) {
  Job job;
  SimulatedGroup group(kProcesses);
  group.Kill(3);
  const auto start = Clock::now();
  std::vector<Status> statuses = job.SaveAll(group, TrainState(0.5f), TestOptions(0.5));
  EXPECT_LT(SecondsSince(start), 2.0);
  EXPECT_EQ(statuses[3].code(), StatusCode::kCancelled) << statuses[3].ToString();
  ExpectTimedOutWaitingFor(3, statuses);
  ExpectNothingCommitted(job.shared());
  ExpectRestartedJobSaves(job);
}

TEST(MultiprocessSaveTest, ProcessDyingAsItWritesTimesOutTheOthers) {
  Job job;
  SimulatedGroup group(kProcesses);
  job.Inject([&](int p, std::string_view op, const std::string&) {
    if (p != 2 || op != "OpenForAppend") return Status::Ok();
    group.Kill(2);
    return StorageError("process 2 crashed");
  });
  const auto start = Clock::now();
  std::vector<Status> statuses = job.SaveAll(group, TrainState(0.5f), TestOptions(0.5));
  EXPECT_LT(SecondsSince(start), 2.0);
  EXPECT_FALSE(statuses[2].ok());
  ExpectTimedOutWaitingFor(2, statuses);
  ExpectNothingCommitted(job.shared());
  ExpectRestartedJobSaves(job);
}

TEST(MultiprocessSaveTest, StalledProcessTimesOutTheOthers) {
  Job job;
  SimulatedGroup group(kProcesses);
  std::atomic<bool> stalled{false};
  job.Inject([&](int p, std::string_view op, const std::string&) {
    if (p == 1 && op == "Append" && !stalled.exchange(true)) {
      std::this_thread::sleep_for(milliseconds(2000));
    }
    return Status::Ok();
  });
  const TrainState state(0.5f);
  const std::string operation_id = NextOperationId();
  std::vector<double> finished_s(kProcesses);
  const auto start = Clock::now();
  std::vector<Status> statuses = RunProcesses([&](int p) {
    Status status = Save(job.view(p), group.Member(p),
                         RequestOf(p, state, operation_id), TestOptions(0.5));
    finished_s[p] = SecondsSince(start);
    return status;
  });
  ASSERT_TRUE(stalled);
  ExpectTimedOutWaitingFor(1, statuses);
  for (int p : {0, 2, 3}) {
    EXPECT_LT(finished_s[p], 1.5) << "process " << p << " waited for the stalled one";
  }
  // The stalled process finds, when it wakes, that the others gave up.
  EXPECT_EQ(statuses[1].code(), StatusCode::kTimeout) << statuses[1].ToString();
  ExpectNothingCommitted(job.shared());
}

TEST(MultiprocessSaveTest, PrimaryStalledBeforeCommitDoesNotCommitAfterOthersGaveUp) {
  // The primary stalls writing _SHARDKEEP, past the others' timeout: they
  // give up waiting at the last barrier and report failure, so the
  // primary must not make the checkpoint visible when it wakes.
  Job job;
  SimulatedGroup group(kProcesses);
  StallPrimaryCommitRecord(job);
  std::vector<Status> statuses = job.SaveAll(group, TrainState(0.5f), TestOptions(0.5));
  for (int p = 1; p < kProcesses; ++p) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kTimeout) << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("primary (process 0) did not report the commit"),
              std::string::npos)
        << statuses[p].ToString();
  }
  EXPECT_EQ(statuses[0].code(), StatusCode::kCancelled) << statuses[0].ToString();
  ExpectNothingCommitted(job.shared());
}

// A process's coordinator as seen through a connection that loses every
// key-value write of a key ending in `lost_suffix` (after `delay`);
// barriers, reads and other writes still reach the group.
class LosesKeyValueSets final : public Coordinator {
 public:
  LosesKeyValueSets(std::shared_ptr<Coordinator> member, std::string lost_suffix,
                    milliseconds delay = milliseconds(0))
      : member_(std::move(member)), lost_suffix_(std::move(lost_suffix)), delay_(delay) {}
  int process_index() const override { return member_->process_index(); }
  int process_count() const override { return member_->process_count(); }
  Status Barrier(const std::string& key, double timeout_s) override {
    return member_->Barrier(key, timeout_s);
  }
  Status KeyValueSet(const std::string& key, const std::string& value) override {
    if (!key.ends_with(lost_suffix_)) return member_->KeyValueSet(key, value);
    std::this_thread::sleep_for(delay_);
    return TimeoutError("setting '" + key + "': coordination service unreachable");
  }
  Result<std::string> KeyValueGet(const std::string& key, double timeout_s) override {
    return member_->KeyValueGet(key, timeout_s);
  }
  Result<std::optional<std::string>> KeyValueTryGet(const std::string& key) override {
    return member_->KeyValueTryGet(key);
  }
  Result<std::vector<std::string>> KeyValueList(const std::string& prefix) override {
    return member_->KeyValueList(prefix);
  }
  Status KeyValueDelete(const std::string& key) override {
    return member_->KeyValueDelete(key);
  }

 private:
  const std::shared_ptr<Coordinator> member_;
  const std::string lost_suffix_;
  const milliseconds delay_;
};

TEST(MultiprocessSaveTest, FailureWhoseReportIsLostStillFailsTheSave) {
  // Process 2 fails to write and cannot record its failure: the others
  // must not take its silence for success and commit without its shards.
  Job job;
  SimulatedGroup group(kProcesses);
  job.Inject([](int p, std::string_view op, const std::string& path) {
    return p == 2 && op == "Append" ? StorageError("injected failure at " + path)
                                    : Status::Ok();
  });
  const TrainState state(0.5f);
  const std::string operation_id = NextOperationId();
  const auto start = Clock::now();
  std::vector<Status> statuses = RunProcesses([&](int p) {
    std::shared_ptr<Coordinator> coordinator = group.Member(p);
    if (p == 2) coordinator = std::make_shared<LosesKeyValueSets>(coordinator, "/failed");
    return Save(job.view(p), coordinator, RequestOf(p, state, operation_id),
                TestOptions(0.5));
  });
  EXPECT_LT(SecondsSince(start), 2.0);
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_FALSE(statuses[p].ok()) << "process " << p << " succeeded";
  }
  ExpectNothingCommitted(job.shared());
}

TEST(MultiprocessSaveTest, InvalidShardOnOneProcessFailsStartSaveEverywhere) {
  Job job;
  SimulatedGroup group(kProcesses);
  const TrainState state(0.5f);
  const std::string operation_id = NextOperationId();
  std::vector<Status> statuses = RunProcesses([&](int p) {
    SaveRequest request = RequestOf(p, state, operation_id);
    if (p == 2) {
      // Rows 14..17 of a 16-row leaf.
      request.parts[0].shards[0].box = Box{{kRows - 2, 0}, {kBlockRows, kCols}};
    }
    // The blocking phase agrees on the request: StartSave itself fails.
    return StartSave(job.view(p), group.Member(p), std::move(request), TestOptions(5))
        .status();
  });
  EXPECT_EQ(statuses[2].code(), StatusCode::kInvalidArgument) << statuses[2].ToString();
  EXPECT_NE(statuses[2].message().find("outside shape"), std::string::npos);
  for (int p : {0, 1, 3}) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kCancelled)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("process 2"), std::string::npos)
        << statuses[p].ToString();
  }
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_EQ(job.view(p)->Count("OpenForAppend"), 0) << "process " << p << " wrote data";
  }
  ExpectNothingCommitted(job.shared());
}

// Every process saves `state`; process p reaches the group through
// wrap(p, its member) and the storage through its view.
std::vector<Status> SaveAllThrough(
    Job& job, SimulatedGroup& group, const TrainState& state, const Options& options,
    const std::function<std::shared_ptr<Coordinator>(int, std::shared_ptr<Coordinator>)>&
        wrap) {
  const std::string operation_id = NextOperationId();
  return RunProcesses([&](int p) {
    return Save(job.view(p), wrap(p, group.Member(p)), RequestOf(p, state, operation_id),
                options);
  });
}

// The primary stalls past the others' timeout, and they cannot record
// their "abort": the primary's "commit" wins and the checkpoint appears.
// The others must not claim that nothing was committed.
TEST(MultiprocessSaveTest, UnrecordedAbortReportsTheCommitStateAsUnknown) {
  Job job;
  SimulatedGroup group(kProcesses);
  StallPrimaryCommitRecord(job);
  const TrainState state(0.5f);
  std::vector<Status> statuses = SaveAllThrough(
      job, group, state, TestOptions(0.5),
      [](int p, std::shared_ptr<Coordinator> member) -> std::shared_ptr<Coordinator> {
        if (p == 0) return member;
        return std::make_shared<LosesKeyValueSets>(member, "/outcome");
      });
  SK_EXPECT_OK(statuses[0]);
  ExpectCheckpointHolds(job.shared(), state);
  for (int p = 1; p < kProcesses; ++p) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kCommitStateUnknown)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("may or may not be committed"), std::string::npos)
        << statuses[p].ToString();
  }
}

// Processes 1 and 2 cannot record their "abort" but process 3 can: reading
// the outcome back, they learn that nothing was committed.
TEST(MultiprocessSaveTest, UnrecordedAbortReadsTheOutcomeBack) {
  Job job;
  SimulatedGroup group(kProcesses);
  StallPrimaryCommitRecord(job);
  std::vector<Status> statuses = SaveAllThrough(
      job, group, TrainState(0.5f), TestOptions(0.5),
      [](int p, std::shared_ptr<Coordinator> member) -> std::shared_ptr<Coordinator> {
        if (p != 1 && p != 2) return member;
        // Slow to fail, so that process 3's "abort" is in by then.
        return std::make_shared<LosesKeyValueSets>(member, "/outcome", milliseconds(200));
      });
  EXPECT_EQ(statuses[0].code(), StatusCode::kCancelled) << statuses[0].ToString();
  for (int p = 1; p < kProcesses; ++p) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kTimeout)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("nothing was committed"), std::string::npos)
        << statuses[p].ToString();
  }
  ExpectNothingCommitted(job.shared());
}

// Expects that every process failed alike, naming the processes that
// disagree as `description` says, and that nothing was written or left.
void ExpectDisagreement(Job& job, const std::vector<Status>& statuses,
                        const std::string& description) {
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kInvalidArgument)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("the processes disagree on what to save: " +
                                         description),
              std::string::npos)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_EQ(job.view(p)->Count("OpenForAppend"), 0) << "process " << p << " wrote data";
  }
  ExpectNothingCommitted(job.shared());
  SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, job.shared()->Exists(kTmp));
  EXPECT_FALSE(tmp_left);
}

// Every process starts a save of the same state after `edit` has changed
// its request.
std::vector<Status> StartEditedSaves(Job& job,
                                     const std::function<void(int, SaveRequest&)>& edit) {
  SimulatedGroup group(kProcesses);
  const TrainState state(0.5f);
  const std::string operation_id = NextOperationId();
  return RunProcesses([&](int p) {
    SaveRequest request = RequestOf(p, state, operation_id);
    edit(p, request);
    return StartSave(job.view(p), group.Member(p), std::move(request), TestOptions(5))
        .status();
  });
}

TEST(MultiprocessSaveTest, ProcessesWithAnotherMetaJsonFailTheSaveNamingThem) {
  Job job;
  std::vector<Status> statuses = StartEditedSaves(job, [](int p, SaveRequest& request) {
    if (p == 2 || p == 3) {
      // These processes think bias is float16: their own shards (of w)
      // still match their meta.json, but the primary's would be written.
      request.parts[0].meta_json = testdata::PytreeMetaJson(
          {{"w", "float32", {kRows, kCols}}, {"bias", "float16", {kCols}}});
    }
  });
  ExpectDisagreement(job, statuses,
                     "processes 2, 3 differ from process 0 in the meta.json of 'state'");
  ExpectRestartedJobSaves(job);
}

TEST(MultiprocessSaveTest, ProcessesWithOtherCheckpointablesFailTheSaveNamingThem) {
  Job job;
  std::vector<Status> statuses = StartEditedSaves(job, [](int p, SaveRequest& request) {
    if (p == 1) request.parts.pop_back();  // no "dataset"
  });
  ExpectDisagreement(job, statuses,
                     "process 1 differs from process 0 in the checkpointables to save "
                     "('state' instead of 'state', 'dataset')");
}

// The primary's forced replacement fails and cannot be undone: every
// process reports the unknown state, none claims nothing was committed.
TEST(MultiprocessSaveTest, PrimaryUnknownCommitStateReachesEveryProcess) {
  Job job;
  SimulatedGroup group(kProcesses);
  ExpectAllOk(job.SaveAll(group, TrainState(0.5f), TestOptions(5)));
  std::atomic<int> exchanges{0};
  job.Inject([&](int p, std::string_view op, const std::string& path) {
    if (p == 0 && op == "SyncDir" && path == "root") {
      return StorageError("injected fsync failure");
    }
    if (p == 0 && op == "Exchange" && ++exchanges == 2) {
      return StorageError("injected failure swapping back");
    }
    return Status::Ok();
  });
  const TrainState state(2.f);
  const std::string operation_id = NextOperationId();
  std::vector<Status> statuses = RunProcesses([&](int p) {
    SaveRequest request = RequestOf(p, state, operation_id);
    request.force = true;
    return Save(job.view(p), group.Member(p), std::move(request), TestOptions(5));
  });
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_EQ(statuses[p].code(), StatusCode::kCommitStateUnknown)
        << "process " << p << ": " << statuses[p].ToString();
  }
  // Nothing was deleted: the new checkpoint is in place, the previous one
  // beside it.
  ExpectCheckpointHoldsAt(job.shared(), kPath, state);
  ExpectCheckpointHoldsAt(job.shared(), kTmp, TrainState(0.5f));
}

// Process 2's disk fills up: every process fails, process 2 saying how
// much it meant to write and how much space was left; the temporary folder
// is removed, and a save to another path succeeds.
TEST(MultiprocessSaveTest, OutOfSpaceSaysSoAndLeavesNothingBehind) {
  Job job;
  SimulatedGroup group(kProcesses);
  job.Inject([](int p, std::string_view op, const std::string& path) {
    if (p != 2 || op != "Append") return Status::Ok();
    return OutOfSpaceError("write " + path +
                           ": No space left on device (100 bytes free on its file system)");
  });
  std::vector<Status> statuses = job.SaveAll(group, TrainState(0.5f), TestOptions(5));
  EXPECT_EQ(statuses[2].code(), StatusCode::kOutOfSpace) << statuses[2].ToString();
  const std::string needed = "ran out of space: process 2 had " +
                             std::to_string(kBlockRows * kCols * sizeof(float)) +
                             " bytes to write";
  for (int p = 0; p < kProcesses; ++p) {
    EXPECT_NE(statuses[p].message().find(needed), std::string::npos)
        << "process " << p << ": " << statuses[p].ToString();
    EXPECT_NE(statuses[p].message().find("100 bytes free"), std::string::npos)
        << "process " << p << ": " << statuses[p].ToString();
  }
  ExpectNothingCommitted(job.shared());
  SK_ASSERT_OK_AND_ASSIGN(bool tmp_left, job.shared()->Exists(kTmp));
  EXPECT_FALSE(tmp_left) << "the failed save left its temporary folder";
  SK_ASSERT_OK_AND_ASSIGN(std::vector<std::string> root, job.shared()->List("root"));
  EXPECT_EQ(root, std::vector<std::string>{}) << "the failed save left files";

  // The next save (another step, another path) succeeds.
  job.Inject(nullptr);
  const TrainState next(9.f);
  const std::string operation_id = NextOperationId();
  ExpectAllOk(RunProcesses([&](int p) {
    SaveRequest request = RequestOf(p, next, operation_id);
    request.path = "root/ckpt-next";
    return Save(job.view(p), group.Member(p), std::move(request), TestOptions(5));
  }));
  SK_ASSERT_OK_AND_ASSIGN(auto reader,
                          CheckpointReader::Open(job.shared(), "root/ckpt-next"));
}

}  // namespace
}  // namespace shardkeep
