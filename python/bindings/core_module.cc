// shardkeep._core: the thin binding between the Python front and the C++
// engine. Arguments become C++ structs, the GIL is released around every
// call that touches storage, array bytes cross as uint8 views without
// copies, and a non-OK Status becomes a shardkeep.errors exception here and
// nowhere else.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "shardkeep/checkpoint.h"

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
    default: return "ShardkeepError";
  }
}

[[noreturn]] void Raise(const Status& status) {
  nb::object type =
      nb::module_::import_("shardkeep.errors").attr(ErrorClassName(status.code()));
  PyErr_SetString(type.ptr(), status.message().c_str());
  throw nb::python_error();
}

void ThrowIfError(const Status& status) {
  if (!status.ok()) Raise(status);
}

template <typename T>
T ValueOrRaise(Result<T> result) {
  if (!result.ok()) Raise(result.status());
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

// The (leaf, dtype, origin, shape, buffer) tuples of shards and read
// requests: the first four fields, checked; the caller takes the buffer.
struct LeafBox {
  uint32_t leaf;
  DType dtype;
  Box box;
};
LeafBox ParseLeafBox(nb::handle item, const char* what) {
  nb::tuple fields = nb::cast<nb::tuple>(item);
  if (fields.size() != 5) {
    Raise(InvalidArgumentError(std::string(what) +
                               " is a (leaf, dtype, origin, shape, buffer) tuple"));
  }
  return {nb::cast<uint32_t>(fields[0]), DTypeOrRaise(nb::cast<std::string>(fields[1])),
          MakeBox(nb::cast<std::vector<uint64_t>>(fields[2]),
                  nb::cast<std::vector<uint64_t>>(fields[3]))};
}

StorageLocation Locate(const std::string& url) { return ValueOrRaise(ResolveStorage(url)); }

nlohmann::json ParseJson(const std::string& text, const char* what) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) Raise(InvalidArgumentError(std::string(what) + " is not JSON"));
  return value;
}

// A Python callable that may be called, and dropped, from C++ threads: the
// GIL is taken for both.
class PyFunction {
 public:
  explicit PyFunction(nb::object fn) : fn_(std::move(fn)) {}
  ~PyFunction() {
    nb::gil_scoped_acquire acquire;
    fn_.reset();
  }
  // Calls the function; a Python exception becomes a Status (a timeout
  // stays a timeout, an existing key stays AlreadyExists, anything else
  // names the coordination service).
  template <typename... Args>
  Result<nb::object> Call(const Args&... args) const {
    nb::gil_scoped_acquire acquire;
    try {
      return fn_(args...);
    } catch (nb::python_error& error) {
      // str() of the exception: what() would add the traceback.
      std::string message = nb::str(error.value()).c_str();
      if (error.matches(PyExc_TimeoutError)) return TimeoutError(message);
      if (error.matches(PyExc_FileExistsError)) return AlreadyExistsError(message);
      return InternalError("coordination service call failed: " + message);
    }
  }

 private:
  nb::object fn_;
};

struct PyCoordinator {
  std::shared_ptr<Coordinator> coordinator;
};

// Wraps four Python functions (see shardkeep/distributed.py) as a C++
// Coordinator: barrier(key, timeout_s), set(key, value), get(key,
// timeout_s) -> str, try_get(key) -> str | None.
PyCoordinator* MakeCallbackCoordinator(int process_index, int process_count,
                                       nb::object barrier, nb::object set,
                                       nb::object get, nb::object try_get) {
  auto barrier_fn = std::make_shared<PyFunction>(std::move(barrier));
  auto set_fn = std::make_shared<PyFunction>(std::move(set));
  auto get_fn = std::make_shared<PyFunction>(std::move(get));
  auto try_get_fn = std::make_shared<PyFunction>(std::move(try_get));
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
  return new PyCoordinator{
      NewCallbackCoordinator(process_index, process_count, std::move(functions))};
}

