// rlsched._native — the balancer and the step planner in process (pybind11).
//
// Overview
//   balance() and plan_step() run balance::Balance() and balance::PlanStep() on
//   lengths (and groups) given as Python sequences of ints or numpy integer arrays; a
//   C-contiguous int64 array is read in place, anything else is converted once. The
//   options mirror the daemon's BalanceRequest and PlanStepRequest (the same defaults:
//   0 means 1 for the micro-batch counts, the padding and the pipeline stages; None
//   keeps the library's refinement budget, overhead and count tolerance), with the
//   token cost model (the daemon's default). The GIL is released while solving. Bad
//   input raises ValueError whose message starts with the field ("lengths[3]: must be
//   in [0, 2147483648], got -1") and whose `field` attribute is that path.
//   Built with the wire library (RLSCHED_BUILD_PROGRAM), the module also has
//   Orchestrator (the decision core over rlsched.v1 messages) and solve() (a whole
//   rlsched.v1.Request, as the daemon answers it): wire_bindings.cc; HAS_WIRE says which.
//   quantize_block128() runs rollout::QuantizeBlock128 (fp8 e4m3 in 128 x 128 blocks,
//   the bytes of python/rlsched/weight_sync/executor.py's torch path) on numpy arrays in place: x
//   C-contiguous float32, float16, or 16-bit integers holding bf16 or f16 bits (dtype
//   "bfloat16" or "float16"), into C-contiguous writable codes (uint8, x's shape) and
//   scales (float32, x.shape[:-2] + (ceil(rows / 128), ceil(cols / 128))); ValueError
//   naming the argument otherwise.
//
// Thread-safety: the functions are pure; concurrent calls from threads are safe. An
// int64 array read in place is read without the GIL: another thread must not write it
// during the call (as with numpy's own functions that release the GIL).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rlsched/balance/balance.h"
#include "rlsched/balance/cost_model.h"
#include "rlsched/balance/partition.h"
#include "rlsched/balance/plan_step.h"
#include "rlsched/common/check.h"
#include "rlsched/common/error.h"
#include "rlsched/rollout/quantize.h"
#ifdef RLSCHED_NATIVE_WIRE
#include "wire_bindings.h"
#endif

namespace py = pybind11;

namespace {

using rlsched::FieldError;
namespace balance = rlsched::balance;
using rlsched::CheckAtLeast;
using rlsched::CheckInRange;
using rlsched::CheckRealInRange;
using rlsched::End;
using rlsched::ZeroMeansOne;

// Integers from Python: a view of a C-contiguous int64 array, or an owned copy.
class Int64Input {
 public:
  std::span<const std::int64_t> span() const { return span_; }
  std::int64_t size() const { return static_cast<std::int64_t>(span_.size()); }

  static Int64Input From(const py::handle& object, const std::string& field) {
    Int64Input input;
    if (object.is_none()) return input;
    if (py::isinstance<py::array>(object)) {
      const py::array array = py::reinterpret_borrow<py::array>(object);
      const char kind = array.dtype().kind();
      if (kind != 'i' && kind != 'u' && kind != 'b') {
        throw FieldError(field, "must be integers, got an array of dtype " +
                                    std::string(py::str(array.dtype())));
      }
      if (array.ndim() != 1) {
        throw FieldError(
            field, "must be one-dimensional, got " + std::to_string(array.ndim()) + " dimensions");
      }
      if (kind == 'u' && array.itemsize() == 8) {
        // uint64 values above the int64 range would wrap: check them on a copy.
        const auto values = array.cast<py::array_t<std::uint64_t, py::array::c_style>>();
        for (py::ssize_t i = 0; i < values.size(); ++i) {
          if (values.data()[i] >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
            throw FieldError(field + "[" + std::to_string(i) + "]", "out of the int64 range");
          }
        }
      }
      // No copy when the array is already C-contiguous int64.
      input.array_ =
          py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(array);
      if (!input.array_) throw py::error_already_set();
      input.span_ = {input.array_.data(), static_cast<std::size_t>(input.array_.size())};
      return input;
    }
    py::object values = py::reinterpret_borrow<py::object>(object);
    if (py::hasattr(values, "tolist") && !py::isinstance<py::list>(values)) {
      values = values.attr("tolist")();
    }
    // A list or tuple as it is, any other iterable through a list.
    const py::object fast = py::reinterpret_steal<py::object>(
        PySequence_Fast(values.ptr(), (field + ": must be a sequence of integers").c_str()));
    if (!fast) throw py::error_already_set();
    const std::size_t n = static_cast<std::size_t>(PySequence_Fast_GET_SIZE(fast.ptr()));
    PyObject** items = PySequence_Fast_ITEMS(fast.ptr());
    input.owned_.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      input.owned_[i] = ToInt64(items[i], field, i);
    }
    input.span_ = input.owned_;
    return input;
  }

