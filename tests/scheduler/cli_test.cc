// Runs the built `rlsched` program over pipes, as a user or a script would.

#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "balance_convert.h"
#include "lengths_reader.h"

namespace rlsched::scheduler {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

struct ProcessResult {
  int status = -1;  // exit status, or 128 + signal number
  std::string out;
  std::string err;
};

// Runs the program with `args`, feeding `input` on stdin and collecting stdout and
// stderr until it exits.
ProcessResult RunProgram(const std::vector<std::string>& args, const std::string& input = "") {
  ::signal(SIGPIPE, SIG_IGN);  // the program may exit without reading its stdin
  int in_pipe[2];
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe(in_pipe) != 0 || ::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    ADD_FAILURE() << "pipe: " << std::strerror(errno);
    return {};
  }
  std::vector<std::string> argv_strings = {RLSCHED_PROGRAM};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << std::strerror(errno);
    return {};
  }
  if (pid == 0) {
    ::dup2(in_pipe[0], STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    for (const int fd :
         {in_pipe[0], in_pipe[1], out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      ::close(fd);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::fcntl(in_pipe[1], F_SETFL, ::fcntl(in_pipe[1], F_GETFL) | O_NONBLOCK);

  ProcessResult result;
  int in_fd = in_pipe[1];
  int out_fd = out_pipe[0];
  int err_fd = err_pipe[0];
  std::size_t written = 0;
  if (input.empty()) {
    ::close(in_fd);
    in_fd = -1;
  }
  while (in_fd >= 0 || out_fd >= 0 || err_fd >= 0) {
    pollfd fds[3] = {{in_fd, POLLOUT, 0}, {out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    if (::poll(fds, 3, -1) < 0) {
      if (errno == EINTR) continue;
      ADD_FAILURE() << "poll: " << std::strerror(errno);
      break;
    }
    if (in_fd >= 0 && fds[0].revents != 0) {
      const ssize_t n = ::write(in_fd, input.data() + written, input.size() - written);
      if (n > 0) written += static_cast<std::size_t>(n);
      if ((n < 0 && errno != EAGAIN && errno != EINTR) || written == input.size()) {
        ::close(in_fd);
        in_fd = -1;
      }
    }
    for (const auto& [index, fd, sink] :
         {std::tuple{1, &out_fd, &result.out}, std::tuple{2, &err_fd, &result.err}}) {
      if (*fd < 0 || fds[index].revents == 0) continue;
      char buffer[65536];
      const ssize_t n = ::read(*fd, buffer, sizeof buffer);
      if (n > 0) {
        sink->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        ::close(*fd);
        *fd = -1;
      }
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

v1::BalanceReply ParseReply(const std::string& out) {
  v1::BalanceReply reply;
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << "not one line:\n" << out;
  const auto status = google::protobuf::util::JsonStringToMessage(out, &reply);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << out;
  return reply;
}

void ExpectPartition(const v1::BalanceReply& reply, std::int64_t n, std::int64_t k) {
  ASSERT_EQ(reply.parts_size(), k);
  std::vector<int> seen(static_cast<std::size_t>(n), 0);
  for (const v1::Part& part : reply.parts()) {
    EXPECT_TRUE(std::is_sorted(part.indices().begin(), part.indices().end()));
    for (const std::int64_t index : part.indices()) {
      ASSERT_GE(index, 0);
      ASSERT_LT(index, n);
      ++seen[static_cast<std::size_t>(index)];
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n);
}

std::string SharedData(const std::string& name) {
  return (std::filesystem::path(RLSCHED_SHARED_DATA_DIR) / name).string();
}

TEST(CliTest, Version) {
  const ProcessResult r = RunProgram({"--version"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "rlsched " RLSCHED_VERSION "\n");
  EXPECT_THAT(r.err, IsEmpty());
}

TEST(CliTest, Help) {
  const ProcessResult r = RunProgram({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("balance"));
  const ProcessResult balance = RunProgram({"balance", "--help"});
  EXPECT_EQ(balance.status, 0);
  EXPECT_THAT(balance.out, HasSubstr("--parts"));
  EXPECT_THAT(balance.out, HasSubstr("Llama-3.1-8B"));
}

TEST(CliTest, ExampleTable) {
  const ProcessResult r = RunProgram({"balance", "--example"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, IsEmpty());
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_THAT(lines[0], HasSubstr("1024 sequences in 128 groups"));
  EXPECT_THAT(lines[0], HasSubstr("k = 8 parts"));
  EXPECT_THAT(lines[1], HasSubstr("cost model: tokens"));
  EXPECT_THAT(lines[2], HasSubstr("Karmarkar-Karp"));
  int part_rows = 0;
  for (const std::string& line : lines) {
    if (line.starts_with("   ") && line.find_first_not_of(' ') != std::string::npos &&
        std::isdigit(static_cast<unsigned char>(line[line.find_first_not_of(' ')]))) {
      ++part_rows;
    }
  }
  EXPECT_EQ(part_rows, 8) << r.out;
  EXPECT_THAT(r.out, HasSubstr("\nlower bound "));
  EXPECT_THAT(r.out, HasSubstr("\ngap "));
  EXPECT_THAT(r.out, HasSubstr("\nproven optimal "));
  EXPECT_THAT(r.out, HasSubstr("\nnaive contiguous split: max cost "));
}

TEST(CliTest, ExampleMatchesSeed) {
  const ProcessResult a = RunProgram({"balance", "--example", "--json"});
  const ProcessResult b = RunProgram({"balance", "--example", "--json", "--seed", "1"});
  const ProcessResult c = RunProgram({"balance", "--example", "--json", "--seed", "2"});
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

TEST(CliTest, ManyPartsAreElided) {
  const ProcessResult r = RunProgram({"balance", "--example", "--parts", "100"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("… (36 more parts)"));
}

TEST(CliTest, ExampleAttentionUsesTheDefaultShape) {
  const ProcessResult r = RunProgram({"balance", "--example", "--cost", "attention"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(Lines(r.out).at(1), HasSubstr("Llama-3.1-8B"));
}

TEST(CliTest, JsonFromStdinIsTheSolveBalanceReply) {
  const std::string input = "100\n200 300\n\n400 5000\n";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"balance", "--json", "--parts", "2"},
        std::vector<std::string>{"balance", "-", "--json", "--parts", "2"}}) {
    const ProcessResult r = RunProgram(args, input);
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, IsEmpty());
    v1::BalanceRequest request;
    for (const std::int64_t length : ParseLengths(input).lengths) request.add_lengths(length);
    request.set_num_parts(2);
    request.mutable_cost()->set_kind(v1::COST_KIND_TOKENS);
    request.set_algorithm(v1::ALGORITHM_KARMARKAR_KARP);
    EXPECT_EQ(r.out, ToJson(SolveBalance(request)) + "\n");
    ExpectPartition(ParseReply(r.out), 5, 2);
  }
}

TEST(CliTest, OptionsReachTheRequest) {
  const std::string input = "5\n9\n1\n7\n3\n8\n2\n";
  const ProcessResult r =
      RunProgram({"balance", "--json", "--parts", "3", "--equal-size", "--algorithm", "lpt",
                  "--refine-iterations", "0", "--quadratic", "0.5", "--constant", "2"},
                 input);
  ASSERT_EQ(r.status, 0) << r.err;
  v1::BalanceRequest request;
  for (const std::int64_t length : ParseLengths(input).lengths) request.add_lengths(length);
  request.set_num_parts(3);
  request.set_equal_size(true);
  request.set_algorithm(v1::ALGORITHM_GREEDY);
  request.set_refine_iterations(0);
  request.mutable_cost()->set_kind(v1::COST_KIND_ATTENTION);
  request.mutable_cost()->mutable_coefficients()->set_linear(1.0);
  request.mutable_cost()->mutable_coefficients()->set_quadratic(0.5);
  request.mutable_cost()->mutable_coefficients()->set_constant(2.0);
  EXPECT_EQ(r.out, ToJson(SolveBalance(request)) + "\n");
}

TEST(CliTest, LogsGoToStderrOnly) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--log-level", "debug", "balance", "--json"},
        std::vector<std::string>{"balance", "--json", "--log-level", "info"}}) {
    const ProcessResult r = RunProgram(args, "1 2 3 4 5 6\n");
    ASSERT_EQ(r.status, 0) << r.err;
    ExpectPartition(ParseReply(r.out), 6, 8);
    EXPECT_THAT(r.err, HasSubstr("balanced 6 sequences"));
  }
}

TEST(CliTest, SharedGrpoRolloutsKeepGroups) {
  const std::string path = SharedData("rollout_lengths_amc23_llama3b.csv");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  const ProcessResult table =
      RunProgram({"balance", path, "--parts", "8", "--keep-groups", "--equal-size"});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("2000 sequences in 40 groups"));

  const ProcessResult r =
      RunProgram({"balance", path, "--parts", "8", "--keep-groups", "--equal-size", "--json"});
  ASSERT_EQ(r.status, 0) << r.err;
  const v1::BalanceReply reply = ParseReply(r.out);
  ExpectPartition(reply, 2000, 8);
  // The file lists each group's 50 samples together: index / 50 is the group.
  for (const v1::Part& part : reply.parts()) {
    std::set<std::int64_t> groups;
    for (const std::int64_t index : part.indices()) groups.insert(index / 50);
    EXPECT_EQ(groups.size(), 5u);
    EXPECT_EQ(part.indices_size(), 250);
  }
}

TEST(CliTest, SharedReasoningLengths) {
  const std::string path = SharedData("reasoning_lengths_intellect3_math.csv");
  if (!std::filesystem::exists(path)) GTEST_SKIP() << path << " not found";
  const ProcessResult table = RunProgram({"balance", path, "--parts", "4", "--cost", "attention"});
  ASSERT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(Lines(table.out).at(0), HasSubstr("42 sequences,"));
  const ProcessResult r = RunProgram({"balance", "--parts", "4", "--json", path});
  ASSERT_EQ(r.status, 0) << r.err;
  ExpectPartition(ParseReply(r.out), 42, 4);
}

struct BadCase {
  std::vector<std::string> args;
  std::string input;
  std::string message;  // in stderr
};

TEST(CliTest, BadInputExitsWithStatusTwo) {
  const std::vector<BadCase> cases = {
      {{"balance"}, "1\n2\nabc\n", "stdin: line 3: 'abc' is not an integer"},
      {{"balance"}, "", "stdin: no lengths"},
      {{"balance", "--json"}, "5\n-3\n", "line 2: length -3 must be in [0, 2147483648]"},
      {{"balance"}, "1\n99999999999\n", "must be in [0, 2147483648]"},
      {{"balance"}, "group,prompt_tokens\n1,2\n", "the header has no length column"},
      {{"balance"}, "length,group\n1\n", "line 2: expected 2 fields"},
      {{"balance", "--parts", "0"}, "1\n", "--parts: must be an integer in [1, 1048576], got '0'"},
      {{"balance", "--parts", "x"}, "1\n", "--parts"},
      {{"balance", "/nonexistent/lengths.txt"}, "", "/nonexistent/lengths.txt: cannot open"},
      {{"balance", "/"}, "", "/: is a directory"},
      {{"balance", "--frobnicate"}, "1\n", "frobnicate"},
      {{}, "", "a command is required: balance"},
      {{"frobnicate"}, "", "frobnicate"},
      {{"--log-level", "loud", "balance"}, "1\n", "--log-level"},
      {{"balance", "--cost", "flops"}, "1\n", "--cost"},
      {{"balance", "--algorithm", "magic"}, "1\n", "--algorithm"},
      {{"balance", "--cost", "tokens", "--hidden-size", "4096"}, "1\n", "--cost"},
      {{"balance", "--hidden-size", "4096", "--linear", "2"},
       "1\n",
       "--linear, --quadratic, --constant: cannot be combined with model shape options"},
      {{"balance", "--quadratic", "-1"}, "1\n", "--quadratic: must be a finite number >= 0"},
      {{"balance", "--num-heads", "3"}, "1\n", "--num-heads: must divide the hidden size (4096)"},
      {{"balance", "--num-heads", "16", "--num-kv-heads", "3"}, "1\n", "--num-kv-heads"},
      {{"balance", "--num-layers", "0"}, "1\n", "--num-layers: must be an integer >= 1, got '0'"},
      {{"balance", "--linear", "0"}, "1\n", "cost.coefficients: linear + quadratic must be > 0"},
      {{"balance", "--keep-groups"}, "1\n2\n", "--keep-groups: the input has no group column"},
      {{"balance", "--parts", "2", "--constant", "4611686018427387904"}, "1\n", "error: "},
      {{"balance", "--refine-iterations", "-1"}, "1\n", "--refine-iterations"},
      {{"balance", "--seed", "3"}, "1\n", "--seed"},
      {{"balance", "--example", "--seed", "-1"}, "", "--seed: must be an integer in [0, 2^64)"},
      {{"balance", "--parts", "3", "--parts", "4"}, "1\n", "--parts"},
      {{"balance", "-", "extra"}, "1\n", "extra"},
      {{"balance", "--example", "file.txt"}, "", "excludes"},
  };
  for (const BadCase& c : cases) {
    std::string command;
    for (const std::string& arg : c.args) command += " " + arg;
    SCOPED_TRACE("rlsched" + command);
    const ProcessResult r = RunProgram(c.args, c.input);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_THAT(r.out, IsEmpty());
    EXPECT_THAT(r.err, StartsWith("error: "));
    EXPECT_THAT(r.err, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace rlsched::scheduler
