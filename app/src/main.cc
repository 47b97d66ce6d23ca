// rlsched — the project's program. Results go to stdout, logs and errors to stderr.
// Exit status: 0 success, 2 bad input or usage, 1 any other failure.

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "balance_command.h"
#include "plan_step_command.h"
#include "reshard_command.h"
#include "run_command.h"
#include "serve_command.h"
#include "simulate_command.h"

#ifndef RLSCHED_VERSION
#error "RLSCHED_VERSION must be defined by the build"
#endif

namespace {

// Where to read about the command that failed: the subcommand's --help when one was
// named, else the program's.
std::string UsageHint(const CLI::App& app) {
  const auto named = app.get_subcommands();
  if (named.empty()) return "run 'rlsched --help' for usage";
  return "run 'rlsched " + named.front()->get_name() + " --help' for usage";
}

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

int Run(int argc, char** argv) {
  // Replace spdlog's default logger, which writes to stdout. Thread-safe: the daemon
  // logs from its pipeline's threads.
  spdlog::set_default_logger(spdlog::stderr_color_mt("rlsched"));
  spdlog::set_pattern("%Y-%m-%d %H:%M:%S.%e [%^%l%$] %v");
  spdlog::set_level(spdlog::level::warn);

  CLI::App app("rlsched — scheduling for RL post-training of LLMs", "rlsched");
  app.set_version_flag("--version", "rlsched " RLSCHED_VERSION);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "Logging to stderr (default: warn)")
      ->type_name("trace|debug|info|warn|error|critical|off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"})
                  .description(""));
  app.require_subcommand(0, 1);  // none is reported below, naming the commands
  app.footer("Run 'rlsched COMMAND --help' for a command's options.");

  rlsched::app::BalanceArgs balance_args;
  CLI::App* balance = rlsched::app::AddBalanceCommand(app, balance_args);
  rlsched::app::PlanStepArgs plan_step_args;
  CLI::App* plan_step = rlsched::app::AddPlanStepCommand(app, plan_step_args);
  rlsched::app::ServeArgs serve_args;
  CLI::App* serve = rlsched::app::AddServeCommand(app, serve_args);
  rlsched::app::ReshardArgs reshard_args;
  CLI::App* reshard = rlsched::app::AddReshardCommand(app, reshard_args);
  rlsched::app::SimulateArgs simulate_args;
  CLI::App* simulate = rlsched::app::AddSimulateCommand(app, simulate_args);
  rlsched::app::RunArgs run_args;
  CLI::App* run = rlsched::app::AddRunCommand(app, run_args);
  rlsched::app::ReplayArgs replay_args;
  CLI::App* replay = rlsched::app::AddReplayCommand(app, replay_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      return app.exit(e);  // --help, --version: printed to stdout
    }
    std::cerr << "error: " << e.what() << '\n' << UsageHint(app) << '\n';
    return kExitBadInput;
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (app.get_subcommands().empty()) {
    std::cerr << "error: a command is required: balance, plan-step, serve, reshard, simulate, "
                 "run, replay\n"
                 "run 'rlsched --help' for usage\n";
    return kExitBadInput;
  }

  try {
    if (serve->parsed()) return rlsched::app::RunServeCommand(serve_args);
    if (run->parsed()) return rlsched::app::RunRunCommand(run_args);
    if (replay->parsed()) return rlsched::app::RunReplayCommand(replay_args);
    if (balance->parsed()) rlsched::app::RunBalanceCommand(balance_args, std::cin, std::cout);
    if (plan_step->parsed()) {
      rlsched::app::RunPlanStepCommand(plan_step_args, std::cin, std::cout);
    }
    if (reshard->parsed()) {
      rlsched::app::RunReshardCommand(reshard_args, std::cout, std::cerr);
    }
    if (simulate->parsed()) rlsched::app::RunSimulateCommand(simulate_args, std::cout);
  } catch (const std::invalid_argument& e) {
    std::cerr << "error: " << e.what() << '\n' << UsageHint(app) << '\n';
    return kExitBadInput;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  try {
    return Run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << '\n';
  } catch (...) {
    std::cerr << "error: unknown failure\n";
  }
  return kExitFailure;
}