 private:
  static std::int64_t ToInt64(const py::handle& item, const std::string& field, std::size_t i) {
    PyObject* object = item.ptr();
    if (PyLong_Check(object)) {
      int overflow = 0;
      const long long value = PyLong_AsLongLongAndOverflow(object, &overflow);
      if (overflow != 0) {
        throw FieldError(field + "[" + std::to_string(i) + "]", "out of the int64 range");
      }
      return static_cast<std::int64_t>(value);
    }
    if (PyFloat_Check(object)) {
      // Integral floats are accepted, as by the daemon client; others refused.
      const double value = PyFloat_AS_DOUBLE(object);
      if (std::isfinite(value) && std::trunc(value) == value && value >= -9.2e18 &&
          value <= 9.2e18) {
        return static_cast<std::int64_t>(value);
      }
    } else if (PyIndex_Check(object)) {          // numpy integer scalars
      PyObject* index = PyNumber_Index(object);  // new reference, or null with an error set
      if (index == nullptr) throw py::error_already_set();
      return ToInt64(py::reinterpret_steal<py::object>(index), field, i);
    }
    throw FieldError(field + "[" + std::to_string(i) + "]",
                     "must be an integer, got " + std::string(py::repr(item)));
  }

  py::array_t<std::int64_t> array_;
  std::vector<std::int64_t> owned_;
  std::span<const std::int64_t> span_;
};

// A vector handed to numpy without a copy.
py::array_t<std::int64_t> ToArray(std::vector<std::int64_t>&& values) {
  auto* heap = new std::vector<std::int64_t>(std::move(values));
  const py::capsule owner(heap, [](void* p) { delete static_cast<std::vector<std::int64_t>*>(p); });
  return py::array_t<std::int64_t>(static_cast<py::ssize_t>(heap->size()), heap->data(), owner);
}

void CheckCount(const char* field, std::int64_t value) {
  CheckInRange(field, value, 1, balance::kMaxParts);
}

void CheckGroups(const Int64Input& lengths, const Int64Input& groups, bool keep_groups) {
  if (groups.size() != 0 && groups.size() != lengths.size()) {
    rlsched::Fail("groups", "must be empty or have one entry per length (" +
                                std::to_string(lengths.size()) + "), got " +
                                std::to_string(groups.size()));
  }
  if (keep_groups && groups.size() == 0) {
    rlsched::Fail("keep_groups", "requires groups (one group id per length)");
  }
}

balance::RefineOptions ToRefine(std::optional<std::int64_t> refine_iterations) {
  balance::RefineOptions refine;
  if (refine_iterations) {
    CheckAtLeast("refine_iterations", *refine_iterations, 0);
    refine.enabled = *refine_iterations > 0;
    refine.max_iterations = *refine_iterations;
  }
  return refine;
}

balance::Algorithm ToAlgorithm(const std::string& name) {
  if (name.empty() || name == "karmarkar_karp") return balance::Algorithm::kKarmarkarKarp;
  if (name == "greedy") return balance::Algorithm::kGreedy;
  rlsched::Fail("algorithm", "unknown value '" + name + "'; one of karmarkar_karp, greedy");
}

