// The one interface shardkeep uses to reach bytes: a POSIX file system, an
// in-memory store for tests, later object stores. Paths are '/'-separated
// strings; the file backend takes them as file-system paths, the memory
// backend as keys. Every method is safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardkeep/status.h"

namespace shardkeep {

// What a backend guarantees, so the commit protocol can pick its strategy.
struct StorageFeatures {
  bool atomic_rename = false;  // Rename() of a directory is atomic
  bool durable_sync = false;   // Sync()/SyncDir() make data survive a crash
  // Exchange() may swap two entries atomically (it still answers false
  // where the file system under the paths cannot).
  bool atomic_exchange = false;
  // WriteIfAbsent() is atomic: of writers racing to create one path,
  // exactly one succeeds (an object store's conditional PUT). Backends
  // without atomic_rename commit through it.
  bool conditional_create = false;
  // Reads worth having in flight at once in one process when
  // Options::io_threads is 0; 0 means one per core. A store reached over
  // the network answers each request after a round trip, so it keeps more
  // requests in flight than there are cores.
  int parallel_reads = 0;
  // The same for a save's writer threads (each writes its own data files)
  // when Options::io_threads is 0; 0 means one per core. A store whose
  // uploads wait on the network mostly (GCS) gains from more files in
  // flight than there are cores.
  int parallel_writes = 0;
  // A writer starts a new data file once its current one would pass this
  // (or Options::data_file_bytes, the smaller); 0: the options decide. A
  // store where a file larger than one upload request costs more (GCS
  // joins the parts of one by compose) keeps files to one request each.
  uint64_t data_file_bytes = 0;
  // A read shorter than this costs about as much as one this long (each
  // request pays a round trip), so the reader merges neighbouring chunks up
  // to this size even where each could be read straight into place: a copy
  // out of a buffer is cheaper than a request. 0: never.
  uint64_t min_efficient_read_bytes = 0;
  // ReadScatter() fills all its pieces with about the cost of one ReadAt()
  // of their span (a vectored read), so a box that is not contiguous in
  // its file is read straight into place row by row instead of through a
  // buffer. Without it, ReadScatter() is correct but makes one request per
  // piece, and the reader does not use it.
  bool scatter_reads = false;
  // Reads travel over a network (an object store), where a transfer can
  // damage bytes that TCP's 16-bit checksum lets through (a faulty NIC,
  // proxy or middlebox). A reader then reads a chunk, index or small file
  // whose checksum fails once more before it reports the stored bytes
  // damaged; on local storage a second read would only repeat the first.
  bool remote = false;
};

// One destination of Storage::ReadScatter(): the next `size` bytes of the
// file go to `dst`, or are skipped when `dst` is null.
struct ScatterPiece {
  void* dst;
  uint64_t size;
};

// A file being written front to back by one thread.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  virtual Status Append(const void* data, size_t size) = 0;
  // Makes every appended byte durable. Called once, after the last Append.
  virtual Status Sync() = 0;
  // REQUIRES: called once; no Append after it.
  virtual Status Close() = 0;
};

class Storage {
 public:
  virtual ~Storage() = default;

  virtual StorageFeatures features() const = 0;

  // Reads exactly `size` bytes at `offset` into `dst`. NotFound when the
  // file does not exist; Corruption when it ends before offset + size. A
  // zero-size read succeeds at any offset.
  virtual Status ReadAt(const std::string& path, uint64_t offset,
                        uint64_t size, void* dst) = 0;
  // Reads the bytes from `offset` on into `pieces`, in order, each taking
  // the next piece.size bytes. Errors as ReadAt, for the span of all
  // pieces. The default calls ReadAt once per piece.
  virtual Status ReadScatter(const std::string& path, uint64_t offset,
                             const std::vector<ScatterPiece>& pieces) {
    for (const ScatterPiece& piece : pieces) {
      if (piece.dst != nullptr) {
        SK_RETURN_IF_ERROR(ReadAt(path, offset, piece.size, piece.dst));
      }
      offset += piece.size;
    }
    return Status::Ok();
  }
  // The whole file. NotFound when absent.
  virtual Result<std::string> ReadAll(const std::string& path) = 0;
  virtual Result<uint64_t> FileSize(const std::string& path) = 0;

  // Replaces the file's content with `data` (creating it). When `sync`, the
  // content is durable on return. Not atomic: a crash may leave part of
  // it, so callers that need atomicity write under a temporary name (the
  // commit protocol writes inside the temporary checkpoint folder).
  virtual Status WriteAll(const std::string& path, std::string_view data,
                          bool sync) = 0;
  // Creates `path` for appending: AlreadyExists when it exists, changing
  // nothing. Create-only because data files are hard-linked into several
  // checkpoints and mapped into live arrays: a write that truncated one
  // would corrupt checkpoints and arrays that share it.
  virtual Result<std::unique_ptr<WritableFile>> OpenForAppend(
      const std::string& path) = 0;