// A save in flight. Holds the Python arrays it borrows until it has
// committed, so their memory outlives the background writes.
struct PySaveHandle {
  // Declared first so it is destroyed last, after the writer has finished.
  nb::object borrowed;
  std::unique_ptr<SaveHandle> handle;

  PySaveHandle(nb::object borrowed, std::unique_ptr<SaveHandle> handle)
      : borrowed(std::move(borrowed)), handle(std::move(handle)) {}
  // A dropped future still commits: wait for the background phase without
  // holding the GIL, then let go of the arrays.
  ~PySaveHandle() {
    nb::gil_scoped_release release;
    handle.reset();
  }

  bool Wait(std::optional<double> timeout) {
    std::optional<Status> outcome =
        WithoutGil([&] { return handle->future().Wait(timeout ? *timeout : -1.0); });
    if (!outcome) return false;
    borrowed = nb::none();
    ThrowIfError(*outcome);
    return true;
  }
};

CheckpointablePayload ParsePart(nb::dict part, nb::list& borrowed) {
  CheckpointablePayload payload;
  payload.name = nb::cast<std::string>(part["name"]);
  payload.kind = nb::cast<std::string>(part["kind"]);
  payload.meta_json = nb::cast<std::string>(part["meta_json"]);
  nb::bytes value = nb::cast<nb::bytes>(part["value"]);
  payload.value.assign(value.c_str(), value.size());
  for (nb::handle item : nb::cast<nb::list>(part["shards"])) {
    LeafBox shard = ParseLeafBox(item, "a shard");
    nb::object buffer = nb::cast<nb::tuple>(item)[4];
    InputBytes bytes = nb::cast<InputBytes>(buffer);
    CheckBufferSize(bytes.size(), shard.box, shard.dtype, "shard data");
    borrowed.append(buffer);
    payload.shards.push_back({shard.leaf, shard.dtype, std::move(shard.box), bytes.data()});
  }
  return payload;
}

PySaveHandle* StartSavePy(const std::string& url, nb::list parts,
                          std::optional<int64_t> step,
                          const std::string& custom_metadata_json,
                          const std::string& metrics_json, bool force,
                          const Options& options, const PyCoordinator* coordinator,
                          const std::string& operation_id) {
  StorageLocation location = Locate(url);
  SaveRequest request;
  request.path = location.path;
  request.step = step;
  request.force = force;
  request.operation_id = operation_id;
  request.custom_metadata = ParseJson(custom_metadata_json, "custom_metadata");
  request.metrics = ParseJson(metrics_json, "metrics");
  nb::list borrowed;
  for (nb::handle part : parts) {
    request.parts.push_back(ParsePart(nb::cast<nb::dict>(part), borrowed));
  }
  std::shared_ptr<Coordinator> group =
      coordinator ? coordinator->coordinator : NewSingleProcessCoordinator();
  Result<std::unique_ptr<SaveHandle>> started = WithoutGil([&] {
    return StartSave(location.storage, group, std::move(request), options);
  });
  return new PySaveHandle(std::move(borrowed), ValueOrRaise(std::move(started)));
}

struct PyReader {
  std::unique_ptr<CheckpointReader> reader;

  static PyReader* Open(const std::string& url) {
    StorageLocation location = Locate(url);
    return new PyReader{ValueOrRaise(WithoutGil(
        [&] { return CheckpointReader::Open(location.storage, location.path); }))};
  }

  std::string MetaJson(const std::string& name) {
    return ValueOrRaise(WithoutGil([&] { return reader->MetaJson(name); }));
  }

  nb::bytes ReadValue(const std::string& name) {
    std::string bytes = ValueOrRaise(WithoutGil([&] { return reader->ReadValue(name); }));
    return nb::bytes(bytes.data(), bytes.size());
  }

  void Read(const std::string& name, nb::list requests, const Options& options) {
    std::vector<ReadRequest> parsed;
    // The destination arrays stay referenced by `requests` for the call.
    for (nb::handle item : requests) {
      LeafBox request = ParseLeafBox(item, "a read request");
      OutputBytes dst = nb::cast<OutputBytes>(nb::cast<nb::tuple>(item)[4]);
      CheckBufferSize(dst.size(), request.box, request.dtype, "read destination");
      parsed.push_back({request.leaf, request.dtype, std::move(request.box), dst.data()});
    }
    ThrowIfError(WithoutGil([&] { return reader->Read(name, parsed, options); }));
  }

