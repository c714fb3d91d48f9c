// Internal: whether an output's bytes overlap an input's (the front doors refuse y aliasing x).
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>

namespace epfuse::detail {

// [p, p + bytes): a buffer a call reads or writes. Empty or null ranges overlap nothing.
struct ByteRange {
  const char* name = "";
  const void* p = nullptr;
  size_t bytes = 0;
};

inline bool overlaps(const ByteRange& a, const ByteRange& b) {
  if (a.p == nullptr || b.p == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.p), pb = reinterpret_cast<uintptr_t>(b.p);
  return pa < pb + b.bytes && pb < pa + a.bytes;
}

// The name of the first of `inputs` that `out` overlaps, or nullptr (names are the callers' literals).
inline const char* first_overlap(const ByteRange& out, std::initializer_list<ByteRange> inputs) {
  for (const ByteRange& in : inputs)
    if (overlaps(out, in)) return in.name;
  return nullptr;
}

}  // namespace epfuse::detail
