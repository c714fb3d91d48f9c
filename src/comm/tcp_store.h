// Internal: the rendezvous behind Communicator::bootstrap. Rank 0 serves byte blobs by key over TCP
// on MASTER_ADDR:MASTER_PORT; every rank fetches them, retrying until rank 0 is up and has set the key.
//
// Trust: the store and its clients share a per-launch secret (BootstrapOptions::secret) and a job id
// (world size and job id, bootstrap_job). Neither travels on the wire: each request carries an
// HMAC-SHA-256 under the secret, and each reply an HMAC bound to the request's fresh nonce. A client
// without the secret gets a bare kDenied and nothing else (not the job id, not whether the key is
// set); a store without it cannot hand a rank a forged value (the client checks the reply's HMAC).
// The values themselves travel in clear: an eavesdropper on the path sees them (README, "The
// bootstrap trusts no stranger").
//
// Wire format (integers big-endian), one request per connection:
//   request: u32 kRequestMagic, u16 job_bytes, u16 key_bytes, job, key, nonce[16],
//            mac[32] = HMAC(secret, every request byte before mac)
//   reply:   u32 kReplyMagic, u8 status (ReplyStatus), u16 value_bytes, value,
//            mac[32] = HMAC(secret, nonce ‖ every reply byte before mac); all zero for kDenied
//            (kNotSet, kOtherJob, kDenied: no value; kFound: the key's value)
// Limits: job_bytes <= kMaxJobBytes, 1 <= key_bytes <= kMaxKeyBytes, value_bytes <= kMaxValueBytes;
// a peer that sends a larger length is dropped before anything is allocated for it.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace epfuse::detail {

using Blob = std::vector<uint8_t>;

inline constexpr uint32_t kRequestMagic = 0x45504b33;  // "EPK3" (HMAC and 16-bit lengths added to "EPK2")
inline constexpr uint32_t kReplyMagic = 0x45505633;    // "EPV3"
inline constexpr size_t kMaxKeyBytes = 64;
inline constexpr size_t kMaxJobBytes = 576;     // bootstrap_job of a 512-byte job id and any world size
inline constexpr size_t kMaxValueBytes = 128;   // the NCCL unique id (NCCL_UNIQUE_ID_BYTES)
inline constexpr size_t kMaxSecretBytes = 1024;
inline constexpr size_t kNonceBytes = 16;
inline constexpr size_t kMacBytes = 32;
enum class ReplyStatus : uint8_t { kNotSet = 0, kFound = 1, kOtherJob = 2, kDenied = 3 };

// The server: listens on exactly `addr` from construction until destruction; a wildcard address
// (0.0.0.0, ::) is refused unless `bind_any` (EPFUSE_BOOTSTRAP_BIND_ANY=1). One background thread
// serves every connection at once (a poll() loop over non-blocking sockets), so an idle or slow client
// delays no other; each connection is dropped kServerIoBound after it was accepted, and beyond
// kMaxConnections open ones the oldest is dropped.
class TcpStore {
 public:
  static constexpr std::chrono::milliseconds kServerIoBound{3000};
  static constexpr int kMaxConnections = 256;

  // port 0 binds a free port (see port()). `job` is the job id clients must present (may be empty),
  // `secret` the key of their HMAC. `rank` only names this process in error messages. Throws
  // Error(kBootstrap) when the address cannot be resolved or bound or is a wildcard without
  // `bind_any`, Error(kInvalidArgument) for a job id longer than kMaxJobBytes or a secret longer than
  // kMaxSecretBytes.
  TcpStore(const std::string& addr, int port, int rank, std::string job, std::string secret,
           bool bind_any = false);
  ~TcpStore();  // stops the thread: wakes its poll(), joins; never blocks on a client
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  void set(const std::string& key, Blob value);
  int port() const { return port_; }
  // How many replies carried this key's value (rank 0 can wait until every peer has its copy).
  int times_served(const std::string& key) const;

 private:
  struct Entry {
    Blob value;
    int served = 0;
  };
  struct Connection;
  void serve();
  bool advance(Connection& c);  // false: done with it (answered, malformed or gone)
  Blob reply_to(const Blob& request) const;

  int rank_;
  std::string job_;
  std::string secret_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;  // a pipe: the destructor writes, the server thread's poll() wakes
  int wake_write_fd_ = -1;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::thread thread_;
};

// The client: asks addr:port for `key` of job `job` (authenticated with `secret`) until a reply
// carries it, backing off from 50 ms to 1 s between attempts; each attempt's I/O is bounded by
// kClientAttemptBound as well as by `timeout`. Throws Error(kBootstrap) "rank R: no answer from
// ADDR:PORT for key K after N ms" when `timeout` passes first, and at once for an unresolvable
// address, a reply that is not from a TcpStore or fails its HMAC (a forged store), a store that
// refuses this rank's secret (another launch on this port), or a store of another job.
inline constexpr std::chrono::milliseconds kClientAttemptBound{5000};
// The bytes of one request (wire format above) with a fresh nonce; tests craft peers with it.
Blob tcp_store_request(const std::string& job, const std::string& secret, const std::string& key);
Blob tcp_store_get(const std::string& addr, int port, const std::string& job, const std::string& secret,
                   const std::string& key, std::chrono::milliseconds timeout, int rank);

// The job id of Communicator::bootstrap's store and of its clients: world_size and the caller's job id
// (BootstrapOptions::job_id). MASTER_ADDR and MASTER_PORT are left out: a client has reached them
// already, and the ranks of one job may spell one host differently (a name here, an address there).
std::string bootstrap_job(int world_size, const std::string& job_id);

}  // namespace epfuse::detail
