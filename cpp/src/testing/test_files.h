// Reading the checked-in test data under cpp/testdata.
#pragma once

#include <string>

namespace shardkeep::testdata {

// The bytes of cpp/testdata/<relative>; empty when the file is missing
// (tests assert it is not empty).
std::string Read(const std::string& relative);

}  // namespace shardkeep::testdata
