// Internal: SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the bootstrap store's
// authentication (tcp_store.h). Small and dependency-free; not tuned for bulk data.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace epfuse::detail {

using Digest = std::array<uint8_t, 32>;

Digest sha256(std::span<const uint8_t> data);
Digest hmac_sha256(std::span<const uint8_t> key, std::span<const uint8_t> message);

// Compares in time independent of where the first difference is.
bool digests_equal(const uint8_t* a, const uint8_t* b, size_t n);

}  // namespace epfuse::detail