  // Requests as for Read (their buffers are not used); for each, None or
  // (file, offset, length, checksum) of the one raw chunk holding it.
  nb::list LocateRanges(const std::string& name, nb::list requests, const Options& options) {
    std::vector<ReadRequest> parsed;
    for (nb::handle item : requests) {
      LeafBox request = ParseLeafBox(item, "a locate request");
      parsed.push_back({request.leaf, request.dtype, std::move(request.box), nullptr});
    }
    std::vector<std::optional<StoredRange>> ranges = ValueOrRaise(
        WithoutGil([&] { return reader->Locate(name, parsed, options); }));
    nb::list out;
    for (const std::optional<StoredRange>& range : ranges) {
      if (!range) {
        out.append(nb::none());
      } else {
        out.append(nb::make_tuple(range->file, range->offset, range->length,
                                  range->checksum));
      }
    }
    return out;
  }
};

}  // namespace
}  // namespace shardkeep

NB_MODULE(_core, m) {
  using namespace shardkeep;
  m.doc() = "shardkeep's C++ engine; use the shardkeep package, not this module.";

  nb::class_<Options>(m, "Options")
      .def(
          "__init__",
          [](Options* self, uint64_t chunk_bytes, bool compress, int zstd_level,
             int io_threads, uint64_t host_memory_limit, double timeout_s,
             bool allow_lossy_cast, uint64_t coalesce_gap_bytes) {
            new (self) Options();
            self->chunk_bytes = chunk_bytes;
            self->compress = compress;
            self->zstd_level = zstd_level;
            self->io_threads = io_threads;
            self->host_memory_limit = host_memory_limit;
            self->timeout_s = timeout_s;
            self->allow_lossy_cast = allow_lossy_cast;
            self->coalesce_gap_bytes = coalesce_gap_bytes;
          },
          nb::kw_only(), "chunk_bytes"_a = Options().chunk_bytes,
          "compress"_a = false, "zstd_level"_a = 1, "io_threads"_a = 0,
          "host_memory_limit"_a = 0, "timeout_s"_a = Options().timeout_s,
          "allow_lossy_cast"_a = false,
          "coalesce_gap_bytes"_a = Options().coalesce_gap_bytes)
      .def_rw("chunk_bytes", &Options::chunk_bytes)
      .def_rw("compress", &Options::compress)
      .def_rw("zstd_level", &Options::zstd_level)
      .def_rw("io_threads", &Options::io_threads)
      .def_rw("host_memory_limit", &Options::host_memory_limit)
      .def_rw("timeout_s", &Options::timeout_s)
      .def_rw("allow_lossy_cast", &Options::allow_lossy_cast)
      .def_rw("coalesce_gap_bytes", &Options::coalesce_gap_bytes);

  nb::class_<PySaveHandle>(m, "SaveHandle")
      .def("wait", &PySaveHandle::Wait, "timeout"_a = nb::none(),
           "Waits for the commit; False on timeout, raises if the save failed.")
      .def("done", [](PySaveHandle& self) { return self.handle->future().Ready(); });

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
        "process_count"_a, "barrier"_a, "set"_a, "get"_a, "try_get"_a,
        "A Coordinator whose operations are the given Python functions.");

  nb::class_<PyReader>(m, "Reader")
      .def(nb::new_(&PyReader::Open), "path"_a)
      .def("commit_json", [](PyReader& self) { return self.reader->commit_json(); })
      .def("meta_json", &PyReader::MetaJson, "name"_a)
      .def("read_value", &PyReader::ReadValue, "name"_a)
      .def("read", &PyReader::Read, "name"_a, "requests"_a, "options"_a = Options())
      .def("locate", &PyReader::LocateRanges, "name"_a, "requests"_a, "options"_a = Options());
}
