// The in-memory backend for tests. Paths are keys; a trailing '/' is
// ignored. In its file-system mode it mirrors the file backend: writing a
// file creates its parent directories, and a directory exists once created
// until it is deleted, so a test sees the same List/Exists answers from
// both. In its object-store mode it mirrors S3: there are only keys, a
// "directory" is the set of keys below it (none: it does not exist), and
// nothing can be renamed.

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "shardkeep/storage.h"

namespace shardkeep {
namespace {

std::string Normalize(std::string_view path) {
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  return std::string(path);
}

// The prefix every key below directory `dir` starts with; "" for the root.
std::string ChildPrefix(const std::string& dir) {
  return dir.empty() ? std::string() : dir + "/";
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Storage for a file's bytes, shared by the file and the readers copying
// out of it.
struct Buffer {
  explicit Buffer(size_t capacity)
      : bytes(std::make_unique_for_overwrite<char[]>(capacity)),
        capacity(capacity) {}
  const std::unique_ptr<char[]> bytes;
  const size_t capacity;
};

// A file: the first `size` bytes of `buffer`. A reader takes a copy of this
// under Store::mu and reads the bytes after releasing it. Bytes below `size`
// never change, and an append either writes past `size` or moves to a new
// buffer (doubling), so readers copy without the lock and appending n bytes
// costs amortized O(n).
struct File {
  std::shared_ptr<Buffer> buffer;
  size_t size = 0;

  const char* data() const { return buffer->bytes.get(); }
};

File MakeFile(std::string_view content) {
  File file{std::make_shared<Buffer>(content.size()), content.size()};
  if (!content.empty()) {
    std::memcpy(file.buffer->bytes.get(), content.data(), content.size());
  }
  return file;
}

// The state behind a MemoryStorage, shared with its open WritableFiles.
struct Store {
  std::mutex mu;
  std::map<std::string, File> files;
  std::set<std::string> dirs;

  // REQUIRES: mu held.
  void AddParents(const std::string& path) {
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1)) {
      if (slash > 0) dirs.insert(path.substr(0, slash));
    }
  }
  // REQUIRES: mu held.
  bool IsDir(const std::string& path) const {
    return path.empty() || dirs.count(path) > 0;
  }
  // Whether some file's key lies below `dir`. REQUIRES: mu held.
  bool HasFilesBelow(const std::string& dir) const {
    const std::string prefix = ChildPrefix(dir);
    const auto it = files.lower_bound(prefix);
    return it != files.end() && StartsWith(it->first, prefix);
  }
};

// The key of a `dirs` entry or of a `files` entry.
const std::string& KeyOf(const std::string& key) { return key; }
template <typename V>
const std::string& KeyOf(const std::pair<const std::string, V>& entry) {
  return entry.first;
}

// `root` (when present) and every key below `root/`, which sort together.
template <typename Container>
std::vector<std::string> TreeKeys(const Container& entries,
                                  const std::string& root) {
  std::vector<std::string> keys;
  if (entries.count(root) > 0) keys.push_back(root);
  const std::string prefix = root + "/";
  for (auto it = entries.lower_bound(prefix);
       it != entries.end() && StartsWith(KeyOf(*it), prefix); ++it) {
    keys.push_back(KeyOf(*it));
  }
  return keys;
}

class MemoryWritableFile final : public WritableFile {
 public:
  MemoryWritableFile(std::shared_ptr<Store> store, std::string path)
      : store_(std::move(store)), path_(std::move(path)) {}

