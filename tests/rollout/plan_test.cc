#include "rlsched/rollout/plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/layout.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/verify.h"
#include "test_models.h"

namespace rlsched::rollout {
namespace {

// (tensor, row, col) of a full tensor.
using Element = std::tuple<std::int32_t, std::int64_t, std::int64_t>;

// The full-tensor element at local index `idx` of `p`, if it is not padding.
std::optional<Element> FullElement(const LocalParam& p, const std::vector<FullTensor>& tensors,
                                   const std::vector<std::int64_t>& idx) {
  const std::size_t d = idx.size();
  for (const Piece& piece : p.pieces) {
    const bool vec = tensors[piece.tensor].is_vector;
    const std::size_t row_dim = vec ? d - 1 : d - 2;
    bool lead = true;
    for (std::size_t i = 0; i < row_dim; ++i) lead = lead && idx[i] == piece.offset[i];
    if (!lead) continue;
    const std::int64_t r = piece.row_begin + idx[row_dim] - piece.offset[row_dim];
    if (r < piece.row_begin || r >= piece.row_end) continue;
    std::int64_t c = 0;
    if (!vec) {
      c = piece.col_begin + idx[d - 1] - piece.offset[d - 1];
      if (c < piece.col_begin || c >= piece.col_end) continue;
    }
    return Element{piece.tensor, r, c};
  }
  return std::nullopt;
}

std::int64_t Volume(const std::vector<Range>& s) {
  std::int64_t v = 1;
  for (const Range& r : s) v *= r.end - r.begin;
  return v;
}

// The i-th local index of slice `s` (row-major).
std::vector<std::int64_t> IndexIn(const std::vector<Range>& s, std::int64_t i) {
  std::vector<std::int64_t> idx(s.size());
  for (std::size_t k = s.size(); k-- > 0;) {
    const std::int64_t n = s[k].end - s[k].begin;
    idx[k] = s[k].begin + i % n;
    i /= n;
  }
  return idx;
}

// Checks a plan element by element: every destination element that is not padding
// is written exactly once, from a source element of the same full-tensor element
// held by the sender; buckets stay within the budget; totals add up.
void CheckPlan(const ModelConfig& m, const ReshardOptions& o, const ReshardPlan& plan,
               const std::string& what) {
  const std::vector<FullTensor> tensors = HfTensors(m);
  std::map<std::int64_t, std::map<std::string, LocalParam>> src, dst;
  for (std::int64_t r = 0; r < o.train.world_size(); ++r) {
    for (LocalParam& p : MegatronShards(m, o.train, r)) src[r].emplace(p.name, std::move(p));
  }
  std::map<std::int64_t, std::map<std::string, std::vector<int>>> written;
  for (std::int64_t rep = 0; rep < o.infer.replicas; ++rep) {
    for (std::int64_t t = 0; t < o.infer.tp; ++t) {
      const std::int64_t g = EngineRank(o, rep, t);
      for (LocalParam& p : VllmShards(m, o.infer, t)) {
        std::int64_t n = 1;
        for (std::int64_t s : p.shape) n *= s;
        written[g][p.name].assign(n, 0);
        dst[g].emplace(p.name, std::move(p));
      }
    }
  }
  std::map<std::pair<std::int64_t, std::int64_t>, std::int64_t> sent, received;
  std::int64_t last_bucket = 0;
  for (const Transfer& x : plan.transfers) {
    ASSERT_GE(x.bucket, last_bucket) << what << ": transfers not ordered by bucket";
    last_bucket = x.bucket;
    ASSERT_EQ(Volume(x.src_slice), Volume(x.dst_slice)) << what;
    const std::int64_t n = Volume(x.dst_slice);
    const std::string& sname = plan.param_names[x.src_param];
    const std::string& dname = plan.param_names[x.dst_param];
    ASSERT_TRUE(src[x.src_rank].count(sname))
        << what << ": rank " << x.src_rank << " does not hold " << sname;
    const LocalParam& sp = src[x.src_rank].at(sname);
    if (x.quantize != Quantize::kAtSender) {
      ASSERT_EQ(x.bytes % n, 0) << what << ": bytes not a whole number of elements";
    }
    if (!x.local()) sent[{x.src_rank, x.bucket}] += x.bytes;
    for (std::int64_t d : x.dst_ranks) {
      received[{d, x.bucket}] += x.bytes;
      ASSERT_TRUE(dst[d].count(dname)) << what << ": engine " << d << " has no " << dname;
      const LocalParam& dp = dst[d].at(dname);
      auto& count = written[d][dname];
      // Row-major flat offset of a local index.
      auto flat = [&](const std::vector<std::int64_t>& idx) {
        std::int64_t f = 0;
        for (std::size_t k = 0; k < idx.size(); ++k) f = f * dp.shape[k] + idx[k];
        return f;
      };
      for (std::int64_t i = 0; i < n; ++i) {
        const auto si = IndexIn(x.src_slice, i);
        const auto di = IndexIn(x.dst_slice, i);
        const auto se = FullElement(sp, tensors, si);
        const auto de = FullElement(dp, tensors, di);
        ASSERT_TRUE(se.has_value()) << what << ": " << sname << " sends padding";
        ASSERT_TRUE(de.has_value()) << what << ": " << dname << " receives into padding";
        ASSERT_EQ(*se, *de) << what << ": " << sname << " -> " << dname << " element " << i;
        ++count[flat(di)];
      }
    }
  }
  for (const auto& [key, bytes] : sent) ASSERT_LE(bytes, o.bucket_bytes) << what;
  for (const auto& [key, bytes] : received) ASSERT_LE(bytes, o.bucket_bytes) << what;
  // Every non-padding element exactly once, padding never.
  for (auto& [g, params] : written) {
    for (auto& [name, count] : params) {
      const LocalParam& p = dst[g].at(name);
      for (std::size_t f = 0; f < count.size(); ++f) {
        std::vector<std::int64_t> idx(p.shape.size());
        std::int64_t rest = static_cast<std::int64_t>(f);
        for (std::size_t k = p.shape.size(); k-- > 0;) {
          idx[k] = rest % p.shape[k];
          rest /= p.shape[k];
        }
        const int expected = FullElement(p, tensors, idx).has_value() ? 1 : 0;
        ASSERT_EQ(count[f], expected) << what << ": engine " << g << " " << name << " at " << f;
      }
    }
  }
  EXPECT_GE(plan.estimate_seconds, plan.lower_bound_seconds * (1 - 1e-9)) << what;
  EXPECT_GT(plan.naive_seconds, 0.0) << what;
}

TEST(PlanTest, ColocatedLlamaKeepsLocalBytesLocal) {
  const ModelConfig m = testing::SmallModels()[0].second;
  ReshardOptions o;
  o.train = {.tp = 4, .pp = 2};
  o.infer = {.tp = 4, .replicas = 2};
  o.topology.colocated = true;
  const ReshardPlan plan = PlanReshard(m, o);
  CheckPlan(m, o, plan, "colocated");
  EXPECT_GT(plan.bytes_local, 0);
  for (const Transfer& x : plan.transfers) {
    EXPECT_EQ(x.src_slice.size(), x.dst_slice.size());
  }
}

TEST(PlanTest, SmallBucketsSplitTransfers) {
  const ModelConfig m = testing::SmallModels()[2].second;
  ReshardOptions o;
  o.train = {.tp = 2, .dp = 2};
  o.infer = {.tp = 1, .replicas = 2};
  o.bucket_bytes = 256;  // a few rows
  const ReshardPlan plan = PlanReshard(m, o);
  CheckPlan(m, o, plan, "small buckets");
  EXPECT_GT(plan.num_buckets, 10);
}

TEST(PlanTest, Fp8QuantisesLinearWeightsAtTheSenderWhenBlocksAlign) {
  std::ifstream in(std::string(RLSCHED_TEST_CONFIG_DIR) + "/llama-3.1-70b.json");
  std::stringstream text;
  text << in.rdbuf();
  const ModelConfig m = ParseHfConfig(text.str());
  ReshardOptions o;
  o.train = {.tp = 8, .pp = 2, .dp = 4};
  o.infer = {.tp = 4, .replicas = 16};
  o.topology.colocated = true;
  o.bucket_bytes = std::int64_t{1} << 30;
  const ReshardPlan bf16 = PlanReshard(m, o);
  o.target_dtype = TargetDtype::kFp8Block128;
  const ReshardPlan fp8 = PlanReshard(m, o);
  std::int64_t at_sender = 0;
  for (const Transfer& x : fp8.transfers) {
    const std::string& name = fp8.param_names[x.dst_param];
    const bool linear = name.ends_with("_proj.weight");
    EXPECT_EQ(x.quantize == Quantize::kNone, !linear) << name;
    // Llama-3.1-70B's dims and both TP splits are multiples of 128.
    EXPECT_NE(x.quantize, Quantize::kAtDestination) << name;
    at_sender += x.quantize == Quantize::kAtSender;
  }
  EXPECT_GT(at_sender, 0);
  // Linear weights are 97% of the bytes; fp8 + scales halves them.
  const double ratio = static_cast<double>(fp8.bytes_received) / bf16.bytes_received;
  EXPECT_GT(ratio, 0.5);
  EXPECT_LT(ratio, 0.53);
  EXPECT_LT(fp8.estimate_seconds, 0.55 * bf16.estimate_seconds);
}

TEST(PlanTest, Fp8QuantisesStraddlingSlicesAtTheDestination) {
  const ModelConfig m = testing::SmallModels()[0].second;  // intermediate 96
  ReshardOptions o;
  o.train = {.tp = 2};
  o.infer = {.tp = 1};
  o.target_dtype = TargetDtype::kFp8Block128;
  const ReshardPlan plan = PlanReshard(m, o);
  bool straddles = false;
  for (const Transfer& x : plan.transfers) {
    // gate rows [48, 96) of TP rank 1 land mid-block in the engine's gate_up_proj.
    straddles |= x.quantize == Quantize::kAtDestination;
  }
  EXPECT_TRUE(straddles);
  CheckPlan(m, o, plan, "fp8");
  const VerifyResult v = VerifyPlan(m, o, plan);
  EXPECT_TRUE(v.ok) << (v.problems.empty() ? "" : v.problems.front());
}

TEST(PlanTest, BadOptionsNameTheField) {
  const ModelConfig m = testing::SmallModels()[0].second;
  ReshardOptions o;
  o.bucket_bytes = 8;
  try {
    PlanReshard(m, o);
    FAIL() << "a bucket smaller than a row is accepted";
  } catch (const rlsched::FieldError& e) {
    EXPECT_NE(std::string(e.what()).find("bucket_bytes"), std::string::npos);
  }
  o.bucket_bytes = 1 << 20;
  o.topology.inter_node_gb_per_s = 0;
  EXPECT_THROW(PlanReshard(m, o), std::invalid_argument);
  o.topology.inter_node_gb_per_s = 50;
  o.topology.colocated = true;
  o.infer.replicas = 4;  // 4 engine GPUs, 1 trainer GPU
  EXPECT_THROW(PlanReshard(m, o), std::invalid_argument);
}

TEST(PlanTest, SameInputSamePlan) {
  const ModelConfig m = testing::SmallModels()[4].second;
  ReshardOptions o;
  o.train = {.tp = 2, .pp = 2, .ep = 4, .dp = 2};
  o.infer = {.tp = 2, .replicas = 3, .expert_parallel = true};
  const ReshardPlan a = PlanReshard(m, o), b = PlanReshard(m, o);
  ASSERT_FALSE(a.transfers.empty());
  CheckPlan(m, o, a, "deepseek");
  ASSERT_EQ(a.transfers.size(), b.transfers.size());
  for (std::size_t i = 0; i < a.transfers.size(); ++i) {
    EXPECT_EQ(a.transfers[i].src_rank, b.transfers[i].src_rank);
    EXPECT_EQ(a.transfers[i].dst_ranks, b.transfers[i].dst_ranks);
    EXPECT_EQ(a.transfers[i].bucket, b.transfers[i].bucket);
    EXPECT_EQ(a.transfers[i].src_slice, b.transfers[i].src_slice);
  }
  EXPECT_EQ(a.estimate_seconds, b.estimate_seconds);
}

// The layout changes of the issue, for every family (where the layout fits): the plan
// executed on reference tensors equals vLLM's shards byte for byte.
TEST(PlanVerifyTest, EveryFamilyAtTheNamedLayoutChanges) {
  struct Change {
    const char* what;
    TrainLayout train;
    InferLayout infer;
  };
  const Change changes[] = {
      {"TP 1 -> 2", {.tp = 1}, {.tp = 2}},
      {"TP 2 -> 1", {.tp = 2}, {.tp = 1}},
      {"TP 4 -> 2", {.tp = 4}, {.tp = 2}},
      {"TP 2 -> 4", {.tp = 2}, {.tp = 4}},
      {"PP 2 -> PP 1", {.pp = 2}, {.tp = 1}},
      {"EP 4 -> TP 2 with EP", {.tp = 1, .ep = 4, .dp = 4}, {.tp = 2, .expert_parallel = true}},
  };
  for (const auto& [name, m] : testing::SmallModels()) {
    int verified = 0;
    for (const Change& c : changes) {
      if (!m.is_moe() && c.infer.expert_parallel) continue;
      for (bool colocated : {false, true}) {
        ReshardOptions o;
        o.train = c.train;
        if (m.num_layers % o.train.pp != 0) {
          // An odd layer count over 2 stages: Megatron-core needs the split given.
          o.train.first_stage_layers = m.num_layers / o.train.pp + 1;
        }
        o.infer = c.infer;
        o.infer.replicas = 2;
        o.topology.colocated = colocated;
        o.topology.gpus_per_node = 2;
        o.bucket_bytes = 4096;
        const std::string what = name + " " + c.what + (colocated ? " colocated" : "");
        ReshardPlan plan;
        try {
          plan = PlanReshard(m, o);
        } catch (const rlsched::FieldError& e) {
          // Only colocated with fewer trainer than engine GPUs may not fit.
          EXPECT_TRUE(colocated) << what << ": " << e.what();
          continue;
        }
        const VerifyResult v = VerifyPlan(m, o, plan);
        EXPECT_TRUE(v.ok) << what << ": " << (v.problems.empty() ? "" : v.problems.front());
        ++verified;
      }
    }
    EXPECT_GE(verified, 6) << name;
  }
}

// The (first_stage_layers, last_stage_layers) pairs that split `layers` over
// pp = train.pp stages of vpp = train.vpp chunks, by construction: the first and
// last counts are positive multiples of vpp, the other stages' share a positive
// multiple of their count × vpp (0 meaning unset).
std::vector<std::pair<std::int64_t, std::int64_t>> UnevenSplits(std::int64_t layers,
                                                                const TrainLayout& train) {
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const std::int64_t pp = train.pp, vpp = train.vpp;
  if (pp < 2) return out;
  for (std::int64_t first = 0; first <= layers; first += vpp) {
    for (std::int64_t last = 0; first + last <= layers; last += vpp) {
      if (first == 0 && last == 0) continue;
      const std::int64_t others = pp - (first > 0) - (last > 0);
      const std::int64_t rest = layers - first - last;
      const bool fits = others == 0 ? rest == 0 : rest > 0 && rest % (others * vpp) == 0;
      if (fits) out.emplace_back(first, last);
    }
  }
  return out;
}

// Sets train's pipeline split for `layers` (redrawing pp and vpp until one exists):
// even, or one of UnevenSplits() drawn at random. Returns whether the chunks differ
// in size.
bool PickPipelineSplit(std::int64_t layers, TrainLayout& train, std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  while (true) {
    const bool even = layers % (train.pp * train.vpp) == 0;
    const auto splits = UnevenSplits(layers, train);
    if (!splits.empty() && (!even || pick(0, 3) == 0)) {
      const auto [first, last] =
          splits[static_cast<std::size_t>(pick(0, static_cast<std::int64_t>(splits.size()) - 1))];
      if (first > 0) train.first_stage_layers = first;
      if (last > 0) train.last_stage_layers = last;
      const std::int64_t others = train.pp - (first > 0) - (last > 0);
      const std::int64_t middle = others > 0 ? (layers - first - last) / (others * train.vpp) : 0;
      std::set<std::int64_t> sizes;
      if (first > 0) sizes.insert(first / train.vpp);
      if (last > 0) sizes.insert(last / train.vpp);
      if (others > 0) sizes.insert(middle);
      return sizes.size() > 1;
    }
    if (even) return false;
    train.pp = pick(1, 4);
    train.vpp = pick(1, 2);
  }
}

// An explicit uneven pipeline split (Megatron-core's first / last stage layers) on
// every family, with and without virtual stages: planned and verified byte for byte.
TEST(PlanVerifyTest, FirstAndLastStageLayers) {
  struct Split {
    std::int64_t layers, pp, vpp;
    std::optional<std::int64_t> first, last;
  };
  const Split splits[] = {
      {5, 2, 1, 3, std::nullopt},  // 3 | 2
      {6, 4, 1, 2, 2},             // 2 | 1 | 1 | 2
      {7, 3, 1, std::nullopt, 1},  // 3 | 3 | 1
      {10, 3, 2, 2, 4},            // chunks 1, 2, 2 per round
  };
  for (const auto& [name, small] : testing::SmallModels()) {
    for (const Split& s : splits) {
      ModelConfig m = small;
      m.num_layers = s.layers;
      ReshardOptions o;
      o.train.tp = 2;
      o.train.pp = s.pp;
      o.train.vpp = s.vpp;
      o.infer = {.tp = 2, .replicas = 2};
      o.bucket_bytes = 4096;
      const std::string what = name + " " + std::to_string(s.layers) + " layers, pp " +
                               std::to_string(s.pp) + " vpp " + std::to_string(s.vpp);
      EXPECT_THROW(PlanReshard(m, o), std::invalid_argument) << what;  // not by default
      o.train.first_stage_layers = s.first;
      o.train.last_stage_layers = s.last;
      const ReshardPlan plan = PlanReshard(m, o);
      CheckPlan(m, o, plan, what);
      const VerifyResult v = VerifyPlan(m, o, plan);
      EXPECT_TRUE(v.ok) << what << ": " << (v.problems.empty() ? "" : v.problems.front());
      EXPECT_EQ(v.mismatched_elements, 0) << what;
      EXPECT_EQ(v.unwritten_elements, 0) << what;
      // A different split of the same layers is another layout: the plan for one does
      // not pass for the other.
      ReshardOptions other = o;
      other.train.first_stage_layers.reset();
      other.train.last_stage_layers.reset();
      other.train.layers_per_chunk = LayersPerChunk(m, o.train);
      std::rotate(other.train.layers_per_chunk.begin(), other.train.layers_per_chunk.begin() + 1,
                  other.train.layers_per_chunk.end());
      ASSERT_NE(other.train.layers_per_chunk, LayersPerChunk(m, o.train)) << what;
      EXPECT_FALSE(VerifyPlan(m, other, plan).ok) << what;
    }
  }
}

// Random layouts over every family: coverage exactly once, senders hold their
// slices, buckets within budget, and the executed plan equals vLLM's shards.
void RandomLayouts(std::uint64_t first, std::uint64_t count) {
  const auto models = testing::SmallModels();
  std::uint64_t planned = 0, planned_uneven = 0;
  for (std::uint64_t seed = first; seed < first + count; ++seed) {
    std::mt19937_64 rng(seed);
    auto pick = [&](std::int64_t lo, std::int64_t hi) {
      return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
    };
    const auto& [name, small] = models[seed % models.size()];
    ModelConfig m = small;
    if (pick(0, 2) == 0) m.num_layers = pick(5, 8);  // room for uneven splits with vpp
    ReshardOptions o;
    o.train.tp = std::int64_t{1} << pick(0, 3);
    o.train.pp = pick(1, 4);
    o.train.dp = pick(1, 4);
    o.train.cp = pick(1, 2);
    o.train.vpp = pick(1, 2);
    // The pipeline split: even when pp·vpp divides the layers (and sometimes anyway),
    // else Megatron-core's uneven split with first / last stage counts drawn among
    // those it accepts; none: redraw the stages.
    const bool uneven = PickPipelineSplit(m.num_layers, o.train, rng);
    if (m.is_moe()) {
      o.train.ep = std::int64_t{1} << pick(0, 3);
      o.train.etp = std::int64_t{1} << pick(0, 1);
    }
    o.infer.tp = std::int64_t{1} << pick(0, 3);
    o.infer.replicas = pick(1, 4);
    o.infer.expert_parallel = m.is_moe() && pick(0, 1) == 1;
    o.infer.round_robin_experts = o.infer.expert_parallel && pick(0, 1) == 1;
    o.topology.colocated = pick(0, 1) == 1;
    o.topology.gpus_per_node = std::int64_t{1} << pick(0, 3);
    o.bucket_bytes = std::int64_t{1} << pick(9, 16);
    if (pick(0, 3) == 0) {
      o.target_dtype = TargetDtype::kFp8Block128;
      o.bucket_bytes = std::int64_t{1} << pick(14, 17);  // 128 rows of the widest tensor
    }
    const std::string what = "seed " + std::to_string(seed) + " (" + name + ")";
    ReshardPlan plan;
    try {
      plan = PlanReshard(m, o);
    } catch (const std::invalid_argument&) {
      continue;  // a layout that does not fit this model
    }
    ASSERT_FALSE(plan.transfers.empty()) << what;
    CheckPlan(m, o, plan, what);
    const VerifyResult v = VerifyPlan(m, o, plan);
    ASSERT_TRUE(v.ok) << what << ": " << (v.problems.empty() ? "" : v.problems.front());
    if (::testing::Test::HasFatalFailure()) return;
    ++planned;
    if (uneven) ++planned_uneven;
  }
  // Most random layouts fit the small models (the rest are rejected by Validate()),
  // some of them with an uneven pipeline split.
  EXPECT_GE(planned, count / 3);
  EXPECT_GE(planned_uneven, count / 20);
}

// Under AddressSanitizer (CI's second run) a fifth of the seeds: each costs ~0.7 s
// there; the regular run and the thorough sweep cover the rest. (g++ defines
// __SANITIZE_ADDRESS__; clang answers __has_feature.)
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RLSCHED_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(RLSCHED_UNDER_ASAN)
constexpr std::uint64_t kRandomLayoutSeeds = 30;
#else
constexpr std::uint64_t kRandomLayoutSeeds = 150;
#endif
TEST(PlanPropertyTest, RandomLayouts) { RandomLayouts(1, kRandomLayoutSeeds); }
TEST(PlanPropertyTest, ThoroughRandomLayouts) { RandomLayouts(1000, 1500); }

}  // namespace
}  // namespace rlsched::rollout
