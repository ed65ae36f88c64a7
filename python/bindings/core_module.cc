// shardkeep._core: the thin binding between the Python front and the C++
// engine. Arguments become C++ structs, the GIL is released around every
// call that touches storage, array bytes cross as uint8 views without
// copies, and a non-OK Status becomes a shardkeep.errors exception here and
// nowhere else.
//
// Waits are interruptible: a thread waiting for the engine wakes every
// kSignalCheckSeconds to let Python run its signal handlers, so Ctrl-C
// (KeyboardInterrupt) or a SIGTERM handler that raises gets through; the
// interrupted operation is cancelled (an interrupted save never commits
// afterwards) and the handler's exception propagates.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstring>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>

#include "shardkeep/cancellation.h"
#include "shardkeep/checkpoint.h"
#include "shardkeep/checkpoint_root.h"
#include "shardkeep/location.h"
#include "shardkeep/operation_ids.h"
#include "shardkeep/shard_feed.h"
#include "format/commit_record.h"
#include "engine/copy.h"
#include "engine/parallel.h"
#include "engine/save_queue.h"
#include "background_copy.h"
#include "host_staging.h"
#include "meta_objects.h"
#include "raise.h"
#include "record_objects.h"
#include "shard_objects.h"
#include "tree_keys.h"
#include "storage/process_faults.h"
#include "storage/read_counter.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep {
namespace {

using InputBytes = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OutputBytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

const char* ErrorClassName(StatusCode code) {
  switch (code) {
    case StatusCode::kNotFound: return "NotFoundError";
    case StatusCode::kCorruption: return "CorruptionError";
    case StatusCode::kIncompatible: return "IncompatibleError";
    case StatusCode::kTimeout: return "TimeoutError";
    case StatusCode::kStorage: return "StorageError";
    case StatusCode::kAlreadyExists: return "AlreadyExistsError";
    case StatusCode::kInvalidArgument: return "InvalidArgumentError";
    case StatusCode::kOutOfSpace: return "OutOfSpaceError";
    case StatusCode::kCommitStateUnknown: return "CommitStateUnknownError";
    case StatusCode::kLeaseLost: return "LeaseLostError";
    default: return "ShardkeepError";
  }
}

// How long a wait may go without letting Python run its signal handlers:
// Ctrl-C must take effect within half a second.
constexpr double kSignalCheckSeconds = 0.1;

// A KeyboardInterrupt (or another exception that is not an Exception, like
// SystemExit) raised by a Python callback called from C++ on this thread.
// The engine sees a Cancelled status; Raise() re-raises the original, so the
// caller gets the interrupt rather than an error about the callback.
thread_local PyObject* pending_interrupt = nullptr;

// REQUIRES: the GIL.
[[noreturn]] void RaisePendingInterrupt() {
  PyObject* interrupt = pending_interrupt;
  pending_interrupt = nullptr;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(interrupt)), interrupt);
  Py_DECREF(interrupt);
  throw nb::python_error();
}

// Forgets an interrupt that no Status carried out (REQUIRES: the GIL).
void ClearPendingInterrupt() {
  Py_XDECREF(pending_interrupt);
  pending_interrupt = nullptr;
}

using binding::LeafBox;
using binding::PyShard;
using binding::Raise;
using binding::ValueOrRaise;

void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

// Errors of calls on a checkpoint name the URL the caller gave: the engine
// sees only the path inside the storage ("run/7" of "s3://bucket/run/7"),
// which would leave the bucket out.
Status NamingUrl(const Status& status, const std::string& url) {
  if (status.ok() || status.message().find(url) != std::string::npos) return status;
  return status.WithContext(url);
}

void ThrowIfError(const Status& status, const std::string& url) {
  ThrowIfError(NamingUrl(status, url));
}

template <typename T>
T ValueOrRaise(Result<T> result, const std::string& url) {
  if (!result.ok()) Raise(NamingUrl(result.status(), url));
  return std::move(result).value();
}

// Runs `work` with the GIL released (it must not touch Python objects) and
// returns its result; raising happens after, with the GIL held again.
template <typename Work>
auto WithoutGil(Work&& work) {
  nb::gil_scoped_release release;
  return work();
}

DType DTypeOrRaise(const std::string& name) { return ValueOrRaise(DTypeFromName(name)); }

// Checks that a byte buffer holds exactly the box in `dtype`; a box whose
// size overflows 64 bits (it would wrap to a small number) fits no buffer.
void CheckBufferSize(size_t bytes, const Box& box, DType dtype, const char* what) {
  const std::optional<uint64_t> size = CheckedByteSize(box.shape, DTypeSize(dtype));
  if (!size) {
    Raise(InvalidArgumentError(std::string(what) + " of box " + box.ToString() +
                               ": its size in bytes overflows 64 bits"));
  }
  const uint64_t expected = *size;
  if (bytes != expected) {
    Raise(InvalidArgumentError(std::string(what) + " of box " + box.ToString() +
                               " holds " + std::to_string(bytes) +
                               " bytes, expected " + std::to_string(expected)));
  }
}

Box MakeBox(std::vector<uint64_t> origin, std::vector<uint64_t> shape) {
  if (origin.size() != shape.size()) {
    Raise(InvalidArgumentError("box origin and shape differ in rank"));
  }
  return Box{std::move(origin), std::move(shape)};
}

// The TypeError of a field of the argument classes Python builds (Shard,
// SavePart, ReadRequest): "<rule>, got <the value's type>". It names the
// field, where nanobind's own error would list the whole signature.
[[noreturn]] void RaiseFieldTypeError(const std::string& rule, nb::handle value) {
  throw nb::type_error((rule + ", got " + nb::type_name(value.type()).c_str()).c_str());
}

// A field converted to T, or the field's TypeError.
template <typename T>
T FieldOrTypeError(nb::handle value, const char* field, const char* expected) {
  T out;
  if (!nb::try_cast<T>(value, out)) {
    RaiseFieldTypeError(std::string(field) + " must be " + expected, value);
  }
  return out;
}

// _core.ReadRequest: a box to read, cast to `dtype`, into `buffer` (a flat
// uint8 array; None for locate and ranges, which read nothing).
struct PyReadRequest : LeafBox {
  nb::object buffer;
};

// _core.SavePart: one checkpointable of a save. json and bytes parts carry
// `value`; pytree parts their shards.
struct PySavePart {
  std::string name;
  std::string kind;
  std::string meta_json;
  nb::bytes value{"", 0};  // nb::bytes() would be null
  nb::list shards;
  nb::object feed = nb::none();  // a ShardFeed instead of shards, or None
};

nb::object ShardDataOrTypeError(nb::handle data) {
  InputBytes bytes;
  // No conversion: the save reads the array itself, not a converted copy.
  if (!PyCallable_Check(data.ptr()) && !nb::isinstance<StoredIn>(data) &&
      !nb::try_cast<InputBytes>(data, bytes, false)) {
    RaiseFieldTypeError(
        "Shard.data must be a 1-d uint8 array, a callable fill(origin, shape) or a StoredIn",
        data);
  }
  return nb::borrow(data);
}

nb::object ReadBufferOrTypeError(nb::handle buffer) {
  OutputBytes bytes;
  // No conversion: the read must fill the array itself, not a converted copy.
  if (!buffer.is_none() && !nb::try_cast<OutputBytes>(buffer, bytes, false)) {
    RaiseFieldTypeError("ReadRequest.buffer must be a writable 1-d uint8 array or None",
                        buffer);
  }
  return nb::borrow(buffer);
}

nb::list ShardsOrTypeError(nb::handle shards) {
  if (!nb::isinstance<nb::list>(shards)) {
    RaiseFieldTypeError("SavePart.shards must be a list of Shard", shards);
  }
  nb::list list = nb::borrow<nb::list>(shards);
  for (size_t i = 0; i < list.size(); ++i) {
    if (!nb::isinstance<PyShard>(list[i])) {
      RaiseFieldTypeError("SavePart.shards[" + std::to_string(i) + "] must be a Shard", list[i]);
    }
  }
  return list;
}

// The overrides an s3:// path is resolved with: the S3 client's requests
// (their retries included) are bounded by Options.timeout_s unless the
// overrides set their own limit.
S3Overrides S3SettingsOf(const Options& options) {
  S3Overrides s3 = options.s3;
  if (!s3.timeout_s) s3.timeout_s = options.timeout_s;
  return s3;
}

// The same for gs:// paths.
GcsOverrides GcsSettingsOf(const Options& options) {
  GcsOverrides gcs = options.gcs;
  if (!gcs.timeout_s) gcs.timeout_s = options.timeout_s;
  return gcs;
}

