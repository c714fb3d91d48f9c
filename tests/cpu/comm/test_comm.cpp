// CPU tests of the bootstrap: the TCP store between two processes, its timeouts and shutdown, clients
// served at once, job ids, and BootstrapOptions::from_env. No GPU needed.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "comm/sha256.h"
#include "comm/tcp_store.h"
#include "common/hash.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace {

using epfuse::Error;
using epfuse::ErrorCode;
using epfuse::detail::Blob;
using epfuse::detail::bootstrap_job;
using epfuse::detail::TcpStore;
using epfuse::detail::tcp_store_get;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kLoopback = "127.0.0.1";
const std::string kJob = bootstrap_job(2, "test");
const std::string kSecret = "the secret of this test";

// Random bytes (zeros included) that both processes derive from the seed alone.
Blob blob(uint64_t seed, size_t bytes) {
  Blob out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(epfuse::detail::mix64(seed * 0x100000001b3ULL + i));
  return out;
}

// A port nothing listens on right now: bind port 0 on loopback, read it back, close.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ADD_FAILURE() << "cannot bind a loopback socket";
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs f, expects an Error with `code` whose message contains every piece; returns the message.
std::string expect_error(const std::function<void()>& f, ErrorCode code,
                         std::initializer_list<std::string> pieces) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& piece : pieces) EXPECT_NE(std::string(e.what()).find(piece), std::string::npos) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no Error thrown";
  return "";
}

// Waits for a child, at most `limit`; kills it if it hangs. Returns its wait status.
int wait_child(pid_t pid, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "child " << pid << " hung; killed";
      return status;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return status;
}

// A client that connects to the store on `port`, sends `bytes` and then nothing. Returns its socket.
int connect_silent(int port, const std::string& bytes) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << "port " << port;
  if (!bytes.empty()) {
    EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  }
  return fd;
}

// The store counts a reply once its server thread has sent all of it, which can be just after the
// client has read it: wait a little for the count.
int times_served_soon(const TcpStore& store, const std::string& key, int want) {
  const auto deadline = Clock::now() + milliseconds(1000);
  while (store.times_served(key) < want && Clock::now() < deadline) std::this_thread::sleep_for(milliseconds(1));
  return store.times_served(key);
}

const std::map<std::string, Blob>& served_blobs() {
  static const std::map<std::string, Blob> blobs = {
      {"nccl_id", blob(1, 128)},
      {"short", blob(2, 7)},
      {"empty", Blob{}},
  };
  return blobs;
}

TEST(TcpStore, ChildProcessFetchesExactBytesFromParent) {
  const int port = free_port();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {  // rank 1: only fresh sockets and _exit, nothing of the parent's state
    int code = 0;
    try {
      for (const auto& [key, want] : served_blobs()) {
        if (tcp_store_get(kLoopback, port, kJob, kSecret, key, milliseconds(20000), 1) != want) {
          std::fprintf(stderr, "child: key '%s' came back different\n", key.c_str());
          code = 1;
        }
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child: %s\n", e.what());
      code = 2;
    }
    ::_exit(code);
  }
  // Start serving late so that the child has to retry.
  std::this_thread::sleep_for(milliseconds(300));
  std::optional<TcpStore> store;
  store.emplace(kLoopback, port, 0, kJob, kSecret);
  EXPECT_EQ(store->port(), port);
  for (const auto& [key, value] : served_blobs()) store->set(key, value);
  const int status = wait_child(pid, milliseconds(30000));
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: bytes differ, 2: the child's get threw (see stderr)";
  for (const auto& [key, value] : served_blobs()) EXPECT_EQ(times_served_soon(*store, key, 1), 1) << key;
  EXPECT_EQ(store->times_served("never-set"), 0);
  const auto before = Clock::now();
  store.reset();
  EXPECT_LT(Clock::now() - before, milliseconds(1000)) << "the destructor must not linger";
}

TEST(TcpStore, SameProcessSetGetAndOverwrite) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);  // port 0: any free port
  ASSERT_GT(store.port(), 0);
  store.set("k", blob(7, 128));
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "k", milliseconds(5000), 0), blob(7, 128));
  store.set("k", blob(8, 3));
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "k", milliseconds(5000), 0), blob(8, 3));
  EXPECT_EQ(tcp_store_get("localhost", store.port(), kJob, kSecret, "k", milliseconds(5000), 0), blob(8, 3));
}

