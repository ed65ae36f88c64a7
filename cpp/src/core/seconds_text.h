// How error messages write a duration the caller chose (a timeout): as a
// person would write it, "0.5 s", "600 s", "1e+06 s".
#pragma once

#include <string>

namespace shardkeep {

std::string SecondsText(double seconds);

}  // namespace shardkeep
