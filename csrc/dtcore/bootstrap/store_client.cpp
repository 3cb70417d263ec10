#include "dtcore/bootstrap/store_client.h"

#include <c10/util/Exception.h>

#include "dtcore/common/error.h"

// See Note [Store protocol] in store_protocol.h.

namespace dtcore {
namespace {

using store::Bytes;
using store::Clock;
using store::IoResult;
using store::Op;
using store::RefuseReason;
using store::Request;
using store::Response;
using store::Status;

using std::chrono::milliseconds;

// After a timeout the client cancels its request; a live server answers that at once. A server
// that does not within this grace is stuck, and the connection is given up.
constexpr milliseconds kCancelGrace{1'000};
// Once the first byte of an answer has arrived, the rest of the frame gets at least this long.
constexpr milliseconds kFrameGrace{30'000};

Clock::time_point deadline_after(milliseconds timeout) {
  return timeout.count() <= 0 ? Clock::time_point::max() : Clock::now() + timeout;
}

// The keys of a request, for messages: at most 10, each cut at 200 bytes.
std::string join_keys(const std::vector<std::string>& keys) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < 10; ++i) {
    out += (i == 0 ? "" : ", ") + keys[i].substr(0, 200) + (keys[i].size() > 200 ? "..." : "");
  }
  if (keys.size() > 10) out += detail::cat(" and ", keys.size() - 10, " more");
  return out;
}

// What arrived where the handshake expected a frame of `expected` bytes.
struct HandshakeFrame {
  enum Kind {
    Frame,    // `payload`, of the expected size (still to be decoded)
    Refused,  // `refusal`, the server's reason (Note [Store protocol])
    Silent,   // nothing by the deadline
    Closed,   // closed or reset before any byte (`detail`: how)
    Cut,      // a frame began and stopped (closed, reset or the deadline)
    Foreign,  // a frame of a size neither expected nor a Refusal's (`detail`)
  } kind = Frame;
  Bytes payload;
  store::Refusal refusal;
  std::string detail;
};

HandshakeFrame read_handshake_frame(int fd, std::size_t expected, Clock::time_point deadline) {
  HandshakeFrame f;
  std::string error;
  std::uint8_t header[store::kFrameHeaderBytes];
  IoResult r = store::wait_readable(fd, deadline, error);
  if (r == IoResult::Timeout) {
    f.kind = HandshakeFrame::Silent;
    return f;
  }
  if (r == IoResult::Ok) r = store::recv_exact(fd, header, 1, deadline, error);
  if (r != IoResult::Ok) {
    f.kind = HandshakeFrame::Closed;
    f.detail = r == IoResult::Closed ? "closed" : error;
    return f;
  }
  r = store::recv_exact(fd, header + 1, sizeof(header) - 1, deadline, error);
  std::uint32_t length = r == IoResult::Ok ? store::read_frame_length(header) : 0;
  if (r == IoResult::Ok && length != expected && length > store::kMaxRefusalBytes) {
    f.kind = HandshakeFrame::Foreign;
    f.detail = detail::cat("a frame of ", length, " bytes");
    return f;
  }
  if (r == IoResult::Ok) {
    f.payload.resize(length);
    r = store::recv_exact(fd, f.payload.data(), length, deadline, error);
  }
  if (r != IoResult::Ok) {
    f.kind = HandshakeFrame::Cut;
    f.detail = r == IoResult::Timeout ? "stopped half way" : r == IoResult::Closed ? "closed half way" : error;
    return f;
  }
  if (std::optional<store::Refusal> refusal = store::decode_refusal(f.payload)) {
    f.kind = HandshakeFrame::Refused;
    f.refusal = std::move(*refusal);
  } else if (length != expected) {
    f.kind = HandshakeFrame::Foreign;
    f.detail = detail::cat("a frame of ", length, " bytes");
  }
  return f;
}

std::string version_mismatch(const std::string& where, std::int64_t server_version) {
  return detail::cat("the rendezvous store at ", where, " speaks store protocol version ", server_version,
                     ", this client version ", store::kProtocolVersion,
                     ". Fix: install the same dtcore version on every host of the job.");
}

}  // namespace

StoreClient::StoreClient(std::string host, int port, std::string secret, milliseconds timeout)
    : c10d::Store(timeout),
      host_(std::move(host)),
      port_(port),
      secret_(std::move(secret)),
      where_(store::endpoint(host_, port_)),
      timeout_ms_(timeout.count()) {
  DTCORE_CHECK(!secret_.empty(), ConfigError, "the rendezvous store client for ", where_,
               " was given an empty job secret. Fix: pass the job's secret, the same bytes on every rank.");
  DTCORE_CHECK(port_ > 0 && port_ <= 65535, ConfigError, "the rendezvous store client cannot connect to ", where_,
               ": the port is out of range. Fix: pass the port the server reports (StoreServer::port()).");
  handshake(timeout.count() > 0 ? timeout : c10d::Store::kDefaultTimeout);
}

StoreClient::~StoreClient() = default;

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  auto copy = c10::make_intrusive<StoreClient>(host_, port_, secret_, current_timeout());
  copy->owner_ = owner_;
  return copy;
}