TEST(TcpStore, ClientTimesOutWithoutServer) {
  const int port = free_port();
  const auto start = Clock::now();
  expect_error([&] { tcp_store_get(kLoopback, port, kJob, kSecret, "nccl_id", milliseconds(300), 3); }, ErrorCode::kBootstrap,
               {"rank 3: no answer from 127.0.0.1:" + std::to_string(port) + " for key 'nccl_id' after 300 ms",
                "refused"});
  const auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, milliseconds(3000));
}

TEST(TcpStore, ClientTimesOutWhenKeyIsNeverSet) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  expect_error([&] { tcp_store_get(kLoopback, store.port(), kJob, kSecret, "missing", milliseconds(250), 1); },
               ErrorCode::kBootstrap, {"rank 1: no answer from", "for key 'missing' after 250 ms", "not set"});
}

TEST(TcpStore, KeyTheServerSetsLaterIsFetched) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    store.set("late", blob(3, 64));
  });
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "late", milliseconds(10000), 2), blob(3, 64));
  setter.join();
}

TEST(TcpStore, DestructorDoesNotWaitForAStalledClient) {
  std::optional<TcpStore> store;
  store.emplace(kLoopback, 0, 0, kJob, kSecret);
  const int fd = connect_silent(store->port(), "EP");  // half a header, then silence
  std::this_thread::sleep_for(milliseconds(100));  // the server is now inside this request
  const auto before = Clock::now();
  store.reset();
  EXPECT_LT(Clock::now() - before, milliseconds(1000));
  ::close(fd);
}

TEST(TcpStore, ForeignServerIsReportedNotRetried) {
  // Something else on the port that answers garbage: the client says so at once.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::thread server([&] {
    const int client = ::accept(listener, nullptr, nullptr);
    const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
    ::send(client, reply, sizeof(reply) - 1, MSG_NOSIGNAL);
    ::close(client);
  });
  const auto start = Clock::now();
  expect_error([&] { tcp_store_get(kLoopback, ntohs(addr.sin_port), kJob, kSecret, "nccl_id", milliseconds(10000), 1); },
               ErrorCode::kBootstrap, {"rank 1:", "malformed reply"});
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  server.join();
  ::close(listener);
}

TEST(TcpStore, BadArgumentsAreNamed) {
  expect_error([] { TcpStore(kLoopback, 70000, 0, kJob, kSecret); }, ErrorCode::kBootstrap, {"rank 0:", "70000"});
  expect_error([] { tcp_store_get(kLoopback, 0, kJob, kSecret, "k", milliseconds(10), 2); }, ErrorCode::kBootstrap,
               {"rank 2:", "port 0"});
  expect_error([] { tcp_store_get("no-such-host.invalid", 29500, kJob, kSecret, "k", milliseconds(10), 1); },
               ErrorCode::kBootstrap, {"rank 1:", "no-such-host.invalid"});
  const std::string long_job(epfuse::detail::kMaxJobBytes + 1, 'j');
  expect_error([&] { tcp_store_get(kLoopback, 29500, long_job, kSecret, "k", milliseconds(10), 1); },
               ErrorCode::kInvalidArgument, {"rank 1:", "job id of 577 bytes"});
  expect_error([&] { TcpStore(kLoopback, 0, 0, long_job, kSecret); }, ErrorCode::kInvalidArgument,
               {"rank 0:", "job id of 577 bytes"});
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  expect_error([&] { store.set("", Blob{}); }, ErrorCode::kInvalidArgument, {"key length 0"});
  expect_error([&] { store.set(std::string(65, 'k'), Blob{}); }, ErrorCode::kInvalidArgument, {"key length 65"});
  expect_error([&] { store.set("k", Blob(129)); }, ErrorCode::kInvalidArgument, {"129 bytes", "limit 128"});
  const std::string long_secret(epfuse::detail::kMaxSecretBytes + 1, 's');
  expect_error([&] { TcpStore(kLoopback, 0, 0, kJob, long_secret); }, ErrorCode::kInvalidArgument,
               {"rank 0:", "secret of 1025 bytes"});
  expect_error([&] { tcp_store_get(kLoopback, 29500, kJob, long_secret, "k", milliseconds(10), 1); },
               ErrorCode::kInvalidArgument, {"rank 1:", "secret of 1025 bytes"});
  // A second server on a port in use: the bind error is reported with the address.
  expect_error([&] { TcpStore(kLoopback, store.port(), 0, kJob, kSecret); }, ErrorCode::kBootstrap,
               {"cannot listen on 127.0.0.1:" + std::to_string(store.port())});
}

