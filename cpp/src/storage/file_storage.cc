// The POSIX file-system backend. Paths are file-system paths. Every call
// opens what it needs and closes it again, so the backend holds no state and
// one instance serves every thread.
//
// Errors: ENOENT becomes NotFound; ENOSPC and EDQUOT become OutOfSpace,
// saying how many bytes the file system has left; everything else (EACCES,
// EIO...) becomes a StorageError "<operation> <path>: <strerror>".

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardkeep/storage.h"
#include "storage/read_counter.h"

namespace shardkeep {
namespace {

// Small appends are gathered into a buffer of this size so that writing many
// small index entries costs few system calls; larger ones skip the buffer.
constexpr size_t kAppendBufferSize = 64 * 1024;

// An appended file asks the kernel to start writing back each span of this
// many bytes as soon as it is complete, so that the disk works while the
// writer still copies into the page cache and the one fsync at the end
// waits only for the last span instead of for the whole file.
constexpr uint64_t kWritebackSpanBytes = 8 * 1024 * 1024;

// Bytes an unprivileged writer may still use on the file system holding
// `path`, or on the nearest existing folder above it.
std::optional<uint64_t> FreeBytes(const std::string& path) {
  std::string at = path.empty() ? "." : path;
  while (true) {
    struct statvfs fs;
    if (::statvfs(at.c_str(), &fs) == 0) {
      return static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    }
    if ((errno != ENOENT && errno != ENOTDIR) || at == "." || at == "/") {
      return std::nullopt;
    }
    const size_t slash = at.find_last_of('/');
    at = slash == std::string::npos ? "." : slash == 0 ? "/" : at.substr(0, slash);
  }
}

// `what` failed on `path` with `err`. A full file system is told apart, with
// the space left, so that a failed save can say plainly why it failed.
Status PosixError(const std::string& what, int err,
                  const std::string& path = "") {
  Status status = ErrnoError(what, err);
  if (err == ENOENT) return NotFoundError(status.message());
  if (err == ENOSPC || err == EDQUOT) {
    const std::optional<uint64_t> free = FreeBytes(path);
    return OutOfSpaceError(
        status.message() +
        (free ? " (" + std::to_string(*free) + " bytes free on its file system)"
              : std::string()));
  }
  return status;
}

// Closes the descriptor it owns on destruction.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now, so that a failing close() (NFS reports write errors there)
  // reaches the caller.
  Status Close(const std::string& path) {
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return PosixError("close " + path, errno, path);
    return Status::Ok();
  }

 private:
  int fd_;
};

Result<int> OpenFile(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return PosixError("open " + path, errno, path);
  return fd;
}

// Writes all of [data, data + size), retrying short writes and EINTR.
Status WriteFully(int fd, const char* data, size_t size,
                  const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("write " + path, errno, path);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// Reads up to `size` bytes at `offset`; fewer only at end of file. Every
// read of the backend goes through here, which counts what it read.
Result<uint64_t> PreadFully(int fd, uint64_t offset, uint64_t size, char* dst,
                            const std::string& path) {
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, dst + done, size - done,
                              static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + path, errno);
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
  }
  CountStorageBytesRead(done);
  return done;
}

