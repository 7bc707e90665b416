// train/ties.h: which parameters are tied across ranks, who holds them, and where a holder that
// is not the owner updates its mirror.
#include "train/ties.h"

#include <gtest/gtest.h>

namespace pt {
namespace {

std::vector<BackwardGraphs> chunks_reading(const std::vector<std::vector<std::string>>& params) {
  std::vector<BackwardGraphs> out(params.size());
  for (size_t c = 0; c < params.size(); ++c) out[c].params = params[c];
  return out;
}

// A GPT on 4 devices, 2 per rank: the embedding (wte) on chunk 0, its LM head site on chunk 3;
// a bias read twice on rank 0; a weight whose second site no gradient reaches.
TEST(Ties, AParameterWhoseSitesAreOnTwoRanksIsTiedAcrossThem) {
  const std::vector<ParameterSites> sites = {{"wte", {"wte@site1"}}, {"b", {"b@site1"}}, {"f", {"f@site1"}}};
  const auto chunks = chunks_reading({{"wte", "b", "f"}, {"b@site1"}, {}, {"wte@site1"}});
  const std::vector<TiedParameter> ties = ties_across_ranks(sites, chunks, {0, 1, 2, 3}, {0, 0, 1, 1});
  ASSERT_EQ(ties.size(), 1u);
  EXPECT_EQ(ties[0].parameter, "wte");
  EXPECT_EQ(ties[0].sites, (std::vector<std::string>{"wte", "wte@site1"}));
  EXPECT_EQ(ties[0].site_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(ties[0].holders, (std::vector<int>{0, 1}));
  EXPECT_EQ(ties[0].mirror_device, (std::map<int, int>{{1, 3}}));
  // One rank per device (ranks 4..7: a second replica): the mirror on the head's device.
  EXPECT_EQ(ties_across_ranks(sites, chunks, {0, 1, 2, 3}, {4, 5, 6, 7})[0].mirror_device, (std::map<int, int>{{7, 3}}));
  // A V puts chunks 0 and 3 on device 0: the embedding stays on rank 0, the bias crosses.
  const std::vector<TiedParameter> v = ties_across_ranks(sites, chunks, {0, 1, 1, 0}, {0, 1});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].parameter, "b");
  EXPECT_EQ(v[0].mirror_device, (std::map<int, int>{{1, 1}}));
}

// A holder gets a gradient for each site another rank holds, of its parameter's type.
TEST(Ties, TheExchangeAddsTheOtherRanksSites) {
  TiedParameter t{"wte", {"wte", "wte@site1"}, {0, 1}, {0, 1}, {{1, 3}}};
  std::map<std::string, Tensor> grads;
  grads["wte"].type = TensorType{DType::kFloat32, {4, 2}};
  grads["wte"].data.assign(32, std::byte{1});
  const TrainRanks alone;
  TieExchange exchange({t}, alone, grads);
  ASSERT_TRUE(grads.count("wte@site1"));
  EXPECT_EQ(grads.at("wte@site1").type, grads.at("wte").type);
  EXPECT_EQ(grads.at("wte@site1").data.size(), 32u);
}

}  // namespace
}  // namespace pt
