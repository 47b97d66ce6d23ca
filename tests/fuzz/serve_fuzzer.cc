// serve_fuzzer.cc — libFuzzer target over the daemon's whole delimited request path:
// the input is a byte stream as `rlsched serve` reads it on stdin. Each frame goes
// through RequestReader (framing, the size cap), DecodeRequest (protobuf parsing;
// also as a JSON line), HandleRequest (validation, SolveBalance / SolvePlanStep /
// SolveReshard / SolveSimulate) and EncodeReply (both formats), exactly as Serve() runs them minus
// the thread pool.
//
// Checked beyond the sanitizers: no INTERNAL reply (an exception other than
// std::invalid_argument from a solve is a bug); every reply echoes its request's id;
// a solved balance has num_parts parts holding every index once, a solved step plan
// num_ranks ranks with the same micro-batch count and every index once, a reshard
// plan its transfers exactly when asked and a time per bucket, a simulation conserves
// its samples and keeps its staleness policy's promise; the replies written
// parse back as a sequence of Replies, the last one BAD_FRAME exactly when the stream
// was bad.
//
// A valid request may ask for a lot of work (a million parts, a million micro-batches
// per rank, a large refinement budget): the library allows it and the daemon does it.
// To keep executions short, requests above kMax* below are decoded and validated by
// the harness's own checks but not solved.
//
// Run: see tests/fuzz/CMakeLists.txt.

#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/stubs/logging.h>
#include <google/protobuf/util/delimited_message_util.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "rlsched/rollout/model.h"
#include "serve.h"

