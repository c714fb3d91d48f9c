// The built `epfuse` executable, run as a user would run it. Every `epfuse run` here forces the
// CPU path (EPFUSE_FORCE_CPU=1) so the tests mean the same on a GPU machine.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Result {
  int code = -1;  // exit status, or 128 + signal
  std::string out, err;
  double seconds = 0;
};

// Runs the CLI with `args` and extra environment, capturing stdout and stderr. `on_start(pid)`,
// if given, runs once the child is started (to signal it).
Result run_cli(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
               const std::function<void(pid_t)>& on_start = {}) {
  int out_pipe[2], err_pipe[2];
  EXPECT_EQ(::pipe2(out_pipe, O_CLOEXEC), 0);
  EXPECT_EQ(::pipe2(err_pipe, O_CLOEXEC), 0);
  std::vector<std::string> argv_s = {EPFUSE_CLI_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  auto start = std::chrono::steady_clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    ::execv(argv[0], argv.data());
    ::_exit(126);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (on_start) on_start(pid);
  Result r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open = 2;
  while (open > 0) {
    if (::poll(fds, 2, -1) < 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      } else {
        sinks[i]->append(buf, static_cast<size_t>(n));
      }
    }
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

bool contains(const std::string& hay, const std::string& needle) { return hay.find(needle) != std::string::npos; }

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream is(text);
  for (std::string l; std::getline(is, l);) out.push_back(l);
  return out;
}

// ---- launcher ----

TEST(Launch, AllRanksSucceedAndOutputIsPrefixed) {
  Result r = run_cli({"launch", "-n", "3", "--", "sh", "-c", "echo out $RANK; echo err $RANK >&2; printf tail$RANK"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 3; ++rank) {
    std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "out " + std::to_string(rank) + "\n")) << r.out;
    EXPECT_TRUE(contains(r.err, p + "err " + std::to_string(rank) + "\n")) << r.err;
    // A last line without a newline is flushed, prefixed, when the rank exits.
    EXPECT_TRUE(contains(r.out, p + "tail" + std::to_string(rank) + "\n")) << r.out;
  }
  for (const std::string& l : lines(r.out)) EXPECT_EQ(l.rfind("[rank ", 0), 0u) << l;
}

