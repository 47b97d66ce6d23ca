// The resharding planner: match, choose senders, bucket, estimate.

#include "rlsched/rollout/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <stdexcept>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "bucket_rooms.h"
#include "layout_internal.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"

namespace rlsched::rollout {
namespace {

using internal::TensorIndex;

constexpr int kLinks = 4;  // LinkKind values per GPU

struct Rect {
  std::int64_t r0, r1, c0, c1;
  friend bool operator<(const Rect& a, const Rect& b) {
    return std::tie(a.r0, a.r1, a.c0, a.c1) < std::tie(b.r0, b.r1, b.c0, b.c1);
  }
  friend bool operator==(const Rect&, const Rect&) = default;
};

Rect RectOf(const Piece& p) { return {p.row_begin, p.row_end, p.col_begin, p.col_end}; }

bool Intersect(const Rect& a, const Rect& b, Rect& out) {
  out = {std::max(a.r0, b.r0), std::min(a.r1, b.r1), std::max(a.c0, b.c0), std::min(a.c1, b.c1)};
  return out.r0 < out.r1 && out.c0 < out.c1;
}

// The local slice of `region` (inside piece `p`) in a local tensor of rank
// p.offset.size(), written to out[0, rank).
void LocalSliceInto(const Piece& p, const Rect& region, bool is_vector, Range* out) {
  const std::size_t d = p.offset.size();
  for (std::size_t i = 0; i < d; ++i) out[i] = {p.offset[i], p.offset[i] + 1};
  const std::size_t row_dim = is_vector ? d - 1 : d - 2;
  out[row_dim] = {p.offset[row_dim] + region.r0 - p.row_begin,
                  p.offset[row_dim] + region.r1 - p.row_begin};
  if (!is_vector) {
    out[d - 1] = {p.offset[d - 1] + region.c0 - p.col_begin,
                  p.offset[d - 1] + region.c1 - p.col_begin};
  }
}

std::vector<Range> LocalSlice(const Piece& p, const Rect& region, bool is_vector) {
  std::vector<Range> s(p.offset.size());
  LocalSliceInto(p, region, is_vector, s.data());
  return s;
}

// A set of trainer shards (a class of ranks that hold the same local params).
struct SourceClass {
  std::vector<LocalParam> params;
  std::vector<std::int64_t> holders;  // ascending
};

// Where a rectangle of a full tensor is held: (class, param, piece) per holding.
struct Holding {
  std::int32_t cls, param, piece;
};
struct SourceRect {
  Rect rect;
  std::vector<Holding> holdings;
  std::vector<std::int64_t> holders;  // union over holdings, ascending
  std::int32_t holder_set = 0;        // id of the distinct holder set
  std::int32_t tensor = 0;            // the full tensor
};

// One region to deliver: a rectangle of a full tensor, into one vLLM piece on
// every replica's TP rank `tp_rank`.
struct Job {
  std::int32_t source;  // index into the flat SourceRect list
  std::int32_t tensor;
  Rect region;
  std::int64_t tp_rank;
  std::int32_t dst_param;  // index into the vLLM params of tp_rank
  std::int32_t dst_piece;
  std::int64_t bytes;
  Quantize quantize;
  bool is_vector;  // the full tensor's
};

constexpr std::int64_t kBlock = 128;  // fp8 block edge

// The loops that visit the records in key or bucket order (not the order they are
// stored in) are bound by memory latency: they ask for a record kPrefetchRec steps
// ahead and for its destinations and slices kPrefetchData steps ahead.
constexpr std::size_t kPrefetchRec = 16, kPrefetchData = 8;

void PrefetchAddress(const void* p) {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}

// Bytes of a slice with `rows` x `cols` elements (the last two dims of its local
// tensor; cols = 1 for a vector) as sent: fp8 + an fp32 scale per block when the
// sender quantises, else the full elements.
std::int64_t SliceBytes(std::int64_t rows, std::int64_t cols, std::int64_t element_bytes,
                        Quantize q) {
  if (q != Quantize::kAtSender) return rows * cols * element_bytes;
  return rows * cols + ((rows + kBlock - 1) / kBlock) * ((cols + kBlock - 1) / kBlock) * 4;
}

// One transfer as Assign() emits it, before splitting and bucketing: a job's region
// from `src_rank` to dsts_[dst_begin, + dst_count), its source slice
// ranges_[ranges, + src_dims) and its destination slice the dst_dims ranges after
// that; for a part of a split transfer, rows [part_begin, part_begin + part_rows) of
// those slices. The Transfer is built only once the plan's order is known, from these
// flat arrays (the layouts' pieces are not visited again).
struct Rec {
  std::int64_t src_rank = 0;
  std::int64_t bytes = 0;
  std::size_t dst_begin = 0;
  std::size_t ranges = 0;
  std::int64_t part_begin = 0;
  std::int64_t part_rows = -1;  // -1: the whole region
  std::int32_t dst_count = 0;
  std::int32_t src_param = 0;  // ids in ReshardPlan::param_names
  std::int32_t dst_param = 0;
  std::int16_t src_dims = 0, dst_dims = 0;
  Quantize quantize = Quantize::kNone;
};

class Planner {
 public:
  Planner(const ModelConfig& m, const ReshardOptions& o) : m_(m), o_(o), index_(m) {}

  ReshardPlan Run();

