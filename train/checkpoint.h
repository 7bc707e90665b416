// train/checkpoint.h: a training run's state on disk. In: the step reached, the data position and
// named tensors (parameters, buffers such as BatchNorm running statistics, optimizer state).
// Out: one file per checkpoint, <dir>/step_<N>.ckpt, and <dir>/latest naming the newest.
//
// Atomic: each file is written to a temporary name, flushed to disk (fsync) and renamed into
// place, then `latest` is replaced the same way; a run killed at any instant leaves the previous
// checkpoint readable and never a half-written one under a checkpoint's name. Retention keeps the
// checkpoint just written and the newest one below it; every other step_*.ckpt (and part) is removed, so
// `latest` always names a file that exists (a folder is one run's series: cli/train_cmd.cc
// refuses a fresh run into a folder that holds checkpoints, unless told to clear them).
//
// Format: the line "pipetrain checkpoint 1", a JSON header line (step, data_position, meta, and
// per tensor its name, dtype (ONNX's number), shape, offset and byte count), then the tensors' bytes.
//
// Across processes each rank writes the tensors it holds as a part, <dir>/step_<N>.rank<R>.part
// (the same format, written atomically); once every part is on disk, one rank writes
// step_<N>.ckpt naming them in its header ("parts") and then `latest`. So `latest` only ever
// names a complete set, and reading a checkpoint reads its parts too: it holds every tensor
// whatever the layout that wrote it, and resumes in any layout. The folder must be one every
// rank sees (a shared file system across hosts); a part that is missing is named.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <functional>

#include "core/ir.h"

namespace pt {

struct Checkpoint {
  int64_t step = 0;           // optimizer steps taken
  int64_t data_position = 0;  // training samples consumed (DataLoader::position())
  std::map<std::string, std::string> meta;  // what must match to resume (model, stages, ...)
  std::vector<std::pair<std::string, Tensor>> tensors;
  // Tensors written from where they are held, after `tensors` (no copy of the training state);
  // they must outlive the write. A read fills `tensors` alone.
  std::vector<std::pair<std::string, const Tensor*>> borrowed;

  const Tensor* find(const std::string& name) const;
  Tensor* find(const std::string& name);
};

// Writes <dir>/step_<step>.ckpt (with `parts`: naming those part files, already written, whose
// tensors it holds besides its own) and points <dir>/latest at it. UserError naming the folder
// when it cannot be written.
void write_checkpoint(const std::string& dir, const Checkpoint& c, const std::vector<std::string>& parts = {});
// Writes rank `rank`'s part of step c.step, as checkpoint_part_name(c.step, rank) in dir.
void write_checkpoint_part(const std::string& dir, const Checkpoint& c, int rank);
std::string checkpoint_part_name(int64_t step, int rank);

// Which tensors' bytes a reader takes (by name); the others come with their type checked and no
// data (a rank resuming its own stages reads no other rank's). Empty: every one.
using TensorFilter = std::function<bool(const std::string& name)>;
// Where a reader puts a wanted tensor's bytes: a place holding type.bytes() of them (the tensor's
// home: a resume reads straight into the parameters and the optimizer's state), or null to keep
// them in Checkpoint::tensors. A tensor read into its place comes in `tensors` with its type and
// no data. Empty: every one in `tensors`.
using TensorPlace = std::function<std::byte*(const std::string& name, const TensorType& type)>;

// The checkpoint <dir>/latest names; nullopt when the folder has none. UserError naming the file
// when it is damaged.
std::optional<Checkpoint> read_latest_checkpoint(const std::string& dir, const TensorFilter& wanted = {},
                                                 const TensorPlace& place = {});
Checkpoint read_checkpoint(const std::string& path, const TensorFilter& wanted = {}, const TensorPlace& place = {});

// The steps of the step_*.ckpt files in `dir`, ascending; empty when it has none (or no folder).
std::vector<int64_t> checkpoint_steps(const std::string& dir);
// Removes every step_*.ckpt, every part and `latest` from `dir` (nothing else). UserError naming the file
// that cannot be removed.
void clear_checkpoints(const std::string& dir);

}  // namespace pt
