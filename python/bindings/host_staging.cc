#include "host_staging.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "background_copy.h"
#include "raise.h"
#include "shard_objects.h"
#include "shardkeep/alignment.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardkeep::binding {
namespace {

using Extents = std::vector<uint64_t>;

// One box a save writes of a leaf, and where it lies: inside the host
// view numbered `view`, `offset` elements from that view's origin.
struct Piece {
  uint32_t view = 0;
  Extents origin;
  Extents shape;
  Extents offset;
};

// _core.LeafLayout: the boxes a save writes of one leaf and the host views
// they are carved from. Depends only on the leaf's shape, dtype and
// sharding, so the front builds it once and reuses it for every save of
// the same tree.
struct LeafLayout {
  uint32_t leaf = 0;
  DType dtype{};
  std::vector<Extents> view_shapes;
  std::vector<Piece> pieces;
  // The views are memory the caller owns and may change once the save call
  // returns (donation reuses a CPU buffer): an async save copies them.
  bool callers_memory = true;
};

std::string ExtentsText(const Extents& extents) {
  std::string text = "(";
  for (size_t d = 0; d < extents.size(); ++d) {
    text += (d ? ", " : "") + std::to_string(extents[d]);
  }
  return text + (extents.size() == 1 ? ",)" : ")");
}

LeafLayout MakeLayout(uint32_t leaf, const std::string& dtype,
                      const std::vector<std::tuple<Extents, Extents>>& views,
                      const std::vector<std::tuple<uint32_t, Extents, Extents>>& boxes,
                      bool callers_memory) {
  LeafLayout layout{leaf, ValueOrRaise(DTypeFromName(dtype)), {}, {}, callers_memory};
  const std::string where = "LeafLayout of leaf #" + std::to_string(leaf);
  for (const auto& [origin, shape] : views) {
    if (origin.size() != shape.size()) {
      Raise(InvalidArgumentError(where + ": a view's origin and shape differ in rank"));
    }
    layout.view_shapes.push_back(shape);
  }
  for (const auto& [view, origin, shape] : boxes) {
    if (view >= views.size()) {
      Raise(InvalidArgumentError(where + ": box " + Box{origin, shape}.ToString() +
                                 " names view " + std::to_string(view) + " of " +
                                 std::to_string(views.size())));
    }
    const auto& [view_origin, view_shape] = views[view];
    const Box view_box{view_origin, view_shape};
    const Box box{origin, shape};
    if (origin.size() != shape.size() || !Contains(view_box, box)) {
      Raise(InvalidArgumentError(where + ": box " + box.ToString() +
                                 " does not lie inside its view " + view_box.ToString()));
    }
    Extents offset(origin.size());
    for (size_t d = 0; d < origin.size(); ++d) offset[d] = origin[d] - view_origin[d];
    layout.pieces.push_back(Piece{view, origin, shape, std::move(offset)});
  }
  return layout;
}

// The bytes of a host array, as its buffer export describes them; `owner`
// (a memoryview) holds the export, and with it the array.
struct HostView {
  nb::object owner;
  const uint8_t* data = nullptr;
  Extents shape;
  std::vector<int64_t> strides;  // in bytes, any sign
  size_t itemsize = 0;
};

// Whether numpy and JAX hand arrays of `dtype` over the buffer protocol:
// the ml_dtypes types have no buffer format.
bool HasBufferFormat(DType dtype) {
  switch (dtype) {
    case DType::kBFloat16: case DType::kInt4: case DType::kUInt4:
    case DType::kFloat8E4M3FN: case DType::kFloat8E4M3FNUZ: case DType::kFloat8E4M3B11FNUZ:
    case DType::kFloat8E5M2: case DType::kFloat8E5M2FNUZ: case DType::kFloat8E3M4:
    case DType::kFloat8E4M3: case DType::kFloat8E8M0FNU: case DType::kFloat4E2M1FN:
      return false;
    default:
      return true;
  }
}

// The buffer export of `array`, or nullopt (the Python error cleared) when
// it has none: a jax.Array of the CPU backend and a numpy array export
// theirs without a copy.
std::optional<HostView> Exported(nb::handle array) {
  PyObject* memory = PyMemoryView_FromObject(array.ptr());
  if (!memory) {
    PyErr_Clear();
    return std::nullopt;
  }
  HostView view{nb::steal(memory)};
  const Py_buffer& buffer = *PyMemoryView_GET_BUFFER(memory);
  if (buffer.format && (buffer.format[0] == '>' || buffer.format[0] == '!')) {
    Raise(InvalidArgumentError("carve_shards: a big-endian array (the front converts those)"));
  }
  view.data = static_cast<const uint8_t*>(buffer.buf);
  view.itemsize = static_cast<size_t>(buffer.itemsize);
  view.shape.assign(buffer.shape, buffer.shape + buffer.ndim);
  if (buffer.strides) {
    view.strides.assign(buffer.strides, buffer.strides + buffer.ndim);
  } else {  // C-contiguous
    view.strides.resize(buffer.ndim);
    int64_t stride = buffer.itemsize;
    for (int d = buffer.ndim; d-- > 0;) {
      view.strides[d] = stride;
      stride *= buffer.shape[d];
    }
  }
  return view;
}

// The host view of view `index` of `layout`, checked against the layout.
// Arrays of a dtype without a buffer format (bfloat16, float8, int4) are
// read through numpy, as an unsigned-integer view of the same item size,
// which numpy makes for any strides.
HostView ViewOf(nb::handle array, const LeafLayout& layout, size_t index) {
  const size_t itemsize = DTypeSize(layout.dtype);
  std::optional<HostView> view;
  if (HasBufferFormat(layout.dtype)) view = Exported(array);
  if (!view) {
    static nb::object& asarray = *new nb::object(nb::module_::import_("numpy").attr("asarray"));
    try {
      view = Exported(asarray(array).attr("view")("u" + std::to_string(itemsize)));
    } catch (const nb::python_error&) {  // not an array at all
    }
    if (!view) {
      throw nb::type_error(("leaf #" + std::to_string(layout.leaf) + ": view " +
                            std::to_string(index) + " is a " +
                            nb::type_name(array.type()).c_str() + ", not a host array")
                               .c_str());
    }
  }
  const Extents& want = layout.view_shapes[index];
  if (view->shape != want || view->itemsize != itemsize) {
    Raise(InvalidArgumentError(
        "leaf #" + std::to_string(layout.leaf) + ": view " + std::to_string(index) +
        " has shape " + ExtentsText(view->shape) + " and " + std::to_string(view->itemsize) +
        "-byte items, the layout says " + ExtentsText(want) + " of " +
        std::string(DTypeName(layout.dtype))));
  }
  return std::move(*view);
}

// Whether the elements of `shape` at `strides` (in bytes) are one run of
// memory in row-major order. Extents of 1 have no stride to honour.
bool IsRowMajorRun(const Extents& shape, const std::vector<int64_t>& strides,
                   size_t itemsize) {
  int64_t expected = static_cast<int64_t>(itemsize);
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= static_cast<int64_t>(shape[d]);
  }
  return true;
}