 private:
  std::int64_t Node(std::int64_t gpu) const { return node_of_[static_cast<std::size_t>(gpu)]; }
  double Bandwidth(LinkKind k) const {
    const bool intra = k == LinkKind::kIntraIn || k == LinkKind::kIntraOut;
    return (intra ? o_.topology.intra_node_gb_per_s : o_.topology.inter_node_gb_per_s) * 1e9;
  }
  std::int32_t Name(const std::string& name) {
    auto [it, inserted] =
        names_.try_emplace(name, static_cast<std::int32_t>(plan_.param_names.size()));
    if (inserted) plan_.param_names.push_back(name);
    return it->second;
  }
  std::int64_t& Load(std::int64_t rank, LinkKind k) {
    return link_bytes_[rank * kLinks + static_cast<int>(k)];
  }
  bool Local(const Rec& r) const { return r.dst_count == 1 && dsts_[r.dst_begin] == r.src_rank; }

  void BuildSources();
  void BuildJobs();
  void Assign();
  // Assign()'s steps: the link loads and the bound's accumulators sized, the jobs in
  // the order they are assigned (largest first), the holding a holder rank sends `src`
  // from, and one job's transfers (`remote`, `far`: scratch).
  void PrepareAssign();
  std::vector<std::int32_t> JobsLargestFirst() const;
  std::int32_t HoldingOf(const SourceRect& src, std::int64_t rank) const;
  void AssignJob(std::int32_t j, std::vector<std::int64_t>& remote, std::vector<std::int64_t>& far);
  // Sends job `j` to the engine GPUs `remote` (ascending) of each node from a holder on
  // that node; those with none on theirs go to `far`.
  void SendWithinNodes(std::int32_t j, const std::vector<std::int64_t>& remote,
                       std::vector<std::int64_t>& far);
  // Sends job `j` to `far` over the NICs from the least loaded holder.
  void SendAcrossNodes(std::int32_t j, std::vector<std::int64_t>& far);
  // Appends the record of job `job` sent by `sender` from `holding` to the ranks
  // dsts_[dst_begin, end).
  void Emit(std::int32_t job, std::int64_t sender, std::int32_t holding, std::size_t dst_begin);
  void Bucket();
  // Bucket()'s steps: transfers above the budget split by rows of their region; the
  // pacing keys (key, record), sorted; the records built by bucket, in key order.
  void SplitLarge();
  std::vector<std::pair<double, std::size_t>> PacingKeys() const;
  void MaterializeByBucket(const std::vector<std::pair<double, std::size_t>>& keys,
                           const std::vector<std::int64_t>& bucket);
  // Bucket()'s first fit of the records in the order of `keys` (key, record), rooms
  // held as T: bucket[record].
  template <class T>
  void FirstFit(const std::vector<std::pair<double, std::size_t>>& keys,
                std::vector<std::int64_t>& bucket);
  // Fills `x` (default-constructed) from `r`.
  void Materialize(const Rec& r, std::int64_t bucket, Transfer& x) const;
  void Cost();

  const ModelConfig& m_;
  const ReshardOptions& o_;
  TensorIndex index_;
  ReshardPlan plan_;
  std::unordered_map<std::string, std::int32_t> names_;
  std::vector<SourceClass> classes_;
  std::vector<SourceRect> sources_;
  std::vector<std::vector<std::int32_t>> by_tensor_;    // tensor -> source rects
  std::vector<std::vector<LocalParam>> engine_params_;  // per tp rank
  // Ids in plan_.param_names of each class's / tp rank's params, -1 until used.
  std::vector<std::vector<std::int32_t>> source_name_ids_, engine_name_ids_;
  std::vector<Job> jobs_;
  std::vector<Rec> recs_;              // in emission order
  std::vector<std::int64_t> dsts_;     // the records' destination ranks
  std::vector<Range> ranges_;          // the records' slices
  std::vector<std::int64_t> node_of_;  // per GPU
  std::vector<std::int64_t> link_bytes_;
  // Lower-bound accumulators.
  std::vector<std::int64_t> need_remote_;    // per engine rank: bytes not held by itself
  std::vector<std::int64_t> need_offnode_;   // per engine rank: bytes held on no GPU of its node
  std::vector<std::int64_t> set_nic_bytes_;  // per holder set: bytes that must leave by NIC
  std::vector<std::int64_t> set_size_;
};

void Planner::BuildSources() {
  const TrainLayout& t = o_.train;
  const std::int64_t per_stage = t.tp * t.cp * t.dp;
  for (std::int64_t pp = 0; pp < t.pp; ++pp) {
    for (std::int64_t tp = 0; tp < t.tp; ++tp) {
      SourceClass c{internal::MegatronDenseShards(m_, index_, t, pp, tp), {}};
      for (std::int64_t r = 0; r < per_stage / t.tp; ++r)
        c.holders.push_back(pp * per_stage + r * t.tp + tp);
      classes_.push_back(std::move(c));
    }
    if (!m_.is_moe()) continue;
    for (std::int64_t ep = 0; ep < t.ep; ++ep) {
      for (std::int64_t etp = 0; etp < t.etp; ++etp) {
        SourceClass c{internal::MegatronExpertShards(m_, index_, t, pp, ep, etp), {}};
        for (std::int64_t edp = 0; edp < per_stage / (t.ep * t.etp); ++edp) {
          c.holders.push_back(pp * per_stage + edp * t.ep * t.etp + ep * t.etp + etp);
        }
        classes_.push_back(std::move(c));
      }
    }
  }
  // Group identical rectangles of each tensor; distinct ones must not overlap.
  struct Entry {
    std::int32_t tensor;
    Rect rect;
    Holding h;
  };
  std::vector<Entry> entries;
  for (std::size_t c = 0; c < classes_.size(); ++c) {
    const auto& params = classes_[c].params;
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t k = 0; k < params[p].pieces.size(); ++k) {
        const Piece& piece = params[p].pieces[k];
        entries.push_back({piece.tensor,
                           RectOf(piece),
                           {static_cast<std::int32_t>(c), static_cast<std::int32_t>(p),
                            static_cast<std::int32_t>(k)}});
      }
    }
  }
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.tensor, a.rect) < std::tie(b.tensor, b.rect);
  });
  by_tensor_.assign(index_.tensors().size(), {});
  std::map<std::vector<std::int64_t>, std::int32_t> sets;
  for (std::size_t i = 0; i < entries.size();) {
    SourceRect s{entries[i].rect, {}, {}, 0, entries[i].tensor};
    const std::int32_t tensor = entries[i].tensor;
    for (; i < entries.size() && entries[i].tensor == tensor && entries[i].rect == s.rect; ++i) {
      s.holdings.push_back(entries[i].h);
      const auto& hs = classes_[entries[i].h.cls].holders;
      s.holders.insert(s.holders.end(), hs.begin(), hs.end());
    }
    std::sort(s.holders.begin(), s.holders.end());
    s.holders.erase(std::unique(s.holders.begin(), s.holders.end()), s.holders.end());
    auto [it, inserted] = sets.try_emplace(s.holders, static_cast<std::int32_t>(sets.size()));
    if (inserted) set_size_.push_back(static_cast<std::int64_t>(s.holders.size()));
    s.holder_set = it->second;
    by_tensor_[tensor].push_back(static_cast<std::int32_t>(sources_.size()));
    sources_.push_back(std::move(s));
  }
  set_nic_bytes_.assign(set_size_.size(), 0);
  for (const SourceClass& c : classes_) source_name_ids_.emplace_back(c.params.size(), -1);
}

