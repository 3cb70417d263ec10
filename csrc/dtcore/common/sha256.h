// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), for the rendezvous store's handshake.
//
// The torch wheel ships no OpenSSL, so dtcore carries its own: a plain, portable implementation
// checked against the published vectors (NIST "abc" and "", RFC 4231) in tests/cpp/test_sha256.cpp.
// It authenticates, it does not encrypt: see Note [Store protocol] in bootstrap/store_protocol.h.
//
// Ownership: values only. Thread safety: a Sha256 object is for one thread at a time; the free
// functions are pure and may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace dtcore {

inline constexpr std::size_t kSha256Bytes = 32;
using Sha256Digest = std::array<std::uint8_t, kSha256Bytes>;

// Incremental SHA-256: update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const std::uint8_t> data);
  void update(std::string_view data);
  Sha256Digest finish();

 private:
  void compress(const std::uint8_t* block);

  std::array<std::uint32_t, 8> state_;
  std::array<std::uint8_t, 64> block_{};
  std::size_t block_used_ = 0;  // bytes of block_ filled, always < 64 between calls
  std::uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::span<const std::uint8_t> data);
Sha256Digest sha256(std::string_view data);

// HMAC-SHA256 of `message` under `key` (any length; keys over 64 bytes are hashed first).
Sha256Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message);
Sha256Digest hmac_sha256(std::string_view key, std::string_view message);

// a == b, in time that depends only on the lengths: a MAC check must not tell an attacker how
// many leading bytes of its guess were right.
bool constant_time_equal(std::span<const std::uint8_t> a, std::span<const std::uint8_t> b);

// Lower-case hex, for tests and logs.
std::string to_hex(std::span<const std::uint8_t> bytes);

}  // namespace dtcore
