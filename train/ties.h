// train/ties.h: parameters read by stages on several ranks of a pipeline (a tied embedding and
// LM head on the first and last stage). In: the parameter sites (autodiff/parameter_sites.h:
// each node that reads a parameter reads a copy of its own, whose gradient accumulates where
// that node runs), the chunks, the device of each chunk and the rank of each device. Out: who
// holds what, and per step every site's gradient on every holder.
//
// As Megatron's embedding group does, every rank that reads a site of such a parameter (a
// holder) holds the parameter and its optimizer state. After the pipeline step the holders
// exchange their sites' gradients exactly (one holder has each, the others zeros: a bitwise OR),
// so that each of them then adds the very sums one process adds (each site over the replicas in
// replica order, then the sites in node order: sum_sites) and steps the same update: the copies
// stay equal, with the bits of one process. The rank of the parameter's first reader owns it (it
// writes the parameter and its state into checkpoints and the trained model); every other holder
// updates it as a mirror on its first device that reads one of its sites.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "autodiff/backward.h"
#include "autodiff/parameter_sites.h"
#include "core/ir.h"
#include "train/train_ranks.h"

namespace pt {

struct TiedParameter {
  std::string parameter;
  std::vector<std::string> sites;  // the parameter, then its copies (node order)
  std::vector<int> site_rank;      // the rank whose chunk reads each
  std::vector<int> holders;        // the ranks of site_rank, ascending
  std::map<int, int> mirror_device;  // holder rank (not the owner) -> its first device reading a site
};

// The parameters whose sites are read on more than one rank, in the order of `sites`.
// rank_of_device: the ranks of this replica (train/train_ranks.h).
std::vector<TiedParameter> ties_across_ranks(const std::vector<ParameterSites>& sites,
                                             const std::vector<BackwardGraphs>& chunks,
                                             const std::vector<int>& device_of_chunk,
                                             const std::vector<int>& rank_of_device);

// The exchange of the sites' gradients among each tie's holders. Made once, by every rank of a
// replica alike (it makes the holders' groups, TrainRanks::make_group); adds to `grads` a
// gradient for every site another rank holds of a parameter this rank holds, which run() fills.
class TieExchange {
 public:
  TieExchange(const std::vector<TiedParameter>& ties, const TrainRanks& ranks, std::map<std::string, Tensor>& grads);
  // After the pipeline step, before the sums over the replicas and the sites.
  void run();

 private:
  struct Site {
    int group;
    Tensor* grad;
    bool mine;
  };
  const TrainRanks& ranks_;
  std::vector<Site> sites_;  // this rank's ties' sites, in order
};

}  // namespace pt