balance::MicroBatchOrder ToOrder(const std::string& name) {
  if (name.empty() || name == "pipeline") return balance::MicroBatchOrder::kPipeline;
  if (name == "heaviest_first") return balance::MicroBatchOrder::kHeaviestFirst;
  rlsched::Fail("order", "unknown value '" + name + "'; one of pipeline, heaviest_first");
}

balance::OversizePolicy ToOversize(const std::string& name) {
  if (name.empty() || name == "raise") return balance::OversizePolicy::kRaise;
  if (name == "alone") return balance::OversizePolicy::kAlone;
  rlsched::Fail("oversize", "unknown value '" + name + "'; one of raise, alone");
}

py::dict Balance(const py::handle& lengths_object, std::int64_t num_parts, bool equal_size,
                 const py::handle& groups_object, bool keep_groups, const std::string& algorithm,
                 std::optional<std::int64_t> refine_iterations) {
  CheckCount("num_parts", num_parts);
  const Int64Input lengths = Int64Input::From(lengths_object, "lengths");
  const Int64Input groups = Int64Input::From(groups_object, "groups");
  CheckGroups(lengths, groups, keep_groups);
  balance::BalanceOptions options;
  options.partition.num_parts = num_parts;
  options.partition.equal_size = equal_size;
  options.partition.algorithm = ToAlgorithm(algorithm);
  options.partition.refine = ToRefine(refine_iterations);
  options.keep_groups = keep_groups;

  balance::BalanceResult result;
  {
    const py::gil_scoped_release release;
    result = balance::Balance(lengths.span(), groups.span(), options);
  }
  balance::Partition& partition = result.partition;
  py::dict out;
  out["max_cost"] = partition.max_load;
  out["min_cost"] = partition.min_load;
  out["lower_bound"] = partition.lower_bound;
  out["gap"] = partition.gap;
  out["proven_optimal"] = partition.proven_optimal;
  out["offsets"] = ToArray(std::move(partition.offsets));
  out["indices"] = ToArray(std::move(partition.indices));
  out["costs"] = ToArray(std::move(partition.loads));
  out["tokens"] = ToArray(std::move(result.tokens));
  return out;
}

// Indices as a list of Python ints.
py::list IntList(std::span<const std::int64_t> values) {
  py::list list(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    PyObject* value = PyLong_FromLongLong(static_cast<long long>(values[i]));
    if (value == nullptr) throw py::error_already_set();
    PyList_SET_ITEM(list.ptr(), static_cast<py::ssize_t>(i), value);  // steals
  }
  return list;
}

// The parts of `partition` as lists of Python ints (ascending).
py::list ToLists(const balance::Partition& partition) {
  py::list parts(static_cast<std::size_t>(partition.num_parts()));
  for (std::int64_t p = 0; p < partition.num_parts(); ++p) {
    PyList_SET_ITEM(parts.ptr(), static_cast<py::ssize_t>(p),
                    IntList(partition.part(p)).release().ptr());
  }
  return parts;
}

// Balance() with the token cost and the default options, answered as verl's
// get_seqlen_balanced_partitions answers: num_parts lists of indices (ascending).
py::list Partitions(const py::handle& lengths_object, std::int64_t num_parts, bool equal_size) {
  CheckCount("num_parts", num_parts);
  const Int64Input lengths = Int64Input::From(lengths_object, "lengths");
  balance::BalanceOptions options;
  options.partition.num_parts = num_parts;
  options.partition.equal_size = equal_size;
  balance::BalanceResult result;
  {
    const py::gil_scoped_release release;
    result = balance::Balance(lengths.span(), {}, options);
  }
  return ToLists(result.partition);
}

