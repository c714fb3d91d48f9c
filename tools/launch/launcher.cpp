// The launcher: fork/exec N ranks, relay their output line by line with a rank prefix, and stop
// every rank as soon as one fails (or the launcher is interrupted).
//
// Each rank runs in its own process group so that SIGTERM/SIGKILL reach whatever it spawned (a
// shell's children, for instance), and so that a terminal's Ctrl-C reaches the ranks only through
// the launcher, once. Signals are turned into bytes on a self-pipe so the poll() loop is the only
// place that acts on them.
#include "launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

extern char** environ;

namespace epfuse::tools {
namespace {

using Clock = std::chrono::steady_clock;

void write_all(int fd, std::string_view s) {
  while (!s.empty()) {
    ssize_t n = ::write(fd, s.data(), s.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return;  // our own stdout/stderr is gone: nothing sensible left to report to
    }
    s.remove_prefix(static_cast<size_t>(n));
  }
}

void report(const std::string& line) { write_all(STDERR_FILENO, "epfuse launch: " + line + "\n"); }

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return "killed by signal " + (name ? "SIG" + std::string(name) : std::to_string(WTERMSIG(status)));
  }
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

// The shell's convention, so that a caller (ctest's SKIP_RETURN_CODE, a script) sees the rank's code.
int exit_code_of(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

// Binds port 0 on loopback and reads back the port the kernel chose. Racy by nature (another
// process may take it before rank 0 binds it), as torchrun's is; good enough on one node.
std::optional<int> free_port(std::string& why) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  std::optional<int> port;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  } else {
    why = std::string("bind/getsockname: ") + std::strerror(errno);
  }
  ::close(fd);
  return port;
}

// The bootstrap secret of one launch: EPFUSE_BOOTSTRAP_SECRET as the launcher got it (a multi-node job
// sets one value on every node), else 32 random bytes from the kernel as 64 hex digits.
std::optional<std::string> bootstrap_secret(std::string& why) {
  if (const char* given = std::getenv("EPFUSE_BOOTSTRAP_SECRET"); given != nullptr && *given != '\0') return given;
  unsigned char bytes[32];
  for (size_t have = 0; have < sizeof(bytes);) {
    const ssize_t got = ::getrandom(bytes + have, sizeof(bytes) - have, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      why = std::string("getrandom: ") + std::strerror(errno);
      return std::nullopt;
    }
    have += static_cast<size_t>(got);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string secret;
  for (unsigned char b : bytes) {
    secret.push_back(kHex[b >> 4]);
    secret.push_back(kHex[b & 15]);
  }
  return secret;
}

// PATH lookup done before fork(), so the child only calls async-signal-safe functions.
std::optional<std::string> resolve_command(const std::string& name) {
  auto runnable = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.find('/') != std::string::npos) return runnable(name) ? std::optional(name) : std::nullopt;
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (runnable(candidate)) return candidate;
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

// The environment of one rank: the launcher's, with the torchrun variables replaced.
std::vector<std::string> rank_environment(const LaunchOptions& opts, int rank, int port, const std::string& secret) {
  const std::pair<const char*, std::string> vars[] = {
      {"RANK", std::to_string(rank)},        {"WORLD_SIZE", std::to_string(opts.nprocs)},
      {"LOCAL_RANK", std::to_string(rank)},  {"LOCAL_WORLD_SIZE", std::to_string(opts.nprocs)},
      {"MASTER_ADDR", opts.master_addr},     {"MASTER_PORT", std::to_string(port)},
      {"EPFUSE_BOOTSTRAP_SECRET", secret},
  };
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string_view entry(*e);
    bool replaced = false;
    for (const auto& [name, value] : vars) {
      std::string_view n(name);
      replaced |= entry.size() > n.size() && entry.starts_with(n) && entry[n.size()] == '=';
    }
    if (!replaced) env.emplace_back(entry);
  }
  for (const auto& [name, value] : vars) env.push_back(std::string(name) + "=" + value);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Self-pipe: the signal handlers only write the signal number into it.
int g_signal_pipe_write = -1;
void on_signal(int sig) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe_write, &byte, 1);
  errno = saved;
}

// Installs the handlers for the duration of a launch and restores the caller's on destruction.
class SignalScope {
 public:
  static constexpr int kSignals[] = {SIGINT, SIGTERM, SIGCHLD};

  explicit SignalScope(int write_fd) {
    g_signal_pipe_write = write_fd;
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &sa, &saved_[i]);
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &saved_[i], nullptr);
    g_signal_pipe_write = -1;
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  struct sigaction saved_[std::size(kSignals)]{};
};

// One output stream of one rank: the read end of its pipe and the unfinished last line.
struct Stream {
  int fd = -1;
  int target = STDOUT_FILENO;
  std::string pending;
};