  Status Append(const void* data, size_t size) override {
    std::lock_guard<std::mutex> lock(store_->mu);
    const auto it = store_->files.find(path_);
    if (it == store_->files.end()) {
      return StorageError("append " + path_ +
                          ": file was deleted or renamed while open");
    }
    File& file = it->second;
    if (file.size + size > file.buffer->capacity) {
      // Readers may still hold the old buffer; they keep it alive.
      auto grown = std::make_shared<Buffer>(
          std::max(file.size + size, 2 * file.buffer->capacity));
      if (file.size > 0) {
        std::memcpy(grown->bytes.get(), file.data(), file.size);
      }
      file.buffer = std::move(grown);
    }
    if (size > 0) std::memcpy(file.buffer->bytes.get() + file.size, data, size);
    file.size += size;
    return Status::Ok();
  }
  Status Sync() override { return Status::Ok(); }
  Status Close() override { return Status::Ok(); }

 private:
  const std::shared_ptr<Store> store_;
  const std::string path_;
};

class MemoryStorage final : public Storage {
 public:
  explicit MemoryStorage(MemoryStorageMode mode)
      : objects_(mode == MemoryStorageMode::kObjectStore) {}

  StorageFeatures features() const override {
    if (objects_) {
      return {.atomic_rename = false, .durable_sync = false,
              .atomic_exchange = false, .conditional_create = true};
    }
    return {.atomic_rename = true, .durable_sync = false, .atomic_exchange = true,
            .conditional_create = true};
  }

  Status ReadAt(const std::string& path, uint64_t offset, uint64_t size,
                void* dst) override {
    SK_ASSIGN_OR_RETURN(const File file, Get(path));
    // Like pread, an empty read succeeds at any offset.
    if (size > 0 && (offset > file.size || size > file.size - offset)) {
      return CorruptionError("read " + path + ": wanted " +
                             std::to_string(size) + " bytes at offset " +
                             std::to_string(offset) + " but the file ends at " +
                             std::to_string(file.size));
    }
    if (size > 0) std::memcpy(dst, file.data() + offset, size);
    return Status::Ok();
  }

  Result<std::string> ReadAll(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const File file, Get(path));
    return std::string(file.data(), file.size);
  }

  Result<uint64_t> FileSize(const std::string& path) override {
    SK_ASSIGN_OR_RETURN(const File file, Get(path));
    return static_cast<uint64_t>(file.size);
  }

  Status WriteAll(const std::string& path, std::string_view data,
                  bool /*sync*/) override {
    File file = MakeFile(data);  // Copied before locking.
    std::lock_guard<std::mutex> lock(store_->mu);
    return Put(Normalize(path), std::move(file));
  }

