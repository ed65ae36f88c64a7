#include "progress.h"

#include <unistd.h>

#include <cmath>

namespace shardkeep::cli {
namespace {

constexpr auto kRedrawInterval = std::chrono::milliseconds(100);
constexpr int kBarWidth = 24;

std::string Bytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 5) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

std::string Clock(double seconds) {
  const long s = std::lround(seconds);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%ld:%02ld", s / 60, s % 60);
  }
  return text;
}

}  // namespace

ProgressBar::ProgressBar(std::string label)
    : ProgressBar(std::move(label), isatty(STDERR_FILENO) == 1, stderr) {}

ProgressBar::ProgressBar(std::string label, bool enabled, std::FILE* out)
    : label_(std::move(label)), enabled_(enabled), out_(out),
      start_(std::chrono::steady_clock::now()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  done_ = done;
  total_ = total;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  Draw();
}

void ProgressBar::Finish() {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  finished_ = true;
  if (!drawn_) return;
  Draw();
  std::fputc('\n', out_);
  std::fflush(out_);
}

std::function<void(uint64_t, uint64_t)> ProgressBar::Callback() {
  return [this](uint64_t done, uint64_t total) { Update(done, total); };
}

void ProgressBar::Draw() {
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double fraction = total_ ? static_cast<double>(done_) / total_ : 1.0;
  const int filled = static_cast<int>(fraction * kBarWidth);
  const std::string bar = std::string(filled, '#') + std::string(kBarWidth - filled, '.');
  std::string line = label_ + " [" + bar + "] " + Bytes(done_) + " / " + Bytes(total_);
  char percent[16];
  std::snprintf(percent, sizeof(percent), " %3.0f%%", fraction * 100);
  line += percent;
  if (elapsed > 0.05 && done_ > 0) {
    const double rate = done_ / elapsed;
    line += "  " + Bytes(rate) + "/s";
    line += done_ < total_ ? "  ETA " + Clock((total_ - done_) / rate)
                           : "  in " + Clock(elapsed);
  }
  // Back to the line's start and clear it: the bar is redrawn in place.
  std::fprintf(out_, "\r\033[K%s", line.c_str());
  std::fflush(out_);
  drawn_ = true;
}

}  // namespace shardkeep::cli
