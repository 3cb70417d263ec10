// SignatureHistory: this rank's last collectives' running signatures, for the asynchronous check
// that the ranks issue the same collectives (See Note [Collective signature]).
//
// The health monitor keeps one: every collective issued here adds its number, its running
// signature and its description. A peer's heartbeat carries the peer's latest (number, signature);
// signature_at() answers this rank's signature at that number, so the two can be compared without
// any rank waiting for another. When they differ, the two ranks publish their signature lists
// (encode()), and every rank finds the first collective at which they differ (first_difference()).
// The pure part: no threads, no store, so every case is tested on made-up lists.
//
// Thread safety: none; the health monitor guards it with its mutex.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtcore {

class SignatureHistory {
 public:
  // Keeps the last `capacity` collectives (at least 1).
  explicit SignatureHistory(size_t capacity = 1024);

  // Collective `seq` (1, 2, ... with no gap), its running signature and its description without
  // its number ("all_reduce (torch.float32[8], sum)").
  void add(uint64_t seq, uint64_t signature, std::string_view call);
  // The latest collective added (0: none) and its signature.
  uint64_t last() const { return last_; }
  // This rank's signature at `seq`, when still kept.
  std::optional<uint64_t> signature_at(uint64_t seq) const;
  // This rank's call at `seq`, when still kept.
  std::optional<std::string> call_at(uint64_t seq) const;
  // "first:sig,sig,..." (hexadecimal): the kept signatures up to `upto`, for a peer to compare.
  std::string encode(uint64_t upto) const;

 private:
  struct Entry {
    uint64_t seq = 0;  // 0: empty
    uint64_t signature = 0;
    std::string call;  // assigned in place: its buffer is reused, so adding rarely allocates
  };
  const Entry* find(uint64_t seq) const;

  std::vector<Entry> ring_;  // collective seq at ring_[seq % size]
  uint64_t last_ = 0;
};

// A signature list a rank published (SignatureHistory::encode()).
struct SignatureList {
  uint64_t first = 0;  // the number of sigs[0]
  std::vector<uint64_t> sigs;
  // nullopt for anything malformed.
  static std::optional<SignatureList> decode(std::string_view text);
};

// Where two ranks' signature lists first differ, within the collectives both kept.
struct FirstDifference {
  uint64_t seq = 0;
  bool exact = true;  // false: they differ already at the first collective both kept (it may be earlier)
};
// nullopt when the lists agree wherever both have a signature (or share none).
std::optional<FirstDifference> first_difference(const SignatureList& a, const SignatureList& b);

}  // namespace dtcore