// PartitionItems() on raw weights (no cost model), answered as Partitions(): for the
// frameworks' balancers that pass their own workloads (e.g. a FLOP estimate per
// sequence), which may exceed a length's bound. Each weight >= 0, their sum within
// int64. exact_nodes: the exact search's node budget (None: the library's default; 0:
// no exact search, KK + LPT + refinement alone).
py::list PartitionWeights(const py::handle& weights_object, std::int64_t num_parts, bool equal_size,
                          const std::optional<std::int64_t>& exact_nodes) {
  CheckCount("num_parts", num_parts);
  const Int64Input weights = Int64Input::From(weights_object, "weights");
  balance::PartitionOptions options;
  options.num_parts = num_parts;
  options.equal_size = equal_size;
  if (exact_nodes) {
    CheckAtLeast("exact_nodes", *exact_nodes, 0);
    options.exact.max_nodes = *exact_nodes;
  }
  balance::Partition partition;
  {
    // PartitionItems() checks the weights (field "weights[i]", the total).
    const py::gil_scoped_release release;
    partition = balance::PartitionItems(weights.span(), options);
  }
  return ToLists(partition);
}

py::dict ToDict(const balance::StepPlan& plan) {
  py::list ranks;
  for (const balance::RankPlan& rank : plan.ranks) {
    py::list micro_batches;
    for (const balance::MicroBatch& batch : rank.micro_batches) {
      micro_batches.append(
          py::make_tuple(py::cast(batch.indices), batch.tokens, batch.cost, batch.unpadded_tokens));
    }
    ranks.append(py::make_tuple(std::move(micro_batches), rank.tokens, rank.cost, rank.time,
                                rank.sequences, rank.unpadded_tokens));
  }
  py::dict out;
  out["ranks"] = std::move(ranks);
  out["micro_batches"] = plan.num_micro_batches;
  out["predicted_step_time"] = plan.predicted_step_time;
  out["lower_bound"] = plan.lower_bound;
  out["cap_violations"] = plan.cap_violations;
  out["overhead"] = plan.overhead;
  out["sequences"] = plan.sequences;
  out["tokens"] = plan.tokens;
  out["unpadded_tokens"] = plan.unpadded_tokens;
  out["empty_micro_batches"] = plan.empty_micro_batches;
  out["empty_ranks"] = plan.empty_ranks;
  out["oversized"] = plan.oversized;
  return out;
}

// PlanStep()'s options from the module's arguments (see plan_step's docstring).
balance::StepOptions StepOptionsFrom(
    std::int64_t num_ranks, std::int64_t max_token_len, bool equal_size, bool keep_groups,
    std::int64_t min_micro_batches, std::int64_t micro_batches_multiple_of,
    std::int64_t pad_to_multiple_of, std::int64_t pipeline_stages,
    std::optional<std::int64_t> overhead, std::optional<double> count_tolerance,
    const std::string& order, std::optional<std::int64_t> refine_iterations,
    const std::string& oversize, bool baseline) {
  CheckCount("num_ranks", num_ranks);
  balance::StepOptions options;
  options.num_ranks = num_ranks;
  options.equal_size = equal_size;
  options.keep_groups = keep_groups;
  options.baseline = baseline;
  balance::MicroBatchOptions& micro_batch = options.micro_batch;
  micro_batch.max_tokens_per_micro_batch = CheckAtLeast("max_token_len", max_token_len, 1);
  micro_batch.min_micro_batches =
      ZeroMeansOne("min_micro_batches", min_micro_batches, balance::kMaxParts);
  micro_batch.micro_batches_multiple_of =
      ZeroMeansOne("micro_batches_multiple_of", micro_batches_multiple_of, balance::kMaxParts);
  micro_batch.pad_to_multiple_of = ZeroMeansOne("pad_to_multiple_of", pad_to_multiple_of,
                                                std::numeric_limits<std::int64_t>::max());
  micro_batch.pipeline_stages =
      ZeroMeansOne("pipeline_model_parallel_size", pipeline_stages, balance::kMaxParts);
  if (overhead) micro_batch.overhead = CheckAtLeast("overhead", *overhead, 0);
  if (count_tolerance) {
    micro_batch.count_tolerance =
        CheckRealInRange("count_tolerance", *count_tolerance, 0.0, End::kClosed, 1.0, End::kClosed);
  }
  micro_batch.order = ToOrder(order);
  micro_batch.oversize = ToOversize(oversize);
  micro_batch.refine = ToRefine(refine_iterations);
  return options;
}