// Copies the box at `first` (strides in bytes, any sign) into `dst`, row-major.
void CopyStrided(const uint8_t* first, const Extents& shape, const std::vector<int64_t>& strides,
                 size_t itemsize, uint8_t* dst) {
  const size_t rank = shape.size();
  if (rank == 0) {
    std::memcpy(dst, first, itemsize);
    return;
  }
  const uint64_t inner = shape[rank - 1];
  const bool inner_run = inner <= 1 || strides[rank - 1] == static_cast<int64_t>(itemsize);
  Extents index(rank - 1, 0);  // over the outer dimensions, odometer-style
  while (true) {
    const uint8_t* row = first;
    for (size_t d = 0; d + 1 < rank; ++d) row += static_cast<int64_t>(index[d]) * strides[d];
    if (inner_run) {
      std::memcpy(dst, row, inner * itemsize);
      dst += inner * itemsize;
    } else {
      for (uint64_t i = 0; i < inner; ++i, dst += itemsize) {
        std::memcpy(dst, row + static_cast<int64_t>(i) * strides[rank - 1], itemsize);
      }
    }
    size_t d = rank - 1;
    while (d > 0 && ++index[d - 1] == shape[d - 1]) index[--d] = 0;
    if (d == 0) return;
  }
}

// A flat uint8 numpy array of `nbytes` at `data`, kept alive by `owner`.
nb::object ByteView(const uint8_t* data, size_t nbytes, nb::handle owner) {
  const size_t shape[1] = {nbytes};
  return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(data, 1, shape, owner).cast();
}

