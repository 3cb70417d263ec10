#include "dtcore/bootstrap/store_protocol.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtcore/common/error.h"

// See Note [Store protocol] in store_protocol.h.

namespace dtcore::store {
namespace {

void put_u16(Bytes& out, std::uint16_t v) {
  out.push_back(static_cast<std::uint8_t>(v >> 8));
  out.push_back(static_cast<std::uint8_t>(v));
}

void put_u32(Bytes& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(v >> shift));
}

void put_i64(Bytes& out, std::int64_t v) {
  auto u = static_cast<std::uint64_t>(v);
  for (int shift = 56; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(u >> shift));
}

void put_bytes(Bytes& out, std::span<const std::uint8_t> bytes) {
  put_u32(out, static_cast<std::uint32_t>(bytes.size()));
  out.insert(out.end(), bytes.begin(), bytes.end());
}

void put_string(Bytes& out, std::string_view s) {
  put_bytes(out, {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()});
}

// Reads fields from untrusted bytes: every read checks what is left, and a failed read poisons
// the reader, so a decoder checks ok() once at the end.
class Reader {
 public:
  explicit Reader(std::span<const std::uint8_t> data) : data_(data) {}

  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == data_.size(); }
  std::size_t left() const { return data_.size() - pos_; }

  const std::uint8_t* take(std::size_t n) {
    if (!ok_ || left() < n) {
      ok_ = false;
      return nullptr;
    }
    const std::uint8_t* p = data_.data() + pos_;
    pos_ += n;
    return p;
  }
  std::uint8_t u8() {
    const std::uint8_t* p = take(1);
    return p != nullptr ? p[0] : 0;
  }
  std::uint16_t u16() {
    const std::uint8_t* p = take(2);
    return p != nullptr ? static_cast<std::uint16_t>((p[0] << 8) | p[1]) : 0;
  }
  std::uint32_t u32() {
    const std::uint8_t* p = take(4);
    return p != nullptr ? read_frame_length(p) : 0;
  }
  std::int64_t i64() {
    const std::uint8_t* p = take(8);
    if (p == nullptr) return 0;
    std::uint64_t u = 0;
    for (int i = 0; i < 8; ++i) u = (u << 8) | p[i];
    return static_cast<std::int64_t>(u);
  }
  // A count of length-prefixed items: each takes at least 4 bytes, so a count the rest of the
  // payload cannot hold is malformed (and never reaches reserve()).
  std::uint32_t count() {
    std::uint32_t n = u32();
    if (ok_ && n > left() / 4) ok_ = false;
    return ok_ ? n : 0;
  }
  Bytes bytes() {
    std::uint32_t n = u32();
    const std::uint8_t* p = take(n);
    return p != nullptr ? Bytes(p, p + n) : Bytes();
  }
  std::string string() {
    std::uint32_t n = u32();
    const std::uint8_t* p = take(n);
    return p != nullptr ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
  }
  template <std::size_t N>
  std::array<std::uint8_t, N> array() {
    std::array<std::uint8_t, N> out{};
    const std::uint8_t* p = take(N);
    if (p != nullptr) std::memcpy(out.data(), p, N);
    return out;
  }

 private:
  std::span<const std::uint8_t> data_;
  std::size_t pos_ = 0;
  bool ok_ = true;
};

bool magic_ok(Reader& r) {
  const std::uint8_t* p = r.take(kMagic.size());
  return p != nullptr && std::memcmp(p, kMagic.data(), kMagic.size()) == 0;
}

std::string mac_message(std::string_view label, const Nonce& server_nonce, const Nonce& client_nonce) {
  std::string message(label);
  message.append(reinterpret_cast<const char*>(server_nonce.data()), server_nonce.size());
  message.append(reinterpret_cast<const char*>(client_nonce.data()), client_nonce.size());
  return message;
}

}  // namespace

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Set: return "set";
    case Op::CompareSet: return "compareSet";
    case Op::Get: return "get";
    case Op::Add: return "add";
    case Op::DeleteKey: return "deleteKey";
    case Op::Check: return "check";
    case Op::NumKeys: return "getNumKeys";
    case Op::Wait: return "wait";
    case Op::Append: return "append";
    case Op::MultiGet: return "multiGet";
    case Op::MultiSet: return "multiSet";
    case Op::ListKeys: return "listKeys";
    case Op::QueuePush: return "queuePush";
    case Op::QueuePop: return "queuePop";
    case Op::QueueLen: return "queueLen";
    case Op::Cancel: return "cancel";
  }
  return "unknown";
}