  // True when a file or a directory (or, for key stores, any key below
  // `path/`) exists.
  virtual Result<bool> Exists(const std::string& path) = 0;
  // Sorted names (not paths) of the direct children of directory `dir`:
  // files and subdirectories. NotFound when `dir` does not exist.
  virtual Result<std::vector<std::string>> List(const std::string& dir) = 0;
  // Creates `dir` and its missing parents; OK when it exists already.
  virtual Status CreateDir(const std::string& dir) = 0;
  // Deletes one file. NotFound when absent.
  virtual Status DeleteFile(const std::string& path) = 0;
  // Deletes `path` and everything below it; OK when it does not exist.
  virtual Status DeleteRecursive(const std::string& path) = 0;
  // Moves a file or directory. AlreadyExists when `to` exists; NotFound
  // when `from` does not.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes the entries of directory `dir` (creations, renames) durable.
  virtual Status SyncDir(const std::string& dir) = 0;
  // Swaps the files or directories at `a` and `b` in one atomic step: no
  // observer, and no crash, ever sees either name missing. Both must exist
  // (NotFound otherwise). Returns false, changing nothing, where the
  // backend or the file system under these paths cannot swap atomically;
  // the caller then needs another way. The default never can.
  virtual Result<bool> Exchange(const std::string& a, const std::string& b) {
    (void)a;
    (void)b;
    return false;
  }
  // Makes `to` a file with the bytes of the file `from` without passing
  // them through this host: a hard link on a file system (the bytes are
  // shared), a server-side copy in an object store. A save reuses an
  // earlier checkpoint's data file this way instead of writing its bytes
  // again. Files shardkeep writes are never changed once written, so the
  // two never differ; deleting one leaves the other whole. AlreadyExists
  // when `to` exists; NotFound when `from` does not. Returns false,
  // changing nothing, where the backend or the file system under these
  // paths cannot (another file system, one without hard links, an object
  // past one copy request's limit); the caller then copies. The default
  // never can.
  virtual Result<bool> Link(const std::string& from, const std::string& to) {
    (void)from;
    (void)to;
    return false;
  }
  // Creates the file `path` with `data`, durable on return, unless it
  // exists: AlreadyExists then, changing nothing. Atomic against other
  // writers where features().conditional_create; the default refuses.
  virtual Status WriteIfAbsent(const std::string& path, std::string_view data) {
    (void)data;
    return StorageError("this storage cannot create " + path +
                        " conditionally");
  }
};

std::shared_ptr<Storage> NewFileStorage();

// How an in-memory store behaves (it is a test backend).
enum class MemoryStorageMode {
  // Like a POSIX file system: directories are entries of their own (an
  // empty one exists), Rename and Exchange are atomic.
  kFileSystem,
  // Like an object store (S3): keys only, so a "directory" exists while
  // some key lies below it; no Rename or Exchange; WriteIfAbsent is the
  // atomic operation commits rely on. It lets the commit protocol for
  // object stores be tested without a server.
  kObjectStore,
};
// A fresh, empty in-memory store.
std::shared_ptr<Storage> NewMemoryStorage(
    MemoryStorageMode mode = MemoryStorageMode::kFileSystem);

// Settings for s3:// URLs given by the caller (a per-call override for
// programs that use several stores). Each one that is set wins over the
// environment and the AWS configuration files.
struct S3Overrides {
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> session_token;
  std::optional<std::string> region;
  std::optional<std::string> endpoint_url;  // "http://127.0.0.1:8333"
  std::optional<std::string> profile;
  // Retrying one request gives up after this long; default 600.
  std::optional<double> timeout_s;
};

// Settings for gs:// URLs given by the caller; each one set wins over the
// environment (docs/GCS.md says where the rest come from).
struct GcsOverrides {
  // Where requests go: "https://storage.googleapis.com" unless given here
  // or by STORAGE_EMULATOR_HOST (an emulator, reached without credentials).
  std::optional<std::string> endpoint;
  // A service-account or authorized-user key file: wins over Application
  // Default Credentials.
  std::optional<std::string> credentials_file;
  // No credentials at all (public buckets, emulators).
  std::optional<bool> anonymous;
  // Retrying one request gives up after this long; default 600.
  std::optional<double> timeout_s;
};

// A backend and the path inside it that a URL names.
struct StorageLocation {
  std::shared_ptr<Storage> storage;
  std::string path;
};
// "memory://name/a/b" → the process-wide memory store, path "name/a/b";
// "memory-objects://name/a/b" → the process-wide memory store in object-store
// mode (a separate one, for tests of the object-store commit);
// "file:///x/y" or "/x/y" or "x/y" → the file backend, the path made
// absolute and normalised (Location::key). ParseLocation (location.h) reads the URL: its
// errors (an unknown scheme, an empty path, a malformed s3:// URL) are
// this call's.
// "s3://bucket/prefix" → the S3 backend of `bucket` configured from `s3`,
// the environment and the AWS files, path "prefix"; "gs://bucket/prefix"
// → the GCS backend of `bucket`, credentials from `gcs` or found as
// Google's libraries find them. Storages are shared process-wide by
// configuration and bucket, so their connections (and tokens) are reused.
Result<StorageLocation> ResolveStorage(const std::string& url,
                                       const S3Overrides& s3 = {},
                                       const GcsOverrides& gcs = {});

}  // namespace shardkeep
