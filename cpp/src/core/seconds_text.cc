#include "core/seconds_text.h"

#include <cstdio>

namespace shardkeep {

std::string SecondsText(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

}  // namespace shardkeep
