// Hostile peers against the bootstrap store (tcp_store.h), on 127.0.0.1 only: thousands of random,
// truncated and bit-flipped requests, oversized lengths, silent and trickling clients, 1,000
// connections opened and closed, clients with the wrong secret. Afterwards the store must still serve
// a real rank correctly, and nothing of the value may have reached a stranger. Also SHA-256 / HMAC
// against published vectors. Bounded loops and times: the whole file runs in well under 60 s.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/sha256.h"
#include "comm/tcp_store.h"
#include "epfuse/error.h"

namespace {

using epfuse::detail::Blob;
using epfuse::detail::ReplyStatus;
using epfuse::detail::tcp_store_get;
using epfuse::detail::tcp_store_request;
using epfuse::detail::TcpStore;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kLoopback = "127.0.0.1";
const std::string kJob = epfuse::detail::bootstrap_job(4, "fuzz");
const std::string kSecret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr size_t kReplyHeader = 7;

std::string hex(const epfuse::detail::Digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::span<const uint8_t> bytes(const std::string& s) { return {reinterpret_cast<const uint8_t*>(s.data()), s.size()}; }

TEST(Sha256, PublishedVectors) {
  using epfuse::detail::hmac_sha256;
  using epfuse::detail::sha256;
  EXPECT_EQ(hex(sha256(bytes(""))), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha256(bytes("abc"))), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // 56 bytes: the length no longer fits the first padding block.
  EXPECT_EQ(hex(sha256(bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(hex(sha256(bytes(std::string(1000000, 'a')))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // RFC 4231 test cases 2 and 6 (a key longer than the block).
  EXPECT_EQ(hex(hmac_sha256(bytes("Jefe"), bytes("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(hex(hmac_sha256(bytes(std::string(131, '\xaa')),
                            bytes("Test Using Larger Than Block-Size Key - Hash Key First"))),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port << ": " << std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the peer closes or `limit` passes; returns what came and whether it closed.
struct Read {
  Blob data;
  bool closed = false;
};
Read read_until_closed(int fd, milliseconds limit) {
  Read out;
  const auto deadline = Clock::now() + limit;
  uint8_t buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return out;
    pollfd pfd{fd, POLLIN, 0};
    if (::poll(&pfd, 1, static_cast<int>(left)) <= 0) continue;
    const ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
    if (got <= 0) {  // 0: closed; < 0: reset (the server dropped it with our bytes unread)
      out.closed = true;
      return out;
    }
    out.data.insert(out.data.end(), buf, buf + got);
    if (out.data.size() > 1 << 16) return out;  // far more than any reply: the caller fails on it
  }
}

// Sends `message`, closes our sending side, and returns what the store answered before closing.
Read exchange(int port, const Blob& message) {
  const int fd = connect_loopback(port);
  if (fd < 0) return {};
  size_t sent = 0;
  while (sent < message.size()) {
    const ssize_t n = ::send(fd, message.data() + sent, message.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the store may drop us mid-message (a bad header): fine
    sent += static_cast<size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  Read r = read_until_closed(fd, milliseconds(5000));
  ::close(fd);
  return r;
}

Blob value_of(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Blob v(128);
  for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// What a stranger may see: nothing, or a bare kDenied (header, no value, a zero MAC). Never the value.
void expect_nothing_given(const Read& r, const Blob& secret_value, const std::string& what) {
  EXPECT_TRUE(r.closed) << what << ": the store kept the connection open";
  if (r.data.empty()) return;
  ASSERT_EQ(r.data.size(), kReplyHeader + 32) << what;
  EXPECT_EQ(r.data[4], static_cast<uint8_t>(ReplyStatus::kDenied)) << what;
  EXPECT_EQ(r.data[5], 0) << what;
  EXPECT_EQ(r.data[6], 0) << what;
  EXPECT_TRUE(std::all_of(r.data.begin() + kReplyHeader, r.data.end(), [](uint8_t b) { return b == 0; })) << what;
  EXPECT_EQ(std::search(r.data.begin(), r.data.end(), secret_value.begin(), secret_value.begin() + 16), r.data.end());
}

// The store still works for a real rank: a value set now comes back exactly, and a get is quick.
void expect_store_serves(TcpStore& store, const std::string& key, uint64_t seed) {
  store.set(key, value_of(seed));
  const auto start = Clock::now();
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, key, milliseconds(10000), 1), value_of(seed));
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
}

TEST(TcpStoreFuzz, RandomTruncatedAndFlippedRequestsGetNothing) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  const Blob id = value_of(1);
  store.set("nccl_id", id);
  std::mt19937_64 rng(12345);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int denied = 0, silent = 0;
  const auto start = Clock::now();
  constexpr int kMessages = 3000;
  for (int i = 0; i < kMessages; ++i) {
    Blob m;
    const Blob real = tcp_store_request(kJob, kSecret, "nccl_id");
    std::string what;
    switch (i % 6) {
      case 0: {  // random bytes, random length
        m.resize(pick(800));
        for (uint8_t& b : m) b = static_cast<uint8_t>(rng());
        what = "random bytes";
        break;
      }
      case 1: {  // the right magic, random lengths (often past the caps), random rest
        m.resize(8 + pick(700));
        for (uint8_t& b : m) b = static_cast<uint8_t>(rng());
        m[0] = 0x45, m[1] = 0x50, m[2] = 0x4b, m[3] = 0x33;
        what = "magic with random lengths";
        break;
      }
      case 2: {  // a real request cut short
        m.assign(real.begin(), real.begin() + static_cast<std::ptrdiff_t>(pick(real.size())));
        what = "truncated request of " + std::to_string(m.size()) + " bytes";
        break;
      }
      case 3: {  // a real request with one bit flipped (header, job, key, nonce or MAC)
        m = real;
        m[pick(m.size())] ^= static_cast<uint8_t>(1u << pick(8));
        what = "bit-flipped request";
        break;
      }
      case 4: {  // well formed, signed with the wrong secret, sometimes for the right job
        m = tcp_store_request(i % 12 == 4 ? kJob : "world_size=4", "guess " + std::to_string(i), "nccl_id");
        what = "wrong secret";
        break;
      }
      default: {  // oversized lengths in an otherwise plausible header
        m = real;
        m[4] = m[6] = 0xff;
        m[5] = m[7] = static_cast<uint8_t>(rng());
        what = "oversized lengths";
        break;
      }
    }
    const Read r = exchange(store.port(), m);
    expect_nothing_given(r, id, what + " (message " + std::to_string(i) + ")");
    (r.data.empty() ? silent : denied) += 1;
    if (::testing::Test::HasFailure()) break;  // one clear failure, not thousands
  }
  EXPECT_GT(denied, kMessages / 6) << "wrong-secret and bit-flipped requests get a bare kDenied";
  EXPECT_GT(silent, kMessages / 6) << "malformed and truncated ones get nothing";
  EXPECT_LT(Clock::now() - start, milliseconds(30000));
  EXPECT_EQ(store.times_served("nccl_id"), 0) << "a stranger got the id";
  expect_store_serves(store, "after_fuzz", 2);
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "nccl_id", milliseconds(5000), 2), id);
}

// A length past the cap drops the connection at once: the store neither allocates for it nor waits
// for bytes that would never fit.
TEST(TcpStoreFuzz, OversizedLengthClosesAtOnce) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  for (const Blob& header : {Blob{0x45, 0x50, 0x4b, 0x33, 0xff, 0xff, 0x00, 0x07},
                             Blob{0x45, 0x50, 0x4b, 0x33, 0x00, 0x10, 0x00, 0x41},     // key of 65 bytes
                             Blob{0x45, 0x50, 0x4b, 0x33, 0x02, 0x41, 0x00, 0x07},     // job of 577 bytes
                             Blob{0x45, 0x50, 0x4b, 0x33, 0x00, 0x10, 0x00, 0x00}}) {  // empty key
    const int fd = connect_loopback(store.port());
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::send(fd, header.data(), header.size(), MSG_NOSIGNAL), static_cast<ssize_t>(header.size()));
    const auto start = Clock::now();
    const Read r = read_until_closed(fd, milliseconds(2000));  // our side stays open: the store must close
    EXPECT_TRUE(r.closed);
    EXPECT_TRUE(r.data.empty());
    EXPECT_LT(Clock::now() - start, milliseconds(1000));
    ::close(fd);
  }
  expect_store_serves(store, "k", 3);
}

// A client that connects and sends nothing, one that sends half a request, and one that trickles a
// byte every 200 ms: none holds a real rank, and each is dropped once kServerIoBound has passed.
TEST(TcpStoreFuzz, SlowClientsHoldNoOneAndAreDropped) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  store.set("nccl_id", value_of(4));
  const Blob real = tcp_store_request(kJob, kSecret, "nccl_id");
  const int silent = connect_loopback(store.port());
  const int half = connect_loopback(store.port());
  const int trickle = connect_loopback(store.port());
  ASSERT_GE(silent, 0);
  ASSERT_GE(half, 0);
  ASSERT_GE(trickle, 0);
  ASSERT_EQ(::send(half, real.data(), real.size() / 2, MSG_NOSIGNAL), static_cast<ssize_t>(real.size() / 2));
  const auto opened = Clock::now();
  std::thread trickler([&] {
    for (size_t i = 0; i < real.size() && Clock::now() - opened < milliseconds(5000); ++i) {
      if (::send(trickle, real.data() + i, 1, MSG_NOSIGNAL) != 1) return;  // dropped
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  expect_store_serves(store, "meanwhile", 5);
  for (int fd : {silent, half}) {
    const Read r = read_until_closed(fd, milliseconds(6000));
    EXPECT_TRUE(r.closed) << "a silent client was never dropped";
    EXPECT_TRUE(r.data.empty());
  }
  const auto dropped = Clock::now() - opened;
  EXPECT_GE(dropped, TcpStore::kServerIoBound - milliseconds(100));
  EXPECT_LT(dropped, TcpStore::kServerIoBound + milliseconds(2000));
  const Read r = read_until_closed(trickle, milliseconds(3000));
  EXPECT_TRUE(r.closed) << "the trickling client was never dropped";
  EXPECT_TRUE(r.data.empty()) << "a request that took longer than the bound was answered";
  trickler.join();
  for (int fd : {silent, half, trickle}) ::close(fd);
  EXPECT_EQ(store.times_served("nccl_id"), 0);
  expect_store_serves(store, "after", 6);
}

// 1,000 connections opened and closed: one after another (half of them reset rather than closed),
// then 4 waves of 250 held open at once (each wave past kMaxConnections, so the oldest are dropped).
TEST(TcpStoreFuzz, AThousandConnectionsOpenedAndClosed) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  store.set("nccl_id", value_of(7));
  for (int i = 0; i < 1000; ++i) {
    const int fd = connect_loopback(store.port());
    ASSERT_GE(fd, 0) << "connection " << i;
    if (i % 2 == 1) {
      const linger reset{1, 0};  // close() sends RST
      ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    }
    ::close(fd);
  }
  expect_store_serves(store, "after_sequential", 8);
  for (int wave = 0; wave < 4; ++wave) {
    std::vector<int> open;
    for (int i = 0; i < 250; ++i) {
      const int fd = connect_loopback(store.port());
      ASSERT_GE(fd, 0) << "wave " << wave << " connection " << i;
      open.push_back(fd);
    }
    expect_store_serves(store, "during_wave_" + std::to_string(wave), 9 + wave);
    for (int fd : open) ::close(fd);
  }
  EXPECT_EQ(store.times_served("nccl_id"), 0);
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "nccl_id", milliseconds(5000), 1), value_of(7));
}

// Ranks of another launch (another secret) fail at once, in parallel with a real rank that succeeds.
TEST(TcpStoreFuzz, WrongSecretClientsFailFastRealOnesSucceed) {
  TcpStore store(kLoopback, 0, 0, kJob, kSecret);
  store.set("nccl_id", value_of(20));
  std::vector<std::thread> strangers;
  std::vector<std::string> errors(16);
  const auto start = Clock::now();
  for (int i = 0; i < 16; ++i) {
    strangers.emplace_back([&, i] {
      try {
        tcp_store_get(kLoopback, store.port(), kJob, kSecret + std::to_string(i), "nccl_id", milliseconds(20000), i);
      } catch (const epfuse::Error& e) {
        errors[static_cast<size_t>(i)] = e.what();
      }
    });
  }
  EXPECT_EQ(tcp_store_get(kLoopback, store.port(), kJob, kSecret, "nccl_id", milliseconds(10000), 1), value_of(20));
  for (std::thread& t : strangers) t.join();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("refused this rank"), std::string::npos) << e;
    EXPECT_EQ(e.find(kSecret), std::string::npos) << e;
  }
  EXPECT_EQ(store.times_served("nccl_id"), 1);
}

}  // namespace