struct Rank {
  pid_t pid = -1;  // also its process-group id
  bool running = false;
  Stream out, err;
};

class Launch {
 public:
  Launch(const LaunchOptions& opts, std::vector<Rank>& ranks) : opts_(opts), ranks_(ranks) {}

  // Starting a rank failed (already reported): kill those started, without blaming them.
  void abort_start() {
    aborted_ = true;
    signal_all(SIGKILL);
  }

  // Relays output and reaps ranks until all have exited and their pipes are drained.
  int run(int signal_fd) {
    while (true) {
      int running = 0;
      for (const Rank& r : ranks_) running += r.running;
      if (running == 0 && !drain_deadline_) drain_deadline_ = Clock::now() + std::chrono::milliseconds(500);
      if (running == 0 && (open_streams() == 0 || Clock::now() >= *drain_deadline_)) break;
      if (kill_deadline_ && Clock::now() >= *kill_deadline_) {
        signal_all(SIGKILL);
        kill_deadline_.reset();
      }
      poll_once(signal_fd);
      reap();
    }
    for (Rank& r : ranks_) {
      flush_partial(r, r.out);
      flush_partial(r, r.err);
    }
    if (aborted_) return 1;
    if (interrupted_) return 128 + interrupted_;
    return first_failure_ ? exit_code_of(first_failure_->second) : 0;
  }

 private:
  int open_streams() const {
    int n = 0;
    for (const Rank& r : ranks_) n += (r.out.fd >= 0) + (r.err.fd >= 0);
    return n;
  }

  void poll_once(int signal_fd) {
    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
    std::vector<std::pair<Rank*, Stream*>> owners{{nullptr, nullptr}};
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd < 0) continue;
        fds.push_back({s->fd, POLLIN, 0});
        owners.emplace_back(&r, s);
      }
    }
    // Bounded so that the kill and drain deadlines are honoured without a timer.
    int rc = ::poll(fds.data(), fds.size(), 50);
    if (rc <= 0) return;  // timeout or EINTR: the caller re-checks children and deadlines
    if (fds[0].revents & POLLIN) handle_signals(signal_fd);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_stream(*owners[i].first, *owners[i].second);
    }
  }

  void handle_signals(int signal_fd) {
    unsigned char buf[64];
    ssize_t n = ::read(signal_fd, buf, sizeof(buf));
    for (ssize_t i = 0; i < n; ++i) {
      int sig = buf[i];
      if (sig == SIGCHLD) continue;  // reap() runs after every poll
      if (!interrupted_) {
        interrupted_ = sig;
        report(std::string("received SIG") + sigabbrev_np(sig) + ", forwarding it to the ranks");
      }
      signal_all(sig);
      if (!kill_deadline_) kill_deadline_ = Clock::now() + opts_.grace;
    }
  }

  void read_stream(Rank& r, Stream& s) {
    char buf[65536];
    ssize_t n = ::read(s.fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) return;
    if (n <= 0) {  // EOF (every writer closed it) or a broken pipe
      ::close(s.fd);
      s.fd = -1;
      return;
    }
    std::string_view data(buf, static_cast<size_t>(n));
    while (!data.empty()) {
      size_t nl = data.find('\n');
      if (nl == std::string_view::npos) {
        s.pending.append(data);
        break;
      }
      s.pending.append(data.substr(0, nl + 1));
      emit(r, s);
      data.remove_prefix(nl + 1);
    }
  }

  // One write() per line, so lines of different ranks never interleave mid-line.
  void emit(const Rank& r, Stream& s) {
    if (opts_.prefix_output) s.pending.insert(0, "[rank " + std::to_string(&r - ranks_.data()) + "] ");
    write_all(s.target, s.pending);
    s.pending.clear();
  }

  void flush_partial(Rank& r, Stream& s) {
    if (s.fd >= 0) {
      ::close(s.fd);
      s.fd = -1;
    }
    if (s.pending.empty()) return;
    s.pending.push_back('\n');
    emit(r, s);
  }

  void reap() {
    for (size_t i = 0; i < ranks_.size(); ++i) {
      Rank& r = ranks_[i];
      if (!r.running) continue;
      int status = 0;
      pid_t got = ::waitpid(r.pid, &status, WNOHANG);
      if (got == 0 || (got < 0 && errno == EINTR)) continue;
      r.running = false;
      if (got < 0) status = 0;  // reaped by someone else (a caller's SIGCHLD handler): unknown, not blamed
      bool failed = WIFSIGNALED(status) || WEXITSTATUS(status) != 0;
      if (failed && !first_failure_ && !interrupted_ && !aborted_) {
        first_failure_ = {static_cast<int>(i), status};
        report("rank " + std::to_string(i) + " " + describe_status(status) + "; stopping the other ranks");
        signal_all(SIGTERM);
        kill_deadline_ = Clock::now() + opts_.grace;
      }
    }
  }

  // To the process group of every rank not yet reaped (a reaped rank's group id may be reused).
  void signal_all(int sig) {
    for (const Rank& r : ranks_) {
      if (r.running) ::kill(-r.pid, sig);
    }
  }

  const LaunchOptions& opts_;
  std::vector<Rank>& ranks_;
  std::optional<std::pair<int, int>> first_failure_;  // (rank, wait status)
  int interrupted_ = 0;                               // the signal the launcher received, if any
  bool aborted_ = false;
  std::optional<Clock::time_point> kill_deadline_, drain_deadline_;
};