// Every path the front hands over is resolved here, with the call's
// options (their s3 settings); a test process that armed storage faults
// gets them wrapped in (see storage/process_faults.h).
StorageLocation Locate(const std::string& url, const Options& options) {
  // Without the GIL: resolving a store the first time may talk to the
  // network (the metadata server of a cloud VM), and other Python threads
  // must run meanwhile.
  StorageLocation location = ValueOrRaise(WithoutGil(
      [&] { return ResolveStorage(url, S3SettingsOf(options), GcsSettingsOf(options)); }));
  location.storage = WithProcessFaults(std::move(location.storage));
  return location;
}

// The code of a shardkeep.errors exception (the inverse of Raise), or
// nullopt for any other exception. REQUIRES: the GIL.
std::optional<StatusCode> ShardkeepErrorCode(nb::handle exception) {
  static constexpr StatusCode kCodes[] = {
      StatusCode::kNotFound,      StatusCode::kCorruption,  StatusCode::kIncompatible,
      StatusCode::kTimeout,       StatusCode::kOutOfSpace,  StatusCode::kStorage,
      StatusCode::kAlreadyExists, StatusCode::kInvalidArgument,
      StatusCode::kCommitStateUnknown, StatusCode::kLeaseLost};
  nb::module_ errors = nb::module_::import_("shardkeep.errors");
  for (StatusCode code : kCodes) {  // OutOfSpace before its base, Storage
    if (PyObject_IsInstance(exception.ptr(), errors.attr(ErrorClassName(code)).ptr()) == 1) {
      return code;
    }
  }
  return std::nullopt;
}

// A Python callable that may be called, and dropped, from C++ threads: the
// GIL is taken for both.
class PyFunction {
 public:
  // `what` names the function in errors ("the coordination service call").
  explicit PyFunction(nb::object fn, std::string what = "coordination service call")
      : fn_(std::move(fn)), what_(std::move(what)) {}
  ~PyFunction() {
    nb::gil_scoped_acquire acquire;
    fn_.reset();
  }
  // Calls the function; a Python exception becomes a Status (a timeout
  // stays a timeout, an existing key stays AlreadyExists, anything else
  // names the function as `what`).
  template <typename... Args>
  Result<nb::object> Call(const Args&... args) const {
    nb::gil_scoped_acquire acquire;
    try {
      return fn_(args...);
    } catch (nb::python_error& error) {
      // str() of the exception: what() would add the traceback.
      std::string message = nb::str(error.value()).c_str();
      if (!error.matches(PyExc_Exception)) {
        Py_XDECREF(pending_interrupt);
        pending_interrupt = error.value().inc_ref().ptr();
        return CancelledError("interrupted (" + message + ")");
      }
      if (error.matches(PyExc_TimeoutError)) return TimeoutError(message);
      if (error.matches(PyExc_FileExistsError)) return AlreadyExistsError(message);
      if (std::optional<StatusCode> code = ShardkeepErrorCode(error.value())) {
        return Status(*code, what_ + " failed: " + message);  // keeps its kind
      }
      return InternalError(what_ + " failed: " + message);
    } catch (const std::exception& error) {
      // E.g. a result of the wrong type: the caller's thread must not die.
      return InternalError(what_ + " failed: " + error.what());
    }
  }

 private:
  nb::object fn_;
  const std::string what_;
};

struct PyCoordinator {
  std::shared_ptr<Coordinator> coordinator;
};

// Wraps six Python functions (see shardkeep/job/distributed.py) as a C++
// Coordinator: barrier(key, timeout_s), set(key, value), get(key,
// timeout_s) -> str, try_get(key) -> str | None, list(prefix) -> list[str]
// (the keys set under prefix) and delete(key) (best effort).
PyCoordinator* MakeCallbackCoordinator(int process_index, int process_count,
                                       nb::object barrier, nb::object set,
                                       nb::object get, nb::object try_get,
                                       nb::object list, nb::object remove) {
  auto barrier_fn = std::make_shared<PyFunction>(std::move(barrier));
  auto set_fn = std::make_shared<PyFunction>(std::move(set));
  auto get_fn = std::make_shared<PyFunction>(std::move(get));
  auto try_get_fn = std::make_shared<PyFunction>(std::move(try_get));
  auto list_fn = std::make_shared<PyFunction>(std::move(list));
  auto remove_fn = std::make_shared<PyFunction>(std::move(remove));
  CoordinatorFunctions functions;
  functions.barrier = [barrier_fn](const std::string& key, double timeout_s) {
    return barrier_fn->Call(key, timeout_s).status();
  };
  functions.set = [set_fn](const std::string& key, const std::string& value) {
    return set_fn->Call(key, value).status();
  };
  functions.get = [get_fn](const std::string& key,
                           double timeout_s) -> Result<std::string> {
    SK_ASSIGN_OR_RETURN(nb::object value, get_fn->Call(key, timeout_s));
    nb::gil_scoped_acquire acquire;
    nb::object owned = std::move(value);
    return nb::cast<std::string>(owned);
  };
  functions.try_get = [try_get_fn](const std::string& key)
      -> Result<std::optional<std::string>> {
    SK_ASSIGN_OR_RETURN(nb::object value, try_get_fn->Call(key));
    nb::gil_scoped_acquire acquire;
    nb::object owned = std::move(value);
    if (owned.is_none()) return std::optional<std::string>();
    return std::optional<std::string>(nb::cast<std::string>(owned));
  };
  functions.list = [list_fn](const std::string& prefix)
      -> Result<std::vector<std::string>> {
    SK_ASSIGN_OR_RETURN(nb::object keys, list_fn->Call(prefix));
    nb::gil_scoped_acquire acquire;
    nb::object owned = std::move(keys);
    try {
      return nb::cast<std::vector<std::string>>(owned);
    } catch (const std::exception&) {
      return InternalError("the coordination service's list of keys under '" + prefix +
                           "' is not a list of strings");
    }
  };
  functions.remove = [remove_fn](const std::string& key) {
    return remove_fn->Call(key).status();
  };
  return new PyCoordinator{
      NewCallbackCoordinator(process_index, process_count, std::move(functions))};
}

// The agreement of operation ids of one job (shardkeep/operation_ids.h).
struct PyOperationIds {
  std::unique_ptr<OperationIds> ids;

  // Waits with the GIL released; the coordinator's Python functions take it
  // for each call. An interrupt raised in one of them comes out as itself,
  // also when the agreement got through (a best-effort delete was cut short).
  std::string Agree(const std::string& kind, const std::string& subject, double timeout_s) {
    Result<std::string> id = WithoutGil([&] { return ids->Agree(kind, subject, timeout_s); });
    if (id.ok() && pending_interrupt) RaisePendingInterrupt();
    return ValueOrRaise(std::move(id));
  }
};

// The thread Python runs signal handlers on (the interpreter's main
// thread), set when the module is imported.
unsigned long python_main_thread = 0;