void append_frame(Bytes& out, std::span<const std::uint8_t> payload) {
  put_u32(out, static_cast<std::uint32_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
}

std::uint32_t read_frame_length(const std::uint8_t* header) {
  return (std::uint32_t{header[0]} << 24) | (std::uint32_t{header[1]} << 16) | (std::uint32_t{header[2]} << 8) |
         std::uint32_t{header[3]};
}

std::size_t request_bytes(const Request& request) {
  std::size_t n = 1 + 4 + 4 + 8;
  for (const auto& k : request.keys) n += 4 + k.size();
  for (const auto& v : request.values) n += 4 + v.size();
  return n;
}

std::size_t response_bytes(const std::vector<Bytes>& values) {
  std::size_t n = 1 + 4 + 8;
  for (const auto& v : values) n += 4 + v.size();
  return n;
}

Bytes encode_request(const Request& request) {
  Bytes out;
  out.reserve(request_bytes(request));
  out.push_back(static_cast<std::uint8_t>(request.op));
  put_u32(out, static_cast<std::uint32_t>(request.keys.size()));
  for (const auto& k : request.keys) put_string(out, k);
  put_u32(out, static_cast<std::uint32_t>(request.values.size()));
  for (const auto& v : request.values) put_bytes(out, v);
  put_i64(out, request.number);
  return out;
}

std::optional<Request> decode_request(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  Request request;
  std::uint8_t op = r.u8();
  if (op < static_cast<std::uint8_t>(Op::Set) || op > static_cast<std::uint8_t>(Op::Cancel)) return std::nullopt;
  request.op = static_cast<Op>(op);
  std::uint32_t nkeys = r.count();
  request.keys.reserve(nkeys);
  for (std::uint32_t i = 0; i < nkeys && r.ok(); ++i) request.keys.push_back(r.string());
  std::uint32_t nvalues = r.count();
  request.values.reserve(nvalues);
  for (std::uint32_t i = 0; i < nvalues && r.ok(); ++i) request.values.push_back(r.bytes());
  request.number = r.i64();
  if (!r.done()) return std::nullopt;
  return request;
}

bool shape_ok(const Request& request) {
  std::size_t k = request.keys.size();
  std::size_t v = request.values.size();
  switch (request.op) {
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: return k == 1 && v == 1;
    case Op::CompareSet: return k == 1 && v == 2;
    case Op::Get:
    case Op::Add:
    case Op::DeleteKey:
    case Op::QueueLen: return k == 1 && v == 0;
    case Op::QueuePop: return k == 1 && v == 0 && (request.number == 0 || request.number == 1);
    case Op::Check:
    case Op::Wait:
    case Op::MultiGet: return v == 0;
    case Op::MultiSet: return k == v;
    case Op::NumKeys:
    case Op::ListKeys:
    case Op::Cancel: return k == 0 && v == 0;
  }
  return false;
}

Bytes encode_response(const Response& response) {
  Bytes out;
  out.reserve(response_bytes(response.values));
  out.push_back(static_cast<std::uint8_t>(response.status));
  put_u32(out, static_cast<std::uint32_t>(response.values.size()));
  for (const auto& v : response.values) put_bytes(out, v);
  put_i64(out, response.number);
  return out;
}

std::optional<Response> decode_response(std::span<const std::uint8_t> payload) {
  Reader r(payload);
  Response response;
  std::uint8_t status = r.u8();
  if (status > static_cast<std::uint8_t>(Status::Canceled)) return std::nullopt;
  response.status = static_cast<Status>(status);
  std::uint32_t n = r.count();
  response.values.reserve(n);
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) response.values.push_back(r.bytes());
  response.number = r.i64();
  if (!r.done()) return std::nullopt;
  return response;
}

Bytes encode_server_hello(const ServerHello& hello) {
  Bytes out(kMagic.begin(), kMagic.end());
  put_u16(out, hello.version);
  out.insert(out.end(), hello.nonce.begin(), hello.nonce.end());
  return out;
}

std::optional<ServerHello> decode_server_hello(std::span<const std::uint8_t> payload) {
  if (payload.size() != kServerHelloBytes) return std::nullopt;
  Reader r(payload);
  if (!magic_ok(r)) return std::nullopt;
  ServerHello hello;
  hello.version = r.u16();
  hello.nonce = r.array<kNonceBytes>();
  if (!r.done()) return std::nullopt;
  return hello;
}

