#include "testing/test_files.h"

#include <fstream>
#include <sstream>

namespace shardkeep::testdata {

std::string Read(const std::string& relative) {
  std::ifstream in(std::string(SHARDKEEP_TESTDATA_DIR) + "/" + relative,
                   std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace shardkeep::testdata