void Planner::BuildJobs() {
  std::size_t most = 0;  // jobs: at most one per engine piece and source rect
  for (std::int64_t t = 0; t < o_.infer.tp; ++t) {
    engine_params_.push_back(internal::VllmShards(m_, index_, o_.infer, t));
    engine_name_ids_.emplace_back(engine_params_.back().size(), -1);
    for (const LocalParam& param : engine_params_.back()) {
      for (const Piece& piece : param.pieces) most += by_tensor_[piece.tensor].size();
    }
  }
  jobs_.reserve(most);
  for (std::int64_t t = 0; t < o_.infer.tp; ++t) {
    const auto& params = engine_params_[t];
    for (std::size_t p = 0; p < params.size(); ++p) {
      for (std::size_t k = 0; k < params[p].pieces.size(); ++k) {
        const Piece& piece = params[p].pieces[k];
        const FullTensor& full = index_.tensors()[piece.tensor];
        const bool fp8 = o_.target_dtype == TargetDtype::kFp8Block128 && params[p].linear;
        std::int64_t covered = 0;
        for (std::int32_t s : by_tensor_[piece.tensor]) {
          Rect region;
          if (!Intersect(RectOf(piece), sources_[s].rect, region)) continue;
          const std::int64_t elements = (region.r1 - region.r0) * (region.c1 - region.c0);
          covered += elements;
          Quantize q = Quantize::kNone;
          if (fp8) {
            // Whole blocks of the engine tensor: both edges of rows and columns on a
            // block boundary or at the tensor's end.
            const std::vector<Range> slice = LocalSlice(piece, region, full.is_vector);
            const std::size_t d = slice.size();
            auto aligned = [&](const Range& r, std::int64_t dim) {
              return r.begin % kBlock == 0 && (r.end % kBlock == 0 || r.end == dim);
            };
            q = aligned(slice[d - 2], params[p].shape[d - 2]) &&
                        aligned(slice[d - 1], params[p].shape[d - 1])
                    ? Quantize::kAtSender
                    : Quantize::kAtDestination;
          }
          jobs_.push_back(
              {s, piece.tensor, region, t, static_cast<std::int32_t>(p),
               static_cast<std::int32_t>(k),
               SliceBytes(region.r1 - region.r0, region.c1 - region.c0, full.element_bytes, q), q,
               full.is_vector});
        }
        RLSCHED_CHECK(covered == piece.Elements());  // the trainer shards cover the piece
      }
    }
  }
}

void Planner::Emit(std::int32_t job_index, std::int64_t sender, std::int32_t holding,
                   std::size_t dst_begin) {
  const Job& job = jobs_[job_index];
  const Holding& h = sources_[job.source].holdings[holding];
  // Names get their ids on first use (a deterministic order), cached per param.
  auto id = [&](std::int32_t& cached, const std::string& name) {
    if (cached < 0) cached = Name(name);
    return cached;
  };
  const LocalParam& sp = classes_[h.cls].params[h.param];
  const LocalParam& dp = engine_params_[job.tp_rank][job.dst_param];
  const Piece& src_piece = sp.pieces[h.piece];
  const Piece& dst_piece = dp.pieces[job.dst_piece];
  const bool vec = job.is_vector;
  Rec r;
  r.src_rank = sender;
  r.bytes = job.bytes;
  r.dst_begin = dst_begin;
  r.dst_count = static_cast<std::int32_t>(dsts_.size() - dst_begin);
  r.quantize = job.quantize;
  r.src_param = id(source_name_ids_[h.cls][h.param], sp.name);
  r.dst_param = id(engine_name_ids_[job.tp_rank][job.dst_param], dp.name);
  r.ranges = ranges_.size();
  r.src_dims = static_cast<std::int16_t>(src_piece.offset.size());
  r.dst_dims = static_cast<std::int16_t>(dst_piece.offset.size());
  ranges_.resize(ranges_.size() + r.src_dims + r.dst_dims);
  LocalSliceInto(src_piece, job.region, vec, &ranges_[r.ranges]);
  LocalSliceInto(dst_piece, job.region, vec, &ranges_[r.ranges + r.src_dims]);
  recs_.push_back(r);
}