// Fills the buffers of `iov` (adjusted in place) from `offset` on with
// preadv, as many calls as it takes; returns the bytes read, fewer than
// asked only where the file ends.
Result<uint64_t> PreadvFully(int fd, uint64_t offset, iovec* iov, int count,
                             const std::string& path) {
  uint64_t done = 0;
  while (count > 0) {
    const ssize_t n = ::preadv(fd, iov, count, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return PosixError("read " + path, errno);
    }
    if (n == 0) break;
    done += static_cast<uint64_t>(n);
    size_t left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {  // the buffers filled
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {  // one filled in part
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  CountStorageBytesRead(done);
  return done;
}

Status ShortReadError(const std::string& path, uint64_t offset, uint64_t size,
                      uint64_t got) {
  return CorruptionError("read " + path + ": wanted " + std::to_string(size) +
                         " bytes at offset " + std::to_string(offset) +
                         " but the file ends at " + std::to_string(offset + got));
}

Status SyncFd(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return PosixError("fsync " + path, errno, path);
  return Status::Ok();
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(int fd, std::string path)
      : fd_(fd), path_(std::move(path)) {
    buffer_.reserve(kAppendBufferSize);
  }

  ~PosixWritableFile() override {
    // The caller forgot Close(); keep what was appended rather than drop the
    // buffer. There is nobody left to report an error to.
    if (fd_ >= 0) (void)Close();
  }

  Status Append(const void* data, size_t size) override {
    const char* bytes = static_cast<const char*>(data);
    if (buffer_.size() + size <= kAppendBufferSize) {
      buffer_.append(bytes, size);
      return Status::Ok();
    }
    SK_RETURN_IF_ERROR(Flush());
    if (size < kAppendBufferSize) {
      buffer_.append(bytes, size);
      return Status::Ok();
    }
    SK_RETURN_IF_ERROR(WriteFully(fd_, bytes, size, path_));
    Written(size);
    return Status::Ok();
  }

  Status Sync() override {
    SK_RETURN_IF_ERROR(Flush());
    return SyncFd(fd_, path_);
  }

  Status Close() override {
    Status status = Flush();
    if (::close(fd_) != 0 && status.ok()) {
      status = PosixError("close " + path_, errno, path_);
    }
    fd_ = -1;
    return status;
  }

 private:
  Status Flush() {
    Status status = WriteFully(fd_, buffer_.data(), buffer_.size(), path_);
    if (status.ok()) Written(buffer_.size());
    buffer_.clear();
    return status;
  }

  // `size` more bytes reached the file. Starts the writeback of every
  // complete span (see kWritebackSpanBytes). Only a hint: it neither waits
  // nor makes anything durable, and a write error it would meet is
  // reported by the fsync in Sync(), so its own answer is not needed.
  void Written(uint64_t size) {
    written_ += size;
#ifdef SYNC_FILE_RANGE_WRITE
    if (written_ - kicked_ < kWritebackSpanBytes) return;
    const uint64_t end = written_ - written_ % kWritebackSpanBytes;
    (void)::sync_file_range(fd_, static_cast<off_t>(kicked_),
                            static_cast<off_t>(end - kicked_), SYNC_FILE_RANGE_WRITE);
    kicked_ = end;
#endif
  }

  int fd_;
  const std::string path_;
  std::string buffer_;
  uint64_t written_ = 0;  // bytes handed to write()
  uint64_t kicked_ = 0;   // bytes whose writeback was started
};

using DirPtr = std::unique_ptr<DIR, int (*)(DIR*)>;

// Names in `dir`, without "." and "..", in directory order.
Result<std::vector<std::string>> ReadDirNames(DIR* dir,
                                              const std::string& path) {
  std::vector<std::string> names;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) {
      if (errno != 0) return PosixError("readdir " + path, errno);
      return names;
    }
    const std::string_view name = entry->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
}

// Removes `name` (relative to `parent_fd`) and everything below it. Never
// follows a symbolic link: unlink() removes the link itself, and the
// directory is opened with O_NOFOLLOW, so a link swapped in meanwhile fails
// instead of leading the walk out of the tree.
Status RemoveTree(int parent_fd, const std::string& name,
                  const std::string& path) {
  if (::unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT) {
    return Status::Ok();
  }
  // Linux answers EISDIR for a directory, POSIX allows EPERM.
  if (errno != EISDIR && errno != EPERM) {
    return PosixError("unlink " + path, errno);
  }
  const int fd = ::openat(parent_fd, name.c_str(),
                          O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return PosixError("open " + path, errno);
  DirPtr dir(::fdopendir(fd), &::closedir);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return PosixError("opendir " + path, err);
  }
  SK_ASSIGN_OR_RETURN(std::vector<std::string> children,
                      ReadDirNames(dir.get(), path));
  for (const std::string& child : children) {
    SK_RETURN_IF_ERROR(
        RemoveTree(::dirfd(dir.get()), child, path + "/" + child));
  }
  dir.reset();
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 &&
      errno != ENOENT) {
    return PosixError("rmdir " + path, errno);
  }
  return Status::Ok();
}

Status MakeDirs(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) == 0) return Status::Ok();
  if (errno == ENOENT) {
    const size_t slash = dir.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      SK_RETURN_IF_ERROR(MakeDirs(dir.substr(0, slash)));
      if (::mkdir(dir.c_str(), 0755) == 0) return Status::Ok();
    }
  }
  // EEXIST is fine, also from a concurrent creator, if it is a directory.
  if (errno != EEXIST) return PosixError("mkdir " + dir, errno, dir);
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return PosixError("stat " + dir, errno);
  if (!S_ISDIR(st.st_mode)) return ErrnoError("mkdir " + dir, ENOTDIR);
  return Status::Ok();
}

