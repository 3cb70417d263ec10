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
// Version 2. Every message is a frame: a 4-byte big-endian payload length, then the payload.
// Integers are big-endian; a string or byte value is a 4-byte length and the bytes.
//
// Handshake (mutual challenge-response on the job secret; the secret never crosses the wire):
//   server -> ServerHello  "dtcstore" magic (8) | version u16 | server nonce (32)        = 42 bytes
//   client -> ClientHello  "dtcstore" magic (8) | version u16 | client nonce (32)
//                          | HMAC-SHA256(secret, "client" | server nonce | client nonce) = 74 bytes
//   server -> ServerProof  HMAC-SHA256(secret, "server" | server nonce | client nonce)
//                          | max frame bytes u32                                           = 36 bytes
//          or Refusal      "dtcrefus" magic (8) | reason u8 | number i64 | message string
//                                                                            (at most 1024 bytes)
// The server greets as soon as it accepts. It refuses, and closes, a connection whose first frame
// is not a ClientHello of exactly that size (reason Malformed), with another magic (Malformed) or
// version (Version, number = the server's version), with a wrong MAC, compared in constant time
// (WrongSecret), with bytes after it before the proof is sent (Malformed), that has not finished
// within the handshake deadline (HandshakeTimeout, number = the deadline in ms), that is the
// oldest of too many unauthenticated ones (Crowded, number = the limit), or that is still in the
// handshake when the server stops (ShuttingDown). When it has no descriptor left to accept with
// (EMFILE/ENFILE) it frees the one it keeps spare, accepts, sends a Refusal in place of the
// greeting (OutOfDescriptors, number = its open-file limit), closes and takes the spare again, so
// the connection is told why instead of waiting in the backlog, and accept never spins. The
// Refusal is the server's last frame on that connection. A connection closed or reset in the
// handshake without a Refusal was dropped (the network, or the server process failing): the
// client reports it as that, never as a wrong secret, and the caller retries within its deadline,
// as it does for the refusals that time may cure (HandshakeTimeout, Crowded, OutOfDescriptors,
// ShuttingDown). Nonces are 32 bytes from getrandom(2). The client refuses a greeting of another
// size or magic (not a dtcore store: another program holds the port) or a wrong proof (the
// server has another job's secret). Authentication only: frames are not encrypted, so the store
// carries no secrets of its own.
//
// A Refusal is unauthenticated: anyone at the port can send one. The client only ever fails on it
// (with the reason as its message and a fix of its own choosing per reason), so a forged Refusal
// achieves nothing a plain close would not. Its message is shown cut to 1024 bytes with
// non-printable bytes replaced, and never names the secret. A Refusal is told from a proof by its
// magic: a proof whose MAC starts with "dtcrefus" and also parses as a Refusal is a 2^-100 event.
//
// Compatibility: version 1 closed refused connections without a word, so the Refusal frame made
// this version 2. Both sides check the version in the greeting, so a version 1 client facing a
// version 2 server (or the reverse) fails at once with "speaks store protocol version 2, this
// client version 1" and the fix (the same dtcore on every host), never with a secret or foreign-
// listener error. The one exception: a version 1 client refused for lack of descriptors reads the
// Refusal in place of the greeting as "not a dtcore store's greeting". The Refusal layout is
// frozen across later versions (a client of any version reads any server's Refusal), and a reason
// code a client does not know is shown with the server's message and the same-version fix.
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
// connection on an unknown op, a bad shape, trailing bytes or a frame over its limit. No Refusal
// is sent then: the client reads answers there, and only a broken client sends such frames.
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

inline constexpr std::uint16_t kProtocolVersion = 2;
inline constexpr std::array<std::uint8_t, 8> kMagic = {'d', 't', 'c', 's', 't', 'o', 'r', 'e'};
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kFrameHeaderBytes = 4;
inline constexpr std::size_t kServerHelloBytes = 8 + 2 + kNonceBytes;
inline constexpr std::size_t kClientHelloBytes = 8 + 2 + kNonceBytes + kSha256Bytes;
inline constexpr std::size_t kServerProofBytes = kSha256Bytes + 4;
inline constexpr std::array<std::uint8_t, 8> kRefusalMagic = {'d', 't', 'c', 'r', 'e', 'f', 'u', 's'};
inline constexpr std::size_t kMaxRefusalBytes = 1024;  // a Refusal's whole payload, at most

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

// Why the server refuses a connection in the handshake (the Refusal frame). Codes are frozen:
// new reasons get new codes.
enum class RefuseReason : std::uint8_t {
  WrongSecret = 1,       // the client's MAC does not match the server's job secret
  Version = 2,           // the client speaks another protocol version; number: the server's
  Malformed = 3,         // the first frame is not a ClientHello, or data came before the proof
  HandshakeTimeout = 4,  // no handshake within the server's deadline; number: that deadline in ms
  Crowded = 5,           // the oldest of too many unauthenticated connections; number: the limit
  OutOfDescriptors = 6,  // no descriptor left to accept with (EMFILE/ENFILE); number: the open-file limit
  ShuttingDown = 7,      // the server is stopping
};

// True for the reasons that time may cure (the server's load, its descriptors, a restart): the
// rendezvous retries those within its deadline. The others end it at once.
bool is_transient(RefuseReason reason);

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
struct Refusal {
  RefuseReason reason = RefuseReason::Malformed;  // may hold a code this side does not know
  std::int64_t number = 0;                        // see RefuseReason
  std::string message;                            // the server's words, for the client's error
};
// The message is cut so that the payload fits kMaxRefusalBytes.
Bytes encode_refusal(const Refusal& refusal);
// nullopt unless it has the Refusal magic and layout and fits kMaxRefusalBytes; non-printable
// bytes of the message are replaced by '?', since it is shown to users.
std::optional<Refusal> decode_refusal(std::span<const std::uint8_t> payload);

// The two MACs of the handshake; distinct labels, so that one side's proof is never valid as the other's.
Sha256Digest client_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);
Sha256Digest server_mac(std::string_view secret, const Nonce& server_nonce, const Nonce& client_nonce);

// 32 bytes from getrandom(2) (or /dev/urandom). Throws RendezvousError if neither answers.
Nonce random_nonce();

}  // namespace dtcore::store