namespace rlsched::app {
namespace {

// Bounds on the work the harness lets a request ask for.
constexpr std::int64_t kMaxItems = 2048;
constexpr std::int64_t kMaxParts = 512;
constexpr std::int64_t kMaxMicroBatchesPerRank = 512;
constexpr std::int64_t kMaxMicroBatchesTotal = 1 << 14;
constexpr std::int64_t kMaxRefineIterations = 20'000;
// Reshard: parallel sizes, GPUs on either side, layers, experts, a model dimension,
// and transfers implied by splitting the model's bytes into buckets.
constexpr std::int64_t kMaxReshardSize = 64;
constexpr std::int64_t kMaxReshardGpus = 256;
constexpr std::int64_t kMaxReshardLayers = 64;
constexpr std::int64_t kMaxReshardDim = 4096;
constexpr double kMaxReshardSplits = 1 << 14;
// Simulate: events per run and engines.
constexpr std::int64_t kMaxSimulateEvents = 20'000;
constexpr std::int64_t kMaxSimulateEngines = 64;
// The frame cap of the harness (the daemon's default is 64 MiB).
constexpr std::int64_t kMaxMessageBytes = 1 << 20;

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "serve_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

// Whether planning `reshard` is quick. Sizes above the harness's bounds (and below the
// daemon's) are skipped; values the daemon rejects at once are kept.
bool CheapReshard(const v1::ReshardRequest& reshard) {
  const v1::TrainLayout& train = reshard.train();
  std::int64_t trainer_gpus = 1;
  for (const std::int64_t size :
       {train.tp(), train.pp(), train.vpp(), train.ep(), train.etp(), train.cp(), train.dp()}) {
    if (size > kMaxReshardSize) return false;
  }
  for (const std::int64_t size : {train.tp(), train.pp(), train.cp(), train.dp()}) {
    trainer_gpus *= std::max<std::int64_t>(size, 1);
  }
  const v1::InferLayout& infer = reshard.infer();
  if (trainer_gpus > kMaxReshardGpus || infer.tp() > kMaxReshardSize ||
      infer.replicas() > kMaxReshardSize ||
      std::max<std::int64_t>(infer.tp(), 1) * std::max<std::int64_t>(infer.replicas(), 1) >
          kMaxReshardGpus) {
    return false;
  }
  rollout::ModelConfig m;
  try {
    m = rollout::ParseHfConfig(reshard.model_config_json());
  } catch (const std::exception&) {
    return true;  // rejected at once
  }
  if (m.num_layers > kMaxReshardLayers || m.num_experts > kMaxReshardSize ||
      m.num_heads > kMaxReshardDim || m.num_kv_heads > kMaxReshardDim) {
    return false;
  }
  for (const std::int64_t dim :
       {m.hidden_size, m.intermediate_size, m.head_dim, m.vocab_size, m.moe_intermediate_size,
        m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim}) {
    if (dim > kMaxReshardDim) return false;
  }
  double bytes = 0.0;
  for (const rollout::FullTensor& tensor : rollout::HfTensors(m)) {
    bytes += static_cast<double>(tensor.Bytes());
  }
  const double bucket = reshard.bucket_bytes() > 0 ? static_cast<double>(reshard.bucket_bytes())
                                                   : static_cast<double>(std::int64_t{512} << 20);
  return bytes * static_cast<double>(std::max<std::int64_t>(infer.replicas(), 1)) / bucket <=
         kMaxReshardSplits;
}

// Simulate: the event budget must be set and small; samples per step, engines,
// ranks (those of compare's colocated_sync run too) and listed lengths bounded too
// (their setup does not count as events).
bool CheapSimulate(const v1::SimulateRequest& request) {
  const v1::SimulatorConfig& config = request.config();
  const v1::OrchestratorOptions& core = config.orchestrator();
  if (!config.has_max_events() || config.max_events() > kMaxSimulateEvents) return false;
  if (!config.has_engines() || config.engines() > kMaxSimulateEngines) return false;
  if (!config.has_trainer_ranks() || config.trainer_ranks() > kMaxParts) return false;
  if (!core.has_prompts_per_step() || !core.has_samples_per_prompt()) return false;
  if (request.compare()) {
    // The colocated_sync run: the GPUs shared by as many engines and ranks as they hold.
    const std::int64_t per_engine = std::max<std::int64_t>(config.gpus_per_engine(), 1);
    const std::int64_t per_rank = std::max<std::int64_t>(config.gpus_per_trainer_rank(), 1);
    if (per_engine > 4096 || per_rank > 4096) return true;  // rejected at once
    const std::int64_t gpus = config.engines() * per_engine + config.trainer_ranks() * per_rank;
    if (gpus / per_engine > kMaxSimulateEngines || gpus / per_rank > kMaxParts) return false;
  }
  const double samples = static_cast<double>(core.prompts_per_step()) *
                         static_cast<double>(core.samples_per_prompt()) *
                         (1.0 + std::max(core.oversample(), 0.0));
  return samples <= kMaxItems && config.lengths().lengths_size() <= kMaxItems;
}

bool Cheap(const v1::Request& request) {
  switch (request.kind_case()) {
    case v1::Request::kBalance: {
      const v1::BalanceRequest& balance = request.balance();
      return balance.lengths_size() <= kMaxItems && balance.num_parts() <= kMaxParts &&
             balance.refine_iterations() <= kMaxRefineIterations;
    }
    case v1::Request::kPlanStep: {
      const v1::PlanStepRequest& step = request.plan_step();
      const std::int64_t per_rank =
          std::max({step.min_micro_batches(), step.micro_batches_multiple_of(),
                    step.pipeline_stages(), std::int64_t{1}});
      return step.lengths_size() <= kMaxItems && step.num_ranks() <= kMaxParts &&
             per_rank <= kMaxMicroBatchesPerRank &&
             std::max<std::int64_t>(step.num_ranks(), 1) * per_rank <= kMaxMicroBatchesTotal &&
             step.refine_iterations() <= kMaxRefineIterations;
    }
    case v1::Request::kReshard:
      return CheapReshard(request.reshard());
    case v1::Request::kSimulate:
      return CheapSimulate(request.simulate());
    default:
      return true;
  }
}

// Every index of [0, n) exactly once in `indices`.
void CheckPermutation(const std::vector<std::int64_t>& indices, std::int64_t n,
                      const v1::Reply& reply) {
  if (static_cast<std::int64_t>(indices.size()) != n) Die("wrong item count", reply.DebugString());
  std::vector<bool> seen(static_cast<std::size_t>(n), false);
  for (const std::int64_t index : indices) {
    if (index < 0 || index >= n || seen[static_cast<std::size_t>(index)]) {
      Die("an index missing or repeated", reply.DebugString());
    }
    seen[static_cast<std::size_t>(index)] = true;
  }
}

void CheckReply(const v1::Request& request, const v1::Reply& reply) {
  if (reply.id() != request.id()) Die("the reply does not echo the id", reply.DebugString());
  if (reply.has_error() && reply.error().code() == v1::ERROR_CODE_INTERNAL) {
    Die("INTERNAL reply", request.DebugString() + "\n" + reply.DebugString());
  }
  std::vector<std::int64_t> indices;
  if (reply.has_balance()) {
    if (reply.balance().parts_size() != request.balance().num_parts()) {
      Die("wrong part count", reply.DebugString());
    }
    for (const v1::Part& part : reply.balance().parts()) {
      indices.insert(indices.end(), part.indices().begin(), part.indices().end());
    }
    CheckPermutation(indices, request.balance().lengths_size(), reply);
  } else if (reply.has_plan_step()) {
    const v1::PlanStepReply& plan = reply.plan_step();
    if (plan.ranks_size() != request.plan_step().num_ranks()) {
      Die("wrong rank count", reply.DebugString());
    }
    for (const v1::RankPlan& rank : plan.ranks()) {
      if (rank.micro_batches_size() != plan.micro_batches()) {
        Die("micro-batch counts differ across ranks", reply.DebugString());
      }
      for (const v1::MicroBatch& batch : rank.micro_batches()) {
        if (batch.tokens() > request.plan_step().max_tokens_per_micro_batch()) {
          Die("a micro-batch above the cap", reply.DebugString());
        }
        indices.insert(indices.end(), batch.indices().begin(), batch.indices().end());
      }
    }
    CheckPermutation(indices, request.plan_step().lengths_size(), reply);
  } else if (reply.has_simulate()) {
    // Conservation in every run, and its staleness policy's promise: strict keeps the
    // bound, admission discards nothing for staleness.
    for (const v1::SimulationRun& run : reply.simulate().runs()) {
      const v1::OrchestratorCounters& c = run.report().counters();
      if (c.admitted() != c.trained() + c.filtered() + c.buffered() + c.queued() + c.in_flight()) {
        Die("a simulation lost samples", run.report().ShortDebugString());
      }
      const v1::OrchestratorOptions& core = run.config().orchestrator();
      const std::int64_t bound = core.mode() == v1::ORCHESTRATOR_MODE_ASYNC ? core.max_staleness()
                                 : core.mode() == v1::ORCHESTRATOR_MODE_ONE_STEP_OFF ? 1
                                                                                     : 0;
      const bool strict = core.staleness_policy() == v1::STALENESS_POLICY_STRICT;
      if (strict && run.report().metrics().max_staleness() > bound) {
        Die("a simulation broke the staleness bound", run.report().ShortDebugString());
      }
      if (!strict && (c.stale_restarts() != 0 || c.stale_discarded_tokens() != 0)) {
        Die("the admission policy discarded tokens", run.report().ShortDebugString());
      }
    }
  } else if (reply.has_reshard()) {
    const v1::ReshardPlan& plan = reply.reshard();
    if (plan.transfers_size() !=
        (request.reshard().include_transfers() ? plan.num_transfers() : 0)) {
      Die("wrong transfer count", plan.ShortDebugString());
    }
    if (plan.bucket_seconds_size() != plan.num_buckets() || plan.trainer_ranks() < 1 ||
        plan.engine_ranks() < 1 || plan.bytes_local() > plan.bytes_received()) {
      Die("inconsistent reshard plan", plan.ShortDebugString());
    }
  }
}

}  // namespace
}  // namespace rlsched::app

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace rlsched::app;   // NOLINT
  using namespace rlsched::wire;  // NOLINT
  using rlsched::v1::Reply;
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // e.g. "invalid UTF-8" on every such frame
    return true;
  }();
  (void)quiet;

  // Chunks of 1 to 13 bytes, so that frames straddle the stream's buffers.
  google::protobuf::io::ArrayInputStream input(data, static_cast<int>(size),
                                               static_cast<int>(size % 13) + 1);
  RequestReader reader(input, WireFormat::kDelimited, kMaxMessageBytes);
  std::string output;
  bool bad_frame = false;
  while (true) {
    RequestReader::Frame frame = reader.Next();
    if (frame.kind == RequestReader::Frame::Kind::kEnd) break;
    if (frame.kind == RequestReader::Frame::Kind::kBadFrame) {
      output += EncodeReply(ErrorReply("", rlsched::v1::ERROR_CODE_BAD_FRAME, frame.error),
                            WireFormat::kDelimited);
      bad_frame = true;
      break;
    }
    (void)DecodeRequest(frame.payload, WireFormat::kJson);  // the JSON parser on the same bytes
    DecodedRequest decoded = DecodeRequest(frame.payload, WireFormat::kDelimited);
    Reply reply;
    if (decoded.error) {
      reply = std::move(*decoded.error);
    } else if (!Cheap(decoded.request)) {
      continue;  // valid or not, too much work for a fuzzer's execution
    } else {
      reply = Solve(decoded.request);
      CheckReply(decoded.request, reply);
    }
    output += EncodeReply(reply, WireFormat::kDelimited);
    (void)EncodeReply(reply, WireFormat::kJson);
  }

  // What the client reads back.
  google::protobuf::io::ArrayInputStream replies(output.data(), static_cast<int>(output.size()));
  Reply last;
  while (true) {
    Reply reply;
    bool clean_eof = false;
    if (!google::protobuf::util::ParseDelimitedFromZeroCopyStream(&reply, &replies, &clean_eof)) {
      if (!clean_eof) Die("the replies do not parse back", "");
      break;
    }
    last = std::move(reply);
  }
  if (bad_frame != (last.error().code() == rlsched::v1::ERROR_CODE_BAD_FRAME)) {
    Die("BAD_FRAME must be the last reply exactly when the stream is bad", last.DebugString());
  }
  return 0;
}
