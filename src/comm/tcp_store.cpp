// TCP rendezvous (tcp_store.h): POSIX sockets, non-blocking I/O under poll() so that every wait
// has a bound, the server serves all its clients at once, and its thread can always be woken to stop.
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <utility>

#include "comm/sha256.h"
#include "common/check.h"
#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kRequestHeaderBytes = 8;  // magic, job_bytes, key_bytes
constexpr size_t kReplyHeaderBytes = 7;    // magic, status, value_bytes
constexpr size_t kMaxRequestBytes = kRequestHeaderBytes + kMaxJobBytes + kMaxKeyBytes + kNonceBytes + kMacBytes;
static_assert(kMaxRequestBytes <= 1024, "the most the server allocates for one request");
constexpr auto kFirstBackoff = std::chrono::milliseconds(50);
constexpr auto kMaxBackoff = std::chrono::milliseconds(1000);

std::string errno_text(int err) { return std::string(std::strerror(err)); }

std::string where(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      close_now();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { close_now(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  void close_now() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  int fd_;
};

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

AddrInfoList resolve(const std::string& addr, int port, int rank) {
  EPFUSE_REQUIRE(!addr.empty(), ErrorCode::kBootstrap,
                 "rank " + std::to_string(rank) + ": the master address is empty");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;  // never AI_PASSIVE: only the given address, never a wildcard
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &list);
  if (rc != 0 || list == nullptr) {
    throw Error(ErrorCode::kBootstrap,
                "rank " + std::to_string(rank) + ": cannot resolve master address '" + addr + "': " + gai_strerror(rc));
  }
  return AddrInfoList(list);
}

bool is_wildcard(const addrinfo& ai) {
  if (ai.ai_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(ai.ai_addr)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (ai.ai_family == AF_INET6) {
    const in6_addr& a = reinterpret_cast<const sockaddr_in6*>(ai.ai_addr)->sin6_addr;
    return std::memcmp(&a, &in6addr_any, sizeof(a)) == 0;
  }
  return false;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// HMAC(secret, prefix ‖ body): the request's (no prefix) and the reply's (the request's nonce).
Digest mac_of(const std::string& secret, std::span<const uint8_t> prefix, std::span<const uint8_t> body) {
  Blob message(prefix.begin(), prefix.end());
  message.insert(message.end(), body.begin(), body.end());
  return hmac_sha256(bytes_of(secret), message);
}

// Fresh random bytes for a request's nonce (getrandom never fails for 16 bytes once the pool is up).
void random_bytes(uint8_t* out, size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(out, n, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kBootstrap, "getrandom(): " + errno_text(errno));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

enum class Io { kOk, kClosed, kTimeout, kError };

// Sends or receives exactly n bytes on a non-blocking socket, however the kernel splits them.
// Stops early when the peer closes or the deadline passes.
Io transfer(int fd, void* data, size_t n, bool sending, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t got = sending ? ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) : ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0 && !sending) return Io::kClosed;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return Io::kError;
    pollfd pfd{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    const int ms = remaining_ms(deadline);
    if (ms == 0) return Io::kTimeout;
    if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return Io::kError;
  }
  return Io::kOk;
}

void put_be(uint8_t* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, v >>= 8) out[i] = static_cast<uint8_t>(v);
}
uint64_t get_be(const uint8_t* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v = (v << 8) | in[i];
  return v;
}

// Connects a non-blocking socket, waiting at most until the deadline. On failure returns -1 and
// describes why in `reason`.
int connect_by(const addrinfo& ai, Clock::time_point deadline, std::string& reason) {
  Fd fd(::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol));
  if (fd.get() < 0) {
    reason = "socket(): " + errno_text(errno);
    return -1;
  }
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) == 0) return fd.release();
  if (errno != EINPROGRESS && errno != EINTR) {
    reason = errno_text(errno);
    return -1;
  }
  pollfd pfd{fd.get(), POLLOUT, 0};
  const int ready = ::poll(&pfd, 1, remaining_ms(deadline));
  if (ready <= 0) {
    reason = ready == 0 ? "connect timed out" : "poll(): " + errno_text(errno);
    return -1;
  }
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    reason = errno_text(err != 0 ? err : errno);
    return -1;
  }
  return fd.release();
}