void Planner::Assign() {
  PrepareAssign();
  std::vector<std::int64_t> remote;  // engine GPUs without the bytes, ascending
  std::vector<std::int64_t> far;     // those on nodes without a holder
  for (const std::int32_t j : JobsLargestFirst()) AssignJob(j, remote, far);
}

void Planner::PrepareAssign() {
  recs_.reserve(jobs_.size() + jobs_.size() / 4);
  // Every job reaches each replica once (a local copy, or in one transfer).
  dsts_.reserve(jobs_.size() * static_cast<std::size_t>(o_.infer.replicas));
  ranges_.reserve(recs_.capacity() * 5);
  const std::int64_t trainer = o_.train.world_size();
  const std::int64_t engines = o_.infer.tp * o_.infer.replicas;
  const std::int64_t ranks = std::max(trainer, engines + (o_.topology.colocated ? 0 : trainer));
  link_bytes_.assign(static_cast<std::size_t>(ranks) * kLinks, 0);
  node_of_.resize(static_cast<std::size_t>(ranks));
  for (std::int64_t g = 0; g < ranks; ++g) node_of_[g] = g / o_.topology.gpus_per_node;
  need_remote_.assign(engines, 0);
  need_offnode_.assign(engines, 0);
}

// Largest jobs first, ties in job order: a counting sort over the distinct sizes (few:
// the same shapes repeat over layers and experts).
std::vector<std::int32_t> Planner::JobsLargestFirst() const {
  std::vector<std::int32_t> order(jobs_.size());
  std::unordered_map<std::int64_t, std::int32_t> size_ids;
  std::vector<std::int64_t> sizes;                  // by id
  std::vector<std::int32_t> size_of(jobs_.size());  // per job
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    const auto [it, inserted] =
        size_ids.try_emplace(jobs_[j].bytes, static_cast<std::int32_t>(sizes.size()));
    if (inserted) sizes.push_back(jobs_[j].bytes);
    size_of[j] = it->second;
  }
  std::vector<std::int32_t> by_size(sizes.size());  // ids, largest size first
  std::iota(by_size.begin(), by_size.end(), 0);
  std::sort(by_size.begin(), by_size.end(),
            [&](std::int32_t a, std::int32_t b) { return sizes[a] > sizes[b]; });
  std::vector<std::size_t> next(sizes.size());  // per id: its next place in `order`
  std::size_t place = 0;
  std::vector<std::size_t> count(sizes.size(), 0);
  for (std::int32_t id : size_of) ++count[id];
  for (std::int32_t id : by_size) {
    next[id] = place;
    place += count[id];
  }
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    order[next[size_of[j]]++] = static_cast<std::int32_t>(j);
  }
  return order;
}

// The first holding that lists the rank's class.
std::int32_t Planner::HoldingOf(const SourceRect& src, std::int64_t rank) const {
  for (std::size_t i = 0; i < src.holdings.size(); ++i) {
    const auto& hs = classes_[src.holdings[i].cls].holders;
    if (std::binary_search(hs.begin(), hs.end(), rank)) return static_cast<std::int32_t>(i);
  }
  RLSCHED_CHECK(!"every holder has a holding");
  return 0;
}

void Planner::AssignJob(std::int32_t j, std::vector<std::int64_t>& remote,
                        std::vector<std::int64_t>& far) {
  const Job& job = jobs_[j];
  const SourceRect& src = sources_[job.source];
  remote.clear();
  far.clear();
  const std::int64_t lowest = src.holders.front(), highest = src.holders.back();
  for (std::int64_t rep = 0; rep < o_.infer.replicas; ++rep) {
    const std::int64_t e = rep * o_.infer.tp + job.tp_rank;
    const std::int64_t gpu = EngineRank(o_, rep, job.tp_rank);
    if (gpu >= lowest && gpu <= highest &&
        std::binary_search(src.holders.begin(), src.holders.end(), gpu)) {
      const std::size_t begin = dsts_.size();
      dsts_.push_back(gpu);
      Emit(j, gpu, HoldingOf(src, gpu), begin);
      plan_.bytes_local += job.bytes;
      continue;
    }
    need_remote_[e] += job.bytes;
    remote.push_back(gpu);
  }
  SendWithinNodes(j, remote, far);
  if (!far.empty()) SendAcrossNodes(j, far);
  plan_.bytes_received += job.bytes * o_.infer.replicas;
}