TEST(Launch, TorchrunEnvironmentInEveryRank) {
  Result r = run_cli({"launch", "-n", "2", "--master-port", "0", "--", "sh", "-c",
                      "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::regex re(R"(\[rank (\d)\] env (\d) 2 (\d) 2 127\.0\.0\.1 (\d+))");
  std::vector<std::string> ports;
  for (const std::string& l : lines(r.out)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(l, m, re)) << l;
    EXPECT_EQ(m[1], m[2]);
    EXPECT_EQ(m[1], m[3]);
    ports.push_back(m[4]);
  }
  ASSERT_EQ(ports.size(), 2u);
  EXPECT_EQ(ports[0], ports[1]);
  EXPECT_GT(std::stoi(ports[0]), 0);
  // An explicit port is passed through.
  Result fixed = run_cli({"launch", "-n", "1", "--master-port", "29517", "--", "sh", "-c", "echo $MASTER_PORT"});
  EXPECT_EQ(fixed.out, "[rank 0] 29517\n");
}

// The bootstrap secret: one per launch, the same in every rank, new for the next launch (random, 256
// bits as hex), and the launcher's own EPFUSE_BOOTSTRAP_SECRET passed on as it is.
TEST(Launch, BootstrapSecretPerLaunch) {
  auto secrets = [](const Result& r) {
    std::vector<std::string> out;
    std::regex re(R"(\[rank \d\] secret ([0-9a-f]{64}))");
    for (const std::string& l : lines(r.out)) {
      std::smatch m;
      EXPECT_TRUE(std::regex_match(l, m, re)) << l;
      if (m.size() == 2) out.push_back(m[1]);
    }
    return out;
  };
  const std::vector<std::string> cmd = {"launch", "-n", "3", "--", "sh", "-c", "echo secret $EPFUSE_BOOTSTRAP_SECRET"};
  Result first = run_cli(cmd, {{"EPFUSE_BOOTSTRAP_SECRET", ""}});
  Result second = run_cli(cmd, {{"EPFUSE_BOOTSTRAP_SECRET", ""}});
  ASSERT_EQ(first.code, 0) << first.err;
  ASSERT_EQ(second.code, 0) << second.err;
  const std::vector<std::string> a = secrets(first), b = secrets(second);
  ASSERT_EQ(a.size(), 3u) << first.out;
  ASSERT_EQ(b.size(), 3u) << second.out;
  EXPECT_EQ(a[0], a[1]);
  EXPECT_EQ(a[0], a[2]);
  EXPECT_EQ(b[0], b[2]);
  EXPECT_NE(a[0], b[0]) << "two launches share a secret";
  Result given = run_cli({"launch", "-n", "2", "--", "sh", "-c", "echo \"[$EPFUSE_BOOTSTRAP_SECRET]\""},
                         {{"EPFUSE_BOOTSTRAP_SECRET", "multi node"}});
  ASSERT_EQ(given.code, 0) << given.err;
  EXPECT_TRUE(contains(given.out, "[rank 0] [multi node]\n")) << given.out;
  EXPECT_TRUE(contains(given.out, "[rank 1] [multi node]\n")) << given.out;
}

TEST(Launch, EightRanksEachWithItsOwnRank) {
  // The 8-GPU machine runs 8 ranks: nothing in the launcher may assume 4 or fewer.
  Result r = run_cli({"launch", "-n", "8", "--", "sh", "-c", "echo env $RANK $WORLD_SIZE $LOCAL_RANK"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (int rank = 0; rank < 8; ++rank) {
    const std::string k = std::to_string(rank);
    EXPECT_TRUE(contains(r.out, "[rank " + k + "] env " + k + " 8 " + k + "\n")) << r.out;
  }
}

TEST(Cli, RunReferenceOnEightSimulatedRanks) {
  Result r = run_cli({"run", "--impl", "reference", "--hidden", "128", "--intermediate", "128", "--experts", "16",
                      "--topk", "4", "--tokens", "3,0,1,2,0,4,1,2", "--ranks", "8"},
                     {{"EPFUSE_FORCE_CPU", "1"}});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "with 8 simulated ranks")) << r.out;
}

TEST(Launch, FailingRankStopsTheOthersQuickly) {
  Result r = run_cli({"launch", "-n", "2", "--", "sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60"});
  EXPECT_NE(r.code, 0);
  EXPECT_EQ(r.code, 3);  // the failing rank's status
  EXPECT_TRUE(contains(r.err, "epfuse launch: rank 1 exited with status 3")) << r.err;
  EXPECT_LT(r.seconds, 20.0);
}

TEST(Launch, RankKilledBySignalIsNamed) {
  Result r = run_cli({"launch", "-n", "2", "--", "sh", "-c", "if [ \"$RANK\" = 0 ]; then kill -KILL $$; fi; sleep 60"});
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.err, "epfuse launch: rank 0 killed by signal SIGKILL")) << r.err;
  EXPECT_LT(r.seconds, 20.0);
}

// A rank that ignores SIGTERM is killed after the grace period.
TEST(Launch, SigkillAfterGrace) {
  Result r = run_cli({"launch", "-n", "2", "--grace-ms", "500", "--", "sh", "-c",
                      "if [ \"$RANK\" = 1 ]; then exit 1; fi; trap '' TERM; sleep 60"});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "rank 1 exited with status 1")) << r.err;
  EXPECT_LT(r.seconds, 20.0);
}