void StoreClient::handshake(milliseconds timeout) {
  Clock::time_point deadline = Clock::now() + timeout;
  std::string error;
  bool resolved = false;
  fd_ = store::connect_any(host_, port_, deadline, error, &resolved);  // the caller retries
  if (!resolved) {
    C10_THROW_ERROR(DistNetworkError,
                    detail::cat("cannot reach the rendezvous store at ", where_, ": ", host_, " does not resolve (",
                                error, "). Fix: check the store's host name (MASTER_ADDR)."));
  }
  if (!fd_.valid()) {
    C10_THROW_ERROR(DistNetworkError,
                    detail::cat("could not connect to the rendezvous store at ", where_, ": ", error,
                                ". Nothing accepts connections there (yet): the server may not be started, or a "
                                "firewall drops the connection."));
  }
  auto foreign = [&](const std::string& what) {
    fd_.reset();
    DTCORE_CHECK(false, RendezvousError, "the listener at ", where_, " is not a dtcore rendezvous store: ", what,
                 ". Another program holds that port. Fix: give the store a port nobody else uses (MASTER_PORT=<port>), "
                 "or stop the other program (`ss -ltnp 'sport = :",
                 port_, "'` names it).");
  };
  // Closed, reset or cut short without a Refusal: not a judgement on this client (Note [Store protocol]).
  auto dropped = [&](const std::string& what) {
    fd_.reset();
    C10_THROW_ERROR(DistNetworkError,
                    detail::cat("the connection to the rendezvous store at ", where_, " ", kDroppedInHandshake, ": ",
                                what, ", and the server sent no refusal saying why. A network failure, ",
                                "a store stopping or a failing serving process does this, not a wrong job secret; the ",
                                "rendezvous retries within its timeout."));
  };
  auto expect = [&](std::size_t bytes, const std::string& stage) -> Bytes {
    HandshakeFrame f = read_handshake_frame(fd_.get(), bytes, deadline);
    if (f.kind == HandshakeFrame::Refused) refused(f.refusal);
    if (f.kind == HandshakeFrame::Silent && bytes == store::kServerHelloBytes) {
      foreign(detail::cat("it sent no greeting within ", timeout.count(), " ms"));
    }
    if (f.kind == HandshakeFrame::Silent) dropped(detail::cat("no ", stage, " came within ", timeout.count(), " ms"));
    if (f.kind == HandshakeFrame::Closed) dropped(detail::cat("the connection was ", f.detail, " before the ", stage));
    if (f.kind == HandshakeFrame::Cut) dropped(detail::cat("the ", stage, " ", f.detail));
    if (f.kind == HandshakeFrame::Foreign) {
      foreign(detail::cat("its ", stage, " is not a dtcore store's (", f.detail, ")"));
    }
    return std::move(f.payload);
  };

  auto hello = store::decode_server_hello(expect(store::kServerHelloBytes, "greeting"));
  if (!hello) foreign("its greeting has the wrong magic");
  if (hello->version != store::kProtocolVersion) {
    fd_.reset();
    throw StoreRefused(RefuseReason::Version, version_mismatch(where_, hello->version));
  }
  store::ClientHello mine;
  mine.nonce = store::random_nonce();
  mine.mac = store::client_mac(secret_, hello->nonce, mine.nonce);
  Bytes frame;
  store::append_frame(frame, store::encode_client_hello(mine));
  // A failed send is not the end: the server may have refused first, and its Refusal is read next.
  store::send_all(fd_.get(), frame.data(), frame.size(), deadline, error);
  auto proof = store::decode_server_proof(expect(store::kServerProofBytes, "proof of the job secret"));
  Sha256Digest expected = store::server_mac(secret_, hello->nonce, mine.nonce);
  if (!proof || !constant_time_equal(expected, proof->mac)) {
    fd_.reset();
    throw StoreRefused(RefuseReason::WrongSecret,
                       detail::cat("the rendezvous store at ", where_, " does not have this job's secret: its proof ",
                                   "of the job secret is wrong (another job's store, or an impostor). Fix: give every ",
                                   "rank the same job secret, and the store a port nobody else uses."));
  }
  if (proof->max_frame_bytes < 1024) foreign("its frame limit is implausible");
  max_frame_bytes_ = proof->max_frame_bytes;
}