void Planner::SendWithinNodes(std::int32_t j, const std::vector<std::int64_t>& remote,
                              std::vector<std::int64_t>& far) {
  const Job& job = jobs_[j];
  const SourceRect& src = sources_[job.source];
  const std::int64_t lowest = src.holders.front(), highest = src.holders.back();
  const std::int64_t gpn = o_.topology.gpus_per_node;
  // Per node (the GPUs ascend, so a node's are consecutive).
  for (std::size_t first = 0, last = 0; first < remote.size(); first = last) {
    const std::int64_t node = Node(remote[first]);
    while (last < remote.size() && Node(remote[last]) == node) ++last;
    // Holders on this node send over the intra-node links; else over the NICs. The
    // holders ascend, so a node's are consecutive: the first least loaded.
    auto on_node = src.holders.end(), off_node = src.holders.end();
    if (highest >= node * gpn && lowest < (node + 1) * gpn) {
      on_node = std::lower_bound(src.holders.begin(), src.holders.end(), node * gpn);
      off_node = std::lower_bound(on_node, src.holders.end(), (node + 1) * gpn);
    }
    std::int64_t best = -1;
    for (auto h = on_node; h != off_node; ++h) {
      if (best < 0 || Load(*h, LinkKind::kIntraOut) < Load(best, LinkKind::kIntraOut)) best = *h;
    }
    if (best < 0) {
      for (std::size_t k = first; k < last; ++k) {
        const std::int64_t d = remote[k];
        far.push_back(d);
        const std::int64_t e = o_.topology.colocated ? d : d - o_.train.world_size();
        need_offnode_[e] += job.bytes;
      }
      continue;
    }
    Load(best, LinkKind::kIntraOut) += job.bytes;
    const std::size_t begin = dsts_.size();
    for (std::size_t k = first; k < last; ++k) {
      Load(remote[k], LinkKind::kIntraIn) += job.bytes;
      dsts_.push_back(remote[k]);
    }
    Emit(j, best, HoldingOf(src, best), begin);
  }
}

void Planner::SendAcrossNodes(std::int32_t j, std::vector<std::int64_t>& far) {
  const Job& job = jobs_[j];
  const SourceRect& src = sources_[job.source];
  std::sort(far.begin(), far.end());
  std::int64_t best = src.holders.front();
  for (std::int64_t h : src.holders) {
    if (Load(h, LinkKind::kNicOut) < Load(best, LinkKind::kNicOut)) best = h;
  }
  Load(best, LinkKind::kNicOut) += job.bytes;
  const std::size_t begin = dsts_.size();
  for (std::int64_t d : far) {
    Load(d, LinkKind::kNicIn) += job.bytes;
    dsts_.push_back(d);
  }
  set_nic_bytes_[src.holder_set] += job.bytes;
  Emit(j, best, HoldingOf(src, best), begin);
}

void Planner::Materialize(const Rec& r, std::int64_t bucket, Transfer& x) const {
  const Range* src = ranges_.data() + r.ranges;
  const Range* dst = src + r.src_dims;
  x.bucket = bucket;
  x.src_rank = r.src_rank;
  x.src_param = r.src_param;
  x.src_slice.assign(src, src + r.src_dims);
  x.dst_ranks.assign(dsts_.begin() + static_cast<std::ptrdiff_t>(r.dst_begin),
                     dsts_.begin() + static_cast<std::ptrdiff_t>(r.dst_begin + r.dst_count));
  x.dst_param = r.dst_param;
  x.dst_slice.assign(dst, dst + r.dst_dims);
  x.bytes = r.bytes;
  x.quantize = r.quantize;
  if (r.part_rows >= 0) {
    // Rows are the second-to-last dim of a matrix slice; the last of a vector one.
    const std::size_t sd = x.src_slice.size(), dd = x.dst_slice.size();
    const std::size_t src_row = sd >= 2 ? sd - 2 : 0, dst_row = dd >= 2 ? dd - 2 : 0;
    const std::int64_t s0 = x.src_slice[src_row].begin + r.part_begin;
    const std::int64_t d0 = x.dst_slice[dst_row].begin + r.part_begin;
    x.src_slice[src_row] = {s0, s0 + r.part_rows};
    x.dst_slice[dst_row] = {d0, d0 + r.part_rows};
  }
}

void Planner::Bucket() {
  SplitLarge();
  const std::vector<std::pair<double, std::size_t>> keys = PacingKeys();
  const std::int64_t budget = o_.bucket_bytes;
  const std::vector<Rec>& xs = recs_;
  // First fit: the earliest bucket in which the sender and every receiver have room.
  // Each rank's room per bucket, sent and received, is a BucketRooms: the first bucket
  // at or after b with room for a transfer is found in O(log buckets). b only grows,
  // so the first b that no rank moves is the answer.
  std::vector<std::int64_t> bucket(xs.size());
  if (budget <= std::numeric_limits<std::int32_t>::max()) {
    FirstFit<std::int32_t>(keys, bucket);
  } else {
    FirstFit<std::int64_t>(keys, bucket);
  }
  MaterializeByBucket(keys, bucket);
}

void Planner::SplitLarge() {
  const std::int64_t budget = o_.bucket_bytes;
  const bool any_large =
      std::any_of(recs_.begin(), recs_.end(), [&](const Rec& r) { return r.bytes > budget; });
  if (!any_large) return;
  std::vector<Rec> split;
  split.reserve(recs_.size());
  for (const Rec& x : recs_) {
    if (x.bytes <= budget) {
      split.push_back(x);
      continue;
    }
    // Rows are the second-to-last dim of a matrix slice; the last of a vector one.
    const Range* src_slice = ranges_.data() + x.ranges;
    const auto sd = static_cast<std::size_t>(x.src_dims);
    const std::size_t src_row = sd >= 2 ? sd - 2 : 0;
    const std::int64_t rows = src_slice[src_row].end - src_slice[src_row].begin;
    const std::int64_t cols = sd >= 2 ? src_slice[sd - 1].end - src_slice[sd - 1].begin : 1;
    const Quantize quantize = x.quantize;
    std::int64_t step = 1;
    if (quantize == Quantize::kAtSender) {  // whole blocks per part
      step = kBlock;
      while (step < rows && SliceBytes(step + kBlock, cols, 1, quantize) <= budget) {
        step += kBlock;
      }
    } else {
      step = std::max<std::int64_t>(1, budget / (x.bytes / rows));
    }
    for (std::int64_t r = 0; r < rows; r += step) {
      Rec part = x;
      const std::int64_t n = std::min(step, rows - r);
      part.part_begin = r;
      part.part_rows = n;
      part.bytes =
          quantize == Quantize::kAtSender ? SliceBytes(n, cols, 1, quantize) : n * (x.bytes / rows);
      split.push_back(part);
    }
  }
  recs_ = std::move(split);
}

