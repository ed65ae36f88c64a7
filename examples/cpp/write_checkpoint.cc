// Writes a small model-like checkpoint with the C++ API that Python then
// loads with `shardkeep.load(CKPT)`:
//
//   write_checkpoint CKPT [STEP]
//
// CKPT is a local path or an s3:// URL; STEP (default 100) goes into the
// commit record and into the tree. The checkpoint holds:
//
//   "state" (a pytree, what shardkeep.load reads):
//     params/embed         float32  [16, 8]  written as 4 row blocks of 4 rows,
//                                            with a sharding description
//     params/dense/kernel  bfloat16 [8, 6]   written as 2 row blocks of 4 rows
//     params/dense/bias    float32  [6]      one shard, memory handed over
//     step                 int      STEP
//     learning_rate        float    0.001
//   "config" (a json checkpointable): {"model": "tiny", "vocab": 16, "hidden": 8}
//
// The values come from formulas whose results are exact in their dtype, so
// a test can recompute them and compare bit for bit
// (python/tests/test_cpp_round_trip.py):
//   embed[i][j]  = (i * 8 + j) * 0.25 - 16
//   kernel[i][j] = ((i * 6 + j) % 17 - 8) * 0.125
//   bias[j]      = j - 2.5
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "shardkeep/checkpoint_writer.h"
#include "shardkeep/storage.h"

namespace {

using shardkeep::Box;
using shardkeep::DType;
using shardkeep::Status;

constexpr uint64_t kVocab = 16, kHidden = 8, kOut = 6;

// bfloat16 is the upper half of a float32's bits; the kernel's values have
// at most 8 significant bits, so nothing is rounded away.
uint16_t ToBFloat16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return static_cast<uint16_t>(bits >> 16);
}

// Declares the leaves and hands over the shards. `embed` and `kernel` are
// borrowed: they must outlive the save, which they do (main() commits
// before they go).
Status Build(shardkeep::CheckpointWriter& writer, int64_t step,
             const std::vector<float>& embed, const std::vector<uint16_t>& kernel) {
  SK_ASSIGN_OR_RETURN(shardkeep::PytreeBuilder * state, writer.AddPytree("state"));
  // Leaves are named by key path; the tree becomes nested dicts:
  // {"params": {"embed": ..., "dense": {"kernel": ..., "bias": ...}}, ...}.
  // The embedding's rows were spread over 4 devices along a mesh axis
  // "data": recorded, in the Python front's words, for shardkeep.metadata.
  SK_RETURN_IF_ERROR(state->AddArray(
      "params/embed", DType::kFloat32, {kVocab, kHidden},
      R"({"type": "named", "axis_names": ["data"], "mesh_shape": [4],
          "spec": ["data", null], "device_ids": [0, 1, 2, 3]})"));
  SK_RETURN_IF_ERROR(state->AddArray("params/dense/kernel", DType::kBFloat16, {kHidden, kOut}));
  SK_RETURN_IF_ERROR(state->AddArray("params/dense/bias", DType::kFloat32, {kOut}));
  SK_RETURN_IF_ERROR(state->AddInt("step", step));
  SK_RETURN_IF_ERROR(state->AddFloat("learning_rate", 0.001));

  // Row blocks, as the shards of a matrix sharded over its rows would be:
  // box origin {row, 0}, shape {rows, columns}; the bytes are the block's
  // rows, contiguous in the row-major matrix.
  constexpr uint64_t kEmbedRows = 4;
  for (uint64_t row = 0; row < kVocab; row += kEmbedRows) {
    SK_RETURN_IF_ERROR(state->AddShard("params/embed", DType::kFloat32,
                                       Box{{row, 0}, {kEmbedRows, kHidden}},
                                       embed.data() + row * kHidden,
                                       kEmbedRows * kHidden * sizeof(float)));
  }
  constexpr uint64_t kKernelRows = 4;
  for (uint64_t row = 0; row < kHidden; row += kKernelRows) {
    SK_RETURN_IF_ERROR(state->AddShard("params/dense/kernel", DType::kBFloat16,
                                       Box{{row, 0}, {kKernelRows, kOut}},
                                       kernel.data() + row * kOut,
                                       kKernelRows * kOut * sizeof(uint16_t)));
  }
  // A buffer the writer owns from here on (freed when the save completes).
  std::vector<uint8_t> bias(kOut * sizeof(float));
  for (uint64_t j = 0; j < kOut; ++j) {
    const float value = static_cast<float>(j) - 2.5f;
    std::memcpy(bias.data() + j * sizeof(float), &value, sizeof value);
  }
  SK_RETURN_IF_ERROR(
      state->AddShard("params/dense/bias", DType::kFloat32, Box{{0}, {kOut}}, std::move(bias)));

  SK_RETURN_IF_ERROR(writer.AddJson("config", R"({"model": "tiny", "vocab": 16, "hidden": 8})"));
  writer.SetStep(step);
  return writer.SetCustomMetadata(R"({"written_by": "examples/cpp/write_checkpoint"})");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: write_checkpoint CKPT [STEP]\n");
    return 2;
  }
  const int64_t step = argc > 2 ? std::strtoll(argv[2], nullptr, 10) : 100;

  std::vector<float> embed(kVocab * kHidden);
  for (uint64_t i = 0; i < embed.size(); ++i) {
    embed[i] = static_cast<float>(i) * 0.25f - 16.0f;
  }
  std::vector<uint16_t> kernel(kHidden * kOut);
  for (uint64_t i = 0; i < kernel.size(); ++i) {
    kernel[i] = ToBFloat16(static_cast<float>(static_cast<int>(i % 17) - 8) * 0.125f);
  }

  auto where = shardkeep::ResolveStorage(argv[1]);
  if (!where.ok()) {
    std::fprintf(stderr, "write_checkpoint: %s\n", where.status().ToString().c_str());
    return 1;
  }
  // A single process (no coordinator). Several processes would each call
  // writer.SetCoordinator(...) and writer.SetOperationId(...) with the id
  // shardkeep::OperationIds agrees for the save, and add only their own
  // shards.
  shardkeep::CheckpointWriter writer(where->storage, where->path);
  Status status = Build(writer, step, embed, kernel);
  // Commit blocks until the checkpoint is committed (or the save failed):
  // it appears whole at CKPT or not at all.
  if (status.ok()) status = writer.Commit(shardkeep::Options());
  if (!status.ok()) {
    std::fprintf(stderr, "write_checkpoint: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (step %lld)\n", argv[1], static_cast<long long>(step));
  return 0;
}