// How long tcp_store_get takes for a key that is set.
milliseconds time_get(int port, const std::string& key, int rank) {
  const auto start = Clock::now();
  EXPECT_EQ(tcp_store_get(kLoopback, port, kJob, kSecret, key, milliseconds(20000), rank), blob(5, 128));
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start);
}

// The server used to answer one connection at a time, each for up to 5 s: a client that connected
// and said nothing held every other rank for that long.
TEST(TcpStore, StalledClientsDoNotDelayAnother) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  store.set("k", blob(5, 128));
  const int silent = connect_silent(store.port(), "");
  const int half = connect_silent(store.port(), "EPK");  // part of a header
  std::this_thread::sleep_for(milliseconds(100));  // the server has both by now
  EXPECT_LT(time_get(store.port(), "k", 1), milliseconds(1000));
  EXPECT_EQ(times_served_soon(store, "k", 1), 1);
  ::close(silent);
  ::close(half);
}

TEST(TcpStore, IdleConnectionsBeyondTheLimitDoNotLockOthersOut) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  store.set("k", blob(5, 128));
  std::vector<int> idle;
  for (int i = 0; i < TcpStore::kMaxConnections + 8; ++i) idle.push_back(connect_silent(store.port(), ""));
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_LT(time_get(store.port(), "k", 1), milliseconds(2000));
  for (int fd : idle) ::close(fd);
}

TEST(TcpStore, ConcurrentGettersAllGetTheValue) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  const int silent = connect_silent(store.port(), "");
  std::vector<milliseconds> took(4);
  std::vector<std::thread> getters;
  for (int r = 0; r < 4; ++r) getters.emplace_back([&, r] { took[r] = time_get(store.port(), "late", r + 1); });
  std::this_thread::sleep_for(milliseconds(200));  // every getter is retrying by now
  store.set("late", blob(5, 128));
  for (std::thread& t : getters) t.join();
  // Set at 200 ms; a getter retries at most kMaxBackoff (1 s) later.
  for (int r = 0; r < 4; ++r) EXPECT_LT(took[r], milliseconds(2500)) << "getter " << r;
  EXPECT_EQ(times_served_soon(store, "late", 4), 4);
  ::close(silent);
}