// A fresh flat uint8 numpy array holding a copy of the box.
nb::object CopiedBytes(const uint8_t* first, const Extents& shape,
                       const std::vector<int64_t>& strides, size_t itemsize, size_t nbytes) {
  std::unique_ptr<uint8_t[]> copy(new uint8_t[nbytes]);
  CopyStrided(first, shape, strides, itemsize, copy.get());
  nb::capsule owner(copy.get(), [](void* p) noexcept { delete[] static_cast<uint8_t*>(p); });
  const size_t out_shape[1] = {nbytes};
  nb::object out =
      nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(copy.get(), 1, out_shape, owner).cast();
  copy.release();  // the capsule owns it now
  return out;
}

// Each piece of a staging buffer starts at a multiple of kXlaAlignment, as
// every buffer handed to XLA must (the CPU backend adopts only aligned ones).
size_t Aligned(size_t offset) {
  return (offset + kXlaAlignment - 1) / kXlaAlignment * kXlaAlignment;
}

// _core.StagingCopies: an async save's copies of the boxes that are the
// caller's memory (donation may reuse it once the save call returns), into
// one staging buffer: carve_shards gives each such box the buffer's next
// aligned piece and queues its copy on native threads; finish() waits.
class StagingCopies {
 public:
  StagingCopies(nb::handle buffer, int threads)
      : copier_(threads, size_t{4} << 20) {
    using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
    Bytes bytes;
    if (!nb::try_cast<Bytes>(buffer, bytes, false)) {
      throw nb::type_error("StagingCopies: the buffer must be a writable 1-d uint8 array");
    }
    buffer_ = nb::borrow(buffer);
    data_ = bytes.data();
    size_ = bytes.size();
  }

  // The sizes' pieces carved one after another: the bytes the buffer needs.
  static size_t BytesNeeded(const std::vector<size_t>& sizes) {
    size_t total = 0;
    for (size_t size : sizes) total = Aligned(total) + size;
    return total;
  }

  // The next `nbytes` of the buffer.
  uint8_t* Carve(size_t nbytes) {
    const size_t start = Aligned(used_);
    if (start + nbytes > size_) {  // the plan sized it: a bug, not input
      throw std::logic_error("StagingCopies: the staging buffer is too small");
    }
    used_ = start + nbytes;
    return data_ + start;
  }

  // Queues a copy from memory that `owner` keeps alive: the owner is held
  // until Finish, since the array it exports may be a temporary of the
  // front's (a converted big-endian leaf, a scalar's array).
  void Queue(const uint8_t* from, uint8_t* to, size_t nbytes, nb::handle owner) {
    sources_.push_back(nb::borrow(owner));
    copier_.Add(from, to, nbytes);
  }
  void Finish() {
    copier_.Finish();
    sources_.clear();
  }
  // The piece of `nbytes` at `at` as a slice of the buffer: a plain numpy
  // view, which the garbage collector does not track (a view made here
  // would hold a memoryview that it does, one per shard, and the count of
  // those sets off a collection as the blocking phase ends).
  nb::object SliceAt(const uint8_t* at, size_t nbytes) {
    const Py_ssize_t start = at - data_;
    return buffer_[nb::slice(start, start + static_cast<Py_ssize_t>(nbytes))];
  }
  size_t used() const { return used_; }

 private:
  std::vector<nb::object> sources_;  // what the queued copies read, until Finish
  nb::object buffer_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t used_ = 0;
  // Last: destroyed first, its threads done with every queued copy before
  // the sources and the buffer go.
  BackgroundCopy copier_;
};

// The shard of `piece`: a view of its bytes where they are one run of
// the host array, else a copy of them in row-major order.
nb::object CarvedShard(const LeafLayout& layout, const Piece& piece, const HostView& view,
                       StagingCopies* copies) {
  const size_t itemsize = view.itemsize;
  const std::optional<uint64_t> nbytes = CheckedByteSize(piece.shape, itemsize);
  if (!nbytes) Raise(InvalidArgumentError("a box's size in bytes overflows 64 bits"));
  const uint8_t* first = view.data;
  if (*nbytes) {
    for (size_t d = 0; d < piece.offset.size(); ++d) {
      first += static_cast<int64_t>(piece.offset[d]) * view.strides[d];
    }
  }
  const bool one_run = *nbytes == 0 || IsRowMajorRun(piece.shape, view.strides, itemsize);
  PyShard shard;
  shard.leaf = layout.leaf;
  shard.dtype = layout.dtype;
  shard.origin = piece.origin;
  shard.shape = piece.shape;
  if (copies && layout.callers_memory) {
    uint8_t* copy = copies->Carve(*nbytes);
    if (one_run) {
      copies->Queue(first, copy, *nbytes, view.owner);
    } else {
      CopyStrided(first, piece.shape, view.strides, itemsize, copy);
    }
    shard.data = copies->SliceAt(copy, *nbytes);
  } else {
    shard.data = one_run ? ByteView(first, *nbytes, view.owner)
                         : CopiedBytes(first, piece.shape, view.strides, itemsize, *nbytes);
  }
  return nb::cast(std::move(shard));
}