// Waits until `ready` returns true, at most `timeout_s` seconds (negative:
// no limit), with the GIL released except every kSignalCheckSeconds, when
// Python runs its signal handlers. Returns false on timeout; throws
// nb::python_error when a handler raised (the GIL is held on return).
// This is the one wait of the binding that wakes periodically; on other
// threads, where no handler runs, it wakes only when `ready` does.
template <typename Ready>
bool WaitLettingSignalsIn(double timeout_s, Ready&& ready) {
  const auto start = std::chrono::steady_clock::now();
  const bool signals_here = PyThread_get_thread_ident() == python_main_thread;
  while (true) {
    // Off the main thread: an hour per wake-up (a bound that chrono's
    // conversions take without overflowing), not an unbounded wait.
    double slice = signals_here ? kSignalCheckSeconds : 3600.0;
    if (timeout_s >= 0) {
      const double left =
          timeout_s - std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
                          .count();
      if (left <= 0) return WithoutGil([&] { return ready(0.0); });
      slice = std::min(slice, left);
    }
    if (WithoutGil([&] { return ready(slice); })) return true;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

// Adds a note to the exception being propagated (shown under its message).
void AddNote(nb::python_error& error, const std::string& note) {
  nb::object add_note = nb::getattr(error.value(), "add_note", nb::none());
  if (!add_note.is_none()) add_note(note);
}

// A save StartSavePy has started, before the save queue takes it over (a
// start function passed to SaveQueue.enqueue returns it). Holds the Python
// arrays the save borrows; the queue keeps them until the save has ended.
struct PyStartedSave {
  nb::object borrowed;
  std::unique_ptr<SaveHandle> handle;  // null once the queue took it

  // One never handed to the queue: joined without the GIL (its thread may
  // call the coordinator's Python functions).
  ~PyStartedSave() {
    nb::gil_scoped_release release;
    handle.reset();
  }
};

// A shard given as a callable fill(origin, shape) -> uint8 array of the
// chunk's bytes: a source the writer threads call chunk by chunk
// (ShardData::fill), so that conversions never hold the whole state.
ShardData SourceShard(const PyShard& shard, const std::string& part) {
  auto source = std::make_shared<PyFunction>(
      shard.data, "the source of a shard of leaf #" + std::to_string(shard.leaf) +
                      " of '" + part + "'");
  const DType dtype = shard.dtype;
  ShardData data{shard.leaf, dtype, shard.ToBox(), nullptr};
  data.fill = [source, dtype](const Box& chunk, uint8_t* dst) -> Status {
    nb::gil_scoped_acquire acquire;  // held until `produced` is dropped
    SK_ASSIGN_OR_RETURN(nb::object produced, source->Call(chunk.origin, chunk.shape));
    InputBytes bytes;
    if (!nb::try_cast<InputBytes>(produced, bytes)) {
      return InvalidArgumentError("a shard source returned a " +
                                  nb::cast<std::string>(nb::str(produced.type().attr("__name__"))) +
                                  ", not a 1-d uint8 array");
    }
    const uint64_t expected = chunk.NumElements() * DTypeSize(dtype);
    if (bytes.size() != expected) {
      return InvalidArgumentError("a shard source returned " + std::to_string(bytes.size()) +
                                  " bytes for chunk " + chunk.ToString() + ", not " +
                                  std::to_string(expected));
    }
    std::memcpy(dst, bytes.data(), expected);
    return Status::Ok();
  };
  return data;
}

// The StoredIn places a save's shards name, with each checkpoint turned
// into a path of the save's storage once per save (resolving a URL builds a
// storage client; a state has thousands of shards).
class PlacesOfSave {
 public:
  PlacesOfSave(std::string url, const Options& options)
      : url_(std::move(url)), storage_(StoreOf(url_)), options_(options) {}

  // `place` (a StoredIn) in the save's storage; InvalidArgument when it is
  // in another storage.
  StoredIn In(nb::handle place) {
    StoredIn stored = nb::cast<StoredIn>(place);
    auto found = paths_.find(stored.checkpoint);
    if (found == paths_.end()) {
      if (StoreOf(stored.checkpoint) != storage_) {
        Raise(InvalidArgumentError("the save to " + url_ + " cannot reuse the arrays of " +
                                   stored.checkpoint + ": it is in another storage"));
      }
      found = paths_.emplace(stored.checkpoint, Locate(stored.checkpoint, options_).path).first;
    }
    stored.checkpoint = found->second;
    return stored;
  }

 private:
  // What a save and the checkpoint its StoredIn names must share, as
  // linking and reading go through the save's storage.
  static std::string StoreOf(const std::string& url) {
    return ValueOrRaise(ParseLocation(url)).storage;
  }

  const std::string url_;
  const std::string storage_;
  const Options& options_;
  std::map<std::string, std::string> paths_;  // checkpoint as named -> its path
};

// A shard whose bytes are stored in an earlier checkpoint of the save's
// storage (ShardData::stored_in).
ShardData StoredShard(const PyShard& shard, PlacesOfSave& places) {
  ShardData data{shard.leaf, shard.dtype, shard.ToBox(), nullptr};
  data.stored_in = places.In(shard.data);
  return data;
}

// A shard of host bytes or of a source (not a StoredIn) of checkpointable
// `part`; the bytes' array goes to `borrowed`, kept until the save ends.
ShardData HostShard(const PyShard& shard, const std::string& part, nb::list& borrowed) {
  if (PyCallable_Check(shard.data.ptr())) return SourceShard(shard, part);
  InputBytes bytes = nb::cast<InputBytes>(shard.data, /*convert=*/false);
  Box box = shard.ToBox();
  CheckBufferSize(bytes.size(), box, shard.dtype, "shard data");
  borrowed.append(shard.data);
  return ShardData{shard.leaf, shard.dtype, std::move(box), bytes.data()};
}

// _core.ShardFeed: the shards of a pytree part, handed to its save while
// the save runs (SavePart(feed=...), shardkeep/shard_feed.h). The save
// borrows this object, and with it the arrays of every shard added, until
// it ends.
struct PyShardFeed {
  std::string part;  // the checkpointable's name, for the sources' errors
  std::shared_ptr<ShardFeed> feed = std::make_shared<ShardFeed>();
  nb::list borrowed;

  void Add(nb::handle shards) {
    std::vector<ShardData> added;
    for (nb::handle item : ShardsOrTypeError(shards)) {
      const PyShard& shard = nb::cast<const PyShard&>(item);
      if (nb::isinstance<StoredIn>(shard.data) || !shard.compare_with.is_none()) {
        Raise(InvalidArgumentError("a shard fed to the save of '" + part +
                                   "' names an earlier checkpoint: such shards go in "
                                   "SavePart.shards"));
      }
      added.push_back(HostShard(shard, part, borrowed));
    }
    const Status status = feed->Add(std::move(added));
    if (!status.ok()) Raise(status);
  }
};

CheckpointablePayload ParsePart(const PySavePart& part, PlacesOfSave& places,
                                nb::list& borrowed) {
  CheckpointablePayload payload;
  payload.name = part.name;
  payload.kind = part.kind;
  payload.meta_json = part.meta_json;
  payload.value.assign(part.value.c_str(), part.value.size());
  if (!part.feed.is_none()) {
    payload.feed = nb::cast<PyShardFeed&>(part.feed).feed;
    borrowed.append(part.feed);
  }
  // Checked again: the list may have been appended to since it was set.
  for (nb::handle item : ShardsOrTypeError(part.shards)) {
    const PyShard& shard = nb::cast<const PyShard&>(item);
    if (nb::isinstance<StoredIn>(shard.data)) {
      payload.shards.push_back(StoredShard(shard, places));
      continue;
    }
    ShardData& data = payload.shards.emplace_back(HostShard(shard, payload.name, borrowed));
    if (!shard.compare_with.is_none()) {
      data.compare_with = places.In(shard.compare_with);
    }
  }
  return payload;
}

PyStartedSave* StartSavePy(const std::string& url,
                           const std::vector<const PySavePart*>& parts,
                           std::optional<int64_t> step,
                           const std::string& custom_metadata_json,
                           const std::string& metrics_json, bool force,
                           const Options& options, const PyCoordinator* coordinator,
                           const std::string& operation_id) {
  StorageLocation location = Locate(url, options);
  SaveRequest request;
  request.path = location.path;
  request.step = step;
  request.force = force;
  request.operation_id = operation_id;
  request.custom_metadata_json = custom_metadata_json;
  request.metrics_json = metrics_json;
  nb::list borrowed;
  PlacesOfSave places(url, options);
  for (const PySavePart* part : parts) {
    if (!part) Raise(InvalidArgumentError("a part is None, not a SavePart"));
    request.parts.push_back(ParsePart(*part, places, borrowed));
  }
  std::shared_ptr<Coordinator> group =
      coordinator ? coordinator->coordinator : NewSingleProcessCoordinator();
  Result<std::unique_ptr<SaveHandle>> started = WithoutGil([&] {
    return StartSave(location.storage, group, std::move(request), options);
  });
  return new PyStartedSave{std::move(borrowed), ValueOrRaise(std::move(started), url)};
}

// Runs `work` (which returns a Status) on a thread of the core's pool, in a
// CancellationScope, while this thread waits letting signals in. When a
// signal handler raises, the work is cancelled, and its exception
// propagates once the work has stopped (it may be writing into buffers the
// caller owns, so it must not outlive the call). The outcome lives in state
// shared with the pool's job, which may still be unwinding when the wait
// returns.
template <typename Work>
Status RunInterruptibly(Work&& work) {
  struct Shared {
    CancellationToken token;
    std::mutex mu;
    std::condition_variable cv;
    std::optional<Status> outcome;
  };
  auto shared = std::make_shared<Shared>();
  auto run = [&work, shared] {
    Status status;
    {
      CancellationScope scope(shared->token);
      try {
        status = work();
      } catch (const std::bad_alloc&) {
        status = ResourceExhaustedError("out of memory while reading");
      } catch (const std::exception& e) {
        status = InternalError(std::string("reading threw an exception: ") + e.what());
      }
    }
    std::lock_guard<std::mutex> lock(shared->mu);
    shared->outcome = std::move(status);
    shared->cv.notify_all();
  };
  if (!internal::RunOnPool(run)) {
    WithoutGil([&] { run(); return 0; });  // no thread to spare: not interruptible
    return *shared->outcome;
  }
  auto finished = [&](double slice) {
    std::unique_lock<std::mutex> lock(shared->mu);
    return shared->cv.wait_for(lock, std::chrono::duration<double>(slice),
                               [&] { return shared->outcome.has_value(); });
  };
  try {
    WaitLettingSignalsIn(-1.0, finished);
  } catch (nb::python_error&) {
    shared->token.Cancel();
    WithoutGil([&] {
      std::unique_lock<std::mutex> lock(shared->mu);
      shared->cv.wait(lock, [&] { return shared->outcome.has_value(); });
      return 0;
    });
    throw;
  }
  std::lock_guard<std::mutex> lock(shared->mu);
  return *shared->outcome;
}

struct PyReader {
  std::unique_ptr<CheckpointReader> reader;
  std::string url;  // the checkpoint, as the caller named it

  static PyReader* Open(const std::string& url, const Options& options) {
    StorageLocation location = Locate(url, options);
    Result<std::unique_ptr<CheckpointReader>> opened = WithoutGil(
        [&] { return CheckpointReader::Open(location.storage, location.path); });
    return new PyReader{ValueOrRaise(std::move(opened), url), url};
  }

  static PyReader* OpenSafetensors(const std::string& url, const Options& options) {
    StorageLocation location = Locate(url, options);
    Result<std::unique_ptr<CheckpointReader>> opened = WithoutGil([&] {
      return CheckpointReader::OpenSafetensors(location.storage, location.path, options);
    });
    return new PyReader{ValueOrRaise(std::move(opened), url), url};
  }

  binding::CommitRecordObject Commit() {
    return ValueOrRaise(binding::DecodeCommitRecordObject(reader->commit_json(),
                                                          url + "/_SHARDKEEP"),
                        url);
  }

  // A pytree checkpointable's meta.json (InvalidArgument for another kind).
  PytreeInfo Pytree(const std::string& name) {
    return ValueOrRaise(WithoutGil([&] { return reader->Pytree(name); }), url);
  }

  // The kind registered in the Python front that `name` was saved as, or "".
  std::string RegisteredKind(const std::string& name) {
    std::string text =
        ValueOrRaise(WithoutGil([&] { return reader->MetaJson(name); }), url);
    return ValueOrRaise(binding::RegisteredKind(text, url + "/" + name + "/meta.json"), url);
  }

  nb::bytes ReadValue(const std::string& name) {
    std::string bytes =
        ValueOrRaise(WithoutGil([&] { return reader->ReadValue(name); }), url);
    return nb::bytes(bytes.data(), bytes.size());
  }

  void Read(const std::string& name, const std::vector<const PyReadRequest*>& requests,
            const Options& options) {
    std::vector<ReadRequest> parsed;
    // The destination arrays stay referenced by `requests` for the call.
    for (const PyReadRequest* request : requests) {
      if (!request) Raise(InvalidArgumentError("a request is None, not a ReadRequest"));
      if (request->buffer.is_none()) {
        Raise(InvalidArgumentError("a read request of leaf #" + std::to_string(request->leaf) +
                                   " has no buffer to read into"));
      }
      OutputBytes dst = nb::cast<OutputBytes>(request->buffer, /*convert=*/false);
      Box box = request->ToBox();
      CheckBufferSize(dst.size(), box, request->dtype, "read destination");
      parsed.push_back({request->leaf, request->dtype, std::move(box), dst.data()});
    }
    ThrowIfError(RunInterruptibly([&] { return reader->Read(name, parsed, options); }), url);
  }

  // Requests as for Read, their buffers unused (None): the boxes alone.
  static std::vector<ReadRequest> Boxes(const std::vector<const PyReadRequest*>& requests) {
    std::vector<ReadRequest> parsed;
    for (const PyReadRequest* request : requests) {
      if (!request) Raise(InvalidArgumentError("a request is None, not a ReadRequest"));
      parsed.push_back({request->leaf, request->dtype, request->ToBox(), nullptr});
    }
    return parsed;
  }

  // For each request, the one raw chunk holding it (with its checksum),
  // or None.
  std::vector<std::optional<StoredRange>> LocateRanges(
      const std::string& name, const std::vector<const PyReadRequest*>& requests,
      const Options& options) {
    std::vector<ReadRequest> parsed = Boxes(requests);
    return ValueOrRaise(WithoutGil([&] { return reader->Locate(name, parsed, options); }), url);
  }

  // For each request, the ranges a read of it fetches
  // (CheckpointReader::Ranges; no checksums).
  std::vector<std::vector<StoredRange>> StoredRanges(
      const std::string& name, const std::vector<const PyReadRequest*>& requests,
      const Options& options) {
    std::vector<ReadRequest> parsed = Boxes(requests);
    return ValueOrRaise(WithoutGil([&] { return reader->Ranges(name, parsed, options); }), url);
  }
};

std::vector<RootEntry> ListCheckpointsPy(const std::string& url, const Options& options) {
  StorageLocation location = Locate(url, options);
  return ValueOrRaise(
      WithoutGil([&] { return ListCheckpoints(*location.storage, location.path); }), url);
}

// The manager's and the local tier's collection: leases keep every save in
// flight out of it (this job's or another's), so no minimum age.
std::vector<CollectedEntry> CollectLeftoversPy(const std::string& url,
                                               const std::vector<RootEntry>& entries,
                                               const Options& options) {
  StorageLocation location = Locate(url, options);
  return WithoutGil([&] {
    return CollectLeftovers(*location.storage, location.path, entries, CollectOptions());
  });
}

// A checkpoint's own storage call, by URL, without the GIL.
template <typename Call>
auto OnCheckpoint(const std::string& url, const Options& options, Call call) {
  StorageLocation location = Locate(url, options);
  return WithoutGil([&] { return call(*location.storage, location.path); });
}

// (op, path_regex, nth, times, action, max_delay_us) tuples; action is
// "fail", "kill" or "kill_during".
using FaultRuleTuple =
    std::tuple<std::string, std::string, int64_t, int64_t, std::string, int64_t>;

void ArmStorageFaultsPy(const std::vector<FaultRuleTuple>& tuples) {
  std::vector<FaultRule> rules;
  for (const auto& [op, path_regex, nth, times, action, max_delay_us] : tuples) {
    FaultRule rule{op, path_regex, nth, times, FaultRule::Action::kFail, max_delay_us};
    if (action == "kill") {
      rule.action = FaultRule::Action::kKill;
    } else if (action == "kill_during") {
      rule.action = FaultRule::Action::kKillDuring;
    } else if (action != "fail") {
      Raise(InvalidArgumentError("fault action must be fail, kill or kill_during, got " +
                                 action));
    }
    rules.push_back(std::move(rule));
  }
  ThrowIfError(ArmProcessFaults(std::move(rules)));
}

// A read/write attribute of an argument class: `set` checks the value
// (a TypeError naming the field otherwise); `type` is its Python type, for
// the stubs (the setter takes any object, which they would show).
template <typename Class, typename Get, typename Set>
void Attribute(nb::class_<Class>& cls, const char* name, const char* type, Get get, Set set) {
  static std::deque<std::string> signatures;  // nb::sig keeps the pointer
  const std::string& getter =
      signatures.emplace_back(std::string("def ") + name + "(self, /) -> " + type);
  const std::string& setter = signatures.emplace_back(
      std::string("def ") + name + "(self, value: " + type + ", /) -> None");
  // None reaches `set` too, which names the field when it is not allowed.
  cls.def_prop_rw(name, get, set, nb::for_getter(nb::sig(getter.c_str())),
                  nb::for_setter(nb::sig(setter.c_str())),
                  nb::for_setter(nb::arg("value").none()));
}

// The checked setters of the fields of a shard or read request (`what`
// names its class in errors), for its constructor and its attributes alike.
void SetLeaf(LeafBox& box, const std::string& what, nb::handle value) {
  box.leaf = FieldOrTypeError<uint32_t>(value, (what + ".leaf").c_str(), "an int >= 0");
}
void SetDType(LeafBox& box, const std::string& what, nb::handle value) {
  box.dtype =
      DTypeOrRaise(FieldOrTypeError<std::string>(value, (what + ".dtype").c_str(), "a str"));
}
void SetOrigin(LeafBox& box, const std::string& what, nb::handle value) {
  box.origin = FieldOrTypeError<std::vector<uint64_t>>(value, (what + ".origin").c_str(),
                                                       "a sequence of ints >= 0");
}
void SetShape(LeafBox& box, const std::string& what, nb::handle value) {
  box.shape = FieldOrTypeError<std::vector<uint64_t>>(value, (what + ".shape").c_str(),
                                                      "a sequence of ints >= 0");
}

void SetLeafBox(LeafBox& box, const std::string& what, nb::handle leaf, nb::handle dtype,
                nb::handle origin, nb::handle shape) {
  SetLeaf(box, what, leaf);
  SetDType(box, what, dtype);
  SetOrigin(box, what, origin);
  SetShape(box, what, shape);
}

// The attributes the two classes of boxes share.
template <typename Class>
void LeafBoxAttributes(nb::class_<Class>& cls, const std::string& what) {
  static_assert(std::is_base_of_v<LeafBox, Class>);
  Attribute(cls, "leaf", "int", [](const Class& self) { return self.leaf; },
            [what](Class& self, nb::handle v) { SetLeaf(self, what, v); });
  Attribute(cls, "dtype", "str",
            [](const Class& self) { return std::string(DTypeName(self.dtype)); },
            [what](Class& self, nb::handle v) { SetDType(self, what, v); });
  Attribute(cls, "origin", "list[int]", [](const Class& self) { return self.origin; },
            [what](Class& self, nb::handle v) { SetOrigin(self, what, v); });
  Attribute(cls, "shape", "list[int]", [](const Class& self) { return self.shape; },
            [what](Class& self, nb::handle v) { SetShape(self, what, v); });
}

// The checked setters of SavePart's fields.
void SetPartName(PySavePart& part, nb::handle value) {
  part.name = FieldOrTypeError<std::string>(value, "SavePart.name", "a str");
}
void SetPartKind(PySavePart& part, nb::handle value) {
  part.kind = FieldOrTypeError<std::string>(value, "SavePart.kind", "a str");
}
void SetPartMetaJson(PySavePart& part, nb::handle value) {
  part.meta_json = FieldOrTypeError<std::string>(value, "SavePart.meta_json", "a str");
}
void SetPartValue(PySavePart& part, nb::handle value) {
  part.value = FieldOrTypeError<nb::bytes>(value, "SavePart.value", "bytes");
}
void SetPartShards(PySavePart& part, nb::handle value) {
  part.shards = ShardsOrTypeError(value);
}
void SetPartFeed(PySavePart& part, nb::handle value) {
  if (!value.is_none() && !nb::isinstance<PyShardFeed>(value)) {
    RaiseFieldTypeError("SavePart.feed must be a ShardFeed or None", value);
  }
  part.feed = nb::borrow(value);
}

std::string BoxRepr(const LeafBox& box) {
  return "leaf " + std::to_string(box.leaf) + ", " + std::string(DTypeName(box.dtype)) +
         ", box " + MakeBox(box.origin, box.shape).ToString();
}

// ---------------------------------------------------------------------------
// The save queue (engine/save_queue.h): the process's saves from the call
// to their end. Python keeps one SaveQueue (shardkeep.background_saves)
// and thin futures over its QueuedSaves (shardkeep.SaveFuture).

// A Python object that C++ threads may hold and drop: dropped with the GIL.
struct PyKept {
  nb::object object;
  explicit PyKept(nb::object object) : object(std::move(object)) {}
  ~PyKept() {
    nb::gil_scoped_acquire acquire;
    object.reset();
  }
};

// What the Python side of one queued save owns: its start and on_finished
// functions, the arrays it borrows, and the exception its start raised
// (re-raised as itself by every result()).
struct PySaveState {
  PyKept start;
  PyKept on_finished;
  PyKept borrowed{nb::none()};
  PyKept start_error{nb::none()};
  PySaveState(nb::object start, nb::object on_finished)
      : start(std::move(start)), on_finished(std::move(on_finished)) {}
};

// Calls the Python start (which returns _core.start_save's SaveHandle) on
// the queue's starter thread; its exception is kept and becomes a Status.
Result<std::unique_ptr<SaveHandle>> RunPythonStart(PySaveState& state) {
  nb::gil_scoped_acquire acquire;
  try {
    nb::object start = std::move(state.start.object);
    state.start.object = nb::none();
    nb::object started = start();
    start.reset();  // its captures (the staged parts) are not kept
    PyStartedSave* save = nb::cast<PyStartedSave*>(started);
    if (!save->handle) return InvalidArgumentError("a save start returned a used SaveHandle");
    state.borrowed.object = std::move(save->borrowed);
    return std::move(save->handle);
  } catch (nb::python_error& error) {
    state.start_error.object = nb::borrow(error.value());
    std::string message = nb::str(error.value()).c_str();
    return Status(ShardkeepErrorCode(error.value()).value_or(StatusCode::kInternal), message);
  } catch (const std::exception& error) {
    return InternalError(std::string("starting the save failed: ") + error.what());
  }
}

// At the save's end, on the queue's finisher thread: on_finished runs,
// then the borrowed arrays are let go (the save no longer reads them).
// Returns whether on_finished reported a failure itself.
bool RunPythonOnFinished(PySaveState& state, const internal::QueuedSave::End& end) {
  nb::gil_scoped_acquire acquire;
  nb::object on_finished = std::move(state.on_finished.object);
  state.on_finished.object = nb::none();
  bool reported = false;
  if (!on_finished.is_none()) {
    try {
      // (None, created_ns) once committed; otherwise (the error that
      // ended it, None).
      const bool ok = end.outcome.ok();
      nb::object returned = on_finished(ok ? nb::none() : nb::cast(end.outcome.message()),
                                        ok ? nb::cast(end.created_ns) : nb::none());
      reported = !ok && returned.ptr() == Py_True;
    } catch (nb::python_error& error) {
      error.discard_as_unraisable("shardkeep: a save's on_finished");
    }
  }
  state.borrowed.object = nb::none();
  return reported;
}

// One queued save, as Python sees it.
struct PyQueuedSave {
  std::shared_ptr<internal::QueuedSave> save;
  std::shared_ptr<PySaveState> state;

  bool Finished(double slice) { return save->Wait(slice).has_value(); }

  // Waits for the end at most `timeout` seconds (None: no limit), letting
  // signal handlers run: True once ended (raising its error), False on
  // timeout. An interrupted wait cancels the save.
  bool Result(std::optional<double> timeout) {
    save->StartAwaiting();
    bool ended;
    try {
      ended = WaitLettingSignalsIn(timeout ? *timeout : -1.0,
                                   [&](double slice) { return Finished(slice); });
    } catch (nb::python_error& interrupt) {
      save->StopAwaiting();
      save->MarkCollected();
      CancelOnInterrupt(interrupt);
      throw;
    }
    if (save->StopAwaiting()) ended = true;  // it ended as the wait timed out
    if (!ended) return false;
    save->MarkCollected();
    const Status outcome = *save->Wait(0);
    if (outcome.ok()) return true;
    if (state && !state->start_error.object.is_none()) RaiseStartError();
    Raise(NamingUrl(outcome, save->path()));
  }

  // Raises what the start raised: a new exception of its type and
  // arguments, carrying the start's traceback. Raising the kept one would
  // attach this call's frames to it, and through them (they refer to this
  // object) make a cycle the collector cannot see through, keeping the
  // frames' arrays alive.
  [[noreturn]] void RaiseStartError() {
    nb::handle kept = state->start_error.object;
    nb::object raised;
    try {
      raised = kept.type()(*kept.attr("args"));
      nb::setattr(raised, "__traceback__", kept.attr("__traceback__"));
      nb::setattr(raised, "__cause__", kept.attr("__cause__"));
    } catch (nb::python_error&) {
      raised = nb::borrow(kept);  // a type that cannot be rebuilt from its args
    }
    PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised.ptr())), raised.ptr());
    throw nb::python_error();
  }

  // A signal handler raised `interrupt` while this save was awaited: stop
  // the save from committing. If its commit was already under way, wait
  // for that to finish, so that nothing changes at the path once the
  // interrupt has propagated.
  void CancelOnInterrupt(nb::python_error& interrupt) {
    const std::string& url = save->path();
    Status cancelled = WithoutGil([&] { return save->Cancel(); });
    ClearPendingInterrupt();  // a second interrupt, during the cancel itself
    if (cancelled.ok()) return;
    if (cancelled.code() != StatusCode::kAlreadyExists) {
      AddNote(interrupt, "the save to " + url +
                             " may still commit: cancelling it failed: " +
                             cancelled.ToString());
      return;
    }
    try {
      WaitLettingSignalsIn(-1.0, [&](double slice) { return Finished(slice); });
    } catch (nb::python_error&) {
      AddNote(interrupt, "the save to " + url +
                             " was committing when interrupted again and may still commit");
      return;
    }
    AddNote(interrupt, save->Wait(0)->ok()
                           ? "the save to " + url + " had committed before the interrupt"
                           : "the save to " + url + " was not committed");
  }
};

