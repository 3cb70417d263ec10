// The wire format of dtcore's rendezvous store: frames, requests, responses and the handshake.
//
// Pure encoding and decoding, shared by StoreServer (store_server.h) and StoreClient
// (store_client.h); no sockets here. Decoders take bytes from the network, so they check every
// length against what is left and report malformed input by returning std::nullopt, never by
// reading past the end or allocating what a length field claims. See Note [Store protocol].
//
// Ownership: values only. Thread safety: pure functions, except random_nonce(), which reads the
// kernel's random source and may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dtcore/common/sha256.h"

// Note [Store protocol]
// Version 1. Every message is a frame: a 4-byte big-endian payload length, then the payload.
// Integers are big-endian; a string or byte value is a 4-byte length and the bytes.
//
// Handshake (mutual challenge-response on the job secret; the secret never crosses the wire):
//   server -> ServerHello  "dtcstore" magic (8) | version u16 | server nonce (32)        = 42 bytes
//   client -> ClientHello  "dtcstore" magic (8) | version u16 | client nonce (32)
//                          | HMAC-SHA256(secret, "client" | server nonce | client nonce) = 74 bytes
//   server -> ServerProof  HMAC-SHA256(secret, "server" | server nonce | client nonce)
//                          | max frame bytes u32                                           = 36 bytes
// The server greets as soon as it accepts. It closes, without a word, a connection whose first
// frame is not a ClientHello of exactly that size, with another magic or version, with a wrong
// MAC (compared in constant time), with bytes after it before the proof is sent, or that has not
// finished within the handshake deadline. Nonces are 32 bytes from getrandom(2). The client
// refuses a greeting of another size or magic, or a wrong proof; it is then facing a listener
// that is not a dtcore store or has another job's secret. Authentication only: frames are not
// encrypted, so the store carries no secrets of its own.
//
// Why the frames after the handshake carry no MAC: the boundary is the authenticated TCP
// connection on an interface only the job uses (loopback for one node, the master address for
// several; Note [Store address]). To act on such a connection a stranger must be on its path,
// able to read and forge its TCP sequence numbers: root on a host of the job, or the network
// between its hosts. That stranger also reaches the collectives' own connections (Gloo's and
// NCCL's carry every gradient, with no authentication at all) and reads every store value as it
// passes, so a MAC on each store frame would guard the one channel that matters least while the
// others stay open. A network where strangers sit on the path needs its protection below dtcore
// (a private network, VPN or IPsec between the job's hosts), which covers every channel at once.
//
// Requests, after the handshake (one frame each):
//   op u8 | key count u32 | keys | value count u32 | values | number i64
// Responses (one frame per request, in order):
//   status u8 | value count u32 | values | number i64
// Every op uses the same layout; the server checks each op's counts (`shape_ok`) and closes the
// connection on an unknown op, a bad shape, trailing bytes or a frame over its limit.
//   Set         key, value                    -> Ok
//   CompareSet  key, expected, desired        -> Ok [value now stored]   (c10d semantics: a missing key with
//                                                 an empty `expected` is set; a missing key otherwise
//                                                 returns `expected` unchanged)
//   Get         key                           -> Ok [value]               parks until the key exists
//   Add         key, number = delta           -> Ok number = new value   stored as decimal text, as TCPStore
//   DeleteKey   key                           -> Ok number = 1 if it existed
//   Check       keys                          -> Ok number = 1 if all exist
//   NumKeys                                   -> Ok number = key count
//   Wait        keys                          -> Ok                       parks until all exist
//   Append      key, value                    -> Ok
//   MultiGet    keys                          -> Ok [values]              parks until all exist
//   MultiSet    keys, values (same count)     -> Ok
//   ListKeys                                  -> Ok [keys]
//   QueuePush   key, value                    -> Ok
//   QueuePop    key, number = block (0 or 1)  -> Ok [value] | QueueEmpty  parks while empty when blocking
//   QueueLen    key                           -> Ok number = length
//   Cancel                                    -> Canceled
// Status Error carries one value, the server's message (e.g. the stored-bytes limit). Keys set by
// Set, CompareSet, Add, Append and MultiSet release parked Get, Wait and MultiGet requests.
// A connection has at most one request in flight. While one is parked the only request allowed is
// Cancel: the server drops the parked request, or, if it was answered first, the client reads
// that answer before Canceled. The client sends Cancel when its own timeout expires, so the
// connection stays usable after a timed-out wait.