void StoreClient::refused(const store::Refusal& refusal) {
  fd_.reset();
  std::string fix;
  switch (refusal.reason) {
    case RefuseReason::WrongSecret:
      fix =
          "this rank does not have this job's secret (the server's). Fix: give every rank the same job secret "
          "(DTCORE_JOB_SECRET, or DTCORE_JOB_SECRET_FILE on a filesystem every node sees).";
      break;
    case RefuseReason::Version: throw StoreRefused(refusal.reason, version_mismatch(where_, refusal.number));
    case RefuseReason::Malformed:
      fix =
          "the server did not understand this client's handshake. Fix: install the same dtcore version on every "
          "host of the job.";
      break;
    case RefuseReason::HandshakeTimeout:
      fix = detail::cat("this client's handshake did not reach the server within its ", refusal.number,
                        " ms: this host or the network between is overloaded. It is retried within the rendezvous "
                        "timeout; if it persists, check the load on this host and on the server's.");
      break;
    case RefuseReason::Crowded:
      fix = detail::cat("more than ", refusal.number, " connections at once were in the handshake: something besides ",
                        "this job's ranks may be connecting to the port. It is retried within the rendezvous timeout; ",
                        "if it persists, find who connects (`ss -tnp 'dport = :", port_, "'` on the server's host).");
      break;
    case RefuseReason::OutOfDescriptors:
      fix =
          "the process that serves the store (rank 0) has no file descriptor left for this connection. Fix: raise "
          "its open-file limit (`ulimit -n 65536` in the job script before the launcher, or LimitNOFILE= for a "
          "service), or find what holds its descriptors (`ls /proc/<pid>/fd`). It is retried within the rendezvous "
          "timeout meanwhile.";
      break;
    case RefuseReason::ShuttingDown:
      fix = "the server is stopping. It is retried within the rendezvous timeout, in case it restarts.";
      break;
    default:
      fix = detail::cat("refusal code ", static_cast<int>(refusal.reason), " is unknown to this client. Fix: install ",
                        "the same dtcore version on every host of the job.");
  }
  throw StoreRefused(refusal.reason, detail::cat("the rendezvous store at ", where_,
                                                 " refused this connection: ", refusal.message, "; ", fix));
}

void StoreClient::drop(const std::string& why) {
  fd_.reset();
  lost_ = why;
}

void StoreClient::lose(const Request& request, const std::string& why) {
  drop(why);
  C10_THROW_ERROR(
      DistNetworkError,
      detail::cat("lost the connection to the rendezvous store at ", where_, " during ", store::op_name(request.op),
                  ": ", why, ". The server stopped or its host is unreachable; this client cannot be used any more."));
}

void StoreClient::timed_out(const Request& request, milliseconds timeout) {
  bool waits_for_keys = request.op == Op::Get || request.op == Op::Wait || request.op == Op::MultiGet ||
                        (request.op == Op::QueuePop && request.number == 1);
  std::string keys = request.keys.empty() ? "" : ", keys: " + join_keys(request.keys);
  std::string given_up = fd_.valid() ? "" : detail::cat(" The connection was given up (", lost_, ").");
  C10_THROW_ERROR(DistStoreError,
                  detail::cat(store::op_name(request.op), " timeout after ", timeout.count(), "ms", keys,
                              " (the rendezvous store at ", where_, ").", given_up,
                              waits_for_keys ? " Fix: check that every rank reaches this point and sets these keys, "
                                               "or raise the store's timeout."
                                             : " The server did not answer in time: it is overloaded or stalled. Fix: "
                                               "check the host that serves the store, or raise the store's timeout."));
}

