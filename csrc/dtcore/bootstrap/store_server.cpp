#include "dtcore/bootstrap/store_server.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

#include "dtcore/bootstrap/store_protocol.h"
#include "dtcore/bootstrap/store_socket.h"
#include "dtcore/bootstrap/store_state.h"
#include "dtcore/common/error.h"
#include "dtcore/common/log.h"

// See Note [Store protocol] in store_protocol.h.

namespace dtcore {
namespace {

using store::Bytes;
using store::Clock;
using store::ConnId;
using store::Fd;
using store::RefuseReason;

constexpr std::size_t kReadChunk = 64u << 10;
constexpr std::size_t kReadBudget = 1u << 20;  // per connection and poll round: a busy client cannot starve the rest
constexpr int kAcceptBurst = 256;              // per poll round, for the same reason
constexpr auto kAcceptPause = std::chrono::milliseconds(100);  // out of descriptors, and no spare to refuse with

enum class CloseKind { PeerClosed, Rejected, TimedOut, Dropped, Failed, Shutdown };

struct Conn {
  ConnId id = 0;
  Fd fd;
  std::string peer;  // "ip:port", for logs
  bool authenticated = false;
  bool closing = false;        // closed; erased from the table at the end of the poll round
  Clock::time_point deadline;  // of the handshake
  store::Nonce server_nonce{};
  Bytes in;
  std::size_t in_pos = 0;  // bytes of `in` already consumed
  Bytes out;
  std::size_t out_pos = 0;  // bytes of `out` already sent
  std::size_t pending() const { return out.size() - out_pos; }
};

}  // namespace

class StoreServer::Loop {
 public:
  Loop(Fd listener, std::string secret, const StoreServerOptions& options, std::string where)
      : listener_(std::move(listener)),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
        spare_(open_spare()),
        secret_(std::move(secret)),
        options_(options),
        where_(std::move(where)),
        state_(options.max_stored_bytes, options.max_frame_bytes) {
    DTCORE_CHECK(wake_.valid() && spare_.valid(), RendezvousError, "the rendezvous store at ", where_,
                 " could not create its wake-up eventfd or its spare descriptor: ", std::strerror(errno),
                 ". Fix: raise the open-file limit (ulimit -n).");
  }

  void wake() {
    std::uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  }

  void run() {
    try {
      serve();
    } catch (const std::exception& e) {
      log::error("rendezvous store at ", where_, " stopped on an internal error: ", e.what(),
                 ". Its clients get connection errors.");
    }
    for (auto& [id, c] : conns_) refuse(*c, CloseKind::Shutdown, {RefuseReason::ShuttingDown, 0, "the server stopped"});
    conns_.clear();
    listener_.reset();
  }

  StoreServerStats stats() const {
    return {accepted_.load(), authenticated_.load(),       rejected_.load(), timed_out_.load(), dropped_.load(),
            open_.load(),     unauthenticated_open_.load()};
  }

 private:
  void serve() {
    std::vector<pollfd> fds;
    std::vector<ConnId> ids;
    for (;;) {
      fds.clear();
      ids.clear();
      Clock::time_point now = Clock::now();
      fds.push_back({wake_.get(), POLLIN, 0});
      fds.push_back({now >= accept_paused_until_ ? listener_.get() : -1, POLLIN, 0});  // poll skips fd -1
      for (auto& [id, c] : conns_) {
        short events = 0;
        if (!c->authenticated || c->pending() < options_.max_frame_bytes) events |= POLLIN;  // else: backpressure
        if (c->pending() > 0) events |= POLLOUT;
        fds.push_back({c->fd.get(), events, 0});
        ids.push_back(id);
      }
      int n = ::poll(fds.data(), fds.size(), poll_timeout(now));
      if (n < 0 && errno == EINTR) continue;
      DTCORE_CHECK(n >= 0, RendezvousError, "poll() failed: ", std::strerror(errno));
      if (fds[0].revents != 0) return;  // stop()
      if ((fds[1].revents & POLLIN) != 0) accept_new();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        short revents = fds[i + 2].revents;
        auto it = conns_.find(ids[i]);
        if (revents == 0 || it == conns_.end() || it->second->closing) continue;
        try {
          service(*it->second, revents);
        } catch (const std::exception& e) {
          close(*it->second, CloseKind::Failed, e.what());
        }
      }
      expire_handshakes(Clock::now());
      std::erase_if(conns_, [](const auto& entry) { return entry.second->closing; });
    }
  }