class FileStorage final : public Storage {
 public:
  StorageFeatures features() const override {
    return {.atomic_rename = true, .durable_sync = true, .atomic_exchange = true,
            .scatter_reads = true};
  }

  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override {
    SK_ASSIGN_OR_RETURN(const int raw_fd, OpenFile(path, O_RDONLY));
    ScopedFd fd(raw_fd);
    SK_ASSIGN_OR_RETURN(const uint64_t got,
                        PreadFully(fd.get(), offset, size,
                                   static_cast<char*>(dst), path));
    if (got < size) return ShortReadError(path, offset, size, got);
    return Status::Ok();
  }

  // Each run of pieces with destinations is one preadv of up to IOV_MAX
  // buffers; a skipped piece starts the next.
  Status ReadScatter(const std::string& path, uint64_t offset,
                     const std::vector<ScatterPiece>& pieces) override {
    SK_ASSIGN_OR_RETURN(const int raw_fd, OpenFile(path, O_RDONLY));
    ScopedFd fd(raw_fd);
    std::vector<iovec> batch;
    batch.reserve(std::min<size_t>(pieces.size(), IOV_MAX));
    uint64_t batch_offset = offset, batch_bytes = 0;
    auto flush = [&]() -> Status {
      if (batch.empty()) return Status::Ok();
      SK_ASSIGN_OR_RETURN(const uint64_t got,
                          PreadvFully(fd.get(), batch_offset, batch.data(),
                                      static_cast<int>(batch.size()), path));
      if (got < batch_bytes) return ShortReadError(path, batch_offset, batch_bytes, got);
      batch.clear();
      batch_offset += batch_bytes;
      batch_bytes = 0;
      return Status::Ok();
    };
    for (const ScatterPiece& piece : pieces) {
      if (piece.dst == nullptr || batch.size() == IOV_MAX) {
        SK_RETURN_IF_ERROR(flush());
      }
      if (piece.dst == nullptr) {
        batch_offset += piece.size;
        continue;
      }
      batch.push_back({piece.dst, static_cast<size_t>(piece.size)});
      batch_bytes += piece.size;
    }
    return flush();
  }