nb::list CarveShards(const std::vector<const LeafLayout*>& layouts,
                     const std::vector<nb::sequence>& views, StagingCopies* copies) {
  if (layouts.size() != views.size()) {
    Raise(InvalidArgumentError("carve_shards: " + std::to_string(layouts.size()) +
                               " layouts and " + std::to_string(views.size()) + " view lists"));
  }
  nb::list shards;
  for (size_t i = 0; i < layouts.size(); ++i) {
    const LeafLayout& layout = *layouts[i];
    const size_t count = nb::len(views[i]);
    if (count != layout.view_shapes.size()) {
      Raise(InvalidArgumentError("leaf #" + std::to_string(layout.leaf) + ": " +
                                 std::to_string(count) + " views, the layout has " +
                                 std::to_string(layout.view_shapes.size())));
    }
    std::vector<HostView> arrays;
    for (size_t j = 0; j < count; ++j) arrays.push_back(ViewOf(views[i][j], layout, j));
    for (const Piece& piece : layout.pieces) {
      shards.append(CarvedShard(layout, piece, arrays[piece.view], copies));
    }
  }
  return shards;
}

}  // namespace

void BindHostStaging(nb::module_& m) {
  // The alignment of every host buffer handed to XLA (shardkeep/alignment.h).
  m.attr("XLA_ALIGNMENT") = kXlaAlignment;
  nb::class_<LeafLayout>(
      m, "LeafLayout",
      "The boxes a save writes of one leaf and the host views they are carved from: views"
      " are (origin, shape) of each host array in the leaf's index space, boxes are"
      " (view number, origin, shape), each inside its view. callers_memory: the views are"
      " memory the caller may change once the save call returns, which an async save"
      " copies (on accelerators they are fresh device-to-host copies: False).")
      .def("__init__",
           [](LeafLayout* self, uint32_t leaf, const std::string& dtype,
              const std::vector<std::tuple<Extents, Extents>>& views,
              const std::vector<std::tuple<uint32_t, Extents, Extents>>& boxes,
              bool callers_memory) {
             new (self) LeafLayout(MakeLayout(leaf, dtype, views, boxes, callers_memory));
           },
           "leaf"_a, "dtype"_a, "views"_a, "boxes"_a, "callers_memory"_a = true)
      .def_prop_ro("leaf", [](const LeafLayout& self) { return self.leaf; })
      .def_prop_ro("box_count", [](const LeafLayout& self) { return self.pieces.size(); });
  nb::class_<StagingCopies>(
      m, "StagingCopies",
      "An async save's copies into one staging buffer (a writable 1-d uint8 array): each"
      " box carve_shards is given it for goes to the buffer's next 64-byte aligned piece,"
      " copied on `threads` native threads; finish() waits for the copies.")
      .def(nb::init<nb::handle, int>(), "buffer"_a, "threads"_a)
      .def("finish", &StagingCopies::Finish, "Waits, without the GIL, for every copy.")
      .def_prop_ro("used", &StagingCopies::used, "Bytes of the buffer carved so far.")
      .def_static("bytes_needed", &StagingCopies::BytesNeeded, "sizes"_a,
                  "The buffer bytes that pieces of these sizes take, carved in order.");
  m.def("carve_shards", &CarveShards, "layouts"_a, "views"_a, "copies"_a = nb::none(),
        "The Shards of every box of each layout, in order: views[i] are the host arrays"
        " (numpy arrays of any dtype and strides, or jax.Arrays of the CPU backend) of"
        " layouts[i]'s views. With copies, every box of a layout of the caller's memory is"
        " copied into their buffer (StagingCopies), valid once copies.finish() returns;"
        " any other box that is one run of its array is a view of it, the rest row-major"
        " copies.");
}

}  // namespace shardkeep::binding
