// benchmarks/weight_sync_parts.cc — what a new weight-sync plan costs the worker server
// of `rlsched run` before its first SyncWeights goes out: the parts it sends (the
// trainer's, every trainer GPU's ReshardRankPart, and one engine's, its tp GPUs'), made
// the way the server made them before (the whole binary plan file written in memory,
// then the index and each part read back out of it) and the way it makes them now
// (wire::ReshardRankParts: one index of the transfers by GPU, each part built in place
// in the message that carries it).
//
// Usage
//   weight_sync_parts [CONFIG_DIR] [--rounds N]   (default rounds: 7)
//
//   build/benchmarks/weight_sync_parts --rounds 9   (CONFIG_DIR defaults to the
//   repository's tests/data/configs)
//
// Overview
//   Layouts: Llama-3.1-70B, --train tp=8,pp=2,dp=4 --infer tp=4,replicas=8, 64 MiB
//   buckets (benchmarks/weight_sync_run.py's), and Qwen3-235B-A22B, --train
//   tp=4,pp=2,ep=4 --infer tp=4,replicas=8, 64 MiB buckets. Per layout, alternating
//   the two ways for N rounds, the median CPU time of this thread (CLOCK_THREAD_CPUTIME_ID,
//   so that other processes on a shared machine count less) of:
//     file:   WriteReshardPlanBinary() to a string stream, ReadReshardPlanIndex(), then
//             ReadReshardRankPart() of every trainer GPU and of engine 0's GPUs, each
//             added to its WeightSyncPlan;
//     direct: ReshardRankParts(plan), then BuildPart() of the same GPUs into their
//             WeightSyncPlan;
//   and checks that both give equal messages. Prints the medians and their ratio.

#include <google/protobuf/util/message_differencer.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"
#include "rlsched/v1/runtime.pb.h"
#include "rlsched/wire/reshard_convert.h"

namespace {

using namespace rlsched;

double ThreadMs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Messages {
  v1::WeightSyncPlan trainer, engine;
};

// The server's old way: the whole plan file, then the parts read back.
Messages ByFile(const rollout::ReshardPlan& plan, std::int64_t engine_ranks) {
  std::stringstream file;
  wire::WriteReshardPlanBinary(plan, file);
  std::istringstream in(std::move(file).str());
  const v1::ReshardPlanIndex index = wire::ReadReshardPlanIndex(in);
  Messages m;
  for (std::int64_t r = 0; r < plan.trainer_ranks; ++r) {
    *m.trainer.add_parts() = wire::ReadReshardRankPart(in, index, r);
  }
  for (std::int64_t r = 0; r < engine_ranks; ++r) {
    *m.engine.add_parts() = wire::ReadReshardRankPart(in, index, plan.trainer_ranks + r);
  }
  return m;
}

// The new way: the parts built in place.
Messages Direct(const rollout::ReshardPlan& plan, std::int64_t engine_ranks) {
  wire::ReshardRankParts parts(plan);
  Messages m;
  m.trainer.mutable_parts()->Reserve(static_cast<int>(plan.trainer_ranks));
  for (std::int64_t r = 0; r < plan.trainer_ranks; ++r) parts.BuildPart(r, *m.trainer.add_parts());
  for (std::int64_t r = 0; r < engine_ranks; ++r) {
    parts.BuildPart(plan.trainer_ranks + r, *m.engine.add_parts());
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = RLSCHED_BENCHMARK_CONFIG_DIR;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      dir = arg;
    }
  }
  struct Case {
    const char* name;
    const char* config;
    rollout::ReshardOptions options;
  };
  std::vector<Case> cases = {
      {"Llama-3.1-70B tp8 pp2 dp4 -> tp4 x8",
       "llama-3.1-70b.json",
       {.train = {.tp = 8, .pp = 2, .dp = 4}, .infer = {.tp = 4, .replicas = 8}}},
      {"Qwen3-235B-A22B tp4 pp2 ep4 -> tp4 x8",
       "qwen3-235b-a22b.json",
       {.train = {.tp = 4, .pp = 2, .ep = 4}, .infer = {.tp = 4, .replicas = 8}}},
  };
  int status = 0;
  for (Case& c : cases) {
    c.options.bucket_bytes = std::int64_t{64} << 20;
    std::ifstream file(dir + "/" + c.config);
    if (!file) {
      std::fprintf(stderr, "cannot read %s/%s\n", dir.c_str(), c.config);
      return 2;
    }
    std::stringstream text;
    text << file.rdbuf();
    const rollout::ReshardPlan plan =
        rollout::PlanReshard(rollout::ParseHfConfig(text.str()), c.options);
    const std::int64_t engine_ranks = c.options.infer.tp;
    std::vector<double> by_file, direct;
    for (int round = 0; round < rounds; ++round) {
      double start = ThreadMs();
      const Messages a = ByFile(plan, engine_ranks);
      by_file.push_back(ThreadMs() - start);
      start = ThreadMs();
      const Messages b = Direct(plan, engine_ranks);
      direct.push_back(ThreadMs() - start);
      if (round == 0 &&
          (!google::protobuf::util::MessageDifferencer::Equals(a.trainer, b.trainer) ||
           !google::protobuf::util::MessageDifferencer::Equals(a.engine, b.engine))) {
        std::fprintf(stderr, "%s: the two ways differ\n", c.name);
        status = 1;
      }
    }
    std::printf(
        "%s: %zu transfers, %lld trainer GPUs: file %.2f ms, direct %.2f ms (CPU, median of "
        "%d), ratio %.2f\n",
        c.name, plan.transfers.size(), static_cast<long long>(plan.trainer_ranks), Median(by_file),
        Median(direct), rounds, Median(by_file) / Median(direct));
  }
  return status;
}
