// benchmarks/reshard_plan.cc — the weight-resharding planner on the production-sized
// models of tests/data/configs: planning time, estimate vs lower bound vs naive.
//
// Usage
//   reshard_plan [CONFIG_DIR] [--calls N] [--bucket-mb N]
//                (defaults: tests/data/configs, 3 calls, 1024 MiB buckets)
//
// Overview
//   For each scenario (the targets of the resharding issue), reads config.json,
//   calls rollout::PlanReshard() N times (wall time by steady_clock, single thread),
//   and prints the bytes, transfers, buckets, the busiest link, the estimate, its
//   lower bound and the naive gather-on-rank-0-then-broadcast estimate, with the ratios
//   estimate / lower bound (target <= 1.10) and naive / estimate. Peak RSS
//   (getrusage) is printed at the end. Bandwidths: 400 GB/s intra-node, 50 GB/s per
//   GPU inter-node, 8 GPUs per node; buckets of 1 GiB per rank and direction, or
//   --bucket-mb (small buckets make many more transfers and buckets: the first fit's
//   cost; the targets of the resharding issue, and the exit status, apply to 1 GiB).

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"

namespace {

using rlsched::rollout::LinkKind;
using rlsched::rollout::ModelConfig;
using rlsched::rollout::ReshardOptions;
using rlsched::rollout::ReshardPlan;
using rlsched::rollout::TrainLayout;

struct Scenario {
  const char* name;
  const char* config;
  ReshardOptions options;
};

const char* KindName(LinkKind k) {
  switch (k) {
    case LinkKind::kIntraOut:
      return "intra-node out";
    case LinkKind::kIntraIn:
      return "intra-node in";
    case LinkKind::kNicOut:
      return "NIC out";
    case LinkKind::kNicIn:
      return "NIC in";
  }
  return "?";
}

std::int64_t bucket_mib = 1024;

ReshardOptions Options(rlsched::rollout::TrainLayout train, rlsched::rollout::InferLayout infer,
                       bool colocated) {
  ReshardOptions o;
  o.train = std::move(train);
  o.infer = infer;
  o.topology.colocated = colocated;
  o.topology.gpus_per_node = 8;
  o.topology.intra_node_gb_per_s = 400;
  o.topology.inter_node_gb_per_s = 50;
  o.bucket_bytes = bucket_mib << 20;
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = RLSCHED_BENCHMARK_CONFIG_DIR;
  int calls = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--calls" && i + 1 < argc) {
      calls = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--bucket-mb" && i + 1 < argc) {
      bucket_mib = std::clamp<std::int64_t>(std::atoll(argv[++i]), 1, std::int64_t{1} << 20);
    } else {
      dir = a;
    }
  }
  // 61 layers on 8 stages: 7 | 8 × 6 | 6; 94 layers on 4 stages: 23 | 24 | 24 | 23
  // (Megatron's first/last stage layers).
  const TrainLayout deepseek{
      .tp = 2, .pp = 8, .ep = 32, .dp = 32, .first_stage_layers = 7, .last_stage_layers = 6};
  const TrainLayout qwen{
      .tp = 4, .pp = 4, .ep = 16, .dp = 16, .first_stage_layers = 23, .last_stage_layers = 23};
  const std::vector<Scenario> scenarios = {
      {"DeepSeek-V3 TP2 PP8 EP32 (512) -> vLLM TP16 EP x 8 (128 other GPUs)", "deepseek-v3.json",
       Options(deepseek, {.tp = 16, .replicas = 8, .expert_parallel = true}, false)},
      {"DeepSeek-V3 TP2 PP8 EP32 (512) -> vLLM TP16 x 8, experts split by TP", "deepseek-v3.json",
       Options(deepseek, {.tp = 16, .replicas = 8}, false)},
      {"Qwen3-235B-A22B TP4 PP4 EP16 (256) -> vLLM TP8 EP x 16 (128 other GPUs)",
       "qwen3-235b-a22b.json",
       Options(qwen, {.tp = 8, .replicas = 16, .expert_parallel = true}, false)},
      {"Qwen3-235B-A22B TP4 PP4 EP16 (256) -> vLLM TP8 x 16, experts split by TP",
       "qwen3-235b-a22b.json", Options(qwen, {.tp = 8, .replicas = 16}, false)},
      {"Llama-3.1-70B TP8 PP2 DP4 (64) -> vLLM TP4 x 16, colocated", "llama-3.1-70b.json",
       Options({.tp = 8, .pp = 2, .dp = 4}, {.tp = 4, .replicas = 16}, true)},
  };
  bool ok = true;
  for (const Scenario& s : scenarios) {
    std::ifstream in(dir + "/" + s.config);
    if (!in) {
      std::fprintf(stderr, "cannot read %s/%s\n", dir.c_str(), s.config);
      return 2;
    }
    std::stringstream text;
    text << in.rdbuf();
    const ModelConfig model = rlsched::rollout::ParseHfConfig(text.str());
    ReshardPlan plan;
    std::vector<double> ms;
    for (int c = 0; c < calls; ++c) {
      const auto t0 = std::chrono::steady_clock::now();
      plan = rlsched::rollout::PlanReshard(model, s.options);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    const double ratio = plan.estimate_seconds / plan.lower_bound_seconds;
    std::printf("== %s\n", s.name);
    std::printf("   plan time: median %.0f ms (min %.0f, max %.0f, %d calls)\n", ms[ms.size() / 2],
                ms.front(), ms.back(), calls);
    std::printf(
        "   %zu transfers in %lld buckets; received %.1f GB (%.1f GB local), moved %.1f GB\n",
        plan.transfers.size(), static_cast<long long>(plan.num_buckets), plan.bytes_received / 1e9,
        plan.bytes_local / 1e9, plan.bytes_moved / 1e9);
    std::printf("   busiest link: GPU %lld %s, %.1f GB, %.3f s\n",
                static_cast<long long>(plan.busiest_link.rank), KindName(plan.busiest_link.kind),
                plan.busiest_link.bytes / 1e9, plan.busiest_link.seconds);
    std::printf("   estimate %.3f s, lower bound %.3f s, ratio %.3f (target <= 1.10: %s)\n",
                plan.estimate_seconds, plan.lower_bound_seconds, ratio,
                ratio <= 1.10 ? "met" : "NOT met");
    std::printf(
        "   naive (gather on rank 0, broadcast whole tensors) %.1f s = %.1fx the estimate\n",
        plan.naive_seconds, plan.naive_seconds / plan.estimate_seconds);
    if (bucket_mib == 1024) {
      std::printf("   plan under 2 s: %s\n\n", ms[ms.size() / 2] < 2000 ? "met" : "NOT met");
      ok = ok && ratio <= 1.10 && ms[ms.size() / 2] < 2000;
    } else {
      std::printf("   (%lld MiB buckets: no plan-time target)\n\n",
                  static_cast<long long>(bucket_mib));
    }
  }
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf("peak RSS %.0f MB\n", usage.ru_maxrss / 1024.0);
  return ok ? 0 : 1;
}