IoResult StoreClient::read_answer(Clock::time_point deadline, Response& answer, std::string& error) {
  IoResult r = store::wait_readable(fd_.get(), deadline, error);
  if (r != IoResult::Ok) return r;
  // Part of a frame arrived: the stream must not stop mid-frame, whatever the operation's timeout.
  Clock::time_point frame_deadline = std::max(deadline, Clock::now() + kFrameGrace);
  std::uint8_t header[store::kFrameHeaderBytes];
  r = store::recv_exact(fd_.get(), header, sizeof(header), frame_deadline, error);
  if (r == IoResult::Timeout) return IoResult::Failed;
  if (r != IoResult::Ok) return r;
  std::uint32_t length = store::read_frame_length(header);
  if (length == 0 || length > max_frame_bytes_) {
    error = detail::cat("an answer frame of ", length, " bytes, over its own limit of ", max_frame_bytes_);
    return IoResult::Failed;
  }
  Bytes payload(length);
  r = store::recv_exact(fd_.get(), payload.data(), length, frame_deadline, error);
  if (r == IoResult::Timeout) error = "an answer frame stopped half way";
  if (r != IoResult::Ok) return r == IoResult::Timeout ? IoResult::Failed : r;
  std::optional<Response> decoded = store::decode_response(payload);
  if (!decoded) {
    error = "a malformed answer";
    return IoResult::Failed;
  }
  answer = std::move(*decoded);
  return IoResult::Ok;
}

bool StoreClient::cancel(std::optional<Response>& late, std::string& error) {
  Bytes frame;
  store::append_frame(frame, store::encode_request(Request{Op::Cancel, {}, {}, 0}));
  Clock::time_point grace = Clock::now() + kCancelGrace;
  if (store::send_all(fd_.get(), frame.data(), frame.size(), grace, error) != IoResult::Ok) return false;
  for (;;) {
    Response answer;
    if (read_answer(grace, answer, error) != IoResult::Ok) return false;
    if (answer.status == Status::Canceled) return true;
    if (late) return false;  // two answers to one request: the stream cannot be trusted
    late = std::move(answer);
  }
}

Response StoreClient::call(const Request& request, milliseconds timeout) {
  Bytes frame;
  frame.reserve(store::kFrameHeaderBytes + store::request_bytes(request));
  store::append_frame(frame, store::encode_request(request));
  std::lock_guard<std::mutex> lock(mutex_);
  if (frame.size() - store::kFrameHeaderBytes > max_frame_bytes_) {
    C10_THROW_ERROR(DistStoreError,
                    detail::cat(store::op_name(request.op), " of keys [", join_keys(request.keys), "] is a request of ",
                                frame.size() - store::kFrameHeaderBytes, " bytes, over the frame limit of ",
                                max_frame_bytes_, " bytes of the rendezvous store at ", where_,
                                ". Fix: store smaller values (the store is for rendezvous metadata), or raise "
                                "StoreServerOptions::max_frame_bytes where the server is created."));
  }
  if (!fd_.valid()) {
    C10_THROW_ERROR(DistNetworkError, detail::cat("the connection to the rendezvous store at ", where_,
                                                  " was lost earlier (", lost_, "), so ", store::op_name(request.op),
                                                  " cannot be sent: the process serving the store (rank 0, or the "
                                                  "launcher's agent) has probably exited; its log has the first "
                                                  "error."));
  }
  Clock::time_point deadline = deadline_after(timeout);
  std::string error;
  IoResult r = store::send_all(fd_.get(), frame.data(), frame.size(), deadline, error);
  if (r == IoResult::Timeout) {
    drop("the server stopped reading, and a request was cut off at the timeout");
    timed_out(request, timeout);
  }
  if (r != IoResult::Ok) lose(request, error.empty() ? "the server closed the connection" : error);
  Response answer;
  r = read_answer(deadline, answer, error);
  if (r == IoResult::Timeout) {
    // Cancel the parked request so that the connection stays usable. The answer may have crossed
    // the cancel on the wire: then it comes first, and the request did succeed.
    std::optional<Response> late;
    if (!cancel(late, error)) {
      drop(detail::cat("the server did not answer the cancel of the timed-out request within ", kCancelGrace.count(),
                       " ms"));
      timed_out(request, timeout);
    }
    if (!late) timed_out(request, timeout);
    answer = std::move(*late);
  } else if (r != IoResult::Ok) {
    lose(request, error.empty() ? "the server closed the connection" : error);
  }
  if (answer.status == Status::Error) {
    std::string message = answer.values.empty() ? "" : std::string(answer.values[0].begin(), answer.values[0].end());
    C10_THROW_ERROR(DistStoreError, detail::cat("the rendezvous store at ", where_, " refused ",
                                                store::op_name(request.op), ": ", message));
  }
  if (answer.status == Status::Canceled) lose(request, "an unexpected answer (canceled)");
  return answer;
}

namespace {

Bytes value_of(const Response& r, std::size_t i = 0) {
  TORCH_CHECK_WITH(DistStoreError, r.values.size() > i, "the rendezvous store sent an answer without a value");
  return r.values[i];
}

}  // namespace

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(Request{Op::Set, {key}, {value}, 0}, current_timeout());
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  return value_of(call(Request{Op::CompareSet, {key}, {expected, desired}, 0}, current_timeout()));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  return value_of(call(Request{Op::Get, {key}, {}, 0}, current_timeout()));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  return call(Request{Op::Add, {key}, {}, value}, current_timeout()).number;
}