// Two jobs on one port: a rank of the second reaches the first's store and must not get its NCCL id,
// nor learn the first's job id. With the same secret it is told "another job"; with another secret
// (the usual case: each launch has its own) it is refused and told nothing.
TEST(TcpStore, AnotherJobsClientFailsAtOnceAndLearnsNothing) {
  const std::string mine = bootstrap_job(2, "a"), theirs = bootstrap_job(4, "b");
  TcpStore store(kLoopback, 0, 0, mine, kSecret);
  store.set("nccl_id", blob(1, 128));
  const auto start = Clock::now();
  const std::string same_secret =
      expect_error([&] { tcp_store_get(kLoopback, store.port(), theirs, kSecret, "nccl_id", milliseconds(20000), 3); },
                   ErrorCode::kBootstrap,
                   {"rank 3: 127.0.0.1:" + std::to_string(store.port()), "serves another job than this rank's job '" +
                                                                            theirs + "'"});
  EXPECT_EQ(same_secret.find(mine), std::string::npos) << "the store told a stranger its job id: " << same_secret;
  const std::string other_secret = expect_error(
      [&] { tcp_store_get(kLoopback, store.port(), theirs, "their secret", "nccl_id", milliseconds(20000), 3); },
      ErrorCode::kBootstrap, {"rank 3: 127.0.0.1:" + std::to_string(store.port()), "refused this rank", "secret"});
  EXPECT_EQ(other_secret.find(mine), std::string::npos) << other_secret;
  // The right job with a wrong secret is refused just the same.
  expect_error([&] { tcp_store_get(kLoopback, store.port(), mine, "wrong", "nccl_id", milliseconds(20000), 1); },
               ErrorCode::kBootstrap, {"refused this rank"});
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_EQ(store.times_served("nccl_id"), 0);
  // The same job with the secret still gets it.
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), mine, kSecret, "nccl_id", milliseconds(5000), 1), blob(1, 128));
}

// A listener that answers one connection: reads the request, then sends `reply(request)`.
class FakeStore {
 public:
  explicit FakeStore(std::function<Blob(const Blob&)> reply) {
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listener_, 4), 0);
    EXPECT_EQ(::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, reply = std::move(reply)] {
      const int client = ::accept(listener_, nullptr, nullptr);
      if (client < 0) return;
      Blob request(4096);
      const ssize_t got = ::recv(client, request.data(), request.size(), 0);  // one small request: one read
      request.resize(static_cast<size_t>(std::max<ssize_t>(got, 0)));
      const Blob out = reply(request);
      ::send(client, out.data(), out.size(), MSG_NOSIGNAL);
      ::close(client);
    });
  }
  ~FakeStore() {
    ::shutdown(listener_, SHUT_RDWR);
    thread_.join();
    ::close(listener_);
  }
  int port() const { return port_; }

 private:
  int listener_ = -1;
  int port_ = 0;
  std::thread thread_;
};

Blob reply_bytes(epfuse::detail::ReplyStatus status, const Blob& value, const Blob& mac) {
  Blob out(7 + value.size() + mac.size());
  const uint8_t header[7] = {0x45, 0x50, 0x56, 0x33, static_cast<uint8_t>(status),
                             static_cast<uint8_t>(value.size() >> 8), static_cast<uint8_t>(value.size())};
  std::copy(header, header + 7, out.begin());
  std::copy(value.begin(), value.end(), out.begin() + 7);
  std::copy(mac.begin(), mac.end(), out.begin() + 7 + static_cast<std::ptrdiff_t>(value.size()));
  return out;
}

// A stranger that gets the port first must not hand ranks a forged NCCL id: it cannot sign a reply.
TEST(TcpStore, ForgedReplyIsRefusedNotTaken) {
  using epfuse::detail::ReplyStatus;
  FakeStore forger([](const Blob&) { return reply_bytes(ReplyStatus::kFound, blob(9, 128), Blob(32, 0xab)); });
  expect_error([&] { tcp_store_get(kLoopback, forger.port(), kJob, kSecret, "nccl_id", milliseconds(5000), 1); },
               ErrorCode::kBootstrap, {"rank 1:", "fails authentication"});
  // A reply signed with another secret fails the same way.
  FakeStore other([](const Blob& request) {
    Blob signed_part = reply_bytes(ReplyStatus::kFound, blob(9, 128), {});
    Blob message(request.end() - 48, request.end() - 32);  // the request's nonce
    message.insert(message.end(), signed_part.begin(), signed_part.end());
    const std::string key = "not the secret";
    const auto mac = epfuse::detail::hmac_sha256({reinterpret_cast<const uint8_t*>(key.data()), key.size()}, message);
    return reply_bytes(ReplyStatus::kFound, blob(9, 128), Blob(mac.begin(), mac.end()));
  });
  expect_error([&] { tcp_store_get(kLoopback, other.port(), kJob, kSecret, "nccl_id", milliseconds(5000), 1); },
               ErrorCode::kBootstrap, {"fails authentication"});
  // A length past the cap is refused before anything is allocated for it.
  FakeStore huge([](const Blob&) {
    Blob out = {0x45, 0x50, 0x56, 0x33, 1, 0xff, 0xff};
    return out;
  });
  expect_error([&] { tcp_store_get(kLoopback, huge.port(), kJob, kSecret, "nccl_id", milliseconds(5000), 1); },
               ErrorCode::kBootstrap, {"malformed reply"});
}