namespace dtcore::store {

inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::array<std::uint8_t, 8> kMagic = {'d', 't', 'c', 's', 't', 'o', 'r', 'e'};
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kFrameHeaderBytes = 4;
inline constexpr std::size_t kServerHelloBytes = 8 + 2 + kNonceBytes;
inline constexpr std::size_t kClientHelloBytes = 8 + 2 + kNonceBytes + kSha256Bytes;
inline constexpr std::size_t kServerProofBytes = kSha256Bytes + 4;

using Bytes = std::vector<std::uint8_t>;
using Nonce = std::array<std::uint8_t, kNonceBytes>;

enum class Op : std::uint8_t {
  Set = 1,
  CompareSet = 2,
  Get = 3,
  Add = 4,
  DeleteKey = 5,
  Check = 6,
  NumKeys = 7,
  Wait = 8,
  Append = 9,
  MultiGet = 10,
  MultiSet = 11,
  ListKeys = 12,
  QueuePush = 13,
  QueuePop = 14,
  QueueLen = 15,
  Cancel = 16,
};

enum class Status : std::uint8_t {
  Ok = 0,
  Error = 1,       // values[0]: the server's message
  QueueEmpty = 2,  // a non-blocking QueuePop on an empty queue
  Canceled = 3,    // the answer to Cancel
};

std::string_view op_name(Op op);  // "set", "get", ..., for messages

struct Request {
  Op op = Op::Set;
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  std::int64_t number = 0;  // Add: the delta; QueuePop: 1 to block
};

struct Response {
  Status status = Status::Ok;
  std::vector<Bytes> values;
  std::int64_t number = 0;
};

// Frames: header + payload, appended to `out`.
void append_frame(Bytes& out, std::span<const std::uint8_t> payload);
std::uint32_t read_frame_length(const std::uint8_t* header);  // the 4 header bytes

// Requests and responses: payloads (without the frame header).
Bytes encode_request(const Request& request);
std::optional<Request> decode_request(std::span<const std::uint8_t> payload);  // nullopt: malformed or unknown op
bool shape_ok(const Request& request);  // the key and value counts that request.op takes
Bytes encode_response(const Response& response);
std::optional<Response> decode_response(std::span<const std::uint8_t> payload);
// The encoded payload size of a response with these values, to refuse one over the frame limit.
std::size_t response_bytes(const std::vector<Bytes>& values);
std::size_t request_bytes(const Request& request);

// Handshake payloads.
struct ServerHello {
  std::uint16_t version = kProtocolVersion;
  Nonce nonce{};
};
struct ClientHello {
  std::uint16_t version = kProtocolVersion;
  Nonce nonce{};
  Sha256Digest mac{};
};
struct ServerProof {
  Sha256Digest mac{};
  std::uint32_t max_frame_bytes = 0;
};
Bytes encode_server_hello(const ServerHello& hello);
// nullopt when the size or magic is wrong; the version is returned as sent, for the caller to judge.
std::optional<ServerHello> decode_server_hello(std::span<const std::uint8_t> payload);
Bytes encode_client_hello(const ClientHello& hello);
std::optional<ClientHello> decode_client_hello(std::span<const std::uint8_t> payload);
Bytes encode_server_proof(const ServerProof& proof);
std::optional<ServerProof> decode_server_proof(std::span<const std::uint8_t> payload);

// The two MACs of the handshake; distinct labels, so that one side's proof is never valid as the other's.
Sha256Digest client_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
Sha256Digest server_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);

// 32 bytes from getrandom(2) (or /dev/urandom). Throws RendezvousError if neither answers.
Nonce random_nonce();

}  // namespace dtcore::store