enum class Ask { kFound, kNotSet, kNoAnswer };

}  // namespace

// The bytes of a request for `key` of job `job` with a fresh nonce, authenticated with `secret`
// (tcp_store.h).
Blob tcp_store_request(const std::string& job, const std::string& secret, const std::string& key) {
  Blob request(kRequestHeaderBytes + job.size() + key.size() + kNonceBytes + kMacBytes);
  put_be(request.data(), kRequestMagic, 4);
  put_be(request.data() + 4, job.size(), 2);
  put_be(request.data() + 6, key.size(), 2);
  uint8_t* p = request.data() + kRequestHeaderBytes;
  std::memcpy(p, job.data(), job.size());
  std::memcpy(p + job.size(), key.data(), key.size());
  random_bytes(p + job.size() + key.size(), kNonceBytes);
  const size_t signed_bytes = request.size() - kMacBytes;
  const Digest mac = mac_of(secret, {}, std::span(request.data(), signed_bytes));
  std::memcpy(request.data() + signed_bytes, mac.data(), kMacBytes);
  return request;
}

namespace {

// One request/reply exchange with the store. Throws for a reply that is not from a TcpStore or fails
// its HMAC, for a store that refuses this rank, and for a store of another job (retrying cannot help).
Ask ask_once(const addrinfo& ai, const std::string& job, const std::string& secret, const std::string& key,
             Clock::time_point overall, Blob& value, std::string& reason, const std::string& who) {
  const Clock::time_point deadline = std::min(overall, Clock::now() + kClientAttemptBound);
  Fd fd(connect_by(ai, deadline, reason));
  if (fd.get() < 0) return Ask::kNoAnswer;
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

  const Blob request = tcp_store_request(job, secret, key);
  const std::span<const uint8_t> nonce(request.data() + request.size() - kMacBytes - kNonceBytes, kNonceBytes);
  if (transfer(fd.get(), const_cast<uint8_t*>(request.data()), request.size(), true, deadline) != Io::kOk) {
    reason = "sending the request failed";
    return Ask::kNoAnswer;
  }
  uint8_t header[kReplyHeaderBytes];
  const Io io = transfer(fd.get(), header, sizeof(header), false, deadline);
  if (io != Io::kOk) {
    reason = io == Io::kTimeout ? "no reply in time" : "connection closed before the reply";
    return Ask::kNoAnswer;
  }
  const auto status = static_cast<ReplyStatus>(header[4]);
  const uint64_t bytes = get_be(header + 5, 2);
  const bool known = status == ReplyStatus::kNotSet || status == ReplyStatus::kFound ||
                     status == ReplyStatus::kOtherJob || status == ReplyStatus::kDenied;
  // Checked before anything is allocated for it: at most kMaxValueBytes, only with kFound.
  if (get_be(header, 4) != kReplyMagic || !known || bytes > kMaxValueBytes ||
      (status != ReplyStatus::kFound && bytes != 0)) {
    throw Error(ErrorCode::kBootstrap, who + " answered with a malformed reply (not an epfuse TcpStore?)");
  }
  if (status == ReplyStatus::kDenied) {  // unauthenticated by nature: the store does not share our secret
    throw Error(ErrorCode::kBootstrap,
                who +
                    " refused this rank: its bootstrap secret or job differs from rank 0's (another launch on this "
                    "MASTER_PORT? every rank needs the same EPFUSE_BOOTSTRAP_SECRET, WORLD_SIZE and EPFUSE_JOB_ID)");
  }
  Blob rest(bytes + kMacBytes);
  if (transfer(fd.get(), rest.data(), rest.size(), false, deadline) != Io::kOk) {
    reason = "the reply was cut short";
    return Ask::kNoAnswer;
  }
  Blob signed_part(header, header + kReplyHeaderBytes);
  signed_part.insert(signed_part.end(), rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(bytes));
  const Digest mac = mac_of(secret, nonce, signed_part);
  if (!digests_equal(mac.data(), rest.data() + bytes, kMacBytes)) {
    throw Error(ErrorCode::kBootstrap, who +
                                           " answered with a reply that fails authentication: not rank 0's store "
                                           "of this launch (a forged store, or a different bootstrap secret)");
  }
  if (status == ReplyStatus::kOtherJob) {
    throw Error(ErrorCode::kBootstrap,
                who + " serves another job than this rank's job '" + job +
                    "' (two jobs on one MASTER_PORT? give each its own port, or check WORLD_SIZE and EPFUSE_JOB_ID)");
  }
  if (status == ReplyStatus::kNotSet) {
    reason = "key not set yet";
    return Ask::kNotSet;
  }
  value.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(bytes));
  return Ask::kFound;
}

}  // namespace

