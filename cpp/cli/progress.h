// A progress bar for the long commands (verify, cp, export): bytes done of
// the total, percentage, rate and time left, redrawn in place on stderr.
// Drawn only when stderr is a terminal, so that logs and pipes never get
// control characters; silent otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>

namespace shardkeep::cli {

class ProgressBar {
 public:
  // Enabled when stderr is a terminal.
  explicit ProgressBar(std::string label);
  ProgressBar(std::string label, bool enabled, std::FILE* out);
  // Ends the line if anything was drawn.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Records progress; redraws at most ten times a second (always for the
  // first call and when done reaches total). Safe from any thread.
  void Update(uint64_t done, uint64_t total);
  // Draws the last state and ends the line; later updates are ignored.
  // Call it before printing anything else to stderr or stdout.
  void Finish();
  // Update() as a callback for VerifyOptions/CopyOptions::progress. The
  // bar must outlive its use.
  std::function<void(uint64_t, uint64_t)> Callback();

 private:
  void Draw();  // REQUIRES: mu_ held

  const std::string label_;
  const bool enabled_;
  std::FILE* const out_;
  const std::chrono::steady_clock::time_point start_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point last_draw_{};
  bool drawn_ = false;
  bool finished_ = false;
  uint64_t done_ = 0;
  uint64_t total_ = 0;
};

}  // namespace shardkeep::cli
