// simulate_command.h — `rlsched simulate`: run the rollout/train simulator.
//
// Overview
//   Builds a rlsched.v1.SimulateRequest from a JSON config (--config FILE, the
//   rlsched.v1.SimulatorConfig in protobuf's JSON mapping; unset fields keep
//   DefaultSimulatorConfig()'s values) and the flags (a flag given explicitly
//   overrides the file), answers it with SolveSimulate() — the daemon's path — and
//   prints a summary: the workload, the throughput against the ideal bound
//   (min(engine capacity, trainer capacity) in samples/s), idle ratios, weight syncs,
//   partial rollouts, restarts, the counters and the staleness histogram. --compare
//   runs the comparison set (colocated sync on the same GPUs when they divide into
//   engines of --gpus-per-engine and ranks of --gpus-per-trainer-rank, else a note
//   says why not; sync; one_step_off; async s = 1 and s = 2, each with and without
//   partial rollout) on the same workload and seed and prints one table.
//   --json prints the SimulateReply on one line instead (never the trace). --trace
//   FILE writes the Chrome trace JSON (opens in Perfetto) of the run, or with
//   --compare of the run --trace-run names (default async_s1_partial; --trace-run
//   needs --compare and --trace).
//
//   No option is accepted and ignored. --max-staleness, --partial-rollout /
//   --no-partial-rollout, --staleness-policy and --staleness-fraction are async
//   mode's: given without a mode (here or in the file) they select async (where
//   partial rollout is on unless turned off; --staleness-fraction selects the
//   fraction policy too); with sync or one_step_off (staleness 0 and 1, never
//   interrupting a generation) any other value is refused, naming the flag.
//   --colocated is sync's: it selects sync, --mode async or one_step_off refuse it,
//   and async's flags then state sync's values or are refused. --staleness-fraction
//   is refused with the admission or strict policy and with --max-staleness (α
//   bounds the staleness). The rule is ToSimulatorConfig()'s (simulate_convert.h),
//   so it holds for the file and the flags combined; --compare refuses the mode
//   flags (it sets them per run), --release-seconds and --resume-seconds need a
//   colocated run (--colocated, or --compare's colocated_sync), and
//   --filter-all-equal needs --all-equal-rate > 0.
//
//   Speeds in users' units: --engine-tokens-per-second SINGLE,FULL sets the engine
//   model's decode time from tokens/s (one sample alone, and --engine-concurrency
//   samples together), --train-seconds-per-step the trainer's cost unit from its mean
//   seconds per step; each overrides the file's engine.decode_* and
//   seconds_per_cost_unit. The summary prints both speeds back (the decode speed from
//   the engine model, the mean seconds per step of the run).
//
//   --lengths FILE reads response lengths as `rlsched balance` reads its input
//   (lengths_reader.h): plain integers, or a CSV with a header. For a CSV with a
//   `response_tokens` column that column alone gives the response lengths (prompt
//   lengths stay the config's uniform range); otherwise the reader's length (the
//   `length` or `tokens` column). Every length must be >= 1.
//
// Example
//   CLI::App app;
//   rlsched::app::SimulateArgs args;
//   CLI::App* simulate = rlsched::app::AddSimulateCommand(app, args);
//   app.parse(argc, argv);
//   if (simulate->parsed()) rlsched::app::RunSimulateCommand(args, std::cout);
//
// Thread-safety: RunSimulateCommand() touches no global state besides logging.

#ifndef RLSCHED_APP_SIMULATE_COMMAND_H_
#define RLSCHED_APP_SIMULATE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "rlsched/v1/orchestrator.pb.h"