// The process's queue. Never destroyed: at exit its threads are left, not
// joined (SaveQueue::Close).
struct PySaveQueue {
  internal::SaveQueue* queue;

  // log_failure(path, failure) is called (with the GIL) for a failure
  // nobody collected.
  static PySaveQueue* Make(nb::object log_failure, int background_nice) {
    auto log = std::make_shared<PyKept>(std::move(log_failure));
    internal::SaveQueue::Hooks hooks;
    hooks.background_nice = background_nice;
    hooks.log_failure = [log](const std::string& path, const std::string& failure) {
      nb::gil_scoped_acquire acquire;
      try {
        log->object(path, failure);
      } catch (nb::python_error& error) {
        error.discard_as_unraisable("shardkeep: logging a save's failure");
      }
    };
    return new PySaveQueue{new internal::SaveQueue(std::move(hooks))};
  }

  PyQueuedSave* Enqueue(const std::string& path, double timeout_s, nb::object start,
                        nb::object on_finished) {
    auto state = std::make_shared<PySaveState>(std::move(start), std::move(on_finished));
    std::shared_ptr<internal::QueuedSave> save = queue->Enqueue(
        path, timeout_s, [state] { return RunPythonStart(*state); },
        [state](const internal::QueuedSave::End& end) {
          return RunPythonOnFinished(*state, end);
        });
    return new PyQueuedSave{std::move(save), std::move(state)};
  }