// MASTER_ADDR=0.0.0.0 (or ::) would listen on every interface: refused unless asked for.
TEST(TcpStore, WildcardAddressIsRefusedUnlessAllowed) {
  for (const char* any : {"0.0.0.0", "::"}) {
    expect_error([&] { TcpStore(any, 0, 0, kJob, kSecret); }, ErrorCode::kBootstrap,
                 {"rank 0: MASTER_ADDR=" + std::string(any), "every interface", "EPFUSE_BOOTSTRAP_BIND_ANY=1"});
  }
  TcpStore store("0.0.0.0", 0, 0, kJob, kSecret, /*bind_any=*/true);
  store.set("k", blob(4, 16));
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "k", milliseconds(5000), 1), blob(4, 16));
}

TEST(BootstrapJob, WorldSizeAndJobIdTellJobsApart) {
  EXPECT_EQ(bootstrap_job(4, "x"), bootstrap_job(4, "x"));
  EXPECT_NE(bootstrap_job(4, ""), bootstrap_job(8, ""));
  EXPECT_NE(bootstrap_job(4, "x"), bootstrap_job(4, "y"));
  EXPECT_NE(bootstrap_job(4, "x"), bootstrap_job(4, ""));
  EXPECT_NE(bootstrap_job(1, "4"), bootstrap_job(14, ""));  // no two fields run together
}

// Sets the bootstrap variables for one test and restores what was there before.
class EnvTest : public ::testing::Test {
 protected:
  static constexpr const char* kNames[] = {"RANK",        "WORLD_SIZE",  "LOCAL_RANK",
                                           "MASTER_ADDR", "MASTER_PORT", "EPFUSE_BOOTSTRAP_TIMEOUT_MS",
                                           "EPFUSE_JOB_ID", "TORCHELASTIC_RUN_ID", "EPFUSE_COLLECTIVE_TIMEOUT_MS",
                                           "EPFUSE_BOOTSTRAP_SECRET", "EPFUSE_BOOTSTRAP_BIND_ANY"};
  void SetUp() override {
    for (const char* name : kNames) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
  }
  void TearDown() override {
    for (const char* name : kNames) {
      const auto it = saved_.find(name);
      if (it == saved_.end()) {
        ::unsetenv(name);
      } else {
        ::setenv(name, it->second.c_str(), 1);
      }
    }
  }
  static void set(const char* name, const char* value) { ::setenv(name, value, 1); }
  static void expect_env_error(std::initializer_list<std::string> pieces) {
    expect_error([] { epfuse::BootstrapOptions::from_env(); }, ErrorCode::kBootstrap, pieces);
  }
  std::map<std::string, std::string> saved_;
};

TEST_F(EnvTest, DefaultsFillTheOptionalVariables) {
  set("RANK", "3");
  set("WORLD_SIZE", "4");
  const epfuse::BootstrapOptions opts = epfuse::BootstrapOptions::from_env();
  EXPECT_EQ(opts.rank, 3);
  EXPECT_EQ(opts.world_size, 4);
  EXPECT_EQ(opts.local_rank, 3);
  EXPECT_EQ(opts.master_addr, "127.0.0.1");
  EXPECT_EQ(opts.master_port, 29500);
  EXPECT_EQ(opts.timeout, milliseconds(120000));
  EXPECT_EQ(opts.collective_timeout, milliseconds(300000));
  EXPECT_EQ(opts.job_id, "");
}