// PlanStep() on Python lengths and groups, the GIL released while it solves.
balance::PlannedStep SolveStep(const py::handle& lengths_object, const py::handle& groups_object,
                               const balance::StepOptions& options) {
  const Int64Input lengths = Int64Input::From(lengths_object, "lengths");
  const Int64Input groups = Int64Input::From(groups_object, "groups");
  CheckGroups(lengths, groups, options.keep_groups);
  const py::gil_scoped_release release;
  return balance::PlanStep(lengths.span(), groups.span(), options);
}

py::dict PlanStep(const py::handle& lengths_object, std::int64_t num_ranks,
                  std::int64_t max_token_len, const py::handle& groups_object, bool equal_size,
                  bool keep_groups, std::int64_t min_micro_batches,
                  std::int64_t micro_batches_multiple_of, std::int64_t pad_to_multiple_of,
                  std::int64_t pipeline_stages, std::optional<std::int64_t> overhead,
                  std::optional<double> count_tolerance, const std::string& order,
                  std::optional<std::int64_t> refine_iterations, const std::string& oversize,
                  bool baseline) {
  const balance::StepOptions options =
      StepOptionsFrom(num_ranks, max_token_len, equal_size, keep_groups, min_micro_batches,
                      micro_batches_multiple_of, pad_to_multiple_of, pipeline_stages, overhead,
                      count_tolerance, order, refine_iterations, oversize, baseline);
  const balance::PlannedStep step = SolveStep(lengths_object, groups_object, options);
  py::dict out = ToDict(step.plan);
  py::dict recipe;
  recipe["predicted_step_time"] = step.baseline.predicted_step_time;
  recipe["cap_violations"] = step.baseline.cap_violations;
  recipe["micro_batches"] = step.baseline.num_micro_batches;
  recipe["empty_micro_batches"] = step.baseline.empty_micro_batches;
  out["baseline"] = std::move(recipe);
  return out;
}

// PlanStep() answered with its indices alone: (plan, micro_batches, empty_micro_batches),
// plan[r][k] the ascending indices of rank r's k-th micro-batch, in execution order.
py::tuple PlanStepIndices(const py::handle& lengths_object, std::int64_t num_ranks,
                          std::int64_t max_token_len, const py::handle& groups_object,
                          bool equal_size, bool keep_groups, std::int64_t min_micro_batches,
                          std::int64_t micro_batches_multiple_of, std::int64_t pad_to_multiple_of,
                          std::int64_t pipeline_stages, std::optional<std::int64_t> overhead,
                          std::optional<double> count_tolerance, const std::string& order,
                          std::optional<std::int64_t> refine_iterations,
                          const std::string& oversize,
                          std::optional<std::pair<double, double>> attention) {
  balance::StepOptions options =
      StepOptionsFrom(num_ranks, max_token_len, equal_size, keep_groups, min_micro_batches,
                      micro_batches_multiple_of, pad_to_multiple_of, pipeline_stages, overhead,
                      count_tolerance, order, refine_iterations, oversize, false);
  if (attention) {
    options.micro_batch.cost =
        balance::CostModel::Attention(attention->first, attention->second, 0.0);
  }
  const balance::PlannedStep step = SolveStep(lengths_object, groups_object, options);
  py::list ranks(step.plan.ranks.size());
  for (std::size_t r = 0; r < step.plan.ranks.size(); ++r) {
    const std::vector<balance::MicroBatch>& batches = step.plan.ranks[r].micro_batches;
    py::list rank(batches.size());
    for (std::size_t k = 0; k < batches.size(); ++k) {
      PyList_SET_ITEM(rank.ptr(), static_cast<py::ssize_t>(k),
                      IntList(batches[k].indices).release().ptr());
    }
    PyList_SET_ITEM(ranks.ptr(), static_cast<py::ssize_t>(r), rank.release().ptr());
  }
  return py::make_tuple(std::move(ranks), step.plan.num_micro_batches,
                        step.plan.empty_micro_batches);
}