TcpStore::TcpStore(const std::string& addr, int port, int rank, std::string job, std::string secret, bool bind_any)
    : rank_(rank), job_(std::move(job)), secret_(std::move(secret)) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  EPFUSE_REQUIRE(job_.size() <= kMaxJobBytes, ErrorCode::kInvalidArgument,
                 me + "TcpStore: job id of " + std::to_string(job_.size()) + " bytes, more than the limit " +
                     std::to_string(kMaxJobBytes));
  EPFUSE_REQUIRE(secret_.size() <= kMaxSecretBytes, ErrorCode::kInvalidArgument,
                 me + "TcpStore: bootstrap secret of " + std::to_string(secret_.size()) +
                     " bytes, more than the limit " + std::to_string(kMaxSecretBytes));
  EPFUSE_REQUIRE(port >= 0 && port <= 65535, ErrorCode::kBootstrap,
                 me + "master port " + std::to_string(port) + " is outside [0, 65535]");
  const AddrInfoList list = resolve(addr, port, rank);
  for (const addrinfo* ai = list.get(); ai != nullptr && !bind_any; ai = ai->ai_next) {
    EPFUSE_REQUIRE(!is_wildcard(*ai), ErrorCode::kBootstrap,
                   me + "MASTER_ADDR=" + addr +
                       " would make rank 0's bootstrap store listen on every interface: give the address of the "
                       "interface the other ranks reach, or set EPFUSE_BOOTSTRAP_BIND_ANY=1 to allow it");
  }
  std::string reason = "no usable address";
  for (const addrinfo* ai = list.get(); ai != nullptr && listen_fd_ < 0; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    const int one = 1;
    // SO_REUSEADDR: a test or job restarted at once must not wait out TIME_WAIT on this port.
    if (fd.get() < 0 || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      reason = errno_text(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      reason = "getsockname(): " + errno_text(errno);
      continue;
    }
    port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    listen_fd_ = fd.release();
  }
  if (listen_fd_ < 0) {
    throw Error(ErrorCode::kBootstrap, me + "cannot listen on " + where(addr, port) + ": " + reason);
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    throw Error(ErrorCode::kBootstrap, me + "pipe2() failed: " + errno_text(err));
  }
  wake_read_fd_ = pipe_fds[0];
  wake_write_fd_ = pipe_fds[1];
  thread_ = std::thread([this] { serve(); });
}