Bytes encode_client_hello(const ClientHello& hello) {
  Bytes out(kMagic.begin(), kMagic.end());
  put_u16(out, hello.version);
  out.insert(out.end(), hello.nonce.begin(), hello.nonce.end());
  out.insert(out.end(), hello.mac.begin(), hello.mac.end());
  return out;
}

std::optional<ClientHello> decode_client_hello(std::span<const std::uint8_t> payload) {
  if (payload.size() != kClientHelloBytes) return std::nullopt;
  Reader r(payload);
  if (!magic_ok(r)) return std::nullopt;
  ClientHello hello;
  hello.version = r.u16();
  hello.nonce = r.array<kNonceBytes>();
  hello.mac = r.array<kSha256Bytes>();
  if (!r.done()) return std::nullopt;
  return hello;
}

Bytes encode_server_proof(const ServerProof& proof) {
  Bytes out(proof.mac.begin(), proof.mac.end());
  put_u32(out, proof.max_frame_bytes);
  return out;
}

std::optional<ServerProof> decode_server_proof(std::span<const std::uint8_t> payload) {
  if (payload.size() != kServerProofBytes) return std::nullopt;
  Reader r(payload);
  ServerProof proof;
  proof.mac = r.array<kSha256Bytes>();
  proof.max_frame_bytes = r.u32();
  if (!r.done()) return std::nullopt;
  return proof;
}

bool is_transient(RefuseReason reason) {
  switch (reason) {
    case RefuseReason::HandshakeTimeout:
    case RefuseReason::Crowded:
    case RefuseReason::OutOfDescriptors:
    case RefuseReason::ShuttingDown: return true;
    case RefuseReason::WrongSecret:
    case RefuseReason::Version:
    case RefuseReason::Malformed: return false;
  }
  return false;  // a code this side does not know
}

Bytes encode_refusal(const Refusal& refusal) {
  constexpr std::size_t kFixed = kRefusalMagic.size() + 1 + 8 + 4;
  Bytes out(kRefusalMagic.begin(), kRefusalMagic.end());
  out.push_back(static_cast<std::uint8_t>(refusal.reason));
  put_i64(out, refusal.number);
  put_string(out, std::string_view(refusal.message).substr(0, kMaxRefusalBytes - kFixed));
  return out;
}

std::optional<Refusal> decode_refusal(std::span<const std::uint8_t> payload) {
  if (payload.size() > kMaxRefusalBytes) return std::nullopt;
  Reader r(payload);
  const std::uint8_t* magic = r.take(kRefusalMagic.size());
  if (magic == nullptr || std::memcmp(magic, kRefusalMagic.data(), kRefusalMagic.size()) != 0) return std::nullopt;
  Refusal refusal;
  refusal.reason = static_cast<RefuseReason>(r.u8());
  refusal.number = r.i64();
  refusal.message = r.string();
  if (!r.done()) return std::nullopt;
  for (char& ch : refusal.message) {
    if (ch < 0x20 || ch > 0x7e) ch = '?';
  }
  return refusal;
}

Sha256Digest client_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return hmac_sha256(secret, mac_message("client", server_nonce, client_nonce));
}

Sha256Digest server_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce) {
  return hmac_sha256(secret, mac_message("server", server_nonce, client_nonce));
}

Nonce random_nonce() {
  Nonce nonce{};
  std::size_t got = 0;
  while (got < nonce.size()) {
    ssize_t n = getrandom(nonce.data() + got, nonce.size() - got, 0);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;  // ENOSYS on an old kernel: read /dev/urandom instead
    }
  }
  if (got == nonce.size()) return nonce;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  got = 0;
  while (fd >= 0 && got < nonce.size()) {
    ssize_t n = read(fd, nonce.data() + got, nonce.size() - got);
    if (n > 0) {
      got += static_cast<std::size_t>(n);
    } else if (!(n < 0 && errno == EINTR)) {
      break;
    }
  }
  if (fd >= 0) close(fd);
  if (got != nonce.size()) {
    DTCORE_CHECK(false, RendezvousError,
                 "the rendezvous store found no random source (getrandom(2) and /dev/urandom both failed) for its "
                 "handshake nonces. Fix: run on a Linux kernel with getrandom(2) or mount /dev/urandom.");
  }
  return nonce;
}

}  // namespace dtcore::store