TEST(Launch, ForwardsSigtermToRanks) {
  // The ranks write their pids, so we can check they are gone afterwards.
  std::string dir = ::testing::TempDir();
  std::string pid_file = dir + "/epfuse_launch_pids_" + std::to_string(::getpid());
  std::remove(pid_file.c_str());
  Result r = run_cli({"launch", "-n", "2", "--", "sh", "-c", "echo $$ >> " + pid_file + "; echo ready; sleep 60"}, {},
                     [&](pid_t launcher) {
                       // Wait until both ranks started, then interrupt the launcher only.
                       for (int i = 0; i < 200; ++i) {
                         std::ifstream f(pid_file);
                         int n = 0;
                         for (std::string l; std::getline(f, l);) ++n;
                         if (n == 2) break;
                         std::this_thread::sleep_for(std::chrono::milliseconds(50));
                       }
                       ::kill(launcher, SIGTERM);
                     });
  EXPECT_EQ(r.code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(contains(r.err, "received SIGTERM")) << r.err;
  EXPECT_LT(r.seconds, 20.0);
  std::ifstream f(pid_file);
  int checked = 0;
  for (std::string l; std::getline(f, l); ++checked) {
    pid_t pid = std::stoi(l);
    EXPECT_NE(::kill(pid, 0), 0) << "rank pid " << pid << " still exists";  // reaped, not a zombie
  }
  EXPECT_EQ(checked, 2);
  std::remove(pid_file.c_str());
}

TEST(Launch, RanksInheritNoExtraDescriptors) {
  // `ls` opens one descriptor for the listing itself; anything beyond 0-3 leaked from the launcher.
  Result r = run_cli({"launch", "-n", "2", "--", "sh", "-c", "ls /proc/self/fd | tr '\\n' ' '"});
  ASSERT_EQ(r.code, 0) << r.err;
  for (const std::string& l : lines(r.out)) {
    std::istringstream is(l.substr(l.find(']') + 2));
    for (int fd; is >> fd;) EXPECT_LE(fd, 3) << l;
  }
}

TEST(Launch, UsageErrors) {
  Result no_n = run_cli({"launch", "--", "true"});
  EXPECT_EQ(no_n.code, 2);
  EXPECT_TRUE(contains(no_n.err, "--nprocs")) << no_n.err;
  EXPECT_TRUE(contains(no_n.err, "usage: epfuse launch")) << no_n.err;
  Result no_cmd = run_cli({"launch", "-n", "2"});
  EXPECT_EQ(no_cmd.code, 2);
  EXPECT_TRUE(contains(no_cmd.err, "no command")) << no_cmd.err;
  Result missing = run_cli({"launch", "-n", "1", "--", "/nonexistent/epfuse-test-command"});
  EXPECT_EQ(missing.code, 127);
  EXPECT_TRUE(contains(missing.err, "not found")) << missing.err;
}

// ---- the CLI ----

TEST(Cli, HelpAndUnknownCommand) {
  Result help = run_cli({"--help"});
  EXPECT_EQ(help.code, 0);
  EXPECT_TRUE(contains(help.out, "usage: epfuse <command>"));
  Result run_help = run_cli({"run", "--help"});
  EXPECT_EQ(run_help.code, 0);
  EXPECT_TRUE(contains(run_help.out, "--tolerance"));
  EXPECT_TRUE(contains(run_help.out, "5e-3")) << "the help explains the default tolerance";
  Result bad = run_cli({"frobnicate"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.err, "unknown command 'frobnicate'"));
  EXPECT_EQ(run_cli({}).code, 2);
}

TEST(Cli, BadFlagPrintsUsageAndExits2) {
  const std::map<std::string, std::string> cpu = {{"EPFUSE_FORCE_CPU", "1"}};
  Result r = run_cli({"run", "--model", "qwen3-30b", "--bogus", "1"}, cpu);
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "unknown flag --bogus")) << r.err;
  EXPECT_TRUE(contains(r.err, "usage: epfuse run")) << r.err;
  Result typed = run_cli({"run", "--model", "qwen3-30b", "--iters", "many"}, cpu);
  EXPECT_EQ(typed.code, 2);
  EXPECT_TRUE(contains(typed.err, "--iters many: expected an integer")) << typed.err;
  Result model = run_cli({"run", "--model", "gpt5"}, cpu);
  EXPECT_EQ(model.code, 2);
  EXPECT_TRUE(contains(model.err, "--model gpt5")) << model.err;
  Result list = run_cli({"run", "--model", "qwen3-30b", "--tokens", "1,2,3", "--ranks", "2"}, cpu);
  EXPECT_EQ(list.code, 2);
  EXPECT_TRUE(contains(list.err, "3 counts for 2 ranks")) << list.err;
  Result missing = run_cli({"run", "--hidden", "128", "--experts", "8", "--topk", "2"}, cpu);
  EXPECT_EQ(missing.code, 2);
  EXPECT_TRUE(contains(missing.err, "--intermediate is missing")) << missing.err;
}

