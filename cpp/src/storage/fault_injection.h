// A Storage that forwards every call to another one, except the calls a test
// chooses to fail or whose bytes it chooses to damage. Tests use it to prove
// that an I/O error at any step surfaces as a Status and leaves nothing
// half-committed, that a read damaged on the way is caught, and to count
// calls (e.g. how many fsyncs a save issued).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "shardkeep/storage.h"

namespace shardkeep {

class FaultInjectionStorage final : public Storage {
 public:
  // Decides the outcome of one call before it reaches the wrapped backend:
  // a non-OK Status is returned instead of making the call. `op` is the
  // method name ("ReadAt", "WriteAll", "Rename", ...; "Append", "Sync" and
  // "Close" for the WritableFile methods), `path` its path argument (the
  // source for Rename, the file's path for WritableFile methods). A hook may
  // sleep to simulate a slow backend. It runs on the calling thread, without
  // any lock held, so it may call Count() and must be thread-safe itself.
  using Hook =
      std::function<Status(std::string_view op, const std::string& path)>;

  explicit FaultInjectionStorage(std::shared_ptr<Storage> base);
  ~FaultInjectionStorage() override;

  // Replaces the hook; an empty Hook lets every call through.
  void FailOn(Hook hook);
  // A second hook, asked after a call that changes the storage (WriteAll,
  // WriteIfAbsent, CreateDir, DeleteFile, DeleteRecursive, Rename) reached
  // the backend and succeeded: a non-OK Status replaces its answer. This is
  // a reply lost on the way back (a connection reset after the server
  // stored an object): the change happened, the caller hears a failure.
  void LoseAnswerOn(Hook hook);
  // Decides whether the bytes of a read arrive damaged: asked after a
  // ReadAt or ReadAll succeeded, with its path and byte range (ReadAll: 0
  // and the file's size). True flips the lowest bit of the read's first
  // byte in what the caller gets, as a transfer error that TCP's checksum
  // missed would; the stored bytes stay intact. Thread-safe like Hook.
  using CorruptHook = std::function<bool(std::string_view op, const std::string& path,
                                         uint64_t offset, uint64_t size)>;
  void CorruptReadsOn(CorruptHook hook);
  // How many times `op` was called, including the calls the hook failed.
  int Count(std::string_view op) const;
  // Reports `features` instead of the wrapped backend's; without
  // atomic_exchange, Exchange() answers false without reaching the backend
  // (to test the callers' fallback).
  void OverrideFeatures(StorageFeatures features);

  StorageFeatures features() const override;
  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override;
  Status ReadScatter(const std::string& path, uint64_t offset,
                     const std::vector<ScatterPiece>& pieces) override;
  Result<std::string> ReadAll(const std::string& path) override;
  Result<uint64_t> FileSize(const std::string& path) override;
  Status WriteAll(const std::string& path, std::string_view data,
                  bool sync) override;
  Result<std::unique_ptr<WritableFile>> OpenForAppend(
      const std::string& path) override;
  Result<bool> Exists(const std::string& path) override;
  Result<std::vector<std::string>> List(const std::string& dir) override;
  Status CreateDir(const std::string& dir) override;
  Status DeleteFile(const std::string& path) override;
  Status DeleteRecursive(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status SyncDir(const std::string& dir) override;
  // op "Exchange", path `a`.
  Result<bool> Exchange(const std::string& a, const std::string& b) override;
  Status WriteIfAbsent(const std::string& path, std::string_view data) override;
  // op "Link", path `from`.
  Result<bool> Link(const std::string& from, const std::string& to) override;

  // Hook and counters, shared with the WritableFiles this storage opened so
  // they stay valid if a file outlives the storage.
  class State;

 private:
  const std::shared_ptr<Storage> base_;
  const std::shared_ptr<State> state_;
};

}  // namespace shardkeep
