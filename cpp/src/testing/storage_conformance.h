// The behaviour every Storage backend must show, as one value-parameterized
// gtest suite. A backend's test file instantiates it once:
//
//   SK_INSTANTIATE_STORAGE_CONFORMANCE(
//       File, (StorageTestBackend{"file", [] {
//         return StorageLocation{NewFileStorage(), MakeTempDir()};
//       }}));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "shardkeep/storage.h"

namespace shardkeep {

struct StorageTestBackend {
  // Suffix of the test names; letters, digits and '_' only.
  std::string name;
  // A backend and an existing, empty directory in it, fresh for each test.
  // The suite deletes the directory (DeleteRecursive) after the test.
  std::function<StorageLocation()> make;
  // Keys under prefixes rather than directories (S3): CreateDir leaves
  // nothing behind, so an empty directory does not exist, and Rename is
  // refused. Everything else is the same.
  bool object_store = false;
};
// Lets gtest name the backend in failure messages.
void PrintTo(const StorageTestBackend& backend, std::ostream* os);

class StorageConformanceTest
    : public ::testing::TestWithParam<StorageTestBackend> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // `name` inside the test's directory.
  std::string Path(std::string_view name) const;
  // Whether empty directories exist and renames work (not on object
  // stores).
  bool HasDirs() const { return !GetParam().object_store; }
  // On a backend without rename: Rename(from, to) fails, naming both, and
  // changes nothing.
  void ExpectRenameRefused(const std::string& from, const std::string& to);

  std::shared_ptr<Storage> storage_;
  std::string root_;
};

// The test-name suffix of a backend. Defined in storage_conformance.cc; the
// instantiation macro refers to it, which also makes the linker keep the
// suite's tests when they come from a static library.
std::string StorageTestBackendName(
    const ::testing::TestParamInfo<StorageTestBackend>& info);

// A new, empty directory under $TMPDIR (or /tmp), for the file backend.
std::string MakeTempDir();

// `n` pseudo-random bytes, so that a read at a wrong offset does not match.
std::string TestBytes(size_t n, uint32_t seed = 1);

}  // namespace shardkeep

// Use inside namespace shardkeep: gtest pastes the suite name into
// identifiers, so it cannot be qualified.
#define SK_INSTANTIATE_STORAGE_CONFORMANCE(prefix, backend)                \
  INSTANTIATE_TEST_SUITE_P(prefix, StorageConformanceTest,                \
                           ::testing::Values(backend),                     \
                           ::shardkeep::StorageTestBackendName)
