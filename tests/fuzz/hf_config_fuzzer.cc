// hf_config_fuzzer.cc — libFuzzer target over the Hugging Face config.json reader:
// the input is the text of a config.json as `rlsched reshard --model` and the
// daemon's model_config_json pass it to rollout::ParseHfConfig().
//
// Checked beyond the sanitizers and libFuzzer's -rss_limit_mb / -timeout (the reader
// must take O(text) time and memory whatever the numbers in it say): the only
// exception is rlsched::FieldError, with a field that names the config ("config" or
// "config.<key>"); a config that parses passes Validate(), stays within
// kMaxFullTensors and kMaxModelBytes, and its layer rules agree with NumMoeLayers().
// When the model is small, HfTensors() lists exactly SizeOf()'s tensors and bytes, and
// a small plan (1 trainer GPU and 1 engine GPU, or 2 and 2) is refused with a
// FieldError or planned within EstimateTransfers().
//
// Run: see tests/fuzz/CMakeLists.txt.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/common/error.h"
#include "rlsched/rollout/model.h"
#include "rlsched/rollout/plan.h"

namespace rlsched::rollout {
namespace {

// Models small enough to list and plan on every execution.
constexpr double kMaxListedTensors = 4096;
constexpr double kMaxPlannedBytes = 64 << 20;
constexpr std::int64_t kMaxCheckedLayers = 4096;

[[noreturn]] void Die(const char* what, const std::string& detail) {
  std::fprintf(stderr, "hf_config_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

void CheckField(const FieldError& e) {
  const std::string& field = e.field();
  if (field != "config" && !field.starts_with("config.") && !field.starts_with("train.") &&
      !field.starts_with("infer.") && field != "bucket_bytes") {
    Die("an error without a config field", e.what());
  }
}

void Plan(const ModelConfig& m, std::int64_t gpus) {
  ReshardOptions o;
  o.train = {.tp = gpus};
  o.infer = {.tp = gpus};
  o.bucket_bytes = std::int64_t{1} << 20;
  try {
    const TransferEstimate estimate = EstimateTransfers(m, o);
    const ReshardPlan plan = PlanReshard(m, o);
    if (static_cast<double>(plan.transfers.size()) > estimate.transfers) {
      Die("more transfers than estimated",
          std::to_string(plan.transfers.size()) + " > " + std::to_string(estimate.transfers));
    }
  } catch (const FieldError& e) {
    CheckField(e);
  }
}

void Check(std::string_view text) {
  ModelConfig m;
  try {
    m = ParseHfConfig(text);
  } catch (const FieldError& e) {
    CheckField(e);
    return;
  }
  Validate(m);  // what ParseHfConfig() returns is valid
  const ModelSize size = SizeOf(m);
  if (size.tensors > static_cast<double>(kMaxFullTensors) || size.bytes > kMaxModelBytes) {
    Die("a model above the limits parsed", std::to_string(size.tensors));
  }
  if (m.num_layers <= kMaxCheckedLayers) {
    std::int64_t moe = 0;
    for (std::int64_t i = 0; i < m.num_layers; ++i) moe += m.IsMoeLayer(i) ? 1 : 0;
    if (moe != m.NumMoeLayers()) Die("NumMoeLayers() disagrees with IsMoeLayer()", "");
  }
  if (size.tensors > kMaxListedTensors) return;
  const std::vector<FullTensor> tensors = HfTensors(m);
  double bytes = 0.0;
  for (const FullTensor& t : tensors) bytes += static_cast<double>(t.Bytes());
  if (static_cast<double>(tensors.size()) != size.tensors || bytes != size.bytes) {
    Die("SizeOf() disagrees with HfTensors()", std::to_string(tensors.size()));
  }
  if (size.bytes > kMaxPlannedBytes) return;
  Plan(m, 1);
  Plan(m, 2);
}

}  // namespace
}  // namespace rlsched::rollout

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  rlsched::rollout::Check(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