// In the child after fork(): async-signal-safe calls only.
[[noreturn]] void exec_rank(const char* path, char* const argv[], char* const envp[], int out_fd,
                            int err_fd) {
  ::setpgid(0, 0);
  for (int sig : SignalScope::kSignals) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  // Nothing of the launcher's (other ranks' pipes, the caller's descriptors) leaks into a rank.
  ::syscall(SYS_close_range, 3U, ~0U, 0U);
  ::execve(path, argv, envp);
  const char msg[] = "epfuse launch: exec failed\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, msg, sizeof(msg) - 1);
  ::_exit(127);
}

}  // namespace

int launch(const LaunchOptions& opts, const std::vector<std::string>& argv) {
  if (opts.nprocs < 1) {
    report("the number of processes must be at least 1, got " + std::to_string(opts.nprocs));
    return 2;
  }
  if (argv.empty()) {
    report("no command to launch");
    return 2;
  }
  std::optional<std::string> path = resolve_command(argv[0]);
  if (!path) {
    report("command not found or not executable: " + argv[0]);
    return 127;
  }
  int port = opts.master_port;
  if (port == 0) {
    std::string why;
    std::optional<int> p = free_port(why);
    if (!p) {
      report("could not find a free port for MASTER_PORT: " + why);
      return 1;
    }
    port = *p;
  }
  std::string secret_why;
  const std::optional<std::string> secret = bootstrap_secret(secret_why);
  if (!secret) {
    report("could not make a bootstrap secret: " + secret_why);
    return 1;
  }

  int signal_pipe[2];
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    report(std::string("pipe: ") + std::strerror(errno));
    return 1;
  }
  std::vector<Rank> ranks(static_cast<size_t>(opts.nprocs));
  int result = 0;
  {
    SignalScope signals(signal_pipe[1]);
    std::vector<std::string> args = argv;
    std::vector<char*> c_argv = c_strings(args);
    bool started_all = true;
    for (int i = 0; i < opts.nprocs && started_all; ++i) {
      Rank& r = ranks[static_cast<size_t>(i)];
      r.out.target = STDOUT_FILENO;
      r.err.target = STDERR_FILENO;
      int out_pipe[2], err_pipe[2];
      if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
        report(std::string("pipe: ") + std::strerror(errno));
        started_all = false;
        break;
      }
      if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
        report(std::string("pipe: ") + std::strerror(errno));
        ::close(out_pipe[0]);
        ::close(out_pipe[1]);
        started_all = false;
        break;
      }
      std::vector<std::string> env = rank_environment(opts, i, port, *secret);
      std::vector<char*> c_env = c_strings(env);
      // The launcher's signals stay blocked across fork(): until exec_rank resets the handlers, the child
      // runs the launcher's handler, and a SIGTERM sent to its group then (another rank failed at once)
      // reached the launcher's signal pipe as if the launcher had been interrupted. Blocked, it waits
      // for the child's unmask and takes the default action there.
      sigset_t launcher_signals, saved_mask;
      sigemptyset(&launcher_signals);
      for (int sig : SignalScope::kSignals) sigaddset(&launcher_signals, sig);
      ::sigprocmask(SIG_BLOCK, &launcher_signals, &saved_mask);
      pid_t pid = ::fork();
      if (pid == 0) exec_rank(path->c_str(), c_argv.data(), c_env.data(), out_pipe[1], err_pipe[1]);
      ::sigprocmask(SIG_SETMASK, &saved_mask, nullptr);
      ::close(out_pipe[1]);
      ::close(err_pipe[1]);
      if (pid < 0) {
        report(std::string("fork: ") + std::strerror(errno));
        ::close(out_pipe[0]);
        ::close(err_pipe[0]);
        started_all = false;
        break;
      }
      ::setpgid(pid, pid);  // also in the child: whichever runs first, the group exists before kill()
      r.pid = pid;
      r.running = true;
      r.out.fd = out_pipe[0];
      r.err.fd = err_pipe[0];
    }
    Launch launch(opts, ranks);
    if (!started_all) launch.abort_start();
    result = launch.run(signal_pipe[0]);
  }
  ::close(signal_pipe[0]);
  ::close(signal_pipe[1]);
  return result;
}

}  // namespace epfuse::tools
