// partition/cut.h: one chunk of a PartitionPlan -> a standalone Graph whose inputs are the
// tensors crossing into the chunk, whose outputs are those crossing out, and which carries its
// own copies of the initializers it reads.
#pragma once

#include "core/ir.h"
#include "partition/partitioner.h"

namespace pt {

Graph cut_chunk(const Graph& g, const ChunkPlan& chunk);

}  // namespace pt