// The soak modes need the fused layer, so a GPU: without one they fail saying so, or skip (77) where the
// tests ask; flags that contradict them are usage errors (exit 2).
TEST(Cli, SoakModesNeedAGpuAndSayWhichFlagsClash) {
  const std::vector<std::string> shape = {"run", "--hidden", "256", "--intermediate", "256", "--experts", "16",
                                          "--topk", "4", "--tokens", "64", "--ranks", "1"};
  for (const std::vector<std::string>& mode : {std::vector<std::string>{"--graph", "--iters", "30"},
                                               std::vector<std::string>{"--cycles", "3"}}) {
    std::vector<std::string> args = shape;
    args.insert(args.end(), mode.begin(), mode.end());
    Result skipped = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}, {"EPFUSE_SKIP_IF_FEWER_GPUS", "1"}});
    EXPECT_EQ(skipped.code, 77) << mode[0] << ": " << skipped.err;
    Result failed = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}});
    EXPECT_EQ(failed.code, 1) << mode[0];
    EXPECT_TRUE(contains(failed.err, "--impl fused needs a GPU")) << failed.err;
  }
  std::vector<std::string> clash = shape;
  clash.insert(clash.end(), {"--graph", "--vary"});
  Result r = run_cli(clash, {{"EPFUSE_FORCE_CPU", "1"}});
  EXPECT_EQ(r.code, 2);
  EXPECT_TRUE(contains(r.err, "without --vary")) << r.err;
}

TEST(Cli, RunReferenceOnCpu) {
  std::string json = ::testing::TempDir() + "/epfuse_run_" + std::to_string(::getpid()) + ".json";
  Result r = run_cli({"run", "--impl", "reference", "--hidden", "128", "--intermediate", "128", "--experts", "8",
                      "--topk", "2", "--tokens", "3,0", "--ranks", "2", "--json", json},
                     {{"EPFUSE_FORCE_CPU", "1"}});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> out = lines(r.out);
  ASSERT_FALSE(out.empty());
  EXPECT_EQ(out[0], "epfuse run: no GPU found: running the CPU reference (float64) with 2 simulated ranks");
  // The table: rank 0 has 3 tokens and 6 routed slots (top-2, uniform routing), rank 1 none.
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n +0 +3 +6 +0 +[0-9.]+e[-+]\d+ )"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(\n +1 +0 +0 +0 +0\.0000e\+00 )"))) << r.out;
  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  std::string doc = text.str();
  for (const char* key : {"\"device\": \"cpu\"", "\"gpus\": 0", "\"date\": ", "\"commit\": ", "\"command\": ",
                          "\"config\": {", "\"hidden\": 128", "\"impl\": \"reference\"", "\"ranks\": [3, 0]",
                          "\"calls\": 1", "\"max_rel_err\": null", "\"max_row_rel_err\": null",
                          "\"worst_row\": null", "\"row_tolerance\": 0.04", "\"unwritten\": 0", "\"verified\": false"})
    EXPECT_TRUE(contains(doc, key)) << key << " missing in\n" << doc;
  std::remove(json.c_str());
}

