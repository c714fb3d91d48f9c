#include "comm/collective_step.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <exception>
#include <vector>

#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

// Six bytes per double: an integer below 2^48 is exact in a double on every transport.
constexpr size_t kBytesPerValue = 6;
constexpr size_t kValues = (kAgreedMessageBytes + kBytesPerValue - 1) / kBytesPerValue;

std::vector<double> pack_message(const std::string& text) {
  std::vector<double> v(kValues + 1, 0.0);
  const size_t n = std::min(text.size(), kAgreedMessageBytes);
  v[0] = static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t slot = 1 + i / kBytesPerValue;
    const uint64_t byte = static_cast<unsigned char>(text[i]);
    v[slot] += static_cast<double>(byte << (8 * (i % kBytesPerValue)));
  }
  return v;
}

std::string unpack_message(const double* v) {
  const size_t n = std::min(static_cast<size_t>(v[0]), kAgreedMessageBytes);
  std::string text(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint64_t word = static_cast<uint64_t>(v[1 + i / kBytesPerValue]);
    text[i] = static_cast<char>((word >> (8 * (i % kBytesPerValue))) & 0xff);
  }
  return text;
}

}  // namespace

void agree_on_step(Communicator& comm, const std::string& step, const std::function<void()>& local) {
  std::exception_ptr failure;
  std::string why;
  ErrorCode code = ErrorCode::kInternal;
  try {
    local();
  } catch (const Error& e) {
    failure = std::current_exception();
    why = e.what();
    code = e.code();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    why = e.what();
  } catch (...) {
    failure = std::current_exception();
    why = "an exception not derived from std::exception";
  }
  // The agreement's own failure after a local one (a sticky CUDA error stops the host collective's
  // scratch too) must not hide the local one, its cause: the local message comes first.
  auto gather = [&](std::span<const double> values) {
    try {
      return comm.all_gather(values);
    } catch (const std::exception& e) {
      if (!failure) throw;
      throw Error(code, why + " (then agreeing on " + step + " failed: " + e.what() + ")");
    }
  };
  const double mine = failure ? 1.0 : 0.0;
  const std::vector<double> status = gather(std::span<const double>(&mine, 1));
  int failed = -1;
  for (int r = 0; r < static_cast<int>(status.size()) && failed < 0; ++r)
    if (status[static_cast<size_t>(r)] != 0.0) failed = r;
  if (failed < 0) return;
  // Every rank saw the same statuses, so every rank makes this second collective.
  const std::vector<double> messages = gather(pack_message(why));
  if (failure) std::rethrow_exception(failure);
  throw Error(ErrorCode::kAborted, "rank " + std::to_string(comm.rank()) + ": " + step + ": rank " +
                                       std::to_string(failed) + " failed: " +
                                       unpack_message(messages.data() + static_cast<size_t>(failed) * (kValues + 1)));
}

}  // namespace epfuse::detail