TcpStore::~TcpStore() {
  const uint8_t stop = 1;
  while (::write(wake_write_fd_, &stop, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_fd_);
  ::close(wake_write_fd_);
}

void TcpStore::set(const std::string& key, Blob value) {
  EPFUSE_REQUIRE(!key.empty() && key.size() <= kMaxKeyBytes, ErrorCode::kInvalidArgument,
                 "TcpStore::set: key length " + std::to_string(key.size()) + " is outside [1, " +
                     std::to_string(kMaxKeyBytes) + "]");
  EPFUSE_REQUIRE(value.size() <= kMaxValueBytes, ErrorCode::kInvalidArgument,
                 "TcpStore::set: value for key '" + key + "' has " + std::to_string(value.size()) +
                     " bytes, more than the limit " + std::to_string(kMaxValueBytes));
  std::lock_guard<std::mutex> lock(mutex_);
  entries_[key] = Entry{std::move(value), 0};
}

int TcpStore::times_served(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(key);
  return it == entries_.end() ? 0 : it->second.served;
}

// One client: its request as it arrives, then the reply as the socket takes it.
struct TcpStore::Connection {
  Connection(Fd client, Clock::time_point drop_at) : fd(std::move(client)), deadline(drop_at) {}
  Fd fd;
  Clock::time_point deadline;         // dropped then, whatever its state
  Blob in;                            // the request so far
  size_t want = kRequestHeaderBytes;  // the request's length, once its header is in
  Blob out;                           // the reply; empty while the request is incomplete
  size_t sent = 0;
  std::string key;
  bool done = false;
};

void TcpStore::serve() {
  std::vector<Connection> clients;  // in accept order: the oldest first
  std::vector<pollfd> fds;
  for (;;) {
    fds.assign({{wake_read_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}});
    Clock::time_point next = Clock::time_point::max();
    for (const Connection& c : clients) {
      fds.push_back({c.fd.get(), static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
      next = std::min(next, c.deadline);
    }
    if (::poll(fds.data(), fds.size(), clients.empty() ? -1 : remaining_ms(next)) < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "epfuse: rank %d: TcpStore server stops: poll(): %s\n", rank_, std::strerror(errno));
      return;
    }
    if (fds[0].revents & POLLIN) return;
    const auto now = Clock::now();
    for (size_t i = 0; i < clients.size(); ++i) {
      Connection& c = clients[i];
      if (fds[i + 2].revents != 0) c.done = !advance(c);
      c.done = c.done || now >= c.deadline;  // a stalled client is dropped; it retries or times out
    }
    std::erase_if(clients, [](const Connection& c) { return c.done; });
    if (!(fds[1].revents & POLLIN)) continue;
    for (;;) {  // every pending connection; failed accepts (client gone, EINTR) end the round
      Fd client(::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
      if (client.get() < 0) break;
      // Bounded: a flood of idle connections costs the oldest of them their place, never the server.
      if (clients.size() >= static_cast<size_t>(kMaxConnections)) clients.erase(clients.begin());
      clients.emplace_back(std::move(client), Clock::now() + kServerIoBound);
    }
  }
}

// Reads what has arrived of the request, then sends what the socket takes of the reply. A malformed
// request or a closed connection ends it; so does the whole reply sent (one request per connection).
bool TcpStore::advance(Connection& c) {
  while (c.out.empty()) {
    const size_t have = c.in.size();
    c.in.resize(c.want);
    const ssize_t got = ::recv(c.fd.get(), c.in.data() + have, c.want - have, MSG_DONTWAIT);
    c.in.resize(have + static_cast<size_t>(std::max<ssize_t>(got, 0)));
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    if (have < kRequestHeaderBytes && c.in.size() >= kRequestHeaderBytes) {
      // Lengths checked before anything is allocated for them: a larger one drops the connection.
      const uint64_t job_bytes = get_be(c.in.data() + 4, 2), key_bytes = get_be(c.in.data() + 6, 2);
      if (get_be(c.in.data(), 4) != kRequestMagic || job_bytes > kMaxJobBytes || key_bytes == 0 ||
          key_bytes > kMaxKeyBytes)
        return false;
      c.want = kRequestHeaderBytes + job_bytes + key_bytes + kNonceBytes + kMacBytes;
    }
    if (c.in.size() == c.want && c.want > kRequestHeaderBytes) {
      c.out = reply_to(c.in);
      if (static_cast<ReplyStatus>(c.out[4]) == ReplyStatus::kFound) {
        const auto key_begin =
            c.in.begin() + static_cast<std::ptrdiff_t>(kRequestHeaderBytes + get_be(c.in.data() + 4, 2));
        c.key.assign(key_begin, key_begin + static_cast<std::ptrdiff_t>(get_be(c.in.data() + 6, 2)));
      }
    }
  }
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    c.sent += static_cast<size_t>(n);
  }
  if (static_cast<ReplyStatus>(c.out[4]) == ReplyStatus::kFound) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++entries_[c.key].served;
  }
  return false;
}

// The reply to a complete request (its lengths already checked). A request whose HMAC fails gets a
// bare kDenied: nothing of the job, the key or the secret.
Blob TcpStore::reply_to(const Blob& request) const {
  const size_t job_bytes = get_be(request.data() + 4, 2), key_bytes = get_be(request.data() + 6, 2);
  const size_t signed_bytes = request.size() - kMacBytes;
  const std::span<const uint8_t> nonce(request.data() + signed_bytes - kNonceBytes, kNonceBytes);
  auto reply = [&](ReplyStatus status, const void* value, size_t bytes) {
    Blob out(kReplyHeaderBytes + bytes + kMacBytes, 0);
    put_be(out.data(), kReplyMagic, 4);
    out[4] = static_cast<uint8_t>(status);
    put_be(out.data() + 5, bytes, 2);
    if (bytes > 0) std::memcpy(out.data() + kReplyHeaderBytes, value, bytes);
    if (status != ReplyStatus::kDenied) {
      const Digest mac = mac_of(secret_, nonce, std::span(out.data(), kReplyHeaderBytes + bytes));
      std::memcpy(out.data() + kReplyHeaderBytes + bytes, mac.data(), kMacBytes);
    }
    return out;
  };
  const Digest mac = mac_of(secret_, {}, std::span(request.data(), signed_bytes));
  if (!digests_equal(mac.data(), request.data() + signed_bytes, kMacBytes))
    return reply(ReplyStatus::kDenied, nullptr, 0);
  const auto* job = reinterpret_cast<const char*>(request.data() + kRequestHeaderBytes);
  if (std::string_view(job, job_bytes) != job_) return reply(ReplyStatus::kOtherJob, nullptr, 0);
  const std::string key(job + job_bytes, key_bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = entries_.find(key);
  if (it == entries_.end()) return reply(ReplyStatus::kNotSet, nullptr, 0);
  return reply(ReplyStatus::kFound, it->second.value.data(), it->second.value.size());
}

Blob tcp_store_get(const std::string& addr, int port, const std::string& job, const std::string& secret,
                   const std::string& key, std::chrono::milliseconds timeout, int rank) {
  const std::string me = "rank " + std::to_string(rank) + ": ";
  EPFUSE_REQUIRE(port >= 1 && port <= 65535, ErrorCode::kBootstrap,
                 me + "master port " + std::to_string(port) + " is outside [1, 65535]");
  EPFUSE_REQUIRE(
      !key.empty() && key.size() <= kMaxKeyBytes, ErrorCode::kInvalidArgument,
      me + "key length " + std::to_string(key.size()) + " is outside [1, " + std::to_string(kMaxKeyBytes) + "]");
  EPFUSE_REQUIRE(
      job.size() <= kMaxJobBytes, ErrorCode::kInvalidArgument,
      me + "job id of " + std::to_string(job.size()) + " bytes, more than the limit " + std::to_string(kMaxJobBytes));
  EPFUSE_REQUIRE(secret.size() <= kMaxSecretBytes, ErrorCode::kInvalidArgument,
                 me + "bootstrap secret of " + std::to_string(secret.size()) + " bytes, more than the limit " +
                     std::to_string(kMaxSecretBytes));
  const AddrInfoList list = resolve(addr, port, rank);
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::duration_cast<Clock::duration>(kFirstBackoff);
  std::string reason = "no attempt made";
  int attempts = 0;
  for (;;) {
    for (const addrinfo* ai = list.get(); ai != nullptr; ai = ai->ai_next) {
      Blob value;
      std::string why;
      ++attempts;
      if (ask_once(*ai, job, secret, key, deadline, value, why, me + where(addr, port)) == Ask::kFound) return value;
      // An attempt cut short by the deadline says less than the one before it.
      if (attempts == 1 || Clock::now() < deadline) reason = why;
    }
    const auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min(backoff, deadline - now));
    backoff = std::min<Clock::duration>(backoff * 2, kMaxBackoff);
  }
  throw Error(ErrorCode::kBootstrap, me + "no answer from " + where(addr, port) + " for key '" + key + "' after " +
                                         std::to_string(timeout.count()) + " ms (" + std::to_string(attempts) +
                                         " attempts; last: " + reason + ")");
}

std::string bootstrap_job(int world_size, const std::string& job_id) {
  return "world_size=" + std::to_string(world_size) + (job_id.empty() ? "" : " job_id=" + job_id);
}

}  // namespace epfuse::detail