// Without --impl and without a GPU the CPU reference runs; the same seed gives the same output.
TEST(Cli, RunDefaultsToReferenceAndIsDeterministic) {
  const std::vector<std::string> args = {"run", "--hidden", "128", "--intermediate", "256", "--experts", "4",
                                         "--topk", "2", "--tokens", "5", "--ranks", "2", "--routing", "dropped",
                                         "--iters", "2", "--vary"};
  Result a = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}});
  Result b = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}});
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "no GPU found"));
  EXPECT_TRUE(contains(a.out, "tokens (2 calls)")) << a.out;
  auto norms = [](const std::string& text) {
    std::vector<std::string> n;
    const std::regex norm(R"(\d\.\d{4}e[-+]\d\d)");
    for (std::sregex_iterator it(text.begin(), text.end(), norm), end; it != end; ++it)
      n.push_back(it->str());
    return n;
  };
  EXPECT_EQ(norms(a.out), norms(b.out));
  EXPECT_EQ(norms(a.out).size(), 2u);
}

TEST(Cli, GpuImplWithoutGpuFails) {
  Result r = run_cli({"run", "--impl", "unfused", "--model", "qwen3-30b", "--tokens", "4"}, {{"EPFUSE_FORCE_CPU", "1"}});
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.err, "epfuse: --impl unfused needs a GPU")) << r.err;
}

// The GPU matrix in ctest relies on this: too few GPUs is a skip (77) only when asked for.
TEST(Cli, TooFewGpusSkipsOnlyWhenAsked) {
  const std::vector<std::string> args = {"run", "--impl", "unfused", "--model", "qwen3-30b", "--tokens", "4",
                                         "--ranks", "2"};
  Result skip = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}, {"EPFUSE_SKIP_IF_FEWER_GPUS", "1"}});
  EXPECT_EQ(skip.code, 77);
  EXPECT_EQ(skip.out, "SKIPPED: needs 2 GPUs, found 0\n");
  Result error = run_cli(args, {{"EPFUSE_FORCE_CPU", "1"}});
  EXPECT_EQ(error.code, 1);
}

// --one-gpu: every rank on GPU 0. Without a GPU the fused run is a skip (the ctest one-GPU matrix) only
// when asked for; the unfused chain is refused in that mode; the world size must be given.
TEST(Cli, OneGpuMode) {
  const std::map<std::string, std::string> cpu = {{"EPFUSE_FORCE_CPU", "1"}};
  const std::vector<std::string> fused = {"run", "--one-gpu", "--impl", "fused", "--model", "qwen3-30b",
                                          "--tokens", "4", "--ranks", "8"};
  auto skip_env = cpu;
  skip_env["EPFUSE_SKIP_IF_FEWER_GPUS"] = "1";
  Result skip = run_cli(fused, skip_env);
  EXPECT_EQ(skip.code, 77);
  EXPECT_EQ(skip.out, "SKIPPED: needs 1 GPU, found 0\n");
  Result no_gpu = run_cli(fused, cpu);
  EXPECT_EQ(no_gpu.code, 1);
  EXPECT_TRUE(contains(no_gpu.err, "needs a GPU")) << no_gpu.err;
  Result unfused = run_cli({"run", "--one-gpu", "--impl", "unfused", "--model", "qwen3-30b", "--tokens", "4",
                            "--ranks", "2"}, cpu);
  EXPECT_EQ(unfused.code, 1);
  EXPECT_TRUE(contains(unfused.err, "unsupported in one-GPU mode")) << unfused.err;
  Result no_ranks = run_cli({"run", "--one-gpu", "--model", "qwen3-30b", "--tokens", "4"}, cpu);
  EXPECT_EQ(no_ranks.code, 2);
  EXPECT_TRUE(contains(no_ranks.err, "--one-gpu needs --ranks")) << no_ranks.err;
  Result bad_sms = run_cli({"run", "--one-gpu", "--sms", "-1", "--model", "qwen3-30b", "--tokens", "4",
                            "--ranks", "2"}, cpu);
  EXPECT_EQ(bad_sms.code, 2);
  EXPECT_TRUE(contains(bad_sms.err, "--sms")) << bad_sms.err;
}