  nb::list Running() {
    nb::list running;
    for (auto& save : queue->Running()) {
      running.append(nb::cast(new PyQueuedSave{save, nullptr}, nb::rv_policy::take_ownership));
    }
    return running;
  }

  // Waits, letting signals in, until no uninterrupted save runs, at most
  // `timeout_s`; True if none does.
  bool WaitForUninterrupted(double timeout_s) {
    return WaitLettingSignalsIn(
        timeout_s, [&](double slice) { return queue->WaitForUninterrupted(slice); });
  }

  std::vector<std::string> Close() {
    std::vector<std::string> left;
    for (auto& save : WithoutGil([&] { return queue->Close(); })) {
      left.push_back(save->path());
    }
    return left;
  }
};

void BindSaveQueue(nb::module_& m) {
  nb::class_<PyStartedSave>(m, "SaveHandle",
                            "A started save, until a SaveQueue start returns it.")
      .def("cancel",
           [](PyStartedSave& self) {
             if (!self.handle) return false;
             return WithoutGil([&] { return self.handle->Cancel(); }).ok();
           },
           "Cancels the save as an interrupted wait does; True if it will not commit.");

  nb::class_<PyQueuedSave>(m, "QueuedSave")
      .def("result", &PyQueuedSave::Result, "timeout"_a = nb::none(),
           "Waits for the save's end: True once ended (raising its error), False on"
           " timeout. Ctrl-C cancels the save.")
      .def("wait",
           [](PyQueuedSave& self, std::optional<double> timeout) {
             return WaitLettingSignalsIn(timeout ? *timeout : -1.0, [&](double slice) {
               return self.Finished(slice);
             });
           },
           "timeout"_a = nb::none(),
           "Waits for the save's end without collecting its outcome: True once ended,"
           " False on timeout. Ctrl-C propagates and leaves the save running.")
      .def("done", [](PyQueuedSave& self) { return self.save->Done(); })
      .def("cancel",
           [](PyQueuedSave& self) {
             self.save->MarkCollected();
             return WithoutGil([&] { return self.save->Cancel(); }).ok();
           },
           "Cancels the save as an interrupted wait does; True if it will not commit.")
      .def_prop_ro("path", [](PyQueuedSave& self) { return self.save->path(); })
      .def_prop_ro("timeout_s", [](PyQueuedSave& self) { return self.save->timeout_s(); })
      .def_prop_ro("interrupted", [](PyQueuedSave& self) { return self.save->interrupted(); },
                   "True once a wait for it was interrupted (or cancel() called).")
      .def_prop_ro("committed_created_ns",
                   [](PyQueuedSave& self) { return self.save->CommittedCreatedNs(); },
                   "The created_ns of the checkpoint it committed, once it has; None"
                   " before, or if it failed.");

  nb::class_<PySaveQueue>(m, "SaveQueue")
      .def(nb::new_(&PySaveQueue::Make), "log_failure"_a, "background_nice"_a = 0)
      .def("enqueue", &PySaveQueue::Enqueue, "path"_a, "timeout_s"_a, "start"_a,
           "on_finished"_a = nb::none(),
           "Queues a save: start() (returning start_save's SaveHandle) runs after the"
           " starts queued before it, on_finished(error, created_ns) at its end (error:"
           " None once committed, else the message of what ended it; created_ns: the"
           " commit record's, None if it failed). on_finished returns True when it has"
           " reported the failure itself: the queue then does not log it.")
      .def("running", &PySaveQueue::Running,
           "The saves that have not ended (interrupted ones winding down too).")
      .def("wait_for_uninterrupted", &PySaveQueue::WaitForUninterrupted, "timeout_s"_a,
           "Waits until no uninterrupted save runs, at most timeout_s; True if none does.")
      .def("close", &PySaveQueue::Close,
           "At exit: leaves the saves still running to the process's end; their paths.")
      .def_prop_ro("starter_thread_id",
                   [](PySaveQueue& self) { return self.queue->starter_thread_id(); },
                   "The kernel's id of the thread that starts saves (0 before the first).");
}

}  // namespace