namespace rlsched::app {

// The options of `rlsched simulate`. Unset optionals were not given.
struct SimulateArgs {
  std::string config;               // --config FILE; empty: none
  std::optional<std::string> mode;  // "sync", "one_step_off" or "async"
  std::optional<std::int64_t> max_staleness;
  std::optional<bool> partial_rollout;          // --partial-rollout[=BOOL], --no-partial-rollout
  std::optional<std::string> pause_mode;        // "keep" or "abort"
  std::optional<std::string> staleness_policy;  // "admission", "fraction" or "strict"
  std::optional<double> staleness_fraction;     // α of the fraction policy
  std::optional<std::int64_t> train_calls_per_sync;
  bool colocated = false;
  std::optional<double> release_seconds;
  std::optional<double> resume_seconds;
  std::optional<double> oversample;
  std::optional<std::int64_t> engines;
  std::optional<std::int64_t> engine_concurrency;
  std::optional<std::int64_t> engine_kv_cache_tokens;
  std::optional<double> trainer_scaling_exponent;
  std::optional<std::int64_t> trainer_reference_ranks;
  std::optional<double> trainer_offload_seconds;
  std::string engine_tokens_per_second;  // --engine-tokens-per-second SINGLE,FULL; empty: none
  std::optional<std::int64_t> gpus_per_engine;
  std::optional<std::int64_t> trainer_ranks;
  std::optional<std::int64_t> gpus_per_trainer_rank;
  std::optional<double> train_seconds_per_step;
  std::optional<double> train_call_overhead_seconds;
  std::optional<std::int64_t> prompts_per_step;
  std::optional<std::int64_t> samples_per_prompt;
  std::optional<std::int64_t> steps;
  std::string lengths;      // --lengths FILE; empty: none
  std::string length_dist;  // --length-dist lognormal:MU,SIGMA,MAX; empty: none
  std::optional<double> all_equal_rate;
  bool filter_all_equal = false;
  std::string dispatch;      // longest-first | arrival; empty: the config's
  std::string engine_split;  // load | even; empty: the config's
  std::optional<std::int64_t> max_generating_groups;
  std::optional<std::int64_t> warmup_steps;
  std::optional<std::uint64_t> seed;
  std::optional<double> weight_sync_seconds;
  std::optional<double> mtbf;
  std::optional<std::int64_t> max_events;
  bool compare = false;
  std::string trace;      // --trace FILE; empty: none
  std::string trace_run;  // --trace-run NAME (with --compare); empty: async_s1_partial
  bool json = false;
  std::string calibrate;   // --calibrate FILE; empty: simulate
  std::string config_out;  // --config-out FILE (with --calibrate)
};

// Adds the `simulate` subcommand to `app`, writing into `args` (which must outlive
// the parse). Returns the subcommand.
CLI::App* AddSimulateCommand(CLI::App& app, SimulateArgs& args);

// The lognormal of a --length-dist value "lognormal:MU,SIGMA,MAX" (MU finite, SIGMA
// finite and >= 0, MAX an integer in [1, 2^31]). Throws std::invalid_argument naming
// --length-dist and the bound.
v1::LengthDistribution ParseLengthDist(std::string_view text);

// The decode speed of an --engine-tokens-per-second value "SINGLE,FULL" (two finite
// reals > 0; their bounds against each other and max_concurrent are the converter's).
// Throws std::invalid_argument naming --engine-tokens-per-second.
v1::DecodeSpeed ParseEngineTokensPerSecond(std::string_view text);

// Response lengths from text in --lengths' formats (see the file comment). Throws
// std::invalid_argument naming the line and the bound ("line 3: …"), or "no lengths".
std::vector<std::int64_t> ParseResponseLengths(std::string_view text);
// The same from a stream (a --lengths file), read line by line.
std::vector<std::int64_t> ReadResponseLengths(std::istream& in);

// The request `args` ask for: the --config file's config (`config_json`, empty for
// none) with the flags written over it, and the lengths of --lengths
// (`response_lengths`, empty for none). Throws std::invalid_argument naming the option
// (or "--config FILE" for JSON that is not a SimulatorConfig).
v1::SimulateRequest MakeSimulateRequest(const SimulateArgs& args, std::string_view config_json,
                                        const std::vector<std::int64_t>& response_lengths);

// Runs the command: reads --config and --lengths, simulates, writes the summary or
// the comparison table (or the JSON line) to `out` and the trace file when asked.
// Throws std::invalid_argument for bad input or options (the message names the
// option, or "--config FILE" and the field, and the bound), std::runtime_error when
// writing fails.
void RunSimulateCommand(const SimulateArgs& args, std::ostream& out);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_SIMULATE_COMMAND_H_