TEST(Cli, InvalidConfigNamesTheField) {
  const std::map<std::string, std::string> cpu = {{"EPFUSE_FORCE_CPU", "1"}};
  Result experts = run_cli({"run", "--hidden", "128", "--intermediate", "128", "--experts", "7", "--topk", "2",
                            "--tokens", "1", "--ranks", "2"}, cpu);
  EXPECT_EQ(experts.code, 1);
  EXPECT_EQ(lines(experts.err).size(), 1u) << experts.err;
  EXPECT_TRUE(contains(experts.err, "epfuse: ")) << experts.err;
  EXPECT_TRUE(contains(experts.err, "num_experts") || contains(experts.err, "experts")) << experts.err;
  Result hidden = run_cli({"run", "--hidden", "100", "--intermediate", "128", "--experts", "8", "--topk", "2",
                           "--tokens", "1"}, cpu);
  EXPECT_EQ(hidden.code, 1);
  EXPECT_TRUE(contains(hidden.err, "hidden")) << hidden.err;
  Result max_tokens = run_cli({"run", "--model", "qwen3-30b", "--tokens", "8", "--max-tokens", "4"}, cpu);
  EXPECT_EQ(max_tokens.code, 1);
  EXPECT_TRUE(contains(max_tokens.err, "--max-tokens 4")) << max_tokens.err;
}

// --dtype fp8 runs the FP8 reference (the layer's quantisation) and says so in the table and the JSON;
// bad names and --scales without fp8 are usage errors; sizes not a multiple of 64 are refused.
TEST(Cli, RunFp8Dtype) {
  const std::map<std::string, std::string> cpu = {{"EPFUSE_FORCE_CPU", "1"}};
  std::string json = ::testing::TempDir() + "/epfuse_run_fp8_" + std::to_string(::getpid()) + ".json";
  Result r = run_cli({"run", "--hidden", "256", "--intermediate", "384", "--experts", "4", "--topk", "2", "--tokens",
                      "3", "--ranks", "1", "--dtype", "fp8", "--scales", "ue8m0", "--json", json},
                     cpu);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "k=2 fp8 scales=ue8m0)")) << r.out;
  std::ifstream f(json);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_TRUE(contains(text.str(), "\"dtype\": \"fp8\"")) << text.str();
  EXPECT_TRUE(contains(text.str(), "\"scale_format\": \"ue8m0\"")) << text.str();
  std::remove(json.c_str());
  Result bad = run_cli({"run", "--model", "qwen3-30b", "--dtype", "fp16"}, cpu);
  EXPECT_EQ(bad.code, 2);
  EXPECT_TRUE(contains(bad.err, "--dtype fp16: expected bf16 or fp8")) << bad.err;
  Result scales = run_cli({"run", "--model", "qwen3-30b", "--scales", "ue8m0"}, cpu);
  EXPECT_EQ(scales.code, 2);
  EXPECT_TRUE(contains(scales.err, "only with --dtype fp8")) << scales.err;
  Result x_fp8 = run_cli({"run", "--model", "qwen3-30b", "--x-fp8"}, cpu);
  EXPECT_EQ(x_fp8.code, 2);
  EXPECT_TRUE(contains(x_fp8.err, "--x-fp8: only with --dtype fp8")) << x_fp8.err;
  // Multiples of 64 that the kernels do not tile run (padded on a GPU; here the CPU reference, with
  // partial 64-wide FP8 blocks); other sizes are refused.
  Result odd = run_cli({"run", "--hidden", "320", "--intermediate", "192", "--experts", "4", "--topk", "2",
                        "--tokens", "3", "--dtype", "fp8"},
                       cpu);
  EXPECT_EQ(odd.code, 0) << odd.err;
  Result bad_size = run_cli({"run", "--hidden", "2900", "--intermediate", "2880", "--experts", "4", "--topk", "2",
                             "--tokens", "1", "--dtype", "fp8"},
                            cpu);
  EXPECT_EQ(bad_size.code, 1);
  EXPECT_TRUE(contains(bad_size.err, "hidden=2900: must be a positive multiple of 64")) << bad_size.err;
}

TEST(Cli, BenchIsDispatched) {
  Result r = run_cli({"bench", "--help"});
  // Built: its usage; not built: a one-line reason.
  EXPECT_TRUE((r.code == 0 && contains(r.out, "bench")) || (r.code == 1 && contains(r.err, "not built")))
      << r.code << r.out << r.err;
}

}  // namespace
