// train/zero.h: ZeRO-1, the optimizer state sharded over data-parallel replicas. In: one
// device's parameters in update order (every replica holds the same list), its gradients after
// the pipeline step, and the ranks (train/train_ranks.h). Out: each replica steps the optimizer
// over its shard only, and the parameters come back whole on every replica, with the bits of an
// unsharded run.
//
//   shards          the list falls into D runs of about equal bytes: parameter i goes to replica
//                   floor(D x (its middle byte) / (total bytes)); replica k keeps run k.
//   reduce-scatter  the gradients (with their site copies', autodiff/parameter_sites.h) packed in
//                   list order, so each shard is one segment; each replica sums its own segment
//                   in replica order (TrainRanks::sum_shard_in_replica_order).
//   norm            each replica the terms of its shard, brought together exactly and added in
//                   list order (Optimizer::squares): the bits of the whole device's norm.
//   gather          after the step, every replica takes the others' updated parameters.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "autodiff/parameter_sites.h"
#include "train/optimizer.h"
#include "train/train_ranks.h"

namespace pt {

// Per parameter of `params`: the replica (of `replicas`) that keeps it.
std::vector<int> zero_shards(const std::vector<OptimizerParam>& params, int replicas);

void reduce_scatter_gradients(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                              const std::vector<ParameterSites>& sites, std::map<std::string, Tensor>& grads,
                              const TrainRanks& ranks);

double sharded_squared_norm(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                            const std::map<std::string, Tensor>& grads, const TrainRanks& ranks);

void gather_parameter_shards(const std::vector<OptimizerParam>& params, const std::vector<int>& shard_of,
                             const TrainRanks& ranks);

}  // namespace pt