namespace binding {

[[noreturn]] void Raise(const Status& status) {
  if (pending_interrupt) {
    if (status.code() == StatusCode::kCancelled) RaisePendingInterrupt();
    ClearPendingInterrupt();
  }
  nb::object type =
      nb::module_::import_("shardkeep.errors").attr(ErrorClassName(status.code()));
  PyErr_SetString(type.ptr(), status.message().c_str());
  throw nb::python_error();
}

Box LeafBox::ToBox() const { return MakeBox(origin, shape); }

}  // namespace binding
}  // namespace shardkeep

NB_MODULE(_core, m) {
  using namespace shardkeep;
  m.doc() = "shardkeep's C++ engine; use the shardkeep package, not this module.";
  python_main_thread = nb::cast<unsigned long>(
      nb::module_::import_("threading").attr("main_thread")().attr("ident"));

  // Settings for s3:// paths; unset fields (None) fall back to the
  // environment and the AWS files. No repr: it would show the secret.
  nb::class_<S3Overrides>(m, "S3Overrides")
      .def(nb::init<>())
      .def_rw("access_key_id", &S3Overrides::access_key_id)
      .def_rw("secret_access_key", &S3Overrides::secret_access_key)
      .def_rw("session_token", &S3Overrides::session_token)
      .def_rw("region", &S3Overrides::region)
      .def_rw("endpoint_url", &S3Overrides::endpoint_url)
      .def_rw("profile", &S3Overrides::profile);

  // Settings for gs:// paths; unset fields fall back to the environment.
  nb::class_<GcsOverrides>(m, "GcsOverrides")
      .def(nb::init<>())
      .def_rw("endpoint", &GcsOverrides::endpoint)
      .def_rw("credentials_file", &GcsOverrides::credentials_file)
      .def_rw("anonymous", &GcsOverrides::anonymous);

  nb::class_<Options>(m, "Options")
      .def(
          "__init__",
          [](Options* self, uint64_t chunk_bytes, bool compress, int zstd_level,
             int io_threads, uint64_t host_memory_limit, double timeout_s,
             bool allow_lossy_cast, uint64_t coalesce_gap_bytes,
             std::optional<S3Overrides> s3, std::optional<GcsOverrides> gcs) {
            new (self) Options();
            self->chunk_bytes = chunk_bytes;
            self->compress = compress;
            self->zstd_level = zstd_level;
            self->io_threads = io_threads;
            self->host_memory_limit = host_memory_limit;
            self->timeout_s = timeout_s;
            self->allow_lossy_cast = allow_lossy_cast;
            self->coalesce_gap_bytes = coalesce_gap_bytes;
            if (s3) self->s3 = *std::move(s3);
            if (gcs) self->gcs = *std::move(gcs);
          },
          // Every default is the struct's own, so that _core.Options() is the
          // core's defaults (test_documented_defaults.py compares them with
          // shardkeep.Options').
          nb::kw_only(), "chunk_bytes"_a = Options().chunk_bytes,
          "compress"_a = Options().compress, "zstd_level"_a = Options().zstd_level,
          "io_threads"_a = Options().io_threads,
          "host_memory_limit"_a = Options().host_memory_limit,
          "timeout_s"_a = Options().timeout_s,
          "allow_lossy_cast"_a = Options().allow_lossy_cast,
          "coalesce_gap_bytes"_a = Options().coalesce_gap_bytes,
          "s3"_a = nb::none(), "gcs"_a = nb::none())
      .def_rw("chunk_bytes", &Options::chunk_bytes)
      .def_rw("compress", &Options::compress)
      .def_rw("zstd_level", &Options::zstd_level)
      .def_rw("io_threads", &Options::io_threads)
      .def_rw("host_memory_limit", &Options::host_memory_limit)
      .def_rw("timeout_s", &Options::timeout_s)
      .def_rw("allow_lossy_cast", &Options::allow_lossy_cast)
      .def_rw("coalesce_gap_bytes", &Options::coalesce_gap_bytes)
      .def_rw("s3", &Options::s3)
      .def_rw("gcs", &Options::gcs);

  BindSaveQueue(m);
  binding::BindBackgroundCopy(m);

  // The arguments of start_save and Reader.read, built by the Python front.
  nb::class_<StoredIn>(m, "StoredIn",
                       "Where an unchanged array's bytes already are: leaf leaf_path of"
                       " checkpointable in the checkpoint at checkpoint (a path or URL in"
                       " the save's storage), committed by the save whose commit record"
                       " says created_ns. As a Shard's data, the save takes its chunks"
                       " from there; as its compare_with, where they hold the same bytes.")
      .def(nb::init<std::string, std::string, std::string, int64_t>(), "checkpoint"_a,
           "checkpointable"_a, "leaf_path"_a, "created_ns"_a)
      .def_ro("checkpoint", &StoredIn::checkpoint)
      .def_ro("checkpointable", &StoredIn::checkpointable)
      .def_ro("leaf_path", &StoredIn::leaf_path)
      .def_ro("created_ns", &StoredIn::created_ns)
      .def("__repr__", [](const StoredIn& self) {
        return "StoredIn(" + self.checkpoint + ", " + self.checkpointable + ", " +
               self.leaf_path + ")";
      });
  constexpr const char* kShardData =
      "numpy.typing.NDArray[numpy.uint8] | "
      "collections.abc.Callable[[list[int], list[int]], numpy.typing.NDArray[numpy.uint8]] | "
      "StoredIn";
  static const std::string shard_init =  // nb::sig keeps the pointer
      std::string("def __init__(self, leaf: int, dtype: str, origin: "
                  "collections.abc.Sequence[int], shape: collections.abc.Sequence[int], data: ") +
      kShardData + ") -> None";
  nb::class_<PyShard> shard(m, "Shard",
                            "A box of a leaf that this process saves, and its bytes: a flat"
                            " uint8 array, or fill(origin, shape) -> the bytes of a chunk,"
                            " called by the writer threads.");
  shard.def(
      "__init__",
      [](PyShard* self, nb::handle leaf, nb::handle dtype, nb::handle origin, nb::handle shape,
         nb::handle data) {
        PyShard checked;  // checked whole before the object exists
        SetLeafBox(checked, "Shard", leaf, dtype, origin, shape);
        checked.data = ShardDataOrTypeError(data);
        new (self) PyShard(std::move(checked));
      },
      "leaf"_a.none(), "dtype"_a.none(), "origin"_a.none(), "shape"_a.none(), "data"_a.none(),
      nb::sig(shard_init.c_str()));
  LeafBoxAttributes(shard, "Shard");
  Attribute(shard, "data", kShardData, [](const PyShard& self) { return self.data; },
            [](PyShard& self, nb::handle v) { self.data = ShardDataOrTypeError(v); });
  Attribute(
      shard, "compare_with", "StoredIn | None",
      [](const PyShard& self) { return self.compare_with; },
      [](PyShard& self, nb::handle v) {
        if (!v.is_none() && !nb::isinstance<StoredIn>(v)) {
          RaiseFieldTypeError("Shard.compare_with must be a StoredIn or None", v);
        }
        self.compare_with = nb::borrow(v);
      });
  shard.def("__repr__", [](const PyShard& self) { return "Shard(" + BoxRepr(self) + ")"; });
  binding::BindHostStaging(m);

  nb::class_<PyReadRequest> read_request(
      m, "ReadRequest",
      "A box of a leaf to read, cast to dtype, into buffer (a flat uint8 array; None where"
      " nothing is read: locate, ranges).");
  read_request.def(
      "__init__",
      [](PyReadRequest* self, nb::handle leaf, nb::handle dtype, nb::handle origin,
         nb::handle shape, nb::handle buffer) {
        PyReadRequest checked;
        SetLeafBox(checked, "ReadRequest", leaf, dtype, origin, shape);
        checked.buffer = ReadBufferOrTypeError(buffer);
        new (self) PyReadRequest(std::move(checked));
      },
      "leaf"_a.none(), "dtype"_a.none(), "origin"_a.none(), "shape"_a.none(),
      "buffer"_a.none() = nb::none(),
      nb::sig("def __init__(self, leaf: int, dtype: str, origin: collections.abc.Sequence[int],"
              " shape: collections.abc.Sequence[int],"
              " buffer: numpy.typing.NDArray[numpy.uint8] | None = None) -> None"));
  LeafBoxAttributes(read_request, "ReadRequest");
  Attribute(read_request, "buffer", "numpy.typing.NDArray[numpy.uint8] | None",
            [](const PyReadRequest& self) { return self.buffer; },
            [](PyReadRequest& self, nb::handle v) { self.buffer = ReadBufferOrTypeError(v); });
  read_request.def("__repr__", [](const PyReadRequest& self) {
    return "ReadRequest(" + BoxRepr(self) + ")";
  });

  nb::class_<PyShardFeed>(
      m, "ShardFeed",
      "The shards of a pytree part, handed to its save while the save runs"
      " (SavePart(feed=...)): the writers start on the first ones. The producer adds,"
      " then closes, or fails it; the save fails if no shard arrives for its timeout.")
      .def(nb::init<std::string>(), "part"_a,
           "A feed for checkpointable `part` (named in the errors of sources).")
      .def("add", &PyShardFeed::Add, "shards"_a.none(),
           nb::sig("def add(self, shards: list[Shard]) -> None"),
           "Adds shards of data or sources (not StoredIn). Once the save has ended without"
           " taking them, raises its error (a closed or failed feed: InvalidArgumentError).")
      .def("close", [](PyShardFeed& self) { self.feed->Close(); },
           "Every shard has been added.")
      .def("fail",
           [](PyShardFeed& self, const std::string& why) {
             self.feed->Fail(CancelledError(why));
           },
           "why"_a, "The producer failed: the save fails (Cancelled, with `why`), commits"
           " nothing.");

  nb::class_<PySavePart> save_part(
      m, "SavePart",
      "One checkpointable of a save: its name, kind and meta.json text; the value of a json"
      " or bytes part, the shards this process writes of a pytree part.");
  save_part.def(
      "__init__",
      [](PySavePart* self, nb::handle name, nb::handle kind, nb::handle meta_json,
         nb::handle value, nb::handle shards, nb::handle feed) {
        PySavePart checked;
        SetPartName(checked, name);
        SetPartKind(checked, kind);
        SetPartMetaJson(checked, meta_json);
        SetPartValue(checked, value);
        if (!shards.is_none()) SetPartShards(checked, shards);  // else a fresh list
        SetPartFeed(checked, feed);
        new (self) PySavePart(std::move(checked));
      },
      "name"_a.none(), "kind"_a.none(), "meta_json"_a.none(),
      "value"_a.none() = nb::bytes("", 0), "shards"_a.none() = nb::none(),
      "feed"_a.none() = nb::none(),
      nb::sig("def __init__(self, name: str, kind: str, meta_json: str, value: bytes = b'',"
              " shards: list[Shard] | None = None, feed: ShardFeed | None = None) -> None"));
  Attribute(save_part, "name", "str", [](const PySavePart& self) { return self.name; },
            SetPartName);
  Attribute(save_part, "kind", "str", [](const PySavePart& self) { return self.kind; },
            SetPartKind);
  Attribute(save_part, "meta_json", "str",
            [](const PySavePart& self) { return self.meta_json; }, SetPartMetaJson);
  Attribute(save_part, "value", "bytes", [](const PySavePart& self) { return self.value; },
            SetPartValue);
  Attribute(save_part, "shards", "list[Shard]",
            [](const PySavePart& self) { return self.shards; }, SetPartShards);
  Attribute(save_part, "feed", "ShardFeed | None",
            [](const PySavePart& self) { return self.feed; }, SetPartFeed);
  save_part.def("__repr__", [](const PySavePart& self) {
    return "SavePart(" + self.name + ", " + self.kind + ", " +
           (self.feed.is_none() ? std::to_string(self.shards.size()) + " shards" : "fed") +
           ")";
  });

  m.def("start_save", &StartSavePy, "path"_a, "parts"_a, nb::kw_only(),
        "step"_a = nb::none(), "custom_metadata_json"_a = "{}",
        "metrics_json"_a = "{}", "force"_a = false, "options"_a = Options(),
        "coordinator"_a = nb::none(), "operation_id"_a = "",
        "Runs a save's blocking phase and starts its background phase.");

  nb::class_<PyCoordinator>(m, "Coordinator")
      .def_prop_ro("process_index",
                   [](PyCoordinator& self) { return self.coordinator->process_index(); })
      .def_prop_ro("process_count",
                   [](PyCoordinator& self) { return self.coordinator->process_count(); });
  m.def(
      "checksum",
      [](InputBytes bytes) {
        // Reading the bytes may fault them in from a mapped file: no GIL.
        nb::gil_scoped_release release;
        return ChunkChecksum(bytes.data(), bytes.size());
      },
      "data"_a, "XXH3-64 of a uint8 array, as stored for each chunk.");
  m.def("callback_coordinator", &MakeCallbackCoordinator, "process_index"_a,
        "process_count"_a, "barrier"_a, "set"_a, "get"_a, "try_get"_a, "list"_a,
        "delete"_a, "A Coordinator whose operations are the given Python functions.");
  nb::class_<PyOperationIds>(m, "OperationIds",
                             "The agreed ids of a job's collective operations.")
      .def(
          "__init__",
          [](PyOperationIds* self, const PyCoordinator& coordinator) {
            new (self) PyOperationIds{std::make_unique<OperationIds>(coordinator.coordinator)};
          },
          "coordinator"_a)
      .def("agree", &PyOperationIds::Agree, "kind"_a, "subject"_a, "timeout_s"_a,
           "The agreed id of this process's next collective `kind` of `subject`"
           " (\"\" with one process); TimeoutError naming the processes that did not"
           " join within timeout_s.");

  nb::class_<StoredRange>(m, "StoredRange", "Bytes of a data file that a read fetches.")
      .def_ro("file", &StoredRange::file, "The data file's name in the checkpoint.")
      .def_ro("offset", &StoredRange::offset)
      .def_ro("length", &StoredRange::length)
      .def_ro("checksum", &StoredRange::checksum,
              "The XXH3-64 of the range's bytes as stored; None for safetensors files.")
      .def("__repr__", [](const StoredRange& r) {
        return "StoredRange(" + r.file + ", " + std::to_string(r.offset) + ", " +
               std::to_string(r.length) + ")";
      });

  nb::class_<PyReader>(m, "Reader")
      .def(nb::new_(&PyReader::Open), "path"_a, "options"_a = Options())
      .def_prop_ro("commit", &PyReader::Commit, "The checkpoint's _SHARDKEEP, decoded.")
      .def("pytree", &PyReader::Pytree, "name"_a,
           "A pytree checkpointable's meta.json, decoded and checked by the core.")
      .def("registered_kind", &PyReader::RegisteredKind, "name"_a,
           "The kind registered in the Python front a checkpointable was saved as, or \"\".")
      .def("read_value", &PyReader::ReadValue, "name"_a)
      .def("read", &PyReader::Read, "name"_a, "requests"_a, "options"_a = Options())
      .def("locate", &PyReader::LocateRanges, "name"_a, "requests"_a, "options"_a = Options(),
           "For each request (its buffer unused): the one raw chunk holding its bytes, with"
           " its checksum, or None.")
      .def("ranges", &PyReader::StoredRanges, "name"_a, "requests"_a, "options"_a = Options(),
           "For each request (its buffer unused): the ranges of data files its read fetches,"
           " in file order; needs no data file.");

  m.def("open_safetensors", &PyReader::OpenSafetensors, "url"_a, "options"_a = Options(),
        nb::rv_policy::take_ownership,
        "A Reader of safetensors files: one pytree checkpointable, \"tensors\".");
  m.def(
      "check_checkpointable_name",
      [](const std::string& name) { ThrowIfError(format::CheckCheckpointableName(name)); },
      "name"_a,
      "Raises InvalidArgumentError for a name no save accepts (the core's one rule).");
  nb::class_<Location>(m, "Location",
                       "Where a path or storage URL points: the core's one reading of them"
                       " (docs/DESIGN_NOTES.md, \"One Location\"). Raises"
                       " InvalidArgumentError for a URL no backend reads.")
      .def("__init__",
           [](Location* self, const std::string& url) {
             new (self) Location(ValueOrRaise(ParseLocation(url)));
           },
           "url"_a)
      .def_ro("url", &Location::url, "The URL as given.")
      .def_ro("scheme", &Location::scheme, "\"file\" for plain paths, else the URL's scheme.")
      .def_ro("storage", &Location::storage,
              "Equal for two locations of one store (\"file\", \"s3://<bucket>\", ...).")
      .def_ro("key", &Location::key, "The canonical spelling: equal keys are one checkpoint.")
      .def_ro("path", &Location::path, "The path inside the store, as its backend gets it.")
      .def_ro("local_path", &Location::local_path,
              "The absolute, normalised path on this machine's file system, or None.")
      .def_ro("object_store", &Location::object_store,
              "Keys only, no rename (s3, gs, memory-objects).")
      .def("__repr__", [](const Location& l) { return "Location(" + l.key + ")"; });
  m.def(
      "check_cast",
      [](const std::string& from, const std::string& to, bool allow_lossy,
         const std::string& where) {
        ThrowIfError(internal::CheckCast(DTypeOrRaise(from), DTypeOrRaise(to), allow_lossy)
                         .WithContext(where));
      },
      "from_dtype"_a, "to_dtype"_a, "allow_lossy"_a, "where"_a,
      "Raises IncompatibleError, prefixed with `where`, unless a load may cast"
      " from_dtype to to_dtype: the reader's own rule, for sources read in Python.");
  m.def(
      "cast",
      [](InputBytes src, const std::string& from, OutputBytes dst, const std::string& to) {
        const DType from_dtype = DTypeOrRaise(from), to_dtype = DTypeOrRaise(to);
        const uint64_t count = src.size() / DTypeSize(from_dtype);
        if (src.size() % DTypeSize(from_dtype) != 0 ||
            dst.size() != count * DTypeSize(to_dtype)) {
          Raise(InvalidArgumentError("cast of " + std::to_string(src.size()) + " bytes of " +
                                     from + " into " + std::to_string(dst.size()) +
                                     " bytes of " + to + ": the sizes do not match"));
        }
        ThrowIfError(internal::CheckCast(from_dtype, to_dtype, /*allow_lossy=*/true));
        WithoutGil([&] {
          internal::CastElements(src.data(), from_dtype, dst.data(), to_dtype, count);
          return 0;
        });
      },
      "src"_a, "from_dtype"_a, "dst"_a, "to_dtype"_a,
      "Converts the elements of src into dst (flat uint8 views) with the reader's casts"
      " (rounding to nearest even, wrapping integers); check_cast first.");
  binding::BindTreeKeys(m);
  binding::BindMetaObjects(m);
  m.def("storage_bytes_read", &StorageBytesRead,
        "Bytes this process has read through the file, S3 and GCS backends (every read and"
        " GET, whatever asked). Memory-mapped files (Options(map_files=True), the"
        " default for raw chunks on local files) are not read through storage and"
        " are not counted: measure with map_files=False.");
  // A root's layout (checkpoint_root.h): the front asks for these names
  // instead of spelling them.
  m.def("temporary_folder", &TemporaryFolderOf, "path"_a,
        "The folder a save to path writes before its commit on storage with rename.");
  m.def(
      "step_folder_name",
      [](int64_t step, int width) {
        if (step < 0 || width < 1) {
          Raise(InvalidArgumentError("step_folder_name(" + std::to_string(step) + ", " +
                                     std::to_string(width) +
                                     "): the step must be >= 0 and the width >= 1"));
        }
        return StepFolderName(step, width);
      },
      "step"_a, "width"_a, "Step's folder under a managed root: its digits, zero-padded to width.");
  m.def(
      "step_of_folder", [](const std::string& name) { return StepOfFolderName(name); }, "name"_a,
      "The step a folder name under a managed root names, or None for any other name.");
  m.def("slice_folder_name", &SliceFolderName, "process"_a,
        "The folder of process's slices under a local tier's root.");
  m.def(
      "slice_of_folder", [](const std::string& name) { return SliceOfFolderName(name); },
      "name"_a, "The process whose slices a folder under a local tier's root holds, or None.");
  binding::BindRecordObjects(m);
  m.def("list_checkpoints", &ListCheckpointsPy, "root"_a, "options"_a = Options(),
        "The entries directly under a root, sorted by name.");
  m.def("collect_leftovers", &CollectLeftoversPy, "root"_a, "entries"_a,
        "options"_a = Options(),
        "Removes the leftovers among `entries` (list_checkpoints of `root`), never an "
        "only copy or a checkpoint; reports what it removed and kept.");
  m.def(
      "read_commit_record",
      [](const std::string& path, const Options& options) {
        std::string text = ValueOrRaise(
            OnCheckpoint(path, options,
                         [](Storage& s, const std::string& p) { return ReadCommitRecord(s, p); }),
            path);
        return ValueOrRaise(
            binding::DecodeCommitRecordObject(std::move(text), path + "/_SHARDKEEP"), path);
      },
      "path"_a, "options"_a = Options(), "The checkpoint's _SHARDKEEP, checked by the core's decoder.");
  m.def(
      "delete_checkpoint",
      [](const std::string& path, const Options& options) {
        ThrowIfError(OnCheckpoint(path, options, [](Storage& s, const std::string& p) {
          return DeleteCheckpoint(s, p);
        }), path);
      },
      "path"_a, "options"_a = Options(),
      "Renames the checkpoint to <path>.shardkeep-deleting, then deletes it "
      "(storage without rename: its _SHARDKEEP first, then the rest).");
  m.def(
      "remove_leftover",
      [](const std::string& path, const Options& options) {
        ThrowIfError(OnCheckpoint(path, options, [](Storage& s, const std::string& p) {
          return RemoveLeftover(s, p);
        }), path);
      },
      "path"_a, "options"_a = Options(),
      "Deletes a .shardkeep-tmp, -old or -deleting folder, or the generation "
      "folders of a folder without _SHARDKEEP that holds nothing else.");

  nb::module_ testing = m.def_submodule(
      "testing", "Test-only: storage faults armed for the whole process.");
  testing.def("arm_storage_faults", &ArmStorageFaultsPy, "rules"_a,
              "Replaces the plan with (op, path_regex, nth, times, action, "
              "max_delay_us) rules; counts restart.");
  testing.def("disarm_storage_faults", &DisarmProcessFaults);
  testing.def("storage_call_counts", &ProcessFaultCounts,
              "Storage calls per operation since the plan was armed.");
}