TEST_F(EnvTest, CollectiveTimeoutIsReadAndChecked) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("EPFUSE_COLLECTIVE_TIMEOUT_MS", "1500");
  EXPECT_EQ(epfuse::BootstrapOptions::from_env().collective_timeout, milliseconds(1500));
  set("EPFUSE_COLLECTIVE_TIMEOUT_MS", "0");
  expect_env_error({"EPFUSE_COLLECTIVE_TIMEOUT_MS=0"});
  set("EPFUSE_COLLECTIVE_TIMEOUT_MS", "soon");
  expect_env_error({"EPFUSE_COLLECTIVE_TIMEOUT_MS='soon' is not an integer"});
}

TEST_F(EnvTest, EveryVariableIsRead) {
  set("RANK", "5");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("MASTER_ADDR", "10.1.2.3");
  set("MASTER_PORT", "12345");
  set("EPFUSE_BOOTSTRAP_TIMEOUT_MS", "2500");
  const epfuse::BootstrapOptions opts = epfuse::BootstrapOptions::from_env();
  EXPECT_EQ(opts.rank, 5);
  EXPECT_EQ(opts.world_size, 8);
  EXPECT_EQ(opts.local_rank, 1);
  EXPECT_EQ(opts.master_addr, "10.1.2.3");
  EXPECT_EQ(opts.master_port, 12345);
  EXPECT_EQ(opts.timeout, milliseconds(2500));
}

TEST_F(EnvTest, JobIdFromEpfuseJobIdElseTorchelasticRunId) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  set("TORCHELASTIC_RUN_ID", "elastic-7");
  EXPECT_EQ(epfuse::BootstrapOptions::from_env().job_id, "elastic-7");
  set("EPFUSE_JOB_ID", "mine");
  EXPECT_EQ(epfuse::BootstrapOptions::from_env().job_id, "mine");
  set("EPFUSE_JOB_ID", std::string(513, 'j').c_str());
  expect_env_error({"EPFUSE_JOB_ID or TORCHELASTIC_RUN_ID", "513 bytes"});
}

TEST_F(EnvTest, SecretFromTheLauncherElseFromTorchrun) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  EXPECT_EQ(epfuse::BootstrapOptions::from_env().secret, "");
  EXPECT_FALSE(epfuse::BootstrapOptions::from_env().bind_any);
  set("TORCHELASTIC_RUN_ID", "elastic-7");
  set("MASTER_PORT", "29999");
  const std::string derived = epfuse::BootstrapOptions::from_env().secret;
  EXPECT_NE(derived.find("elastic-7"), std::string::npos) << derived;
  EXPECT_NE(derived.find("29999"), std::string::npos) << derived;
  set("MASTER_PORT", "29998");
  EXPECT_NE(epfuse::BootstrapOptions::from_env().secret, derived) << "two launches of one run id share a secret";
  set("EPFUSE_BOOTSTRAP_SECRET", "from the launcher");
  EXPECT_EQ(epfuse::BootstrapOptions::from_env().secret, "from the launcher");
  set("EPFUSE_BOOTSTRAP_SECRET", std::string(1025, 's').c_str());
  expect_env_error({"EPFUSE_BOOTSTRAP_SECRET", "1025 bytes"});
  ::unsetenv("EPFUSE_BOOTSTRAP_SECRET");
  set("EPFUSE_BOOTSTRAP_BIND_ANY", "1");
  EXPECT_TRUE(epfuse::BootstrapOptions::from_env().bind_any);
  set("EPFUSE_BOOTSTRAP_BIND_ANY", "0");
  EXPECT_FALSE(epfuse::BootstrapOptions::from_env().bind_any);
  set("EPFUSE_BOOTSTRAP_BIND_ANY", "yes");
  expect_env_error({"EPFUSE_BOOTSTRAP_BIND_ANY='yes'"});
}