  int poll_timeout(Clock::time_point now) const {
    Clock::time_point next = Clock::time_point::max();
    if (!unauthenticated_.empty()) next = conns_.at(unauthenticated_.front())->deadline;
    if (now < accept_paused_until_) next = std::min(next, accept_paused_until_);
    if (next == Clock::time_point::max()) return -1;
    return static_cast<int>(std::max<long long>(0, std::chrono::ceil<std::chrono::milliseconds>(next - now).count()));
  }

  void accept_new() {
    for (int i = 0; i < kAcceptBurst; ++i) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
          if (!warned_descriptors_) {
            log::warn("rendezvous store at ", where_, ": cannot accept connections: ", std::strerror(error),
                      " (open-file limit ", open_file_limit(), "). Fix: raise the open-file limit (ulimit -n) of the ",
                      "process that serves the store.");
            warned_descriptors_ = true;
          }
          if ((error == EMFILE || error == ENFILE) && refuse_with_spare(error)) continue;
          accept_paused_until_ = Clock::now() + kAcceptPause;  // no spare: the backlog waits, poll does not spin
          return;
        }
        continue;  // ECONNABORTED, EINTR, a network error on that one connection
      }
      auto c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->fd = Fd(fd);
      c->peer = store::address_name(addr, len);
      c->deadline = Clock::now() + options_.handshake_timeout;
      c->server_nonce = store::random_nonce();
      store::set_nodelay(fd);
      ++accepted_;
      ++open_;
      ++unauthenticated_open_;
      unauthenticated_.push_back(c->id);
      Conn& conn = *c;
      conns_.emplace(c->id, std::move(c));
      send_frame(conn, store::encode_server_hello({store::kProtocolVersion, conn.server_nonce}));
      while (unauthenticated_.size() > options_.max_unauthenticated) {
        if (!warned_flood_) {
          log::warn("rendezvous store at ", where_, ": more than ", options_.max_unauthenticated,
                    " connections at once have not finished the handshake; dropping the oldest. Something other "
                    "than this job's ranks connects to this port.");
          warned_flood_ = true;
        }
        refuse(*conns_.at(unauthenticated_.front()), CloseKind::Dropped,
               {RefuseReason::Crowded, static_cast<std::int64_t>(options_.max_unauthenticated),
                detail::cat("more than ", options_.max_unauthenticated,
                            " connections at once had not finished the handshake, and this was the oldest")});
      }
    }
  }

  void service(Conn& c, short revents) {
    if ((revents & POLLOUT) != 0) flush(c);
    if (!c.closing && (revents & (POLLIN | POLLHUP | POLLERR)) != 0) read_from(c);
    if (!c.closing) process(c);  // frames held back by backpressure, once answers have drained
  }

  void read_from(Conn& c) {
    std::size_t budget = kReadBudget;
    while (!c.closing && budget > 0 && c.pending() < options_.max_frame_bytes) {
      ssize_t n = ::recv(c.fd.get(), read_buffer_.data(), read_buffer_.size(), 0);
      if (n > 0) {
        c.in.insert(c.in.end(), read_buffer_.begin(), read_buffer_.begin() + n);
        budget -= std::min(budget, static_cast<std::size_t>(n));
        process(c);
      } else if (n == 0) {
        close(c, CloseKind::PeerClosed, "the peer closed the connection");
      } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return;
      } else if (errno != EINTR) {
        close(c, CloseKind::PeerClosed, std::strerror(errno));
      }
    }
  }

  // Handles every complete frame in c.in. See Note [Store protocol] for what closes a connection.
  void process(Conn& c) {
    while (!c.closing && c.in.size() - c.in_pos >= store::kFrameHeaderBytes) {
      if (c.authenticated && c.pending() >= options_.max_frame_bytes) break;  // answers first
      std::uint32_t length = store::read_frame_length(c.in.data() + c.in_pos);
      if (!c.authenticated && length != store::kClientHelloBytes) {
        return refuse(
            c, CloseKind::Rejected,
            {RefuseReason::Malformed, 0, detail::cat("its first frame (", length, " bytes) is not a handshake")});
      }
      if (length == 0 || length > options_.max_frame_bytes) {
        return reject(c, detail::cat("a frame of ", length, " bytes, over the limit of ", options_.max_frame_bytes));
      }
      if (c.in.size() - c.in_pos < store::kFrameHeaderBytes + length) break;
      std::span<const std::uint8_t> payload(c.in.data() + c.in_pos + store::kFrameHeaderBytes, length);
      c.in_pos += store::kFrameHeaderBytes + length;
      if (c.authenticated) {
        handle_request(c, payload);
      } else {
        handle_hello(c, payload);
      }
    }
    if (c.in_pos > 0) {
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_pos));
      c.in_pos = 0;
    }
  }

  void handle_hello(Conn& c, std::span<const std::uint8_t> payload) {
    auto hello = store::decode_client_hello(payload);
    if (!hello) {
      return refuse(c, CloseKind::Rejected, {RefuseReason::Malformed, 0, "its handshake has the wrong magic"});
    }
    if (hello->version != store::kProtocolVersion) {
      return refuse(c, CloseKind::Rejected,
                    {RefuseReason::Version, store::kProtocolVersion,
                     detail::cat("the client speaks store protocol version ", hello->version, ", this server ",
                                 store::kProtocolVersion)});
    }
    Sha256Digest expected = store::client_mac(secret_, c.server_nonce, hello->nonce);
    if (!constant_time_equal(expected, hello->mac)) {
      return refuse(c, CloseKind::Rejected,
                    {RefuseReason::WrongSecret, 0, "the client's proof does not match this store's job secret"});
    }
    if (c.in.size() > c.in_pos) {
      return refuse(c, CloseKind::Rejected,
                    {RefuseReason::Malformed, 0, "the client sent data before the handshake was done"});
    }
    c.authenticated = true;
    std::erase(unauthenticated_, c.id);
    --unauthenticated_open_;
    ++authenticated_;
    send_frame(c, store::encode_server_proof({store::server_mac(secret_, c.server_nonce, hello->nonce),
                                              static_cast<std::uint32_t>(options_.max_frame_bytes)}));
  }

  void handle_request(Conn& c, std::span<const std::uint8_t> payload) {
    std::optional<store::Request> request = store::decode_request(payload);
    if (!request || !store::shape_ok(*request)) {
      return reject(c, detail::cat("a malformed request or unknown op (op byte ", int{payload[0]}, ")"));
    }
    if (request->op == store::Op::Cancel) {
      state_.drop_parked(c.id);
      return send_frame(c, store::encode_response({store::Status::Canceled, {}, 0}));
    }
    if (state_.is_parked(c.id)) {
      return reject(c, detail::cat("a ", store::op_name(request->op), " request while another one waits"));
    }
    if (std::optional<store::Response> answer = state_.apply(c.id, *request)) {
      send_frame(c, store::encode_response(*answer));
    }
    for (store::Released& r : state_.take_released()) {
      auto it = conns_.find(r.conn);
      if (it != conns_.end() && !it->second->closing) send_frame(*it->second, store::encode_response(r.response));
    }
  }

  void send_frame(Conn& c, const Bytes& payload) {
    store::append_frame(c.out, payload);
    flush(c);
  }

  void flush(Conn& c) {
    while (!c.closing && c.pending() > 0) {
      ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_pos, c.pending(), MSG_NOSIGNAL);
      if (n > 0) {
        c.out_pos += static_cast<std::size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else if (!(n < 0 && errno == EINTR)) {
        close(c, CloseKind::PeerClosed, n < 0 ? std::strerror(errno) : "send() wrote nothing");
      }
    }
    if (c.out_pos == c.out.size()) {
      c.out.clear();
      c.out_pos = 0;
    }
  }

  void reject(Conn& c, const std::string& why) { close(c, CloseKind::Rejected, why); }

  // Closes a connection still in the handshake with a Refusal first, so that its client learns
  // why (Note [Store protocol]); an authenticated one reads answers, so it is only closed.
  void refuse(Conn& c, CloseKind kind, const store::Refusal& refusal) {
    if (c.closing) return;
    Fd fd = std::move(c.fd);  // closed on return, after the counters: they are current once the client knows
    Bytes pending(c.out.begin() + static_cast<std::ptrdiff_t>(c.out_pos), c.out.end());  // the greeting, if unsent
    bool tell = !c.authenticated;
    close(c, kind, refusal.message);
    if (tell) send_refusal(fd.get(), std::move(pending), refusal);
  }

  // One non-blocking send of `pending` and the Refusal: a few dozen bytes into a send buffer that
  // holds at most the greeting, so it fits; if the peer is gone, there is nobody left to tell.
  static void send_refusal(int fd, Bytes pending, const store::Refusal& refusal) {
    store::append_frame(pending, store::encode_refusal(refusal));
    [[maybe_unused]] ssize_t n = ::send(fd, pending.data(), pending.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Out of descriptors: frees the spare, accepts one connection with it, sends it the Refusal in
  // place of the greeting, closes it and takes the spare again. False when nothing could be
  // accepted that way (or the spare could not be taken back): then the caller pauses accepting.
  bool refuse_with_spare(int error) {
    if (!spare_.valid()) spare_ = open_spare();  // lost last time: descriptors may be back
    if (!spare_.valid()) return false;
    spare_.reset();
    Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    bool refused = fd.valid();
    if (refused) {
      ++accepted_;  // before the client knows, as in refuse()
      ++rejected_;
      std::int64_t limit = open_file_limit();
      send_refusal(
          fd.get(), {},
          {RefuseReason::OutOfDescriptors, limit,
           error == EMFILE
               ? detail::cat("the serving process is out of file descriptors (its open-file limit is ", limit, ")")
               : std::string("this host's file table is full (ENFILE: fs.file-max)")});
      fd.reset();
    }
    spare_ = open_spare();
    return refused && spare_.valid();
  }

  static Fd open_spare() { return Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC)); }

  static std::int64_t open_file_limit() {
    rlimit limit{};
    if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return -1;
    return static_cast<std::int64_t>(limit.rlim_cur);
  }

  void close(Conn& c, CloseKind kind, const std::string& why) {
    if (c.closing) return;
    c.closing = true;
    state_.drop_parked(c.id);
    if (!c.authenticated) {
      std::erase(unauthenticated_, c.id);
      --unauthenticated_open_;
    }
    --open_;
    if (kind == CloseKind::Rejected) ++rejected_;
    if (kind == CloseKind::TimedOut) ++timed_out_;
    if (kind == CloseKind::Dropped) ++dropped_;
    if (kind != CloseKind::Shutdown) {
      log::debug("rendezvous store at ", where_, ": closed the ", c.authenticated ? "" : "unauthenticated ",
                 "connection from ", c.peer, ": ", why);
    }
    c.fd.reset();
  }

  void expire_handshakes(Clock::time_point now) {
    while (!unauthenticated_.empty()) {
      Conn& c = *conns_.at(unauthenticated_.front());
      if (c.deadline > now) return;
      refuse(c, CloseKind::TimedOut,
             {RefuseReason::HandshakeTimeout, options_.handshake_timeout.count(),
              detail::cat("no handshake within ", options_.handshake_timeout.count(),
                          " ms (StoreServerOptions::handshake_timeout)")});
    }
  }

  Fd listener_;
  Fd wake_;   // eventfd: stop() writes it to end the poll loop
  Fd spare_;  // /dev/null, held so that at EMFILE one connection can still be accepted and told why
  const std::string secret_;
  const StoreServerOptions options_;
  const std::string where_;  // "host:port", for messages
  store::StoreState state_;
  // What one recv() reads into, for every connection in turn: only the bytes received are then
  // appended to the connection's `in`, which is never grown by a zero-filled chunk.
  Bytes read_buffer_ = Bytes(kReadChunk);
  std::unordered_map<ConnId, std::unique_ptr<Conn>> conns_;
  // Unauthenticated connections, oldest first: the order to drop them in, and (with one handshake
  // timeout for all) the order of their deadlines, so the front's deadline is the next one.
  std::deque<ConnId> unauthenticated_;
  ConnId next_id_ = 1;  // ids are never reused, so a stale id in a waiter list matches no connection
  Clock::time_point accept_paused_until_{};
  bool warned_flood_ = false;
  bool warned_descriptors_ = false;
  std::atomic<std::uint64_t> accepted_{0}, authenticated_{0}, rejected_{0}, timed_out_{0}, dropped_{0}, open_{0},
      unauthenticated_open_{0};
};

