// Internal: the rendezvous behind Communicator::bootstrap. Rank 0 serves byte blobs by key over TCP
// on MASTER_ADDR:MASTER_PORT; every rank fetches them, retrying until rank 0 is up and has set the key.
//
// Wire format (integers big-endian), one request per connection:
//   request: u32 kRequestMagic, u32 key_bytes, key
//   reply:   u32 kReplyMagic, u8 found, u64 value_bytes, value   (found = 0: not set yet, no value)
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

inline constexpr uint32_t kRequestMagic = 0x45504b31;  // "EPK1"
inline constexpr uint32_t kReplyMagic = 0x45505631;    // "EPV1"
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;

// The server: listens on exactly `addr` (never a wildcard address) from construction until
// destruction, answering each connection from one background thread.
class TcpStore {
 public:
  // port 0 binds a free port (see port()). `rank` only names this process in error messages.
  // Throws Error(kBootstrap) when the address cannot be resolved or bound.
  TcpStore(const std::string& addr, int port, int rank);
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
  void serve();
  void answer(int client_fd);

  int rank_;
  int port_ = 0;
  int listen_fd_ = -1;
  int wake_read_fd_ = -1;  // a pipe: the destructor writes, the server thread's poll() wakes
  int wake_write_fd_ = -1;
  mutable std::mutex mutex_;
  std::map<std::string, Entry> entries_;
  std::thread thread_;
};

// The client: asks addr:port for `key` until a reply carries it, backing off from 50 ms to 1 s
// between attempts. Throws Error(kBootstrap) "rank R: no answer from ADDR:PORT for key K after N ms"
// when `timeout` passes first, and at once for an unresolvable address or a reply that is not
// from a TcpStore.
Blob tcp_store_get(const std::string& addr, int port, const std::string& key,
                   std::chrono::milliseconds timeout, int rank);

}  // namespace epfuse::detail
