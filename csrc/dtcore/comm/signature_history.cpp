#include "dtcore/comm/signature_history.h"

#include <algorithm>
#include <charconv>

namespace dtcore {
namespace {

bool parse_u64(std::string_view text, uint64_t& out, int base) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out, base);
  return ec == std::errc() && end == text.data() + text.size() && !text.empty();
}

std::string hex(uint64_t v) {
  char buf[17];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, 16);
  return std::string(buf, end);
}

}  // namespace

SignatureHistory::SignatureHistory(size_t capacity) : ring_(std::max<size_t>(capacity, 1)) {}

void SignatureHistory::add(uint64_t seq, uint64_t signature, std::string_view call) {
  Entry& e = ring_[seq % ring_.size()];
  e.seq = seq;
  e.signature = signature;
  e.call.assign(call);
  last_ = std::max(last_, seq);
}

const SignatureHistory::Entry* SignatureHistory::find(uint64_t seq) const {
  if (seq == 0) return nullptr;
  const Entry& e = ring_[seq % ring_.size()];
  return e.seq == seq ? &e : nullptr;
}

std::optional<uint64_t> SignatureHistory::signature_at(uint64_t seq) const {
  const Entry* e = find(seq);
  if (e == nullptr) return std::nullopt;
  return e->signature;
}

std::optional<std::string> SignatureHistory::call_at(uint64_t seq) const {
  const Entry* e = find(seq);
  if (e == nullptr) return std::nullopt;
  return e->call;
}

std::string SignatureHistory::encode(uint64_t upto) const {
  upto = std::min(upto, last_);
  uint64_t first = upto;
  while (first > 1 && find(first - 1) != nullptr) --first;
  if (find(first) == nullptr) return "";
  std::string out = std::to_string(first) + ":";
  for (uint64_t seq = first; seq <= upto; ++seq) {
    if (seq != first) out += ',';
    out += hex(find(seq)->signature);
  }
  return out;
}

std::optional<SignatureList> SignatureList::decode(std::string_view text) {
  const size_t colon = text.find(':');
  SignatureList list;
  if (colon == std::string_view::npos || !parse_u64(text.substr(0, colon), list.first, 10) || list.first == 0) {
    return std::nullopt;
  }
  for (size_t start = colon + 1; start <= text.size();) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    uint64_t sig = 0;
    if (!parse_u64(text.substr(start, comma - start), sig, 16)) return std::nullopt;
    list.sigs.push_back(sig);
    start = comma + 1;
  }
  return list;
}

std::optional<FirstDifference> first_difference(const SignatureList& a, const SignatureList& b) {
  const uint64_t from = std::max(a.first, b.first);
  const uint64_t to = std::min(a.first + a.sigs.size(), b.first + b.sigs.size());  // exclusive
  for (uint64_t seq = from; seq < to; ++seq) {
    if (a.sigs[seq - a.first] != b.sigs[seq - b.first]) return FirstDifference{seq, seq == 1 || seq != from};
  }
  return std::nullopt;
}

}  // namespace dtcore