bool StoreClient::deleteKey(const std::string& key) {
  return call(Request{Op::DeleteKey, {key}, {}, 0}, current_timeout()).number == 1;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return call(Request{Op::Check, keys, {}, 0}, current_timeout()).number == 1;
}

int64_t StoreClient::getNumKeys() { return call(Request{Op::NumKeys, {}, {}, 0}, current_timeout()).number; }

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, current_timeout()); }

void StoreClient::wait(const std::vector<std::string>& keys, const milliseconds& timeout) {
  call(Request{Op::Wait, keys, {}, 0}, timeout);
}

void StoreClient::setTimeout(const milliseconds& timeout) {
  c10d::Store::setTimeout(timeout);
  timeout_ms_.store(timeout.count());
}

void StoreClient::append(const std::string& key, const std::vector<uint8_t>& value) {
  call(Request{Op::Append, {key}, {value}, 0}, current_timeout());
}

std::vector<std::vector<uint8_t>> StoreClient::multiGet(const std::vector<std::string>& keys) {
  Response r = call(Request{Op::MultiGet, keys, {}, 0}, current_timeout());
  TORCH_CHECK_WITH(DistStoreError, r.values.size() == keys.size(), "the rendezvous store at ", where_, " answered ",
                   r.values.size(), " values to a multiGet of ", keys.size(), " keys");
  return std::move(r.values);
}

void StoreClient::multiSet(const std::vector<std::string>& keys, const std::vector<std::vector<uint8_t>>& values) {
  TORCH_CHECK_WITH(DistStoreError, keys.size() == values.size(), "multiSet got ", keys.size(), " keys and ",
                   values.size(), " values; pass one value per key.");
  call(Request{Op::MultiSet, keys, values, 0}, current_timeout());
}

std::vector<std::string> StoreClient::listKeys() {
  Response r = call(Request{Op::ListKeys, {}, {}, 0}, current_timeout());
  std::vector<std::string> keys;
  keys.reserve(r.values.size());
  for (const Bytes& k : r.values) keys.emplace_back(k.begin(), k.end());
  return keys;
}

void StoreClient::queuePush(const std::string& key, const std::vector<uint8_t>& value) {
  call(Request{Op::QueuePush, {key}, {value}, 0}, current_timeout());
}

std::vector<uint8_t> StoreClient::queuePop(const std::string& key, bool block) {
  Response r = call(Request{Op::QueuePop, {key}, {}, block ? 1 : 0}, current_timeout());
  if (r.status == Status::QueueEmpty) {
    C10_THROW_ERROR(DistQueueEmptyError, detail::cat("queue is empty: queuePop(block=false) of key '", key,
                                                     "' on the rendezvous store at ", where_));
  }
  return value_of(r);
}

int64_t StoreClient::queueLen(const std::string& key) {
  return call(Request{Op::QueueLen, {key}, {}, 0}, current_timeout()).number;
}

namespace store {

Probe probe(const std::string& host, int port, Clock::time_point connect_deadline, Clock::time_point greeting_deadline,
            std::string& detail) {
  Fd fd = connect_any(host, port, connect_deadline, detail);
  if (!fd.valid()) return Probe::Nothing;
  HandshakeFrame f = read_handshake_frame(fd.get(), kServerHelloBytes, greeting_deadline);
  switch (f.kind) {
    case HandshakeFrame::Silent: detail = "it accepted the connection and sent nothing"; return Probe::Silent;
    case HandshakeFrame::Closed:
      // Closed without a greeting: a dtcore store stopping (init() right after shutdown() on the
      // same port) does this as much as another program; the caller tries again until its timeout.
      detail =
          "it accepted the connection and closed it without a greeting (a store shutting down, or another "
          "program)";
      return Probe::Nothing;
    case HandshakeFrame::Cut: detail = "it did not send a dtcore store's whole greeting"; return Probe::Foreign;
    case HandshakeFrame::Foreign: break;
    case HandshakeFrame::Refused:
      // A dtcore store, which said why it will not serve this connection; the handshake reports it.
      detail = "a dtcore store refused the connection: " + f.refusal.message;
      return Probe::Store;
    case HandshakeFrame::Frame:
      if (decode_server_hello(f.payload)) return Probe::Store;
      break;
  }
  detail = "it sent something other than a dtcore store's greeting";
  return Probe::Foreign;
}

}  // namespace store
}  // namespace dtcore