std::vector<std::pair<double, std::size_t>> Planner::PacingKeys() const {
  const std::vector<Rec>& xs = recs_;
  const std::size_t ranks = link_bytes_.size() / kLinks;
  // Order: each receiver's streams (bytes in over its intra-node link, over its NIC,
  // and by local copy) should progress through the buckets at the same pace, so that
  // each bucket carries the same mix of slow and fast bytes. A transfer's key is the
  // largest fraction of its receivers' streams done once it is (streams taken in the
  // current order: largest regions first); first fit then follows the keys. Senders
  // are not paced: each sends a small share of what its receivers take in.
  constexpr int kStreams = 3;  // intra-node in, NIC in, local copy
  auto streams = [&](const Rec& x, auto&& visit) {
    const std::int64_t* d = dsts_.data() + x.dst_begin;
    const int kind = Local(x) ? 2 : Node(d[0]) == Node(x.src_rank) ? 0 : 1;
    for (std::int32_t k = 0; k < x.dst_count; ++k) visit(d[k] * kStreams + kind);
  };
  std::vector<std::int64_t> total(ranks * kStreams, 0), done(ranks * kStreams, 0);
  for (const Rec& x : xs) {
    streams(x, [&](std::size_t s) { total[s] += x.bytes; });
  }
  // (key, index): sorted, the order of a stable sort by key.
  std::vector<std::pair<double, std::size_t>> keys(xs.size());
  for (std::size_t i = 0; i < xs.size(); ++i) {
    double key = 0.0;
    streams(xs[i], [&](std::size_t s) {
      done[s] += xs[i].bytes;
      key = std::max(key, static_cast<double>(done[s]) / static_cast<double>(total[s]));
    });
    keys[i] = {key, i};
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

void Planner::MaterializeByBucket(const std::vector<std::pair<double, std::size_t>>& keys,
                                  const std::vector<std::int64_t>& bucket) {
  const std::vector<Rec>& xs = recs_;
  // By bucket, in key order within a bucket (a counting sort); each Transfer is built
  // once, in its final place.
  std::vector<std::size_t> start(plan_.num_buckets + 1, 0);
  for (std::int64_t b : bucket) ++start[b + 1];
  for (std::int64_t b = 0; b < plan_.num_buckets; ++b) start[b + 1] += start[b];
  std::vector<std::size_t> ordered(xs.size());
  for (const auto& [key, i] : keys) ordered[start[bucket[i]]++] = i;
  plan_.transfers.reserve(xs.size());
  for (std::size_t n = 0; n < ordered.size(); ++n) {
    if (n + kPrefetchRec < ordered.size()) {
      PrefetchAddress(&xs[ordered[n + kPrefetchRec]]);
    }
    if (n + kPrefetchData < ordered.size()) {
      const Rec& ahead = xs[ordered[n + kPrefetchData]];
      PrefetchAddress(&dsts_[ahead.dst_begin]);
      PrefetchAddress(&ranges_[ahead.ranges]);
    }
    const std::size_t i = ordered[n];
    Materialize(xs[i], bucket[i], plan_.transfers.emplace_back());
  }
}

template <class T>
void Planner::FirstFit(const std::vector<std::pair<double, std::size_t>>& keys,
                       std::vector<std::int64_t>& bucket) {
  const std::vector<Rec>& xs = recs_;
  const std::size_t ranks = link_bytes_.size() / kLinks;
  using Rooms = internal::BucketRooms<T>;
  std::vector<Rooms> sent(ranks, Rooms(o_.bucket_bytes)), received(ranks, Rooms(o_.bucket_bytes));
  auto prefetch = [&](std::size_t n) {
    if (n + kPrefetchRec < keys.size()) PrefetchAddress(&xs[keys[n + kPrefetchRec].second]);
    if (n + kPrefetchData < keys.size()) {
      PrefetchAddress(&dsts_[xs[keys[n + kPrefetchData].second].dst_begin]);
    }
  };
  for (std::size_t n = 0; n < keys.size(); ++n) {
    prefetch(n);
    const std::size_t i = keys[n].second;
    const Rec& x = xs[i];
    const bool local = Local(x);
    const std::int64_t* dst = dsts_.data() + x.dst_begin;
    const std::int32_t count = x.dst_count;
    const std::int64_t bytes = x.bytes;
    std::int64_t b = 0;
    for (std::int64_t settled = -1; settled != b;) {
      settled = b;
      if (!local) b = sent[x.src_rank].FirstFit(b, bytes);
      for (std::int32_t k = 0; k < count; ++k) b = received[dst[k]].FirstFit(b, bytes);
    }
    bucket[i] = b;
    if (!local) sent[x.src_rank].Take(b, bytes);
    for (std::int32_t k = 0; k < count; ++k) received[dst[k]].Take(b, bytes);
    plan_.num_buckets = std::max(plan_.num_buckets, b + 1);
  }
}

void Planner::Cost() {
  const std::size_t ranks = link_bytes_.size() / kLinks;
  std::vector<std::int64_t> bucket_load(ranks * kLinks, 0);
  std::vector<std::size_t> touched;
  auto charge = [&](std::int64_t rank, LinkKind k, std::int64_t bytes) {
    const std::size_t i = rank * kLinks + static_cast<int>(k);
    if (bucket_load[i] == 0) touched.push_back(i);
    bucket_load[i] += bytes;
  };
  plan_.bucket_seconds.assign(plan_.num_buckets, 0.0);
  std::size_t i = 0;
  for (std::int64_t b = 0; b < plan_.num_buckets; ++b) {
    for (; i < plan_.transfers.size() && plan_.transfers[i].bucket == b; ++i) {
      const Transfer& x = plan_.transfers[i];
      plan_.bytes_moved += x.local() ? 0 : x.bytes;
      if (x.local()) continue;
      const bool intra = Node(x.dst_ranks.front()) == Node(x.src_rank);
      charge(x.src_rank, intra ? LinkKind::kIntraOut : LinkKind::kNicOut, x.bytes);
      for (std::int64_t d : x.dst_ranks) {
        charge(d, intra ? LinkKind::kIntraIn : LinkKind::kNicIn, x.bytes);
      }
    }
    double worst = 0.0;
    for (std::size_t t : touched) {
      worst = std::max(worst, bucket_load[t] / Bandwidth(static_cast<LinkKind>(t % kLinks)));
      bucket_load[t] = 0;
    }
    touched.clear();
    plan_.bucket_seconds[b] = worst;
    plan_.estimate_seconds += worst;
  }
  // Over the whole plan the links carry what Assign() charged them (splitting into
  // buckets moves no byte to another link).
  for (std::size_t t = 0; t < link_bytes_.size(); ++t) {
    const auto kind = static_cast<LinkKind>(t % kLinks);
    const double s = link_bytes_[t] / Bandwidth(kind);
    if (s > plan_.busiest_link.seconds) {
      plan_.busiest_link = {static_cast<std::int64_t>(t / kLinks), kind, link_bytes_[t], s};
    }
  }
  // Lower bound: into each engine rank, and out of each group of holders.
  const double nic = Bandwidth(LinkKind::kNicIn), intra = Bandwidth(LinkKind::kIntraIn);
  double lb = 0.0;
  for (std::size_t e = 0; e < need_remote_.size(); ++e) {
    lb = std::max(lb, need_offnode_[e] / nic);
    lb = std::max(lb, need_remote_[e] / (nic + intra));
  }
  for (std::size_t s = 0; s < set_size_.size(); ++s) {
    lb = std::max(lb, set_nic_bytes_[s] / (static_cast<double>(set_size_[s]) * nic));
  }
  plan_.lower_bound_seconds = lb;

  // Naive: gather every full tensor on trainer rank 0, then broadcast each to every
  // engine rank (each receives the whole model).
  std::int64_t gather_intra = 0, gather_nic = 0, model_bytes = 0;
  for (const SourceRect& s : sources_) {
    const std::int64_t bytes = (s.rect.r1 - s.rect.r0) * (s.rect.c1 - s.rect.c0) *
                               index_.tensors()[s.tensor].element_bytes;
    model_bytes += bytes;
    if (s.holders.front() == 0) continue;
    const bool in_node = Node(s.holders.front()) == Node(0);
    (in_node ? gather_intra : gather_nic) += bytes;
  }
  bool engine_off_node = false;
  for (std::int64_t rep = 0; rep < o_.infer.replicas; ++rep) {
    for (std::int64_t t = 0; t < o_.infer.tp; ++t) {
      engine_off_node |= Node(EngineRank(o_, rep, t)) != Node(0);
    }
  }
  plan_.naive_seconds = std::max(gather_intra / intra, gather_nic / nic) +
                        model_bytes / (engine_off_node ? nic : intra);
}

ReshardPlan Planner::Run() {
  plan_.options = o_;
  plan_.trainer_ranks = o_.train.world_size();
  plan_.engine_ranks = o_.infer.tp * o_.infer.replicas;
  BuildSources();
  BuildJobs();
  Assign();
  // The records hold what the rest needs of the jobs and the shards.
  std::vector<Job>().swap(jobs_);
  std::vector<std::vector<LocalParam>>().swap(engine_params_);
  std::vector<SourceClass>().swap(classes_);
  Bucket();
  // The records are in plan_.transfers now.
  std::vector<Rec>().swap(recs_);
  std::vector<std::int64_t>().swap(dsts_);
  std::vector<Range>().swap(ranges_);
  Cost();
  return std::move(plan_);
}

}  // namespace

TransferEstimate EstimateTransfers(const ModelConfig& m, const ReshardOptions& o) {
  const auto d = [](std::int64_t v) { return static_cast<double>(v); };
  const double tp = d(o.infer.tp);
  // Regions of a tensor cut into `a` trainer slices (non-overlapping), held in `p`
  // engine pieces (each a 1/p share, or the whole tensor when replicated): each
  // piece meets at most min(a, ceil(a / p) + 1) slices.
  const auto regions = [](double a, double p) { return p * std::min(a, std::ceil(a / p) + 1.0); };
  const double kv_copies = o.infer.tp > m.num_kv_heads ? tp / d(m.num_kv_heads) : 1.0;
  TransferEstimate e;
  double engine_bytes = 0.0;  // one replica's
  auto add = [&](double count, internal::Split split, double bytes) {
    double a = 1.0, p = tp, copies = 1.0;
    switch (split) {
      case internal::Split::kReplicated:
        copies = tp;
        break;
      case internal::Split::kGrouped:
        a = std::max(d(m.num_kv_heads), d(o.train.tp));
        copies = kv_copies;
        break;
      case internal::Split::kTensorParallel:
        a = d(o.train.tp);
        break;
      case internal::Split::kExpert:
        a = d(o.train.etp);
        if (o.infer.expert_parallel) p = 1.0;
        break;
    }
    e.slices += count * regions(a, p);
    engine_bytes += count * bytes * copies;
  };
  const double vocab_bytes = d(m.vocab_size) * d(m.hidden_size) * d(m.dtype_bytes);
  add(m.tie_word_embeddings ? 1.0 : 2.0, internal::Split::kTensorParallel, vocab_bytes);
  add(1.0, internal::Split::kReplicated, d(m.hidden_size) * d(m.dtype_bytes));  // final norm
  const double moe_layers = d(m.NumMoeLayers());
  for (const bool moe : {false, true}) {
    const double layers = moe ? moe_layers : d(m.num_layers) - moe_layers;
    if (layers <= 0.0) continue;
    internal::LayerTensors(m, 0, moe, /*experts_once=*/true, [&](const internal::TensorShape& t) {
      add(layers * d(t.count), t.split, d(t.rows) * d(t.cols) * d(t.element_bytes));
    });
  }
  // A region's transfers: a local copy per replica whose GPU holds it, one per node
  // with a holder (intra-node), one over the NICs for the rest. Separate engine GPUs
  // share a node with the trainer's only where the ranges meet: at most 2 transfers.
  // Colocated: at most 2 per holder + 1 (holders: the DP × CP copies of a dense
  // slice, the expert-DP copies of an expert's).
  const double replicas = d(o.infer.replicas);
  double holders = d(o.train.cp) * d(o.train.dp);
  if (m.is_moe()) {
    holders = std::max(
        holders, d(o.train.tp) * d(o.train.cp) * d(o.train.dp) / (d(o.train.ep) * d(o.train.etp)));
  }
  if (m.tie_word_embeddings) holders *= 2;  // the embedding and the last stage's copy
  e.receivers = std::min(replicas, o.topology.colocated ? 2.0 * holders + 1.0 : 2.0);
  e.bucket_parts = 2.0 * engine_bytes * e.receivers / d(o.bucket_bytes);
  e.transfers = e.slices * e.receivers + e.bucket_parts;
  return e;
}

std::int64_t EngineRank(const ReshardOptions& o, std::int64_t replica, std::int64_t tp_rank) {
  const std::int64_t local = replica * o.infer.tp + tp_rank;
  return o.topology.colocated ? local : o.train.world_size() + local;
}

ReshardPlan PlanReshard(const ModelConfig& model, const ReshardOptions& o) {
  Validate(model, o.train);
  Validate(model, o.infer);
  const Topology& t = o.topology;
  CheckInRange("topology.gpus_per_node", t.gpus_per_node, 1, 65536);
  CheckRealInRange("topology.intra_node_gb_per_s", t.intra_node_gb_per_s, 0, End::kOpen, 1e6,
                   End::kClosed);
  CheckRealInRange("topology.inter_node_gb_per_s", t.inter_node_gb_per_s, 0, End::kOpen, 1e6,
                   End::kClosed);
  if (t.colocated && o.infer.tp * o.infer.replicas > o.train.world_size()) {
    Fail("infer.replicas", "colocated engines need tp·replicas <= the trainer's GPUs (" +
                               std::to_string(o.train.world_size()) + ")");
  }
  CheckInRange("bucket_bytes", o.bucket_bytes, 1, {std::int64_t{1} << 40, "2^40"});
  // The work, before any of it is done.
  const TransferEstimate work = EstimateTransfers(model, o);
  if (work.transfers > static_cast<double>(kMaxPlanTransfers)) {
    const std::string why = ", which makes about " + NumberText(std::round(work.transfers)) +
                            " transfers (" + NumberText(work.slices) + " tensor slices × up to " +
                            NumberText(work.receivers) + " receiver groups each, + " +
                            NumberText(std::round(work.bucket_parts)) +
                            " parts from splitting at the bucket budget)";
    const std::string bound = "such that the plan has at most " + NumberText(kMaxPlanTransfers) +
                              " transfers (kMaxPlanTransfers, by EstimateTransfers())";
    if (work.bucket_parts > work.slices * work.receivers) {
      FailBound("bucket_bytes", bound, NumberText(o.bucket_bytes) + why);
    }
    if (work.receivers > 1.0) {
      FailBound("infer.replicas", bound, NumberText(o.infer.replicas) + why);
    }
    FailBound("config.num_hidden_layers", bound, NumberText(model.num_layers) + why);
  }
  std::int64_t widest_row = 0;
  for (const FullTensor& f : HfTensors(model)) {
    widest_row = std::max(widest_row, f.is_vector ? f.element_bytes : f.cols * f.element_bytes);
  }
  if (o.target_dtype == TargetDtype::kFp8Block128) widest_row *= kBlock;  // whole blocks
  const std::string widest = std::to_string(widest_row) + " (the widest row)";
  CheckInRange("bucket_bytes", o.bucket_bytes, {widest_row, widest},
               {std::int64_t{1} << 40, "2^40"});
  return Planner(model, o).Run();
}

}  // namespace rlsched::rollout