  Result<std::string> ReadAll(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const int raw_fd, OpenFile(path, O_RDONLY));
    ScopedFd fd(raw_fd);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return PosixError("stat " + path, errno);
    std::string content(static_cast<size_t>(st.st_size), '\0');
    SK_ASSIGN_OR_RETURN(const uint64_t got,
                        PreadFully(fd.get(), 0, content.size(), content.data(),
                                   path));
    content.resize(got);  // The file shrank since fstat.
    return content;
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      return PosixError("stat " + path, errno);
    }
    return static_cast<uint64_t>(st.st_size);
  }

  Status WriteAll(const std::string& path, std::string_view data,
                  bool sync) override {
    SK_ASSIGN_OR_RETURN(const int raw_fd,
                        OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ScopedFd fd(raw_fd);
    SK_RETURN_IF_ERROR(WriteFully(fd.get(), data.data(), data.size(), path));
    if (sync) SK_RETURN_IF_ERROR(SyncFd(fd.get(), path));
    return fd.Close(path);
  }

  Result<std::unique_ptr<WritableFile>> OpenForAppend(
      const std::string& path) override {
    int fd;
    do {
      fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno == EEXIST) {
      return AlreadyExistsError("create " + path + ": it exists already (files are "
                                "created once, never truncated)");
    }
    if (fd < 0) return PosixError("open " + path, errno, path);
    return std::unique_ptr<WritableFile>(
        std::make_unique<PosixWritableFile>(fd, path));
  }

  Result<bool> Exists(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) return true;
    if (errno == ENOENT || errno == ENOTDIR) return false;
    return PosixError("stat " + path, errno);
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    DirPtr handle(::opendir(dir.c_str()), &::closedir);
    if (handle == nullptr) return PosixError("opendir " + dir, errno);
    SK_ASSIGN_OR_RETURN(std::vector<std::string> names,
                        ReadDirNames(handle.get(), dir));
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDir(const std::string& dir) override { return MakeDirs(dir); }

  Status DeleteFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink " + path, errno);
    return Status::Ok();
  }

  Status DeleteRecursive(const std::string& path) override {
    return RemoveTree(AT_FDCWD, path, path);
  }

  // renameat2(RENAME_NOREPLACE) refuses an existing target atomically. Where
  // the kernel or the file system lacks it, a stat() check comes first; that
  // check is not atomic: a target created between it and rename() is
  // replaced (a file) or makes rename() fail (a non-empty directory).
  Status Rename(const std::string& from, const std::string& to) override {
#ifdef RENAME_NOREPLACE
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(),
                    RENAME_NOREPLACE) == 0) {
      return Status::Ok();
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP) {
      return RenameError(from, to, errno);
    }
#endif
    SK_ASSIGN_OR_RETURN(const bool target_exists, Exists(to));
    if (target_exists) return RenameError(from, to, EEXIST);
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return RenameError(from, to, errno);
    }
    return Status::Ok();
  }

  // renameat2(RENAME_EXCHANGE) (Linux 3.15; ext4, xfs, btrfs, tmpfs...).
  // Where the kernel or the file system lacks it: false, nothing changed.
  Result<bool> Exchange(const std::string& a, const std::string& b) override {
#ifdef RENAME_EXCHANGE
    if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(),
                    RENAME_EXCHANGE) == 0) {
      return true;
    }
    if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) return false;
    return PosixError("exchange " + a + " and " + b, errno, a);
#else
    (void)a;
    (void)b;
    return false;
#endif
  }

  Result<bool> Link(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) == 0) return true;
    // Another file system, or one without hard links (FAT, some FUSE and
    // network mounts), or a file linked too often: the caller copies.
    if (errno == EXDEV || errno == EPERM || errno == ENOTSUP || errno == ENOSYS ||
        errno == EMLINK || errno == EOPNOTSUPP) {
      return false;
    }
    if (errno == EEXIST) return AlreadyExistsError("link " + from + " as " + to + ": target exists");
    return PosixError("link " + from + " as " + to, errno, errno == ENOENT ? from : to);
  }

  Status SyncDir(const std::string& dir) override {
    SK_ASSIGN_OR_RETURN(const int raw_fd,
                        OpenFile(dir, O_RDONLY | O_DIRECTORY));
    ScopedFd fd(raw_fd);
    SK_RETURN_IF_ERROR(SyncFd(fd.get(), dir));
    return fd.Close(dir);
  }

 private:
  static Status RenameError(const std::string& from, const std::string& to,
                            int err) {
    const std::string what = "rename " + from + " to " + to;
    if (err == EEXIST || err == ENOTEMPTY) {
      return AlreadyExistsError(what + ": target exists");
    }
    return PosixError(what, err, to);
  }
};

}  // namespace

std::shared_ptr<Storage> NewFileStorage() {
  return std::make_shared<FileStorage>();
}

}  // namespace shardkeep
