// Internal: the rendezvous behind Communicator::bootstrap. Rank 0 serves byte blobs by key over TCP
// on MASTER_ADDR:MASTER_PORT; every rank fetches them, retrying until rank 0 is up and has set the key.
// A store belongs to one job (its job id): it answers a client of another job with its own id, so two
// jobs that meet on one port fail at once instead of joining each other's NCCL communicator.
//
// Wire format (integers big-endian), one request per connection:
//   request: u32 kRequestMagic, u32 job_bytes, u32 key_bytes, job, key
//   reply:   u32 kReplyMagic, u8 status (ReplyStatus), u64 value_bytes, value
//            (kNotSet: no value; kFound: the key's value; kOtherJob: the store's job id)
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

inline constexpr uint32_t kRequestMagic = 0x45504b32;  // "EPK2" (job id added to "EPK1")
inline constexpr uint32_t kReplyMagic = 0x45505632;    // "EPV2"
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxJobBytes = 1024;
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;
enum class ReplyStatus : uint8_t { kNotSet = 0, kFound = 1, kOtherJob = 2 };

// The server: listens on exactly `addr` (never a wildcard address) from construction until
// destruction. One background thread serves every connection at once (a poll() loop over
// non-blocking sockets), so an idle or slow client delays no other; each connection is dropped
// kServerIoBound after it was accepted, and beyond kMaxConnections open ones the oldest is dropped.
class TcpStore {
 public:
  static constexpr std::chrono::milliseconds kServerIoBound{5000};
  static constexpr int kMaxConnections = 256;

  // port 0 binds a free port (see port()). `job` is the job id clients must present (may be empty).
  // `rank` only names this process in error messages. Throws Error(kBootstrap) when the address cannot
  // be resolved or bound, Error(kInvalidArgument) for a job id longer than kMaxJobBytes.
  TcpStore(const std::string& addr, int port, int rank, std::string job = "");
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
  Blob reply_to(const std::string& job, const std::string& key) const;

  int rank_;
  std::string job_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;  // a pipe: the destructor writes, the server thread's poll() wakes
  int wake_write_fd_ = -1;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::thread thread_;
};

// The client: asks addr:port for `key` of job `job` until a reply carries it, backing off from 50 ms
// to 1 s between attempts. Throws Error(kBootstrap) "rank R: no answer from ADDR:PORT for key K after
// N ms" when `timeout` passes first, and at once for an unresolvable address, a reply that is not
// from a TcpStore, or a store of another job ("... serves job 'A', not this rank's job 'B' ...").
Blob tcp_store_get(const std::string& addr, int port, const std::string& job, const std::string& key,
                   std::chrono::milliseconds timeout, int rank);

// The job id of Communicator::bootstrap's store and of its clients: world_size and the caller's job id
// (BootstrapOptions::job_id). MASTER_ADDR and MASTER_PORT are left out: a client has reached them
// already, and the ranks of one job may spell one host differently (a name here, an address there).
std::string bootstrap_job(int world_size, const std::string& job_id);

}  // namespace epfuse::detail