// The library's own time for Balance() on these lengths (token cost, the default
// options): `repeats` calls timed in C++ around Balance() alone, in seconds; the
// reference of benchmarks/native_vs_library.py.
std::vector<double> TimeBalance(const py::handle& lengths_object, std::int64_t num_parts,
                                bool equal_size, std::int64_t repeats) {
  CheckCount("num_parts", num_parts);
  CheckAtLeast("repeats", repeats, 1);
  const Int64Input lengths = Int64Input::From(lengths_object, "lengths");
  balance::BalanceOptions options;
  options.partition.num_parts = num_parts;
  options.partition.equal_size = equal_size;
  std::vector<double> seconds;
  const py::gil_scoped_release release;
  for (std::int64_t i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    const balance::BalanceResult result = balance::Balance(lengths.span(), {}, options);
    const auto stop = std::chrono::steady_clock::now();
    if (result.partition.num_parts() != num_parts) throw std::logic_error("bad partition");
    seconds.push_back(std::chrono::duration<double>(stop - start).count());
  }
  return seconds;
}

// The shape of an array as text: "(2, 3)".
std::string ShapeText(const std::vector<py::ssize_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

// A dtype as numpy prints it ("float32", ">f4").
std::string DtypeText(const py::dtype& dtype) { return py::str(py::object(dtype)); }

// An output array of quantize_block128: C-contiguous, writable, of `dtype` and `shape`.
void CheckOutput(const py::array& array, const char* field, const py::dtype& dtype,
                 const std::vector<py::ssize_t>& shape) {
  if (!array.dtype().equal(dtype)) {
    rlsched::Fail(field, "must be an array of dtype " + DtypeText(dtype) + ", got " +
                             DtypeText(array.dtype()));
  }
  const std::vector<py::ssize_t> got(array.shape(), array.shape() + array.ndim());
  if (got != shape) {
    rlsched::Fail(field, "must have shape " + ShapeText(shape) + ", got " + ShapeText(got));
  }
  if ((array.flags() & py::array::c_style) == 0) rlsched::Fail(field, "must be C-contiguous");
  if (!array.writeable()) rlsched::Fail(field, "must be writable");
}

// rollout::QuantizeBlock128 on numpy arrays, in place (see the overview).
void QuantizeBlock128(const py::array& x, const py::array& codes, const py::array& scales,
                      const std::optional<std::string>& dtype) {
  namespace rollout = rlsched::rollout;
  rollout::ElementType type = rollout::ElementType::kF32;
  const py::dtype x_dtype = x.dtype();
  const std::string name = dtype.value_or("");
  // Native byte order only (dtype equality).
  if (x_dtype.equal(py::dtype::of<float>()) && (name.empty() || name == "float32")) {
    type = rollout::ElementType::kF32;
  } else if (x_dtype.equal(py::dtype("float16")) && (name.empty() || name == "float16")) {
    type = rollout::ElementType::kF16;
  } else if ((x_dtype.equal(py::dtype::of<std::int16_t>()) ||
              x_dtype.equal(py::dtype::of<std::uint16_t>())) &&
             (name == "bfloat16" || name == "float16")) {
    type = name == "bfloat16" ? rollout::ElementType::kBf16 : rollout::ElementType::kF16;
  } else if (!name.empty() && name != "bfloat16" && name != "float16" && name != "float32") {
    rlsched::Fail("dtype", "unknown value '" + name + "'; one of bfloat16, float16, float32");
  } else {
    rlsched::Fail("x",
                  "must be float32, float16, or int16 or uint16 with dtype 'bfloat16' or "
                  "'float16' (native byte order), got " +
                      DtypeText(x_dtype) +
                      (name.empty() ? std::string() : " with dtype '" + name + "'"));
  }
  if (x.ndim() < 2) {
    rlsched::Fail("x", "must have at least 2 dimensions, got " + std::to_string(x.ndim()));
  }
  if ((x.flags() & py::array::c_style) == 0) rlsched::Fail("x", "must be C-contiguous");
  const std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim());
  const std::int64_t rows = shape[shape.size() - 2], cols = shape.back();
  std::int64_t matrices = 1;
  for (std::size_t d = 0; d + 2 < shape.size(); ++d) matrices *= shape[d];
  std::vector<py::ssize_t> scale_shape(shape.begin(), shape.end() - 2);
  scale_shape.push_back(rollout::Fp8Blocks(rows));
  scale_shape.push_back(rollout::Fp8Blocks(cols));
  CheckOutput(codes, "codes", py::dtype::of<std::uint8_t>(), shape);
  CheckOutput(scales, "scales", py::dtype::of<float>(), scale_shape);
  // The three are C-contiguous: each is one byte range, and the loops assume that no two
  // of them share memory.
  const auto range = [](const py::array& a) {
    const auto begin = reinterpret_cast<std::uintptr_t>(a.data());
    return std::pair{begin, begin + static_cast<std::uintptr_t>(a.nbytes())};
  };
  const auto overlap = [&](const py::array& a, const py::array& b) {
    const auto [a0, a1] = range(a);
    const auto [b0, b1] = range(b);
    return a0 < b1 && b0 < a1;
  };
  if (overlap(x, codes)) rlsched::Fail("codes", "must not share memory with x");
  if (overlap(x, scales)) rlsched::Fail("scales", "must not share memory with x");
  if (overlap(codes, scales)) rlsched::Fail("scales", "must not share memory with codes");
  const void* in = x.data();
  auto* out_codes = static_cast<std::uint8_t*>(const_cast<void*>(codes.data()));
  auto* out_scales = static_cast<float*>(const_cast<void*>(scales.data()));
  const py::gil_scoped_release release;
  rollout::QuantizeBlock128(in, type, matrices, rows, cols, out_codes, out_scales);
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() =
      "rlsched in process: the balancer, the step planner and the fp8 quantiser (see "
      "python/native/module.cc)";
  m.attr("__version__") = RLSCHED_VERSION;

  // FieldError (and any std::invalid_argument) -> ValueError with a `field` attribute.
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const FieldError& error) {
      py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError)(error.what());
      value_error.attr("field") = error.field();
      PyErr_SetObject(PyExc_ValueError, value_error.ptr());
    } catch (const std::invalid_argument& error) {
      py::object value_error = py::reinterpret_borrow<py::object>(PyExc_ValueError)(error.what());
      value_error.attr("field") = "";
      PyErr_SetObject(PyExc_ValueError, value_error.ptr());
    }
  });

  m.def("balance", &Balance, py::arg("lengths"), py::arg("num_parts"),
        py::arg("equal_size") = false, py::arg("groups") = py::none(),
        py::arg("keep_groups") = false, py::arg("algorithm") = "",
        py::arg("refine_iterations") = py::none(),
        "Balance(): lengths into num_parts parts (token cost). Returns a dict: offsets, "
        "indices (part p is indices[offsets[p]:offsets[p+1]], ascending), costs, tokens, "
        "max_cost, min_cost, lower_bound, gap, proven_optimal.");
  m.def("partitions", &Partitions, py::arg("lengths"), py::arg("num_parts"),
        py::arg("equal_size") = false,
        "Balance() (token cost) as lists: num_parts lists of ascending indices, as "
        "get_seqlen_balanced_partitions returns them.");
  m.def("partition_weights", &PartitionWeights, py::arg("weights"), py::arg("num_parts"),
        py::arg("equal_size") = false, py::arg("exact_nodes") = py::none(),
        "PartitionItems() on raw weights (each >= 0, the sum within int64; no cost model): "
        "num_parts lists of ascending indices, as partitions() returns them. exact_nodes: "
        "the exact search's node budget (None: the default; 0: none).");
  m.def("plan_step", &PlanStep, py::arg("lengths"), py::arg("num_ranks"), py::arg("max_token_len"),
        py::arg("groups") = py::none(), py::arg("equal_size") = false,
        py::arg("keep_groups") = false, py::arg("min_micro_batches") = 0,
        py::arg("micro_batches_multiple_of") = 0, py::arg("pad_to_multiple_of") = 0,
        py::arg("pipeline_model_parallel_size") = 0, py::arg("overhead") = py::none(),
        py::arg("count_tolerance") = py::none(), py::arg("order") = "",
        py::arg("refine_iterations") = py::none(), py::arg("oversize") = "",
        py::arg("baseline") = true,
        "PlanStep(): a whole step (token cost; oversize: raise or alone; baseline: false "
        "leaves the common recipe's figures zero). Returns a dict: ranks "
        "(each a tuple of "
        "micro_batches [(indices, tokens, cost, unpadded_tokens)], tokens, cost, time, "
        "sequences, unpadded_tokens), micro_batches, predicted_step_time, lower_bound, "
        "overhead, sequences, tokens, unpadded_tokens, empty_micro_batches, empty_ranks, "
        "oversized, baseline (a dict).");
  m.def("plan_step_indices", &PlanStepIndices, py::arg("lengths"), py::arg("num_ranks"),
        py::arg("max_token_len"), py::arg("groups") = py::none(), py::arg("equal_size") = false,
        py::arg("keep_groups") = false, py::arg("min_micro_batches") = 0,
        py::arg("micro_batches_multiple_of") = 0, py::arg("pad_to_multiple_of") = 0,
        py::arg("pipeline_model_parallel_size") = 0, py::arg("overhead") = py::none(),
        py::arg("count_tolerance") = py::none(), py::arg("order") = "",
        py::arg("refine_iterations") = py::none(), py::arg("oversize") = "",
        py::arg("attention") = py::none(),
        "plan_step() (without the baseline) answered with its indices alone: a tuple (plan, "
        "micro_batches, empty_micro_batches), plan[r][k] the ascending indices of rank r's "
        "k-th micro-batch in execution order, as lists of ints. attention: None (the token "
        "cost) or (linear, quadratic), the attention cost with those coefficients.");
  m.def("_time_balance", &TimeBalance, py::arg("lengths"), py::arg("num_parts"),
        py::arg("equal_size") = false, py::arg("repeats") = 1,
        "Seconds of each of `repeats` Balance() calls timed in C++ (for the benchmark).");

  m.def("quantize_block128", &QuantizeBlock128, py::arg("x"), py::arg("codes"), py::arg("scales"),
        py::arg("dtype") = py::none(),
        "fp8 e4m3 in 128 x 128 blocks of x's last two dims (rollout::QuantizeBlock128), in "
        "place: x C-contiguous float32, float16, or int16/uint16 holding bf16 (dtype="
        "'bfloat16') or f16 (dtype='float16') bits; codes uint8 of x's shape, scales float32 "
        "of x.shape[:-2] + (ceil(rows / 128), ceil(cols / 128)), both C-contiguous and "
        "writable. The bytes of rlsched.weight_sync.executor's torch path. The GIL is released.");

  // The decision core and solve() (wire_bindings.cc), when the wire library was built.
#ifdef RLSCHED_NATIVE_WIRE
  rlsched::python::RegisterWire(m);
#else
  m.attr("HAS_WIRE") = false;
#endif
}