TEST_F(EnvTest, MissingRequiredVariablesAreNamed) {
  set("WORLD_SIZE", "2");
  expect_env_error({"RANK is not set"});
  ::unsetenv("WORLD_SIZE");
  set("RANK", "0");
  expect_env_error({"WORLD_SIZE is not set"});
}

TEST_F(EnvTest, MalformedValuesAreNamedWithTheirText) {
  set("RANK", "0");
  set("WORLD_SIZE", "2");
  for (const char* bad : {"abc", "1x", "", " 1", "1.5", "0x10"}) {
    set("RANK", bad);
    expect_env_error({"RANK='" + std::string(bad) + "' is not an integer"});
  }
  set("RANK", "99999999999999999999999");
  expect_env_error({"RANK='99999999999999999999999' is out of range"});
  set("RANK", "0");
  set("MASTER_PORT", "http");
  expect_env_error({"MASTER_PORT='http' is not an integer"});
}

TEST_F(EnvTest, OutOfRangeValuesAreNamed) {
  set("RANK", "2");
  set("WORLD_SIZE", "2");
  expect_env_error({"RANK=2", "WORLD_SIZE=2"});
  set("RANK", "-1");
  expect_env_error({"RANK=-1"});
  set("RANK", "0");
  set("WORLD_SIZE", "0");
  expect_env_error({"WORLD_SIZE=0"});
  set("WORLD_SIZE", "2");
  set("LOCAL_RANK", "2");
  expect_env_error({"LOCAL_RANK=2", "WORLD_SIZE=2"});
  ::unsetenv("LOCAL_RANK");
  for (const char* port : {"0", "65536", "-5"}) {
    set("MASTER_PORT", port);
    expect_env_error({"MASTER_PORT=" + std::string(port), "65535"});
  }
  ::unsetenv("MASTER_PORT");
  set("MASTER_ADDR", "");
  expect_env_error({"MASTER_ADDR is empty"});
  ::unsetenv("MASTER_ADDR");
  set("EPFUSE_BOOTSTRAP_TIMEOUT_MS", "0");
  expect_env_error({"EPFUSE_BOOTSTRAP_TIMEOUT_MS=0"});
}

TEST(BootstrapOptions, ValidateNamesTheField) {
  epfuse::BootstrapOptions opts;
  EXPECT_NO_THROW(opts.validate());
  opts.world_size = 2;
  opts.rank = 2;
  expect_error([&] { opts.validate(); }, ErrorCode::kBootstrap, {"RANK=2"});
  opts.rank = 1;
  opts.master_port = 70000;
  expect_error([&] { opts.validate(); }, ErrorCode::kBootstrap, {"MASTER_PORT=70000"});
  opts.master_port = 29500;
  opts.timeout = milliseconds(0);
  expect_error([&] { opts.validate(); }, ErrorCode::kBootstrap, {"EPFUSE_BOOTSTRAP_TIMEOUT_MS=0"});
}

}  // namespace

// Communicator::init_rank checks its arguments before touching CUDA or NCCL (no GPU needed).
TEST(InitRank, OutOfRangeArgumentsAreInvalid) {
  const ncclUniqueId id{};
  struct Case {
    int world, rank, device;
    long long timeout_ms;
  };
  for (const Case c : {Case{0, 0, 0, 1000}, Case{2, 2, 0, 1000}, Case{2, -1, 0, 1000}, Case{2, 0, -1, 1000},
                       Case{2, 0, 0, 0}}) {
    try {
      (void)epfuse::Communicator::init_rank(id, c.world, c.rank, c.device, std::chrono::milliseconds(c.timeout_ms));
      ADD_FAILURE() << "no error for world " << c.world << " rank " << c.rank;
    } catch (const epfuse::Error& e) {
      EXPECT_EQ(e.code(), epfuse::ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("Communicator::init_rank: rank " + std::to_string(c.rank) + " of world " +
                                           std::to_string(c.world)),
                std::string::npos)
          << e.what();
    }
  }
}