StoreServer::StoreServer(const std::string& host, int port, std::string secret, StoreServerOptions options)
    : host_(host) {
  std::string where = store::endpoint(host, port);
  DTCORE_CHECK(!host.empty(), ConfigError,
               "the rendezvous store needs an address to listen at, and got an empty host. Fix: pass an IP address "
               "of this host, 127.0.0.1 for loopback only, or \"0.0.0.0\" or \"::\" to listen on every interface.");
  DTCORE_CHECK(port >= 0 && port <= 65535, ConfigError, "the rendezvous store cannot listen at ", where,
               ": the port is out of range. Fix: pass a port in 1..65535, or 0 for any free port.");
  DTCORE_CHECK(!secret.empty(), ConfigError, "the rendezvous store at ", where,
               " was given an empty job secret, with which anyone could pass its handshake. Fix: pass the job's "
               "secret, the same bytes on every rank.");
  DTCORE_CHECK(options.max_frame_bytes >= 1024 && options.max_frame_bytes <= 0xffffffffu, ConfigError,
               "StoreServerOptions::max_frame_bytes = ", options.max_frame_bytes,
               " is out of range. Fix: pass a value from 1024 to 4294967295 (the default is 16 MiB).");
  DTCORE_CHECK(options.max_stored_bytes > 0 && options.handshake_timeout.count() > 0 && options.max_unauthenticated > 0,
               ConfigError, "StoreServerOptions: max_stored_bytes (", options.max_stored_bytes,
               "), handshake_timeout (", options.handshake_timeout.count(), " ms) and max_unauthenticated (",
               options.max_unauthenticated, ") must all be positive. Fix: pass positive values or the defaults.");
  Fd listener = store::listen_at(host, port, port_);
  where = store::endpoint(host, port_);
  loop_ = std::make_unique<Loop>(std::move(listener), std::move(secret), options, where);
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "dtcore-store");
    loop_->run();
  });
  log::debug("rendezvous store: serving at ", where);
}

StoreServer::~StoreServer() { stop(); }

void StoreServer::stop() {
  std::lock_guard<std::mutex> lock(stop_mutex_);
  if (!thread_.joinable()) return;
  loop_->wake();
  thread_.join();
}

StoreServerStats StoreServer::stats() const { return loop_->stats(); }

}  // namespace dtcore
