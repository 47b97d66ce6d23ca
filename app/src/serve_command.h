// serve_command.h — `rlsched serve`: the daemon over pipes.
//
// Overview
//   Answers rlsched.v1.Request messages read from stdin (or --input PATH, which may
//   be a named pipe) with rlsched.v1.Reply messages on stdout (or --output PATH), in
//   request order, through Serve() (serve.h): varint length-delimited protobuf by
//   default, one JSON object per line with --format=json. Each reply is flushed as
//   soon as it is ready. Logs go to stderr only.
//
//   Exit status:
//     0  the input ended (EOF) and every reply was written;
//     2  a bad frame (a length prefix above --max-message-bytes, a malformed prefix,
//        the stream ending inside a frame, a JSON line above the cap): a BAD_FRAME
//        reply with id "" was written first; also bad options or an --input/--output
//        that cannot be opened (main.cc);
//     1  the output was closed (EPIPE; SIGPIPE is ignored) or reading failed; the
//        replies not yet written are dropped. A closed output is noticed even while
//        the daemon waits for input, when the output is a pipe or a socket.
//   With named pipes, --input is opened before --output.
//
// Example
//   CLI::App app;
//   rlsched::app::ServeArgs args;
//   CLI::App* serve = rlsched::app::AddServeCommand(app, args);
//   app.parse(argc, argv);
//   if (serve->parsed()) return rlsched::app::RunServeCommand(args);
//
// Thread-safety: RunServeCommand() sets process-wide state (SIGPIPE ignored,
// protobuf's log handler); run it once, from main.

#ifndef RLSCHED_APP_SERVE_COMMAND_H_
#define RLSCHED_APP_SERVE_COMMAND_H_

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "serve.h"

namespace rlsched::app {

// The options of `rlsched serve`. Unset optionals were not given.
struct ServeArgs {
  std::string input = "-";              // "-" = stdin
  std::string output = "-";             // "-" = stdout
  std::string format = "delimited";     // or "json"
  std::optional<std::int64_t> threads;  // unset: the hardware's concurrency
  std::int64_t max_message_bytes = kDefaultMaxMessageBytes;
  double request_timeout_seconds = kDefaultRequestTimeoutSeconds;
};

// Adds the `serve` subcommand to `app`, writing into `args` (which must outlive the
// parse). Returns the subcommand.
CLI::App* AddServeCommand(CLI::App& app, ServeArgs& args);

// Runs the daemon until the input ends; returns the exit status (see above). Throws
// std::invalid_argument naming the option when --input or --output cannot be opened.
int RunServeCommand(const ServeArgs& args);

}  // namespace rlsched::app

#endif  // RLSCHED_APP_SERVE_COMMAND_H_