  Result<std::unique_ptr<WritableFile>> OpenForAppend(
      const std::string& path) override {
    const std::string key = Normalize(path);
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->files.contains(key)) {
      return AlreadyExistsError("create " + key + ": it exists already");
    }
    SK_RETURN_IF_ERROR(Put(key, MakeFile("")));
    return std::unique_ptr<WritableFile>(
        std::make_unique<MemoryWritableFile>(store_, key));
  }

  Status WriteIfAbsent(const std::string& path, std::string_view data) override {
    const std::string key = Normalize(path);
    File file = MakeFile(data);
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->files.count(key) > 0 || (!objects_ && store_->IsDir(key))) {
      return AlreadyExistsError("create " + key + ": it exists already");
    }
    return Put(key, std::move(file));
  }

  Result<bool> Exists(const std::string& path) override {
    const std::string key = Normalize(path);
    std::lock_guard<std::mutex> lock(store_->mu);
    return store_->files.count(key) > 0 || IsDir(key);
  }

  Result<std::vector<std::string>> List(const std::string& dir) override {
    const std::string key = Normalize(dir);
    std::lock_guard<std::mutex> lock(store_->mu);
    if (objects_) {
      if (!IsDir(key)) return NotFoundError("list " + key + ": no key below it");
      return ObjectChildren(ChildPrefix(key));
    }
    if (!store_->IsDir(key)) {
      if (store_->files.count(key) > 0) {
        return StorageError("list " + key + ": Not a directory");
      }
      return NotFoundError("list " + key + ": No such directory");
    }
    const std::string prefix = ChildPrefix(key);
    std::vector<std::string> names;
    AddChildren(store_->files, prefix, names);
    AddChildren(store_->dirs, prefix, names);
    std::sort(names.begin(), names.end());
    return names;
  }

  Status CreateDir(const std::string& dir) override {
    // Keys have no folders to create: one exists once a key lies below it.
    if (objects_) return Status::Ok();
    const std::string key = Normalize(dir);
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->files.count(key) > 0) {
      return StorageError("mkdir " + key + ": a file has that name");
    }
    store_->AddParents(key);
    if (!key.empty()) store_->dirs.insert(key);
    return Status::Ok();
  }

  Status DeleteFile(const std::string& path) override {
    const std::string key = Normalize(path);
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->files.erase(key) == 0) {
      return NotFoundError("unlink " + key + ": No such file");
    }
    return Status::Ok();
  }

  Status DeleteRecursive(const std::string& path) override {
    const std::string key = Normalize(path);
    std::lock_guard<std::mutex> lock(store_->mu);
    for (const std::string& k : TreeKeys(store_->files, key)) {
      store_->files.erase(k);
    }
    for (const std::string& k : TreeKeys(store_->dirs, key)) {
      store_->dirs.erase(k);
    }
    return Status::Ok();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    const std::string source = Normalize(from);
    const std::string target = Normalize(to);
    const std::string what = "rename " + source + " to " + target;
    if (objects_) {
      return StorageError(what + ": an object store cannot rename");
    }
    std::lock_guard<std::mutex> lock(store_->mu);
    if (store_->files.count(source) == 0 && store_->dirs.count(source) == 0) {
      return NotFoundError(what + ": No such file or directory");
    }
    if (store_->files.count(target) > 0 || store_->IsDir(target)) {
      return AlreadyExistsError(what + ": target exists");
    }
    if (StartsWith(target, source + "/")) {
      return InvalidArgumentError(what + ": target is inside the source");
    }
    store_->AddParents(target);
    for (const std::string& key : TreeKeys(store_->files, source)) {
      auto node = store_->files.extract(key);
      node.key() = target + key.substr(source.size());
      store_->files.insert(std::move(node));
    }
    for (const std::string& key : TreeKeys(store_->dirs, source)) {
      auto node = store_->dirs.extract(key);
      node.value() = target + key.substr(source.size());
      store_->dirs.insert(std::move(node));
    }
    return Status::Ok();
  }

  Result<bool> Link(const std::string& from, const std::string& to) override {
    if (objects_) return false;  // an object store has no second names
    const std::string source = Normalize(from);
    const std::string target = Normalize(to);
    const std::string what = "link " + source + " as " + target;
    std::lock_guard<std::mutex> lock(store_->mu);
    const auto it = store_->files.find(source);
    if (it == store_->files.end()) {
      return NotFoundError(what + ": No such file or directory");
    }
    if (store_->files.count(target) > 0 || store_->IsDir(target)) {
      return AlreadyExistsError(what + ": target exists");
    }
    File shared = it->second;  // the same buffer: the bytes are shared
    SK_RETURN_IF_ERROR(Put(target, std::move(shared)));
    return true;
  }

  Result<bool> Exchange(const std::string& a, const std::string& b) override {
    const std::string first = Normalize(a);
    const std::string second = Normalize(b);
    const std::string what = "exchange " + first + " and " + second;
    if (objects_) return false;  // no atomic swap of key ranges
    std::lock_guard<std::mutex> lock(store_->mu);
    for (const std::string& key : {first, second}) {
      if (store_->files.count(key) == 0 && store_->dirs.count(key) == 0) {
        return NotFoundError(what + ": " + key + ": No such file or directory");
      }
    }
    if (first == second) return true;
    if (StartsWith(second, first + "/") || StartsWith(first, second + "/")) {
      return InvalidArgumentError(what + ": one is inside the other");
    }
    // Take both trees out before putting either back under the other name.
    auto moved_files = Extract(store_->files, first, second);
    auto moved_dirs = Extract(store_->dirs, first, second);
    for (auto& node : moved_files) store_->files.insert(std::move(node));
    for (auto& node : moved_dirs) store_->dirs.insert(std::move(node));
    return true;
  }

  Status SyncDir(const std::string& /*dir*/) override { return Status::Ok(); }

 private:
  // A snapshot of the file at `path`.
  Result<File> Get(const std::string& path) {
    const std::string key = Normalize(path);
    std::lock_guard<std::mutex> lock(store_->mu);
    const auto it = store_->files.find(key);
    if (it == store_->files.end()) {
      return NotFoundError("open " + key + ": No such file");
    }
    return it->second;
  }

  // A directory: created (file-system mode) or with keys below it (object
  // mode). REQUIRES: store_->mu held.
  bool IsDir(const std::string& key) const {
    return objects_ ? key.empty() || store_->HasFilesBelow(key) : store_->IsDir(key);
  }

  // The names directly below `prefix` among the keys: a key's next path
  // segment, once. REQUIRES: store_->mu held.
  std::vector<std::string> ObjectChildren(const std::string& prefix) const {
    std::vector<std::string> names;
    for (auto it = store_->files.lower_bound(prefix);
         it != store_->files.end() && StartsWith(it->first, prefix); ++it) {
      std::string_view rest = std::string_view(it->first).substr(prefix.size());
      rest = rest.substr(0, rest.find('/'));
      if (!rest.empty() && (names.empty() || names.back() != rest)) {
        names.emplace_back(rest);
      }
    }
    // A segment's keys need not be adjacent: a file "a" and the keys below
    // "a/" sort around "a-b" ('-' comes before '/'). So sort and dedupe.
    std::sort(names.begin(), names.end());
    names.erase(std::unique(names.begin(), names.end()), names.end());
    return names;
  }

  // REQUIRES: store_->mu held.
  Status Put(const std::string& key, File file) {
    if (objects_) {
      store_->files[key] = std::move(file);
      return Status::Ok();
    }
    if (store_->IsDir(key)) {
      return StorageError("open " + key + ": Is a directory");
    }
    store_->AddParents(key);
    store_->files[key] = std::move(file);
    return Status::Ok();
  }

  // Removes the trees at `a` and `b` from `entries`, renamed to each
  // other's name, ready to insert back.
  template <typename Container>
  static std::vector<typename Container::node_type> Extract(
      Container& entries, const std::string& a, const std::string& b) {
    std::vector<typename Container::node_type> nodes;
    for (const auto& [from, to] : {std::pair(a, b), std::pair(b, a)}) {
      for (const std::string& key : TreeKeys(entries, from)) {
        auto node = entries.extract(key);
        Rekey(node, to + key.substr(from.size()));
        nodes.push_back(std::move(node));
      }
    }
    return nodes;
  }
  template <typename Node>
  static void Rekey(Node& node, std::string key) {
    if constexpr (requires { node.key(); }) {
      node.key() = std::move(key);
    } else {
      node.value() = std::move(key);
    }
  }

  // Appends the names of the direct children of `prefix` among `entries`.
  template <typename Container>
  static void AddChildren(const Container& entries, const std::string& prefix,
                          std::vector<std::string>& names) {
    for (auto it = entries.lower_bound(prefix); it != entries.end(); ++it) {
      const std::string& key = KeyOf(*it);
      if (!StartsWith(key, prefix)) break;
      const std::string_view rest = std::string_view(key).substr(prefix.size());
      if (!rest.empty() && rest.find('/') == std::string_view::npos) {
        names.emplace_back(rest);
      }
    }
  }

  const bool objects_;  // object-store mode
  const std::shared_ptr<Store> store_ = std::make_shared<Store>();
};

}  // namespace

std::shared_ptr<Storage> NewMemoryStorage(MemoryStorageMode mode) {
  return std::make_shared<MemoryStorage>(mode);
}

}  // namespace shardkeep
