#include "train/ties.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace pt {

std::vector<TiedParameter> ties_across_ranks(const std::vector<ParameterSites>& sites,
                                             const std::vector<BackwardGraphs>& chunks,
                                             const std::vector<int>& device_of_chunk,
                                             const std::vector<int>& rank_of_device) {
  std::map<std::string, int> chunk_of;  // a site -> the chunk reading it (one: a site is one node)
  for (size_t c = 0; c < chunks.size(); ++c)
    for (const std::string& p : chunks[c].params) chunk_of.emplace(p, static_cast<int>(c));
  const auto rank_of_chunk = [&](int c) {
    return rank_of_device[static_cast<size_t>(device_of_chunk[static_cast<size_t>(c)])];
  };
  std::vector<TiedParameter> out;
  for (const ParameterSites& s : sites) {
    TiedParameter t{s.parameter, {s.parameter}, {}, {}, {}};
    t.sites.insert(t.sites.end(), s.copies.begin(), s.copies.end());
    std::vector<int> read_by;  // chunks, in site order
    for (const std::string& site : t.sites) {
      auto it = chunk_of.find(site);
      if (it == chunk_of.end()) break;  // no gradient reaches it (or frozen): nothing to sum
      read_by.push_back(it->second);
      t.site_rank.push_back(rank_of_chunk(it->second));
    }
    if (read_by.size() != t.sites.size()) continue;
    const std::set<int> holders(t.site_rank.begin(), t.site_rank.end());
    if (holders.size() < 2) continue;
    t.holders.assign(holders.begin(), holders.end());
    std::sort(read_by.begin(), read_by.end());
    for (int c : read_by)  // each holder's first chunk in chunk order, but the owner's (site 0's)
      if (const int r = rank_of_chunk(c); r != t.site_rank[0])
        t.mirror_device.emplace(r, device_of_chunk[static_cast<size_t>(c)]);
    out.push_back(std::move(t));
  }
  return out;
}

TieExchange::TieExchange(const std::vector<TiedParameter>& ties, const TrainRanks& ranks,
                         std::map<std::string, Tensor>& grads)
    : ranks_(ranks) {
  std::map<std::vector<int>, int> group_of;  // holders -> group (made in the order met)
  for (const TiedParameter& t : ties) {
    if (!group_of.count(t.holders))
      group_of[t.holders] = ranks.make_group(std::count(t.holders.begin(), t.holders.end(), ranks.rank()) > 0);
    const int group = group_of.at(t.holders);
    if (group < 0) continue;  // not a holder
    const Tensor* local = nullptr;
    for (size_t k = 0; k < t.sites.size() && !local; ++k)
      if (t.site_rank[k] == ranks.rank()) local = &grads.at(t.sites[k]);
    PT_CHECK(local, "a holder of '" + t.parameter + "' without a gradient of it");
    for (size_t k = 0; k < t.sites.size(); ++k) {
      const bool mine = t.site_rank[k] == ranks.rank();
      Tensor* g = mine ? &grads.at(t.sites[k]) : &grads.emplace(t.sites[k], *local).first->second;
      PT_CHECK(g->type == local->type, "'" + t.sites[k] + "' has another type than its parameter");
      sites_.push_back({group, g, mine});
    }
  }
}

void TieExchange::run() {
  for (const Site& s : sites_) ranks_.share_in_group(s.group, s.grad->data.data(), s.grad->data.size(), s.mine);
}

}  // namespace pt
