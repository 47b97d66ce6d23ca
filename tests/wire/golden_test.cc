// Golden digests: the replies to a few fixed requests of every kind, hashed. The other
// tests check determinism within one process; these catch a change of output across
// processes, compilers and machines. A digest that changes on purpose (a better plan, a
// new reply field) is updated here, with the reason in the commit message.

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "rlsched/wire/solve.h"
#include "serve_test_util.h"

namespace rlsched::wire {
namespace {

using namespace ::rlsched::wire::testing;  // NOLINT: the test helpers

// FNV-1a, 64 bits, of the reply's deterministic serialization.
std::uint64_t Digest(const v1::Reply& reply) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    reply.SerializeToCodedStream(&coded);
  }
  std::uint64_t h = 14695981039346656037ULL;
  for (const char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ULL;
  }
  return h;
}

// 2,000 heavy-tailed lengths from a fixed formula (no random generator involved).
std::vector<std::int64_t> Lengths() {
  std::vector<std::int64_t> lengths;
  for (std::int64_t i = 0; i < 2000; ++i) {
    const std::int64_t base = 50 + (i * 7919) % 1021;
    lengths.push_back(i % 97 == 0 ? base * 20 : i % 13 == 0 ? base * 5 : base);
  }
  return lengths;
}

void ExpectDigest(const v1::Request& request, std::uint64_t expected) {
  const v1::Reply reply = Solve(request);
  ASSERT_FALSE(reply.has_error()) << reply.error().message();
  const std::uint64_t digest = Digest(reply);
  char hex[32];
  std::snprintf(hex, sizeof hex, "0x%016llxULL", static_cast<unsigned long long>(digest));
  EXPECT_EQ(digest, expected) << "request " << request.id() << ": the reply changed; digest now "
                              << hex << " (update it if the change is meant)";
}

v1::Request BalanceOf(std::string id, std::int64_t parts, bool equal_size) {
  v1::Request request;
  request.set_id(std::move(id));
  const std::vector<std::int64_t> lengths = Lengths();
  request.mutable_balance()->mutable_lengths()->Add(lengths.begin(), lengths.end());
  request.mutable_balance()->set_num_parts(parts);
  request.mutable_balance()->set_equal_size(equal_size);
  return request;
}

TEST(GoldenTest, Balance) {
  ExpectDigest(BalanceOf("balance", 16, false), 0x8f17054c28cd229bULL);
  ExpectDigest(BalanceOf("balance-equal", 64, true), 0x935fd44f2027d462ULL);
}

TEST(GoldenTest, PlanStep) {
  v1::Request request;
  request.set_id("plan-step");
  const std::vector<std::int64_t> lengths = Lengths();
  v1::PlanStepRequest* step = request.mutable_plan_step();
  step->mutable_lengths()->Add(lengths.begin(), lengths.end());
  step->set_num_ranks(8);
  step->set_max_tokens_per_micro_batch(32768);
  step->set_pipeline_stages(2);
  ExpectDigest(request, 0x635a150d4045222dULL);
}

TEST(GoldenTest, Reshard) {
  v1::Request request = Reshard("reshard", kTinyLlamaConfig, 2, 2, 2, 4, 2);
  request.mutable_reshard()->set_include_transfers(true);
  ExpectDigest(request, 0x24363a64aeff0d6bULL);  // + the layouts the plan was made for
}

TEST(GoldenTest, Simulate) {
  v1::Request request;
  request.set_id("simulate");
  v1::SimulatorConfig* config = request.mutable_simulate()->mutable_config();
  config->set_steps(3);
  config->set_engines(4);
  config->mutable_engine()->set_max_concurrent(16);
  config->set_trainer_ranks(4);
  config->mutable_orchestrator()->set_mode(v1::ORCHESTRATOR_MODE_ASYNC);
  config->mutable_orchestrator()->set_prompts_per_step(16);
  config->mutable_orchestrator()->set_samples_per_prompt(4);
  config->mutable_lengths()->set_max_tokens(2048);
  config->set_seed(7);
  // + the echoed max_generating_groups, then pause_mode, then max_response_tokens, then the
  // per-step metrics (generation, training, switch, steady state), warmup_steps and the
  // echoed engine.kv_cache_tokens and trainer_scaling_exponent, _reference_ranks, _offload_seconds;
  // then the per-step figures over the steps after the warm-up
  ExpectDigest(request, 0x3199b8b0736e2b2fULL);
}

}  // namespace
}  // namespace rlsched::wire
