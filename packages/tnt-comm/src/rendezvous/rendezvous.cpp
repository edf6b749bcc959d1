#include "rendezvous/rendezvous.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "tnt_comm/types.hpp"

namespace tnt {
namespace {

constexpr std::uint32_t kHelloMagic = 0x544e5448;  // "TNTH"
constexpr std::size_t kDefaultPayload = 256 * 1024;
// How often a meeting that can learn of ranks gone (Rendezvous::Gone) asks, while it waits for
// connections, and while it waits for a peer's address at the store: that wait is on the path of
// every re-forming (20 ms there took recovery from 11-14 to 28-31 ms on 4 ranks).
constexpr int kGoneCheckMs = 20;
constexpr int kAddressLookMs = 1;

// "1, 2, 3": ranks in error messages.
std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

std::size_t payload_from_env() {
  const char* v = std::getenv("TNT_CHUNK_KB");
  if (v == nullptr || *v == '\0') return kDefaultPayload;
  long kb = std::strtol(v, nullptr, 10);
  if (kb < 4 || kb > 64 * 1024) throw InvalidArgument("TNT_CHUNK_KB must be between 4 and 65536");
  return static_cast<std::size_t>(kb) * 1024;
}

// Throws where a rank we still wait for is among those `gone` names: it ended after the job was
// formed without it (its members agreed before its death was seen), and it will never come.
void check_gone(const Rendezvous::Gone& gone, const std::vector<int>& awaited, int rank) {
  if (!gone || awaited.empty()) return;
  std::vector<int> lost;
  for (int r : gone()) {
    if (std::find(awaited.begin(), awaited.end(), r) != awaited.end()) lost.push_back(r);
  }
  if (lost.empty()) return;
  ErrorDetail detail;
  detail.ranks = lost;
  throw PeerFailure(lost.front(), "rank(s) " + join_ranks(lost) + " ended while rank " + std::to_string(rank) +
                                      " met them to re-form the job",
                    std::move(detail));
}

// Peer hello: magic(4) + rank(4) + token, answered by one kHelloAck byte once it is verified.
constexpr char kHelloAck = 'K';
// A real peer sends its hello right after connecting: strangers get this long, and only this many
// may wait at once, so idle or garbage connections to our port cannot hold up a real peer.
constexpr double kHelloSeconds = 2.0;
constexpr std::size_t kMaxPendingHellos = 64;

// Connects to lower rank `to` and presents our hello. The acceptor drops hellos that come too late
// or while it is flooded, so an unanswered connection is retried until the deadline.
Socket connect_to_peer(const std::string& host, int port, int to, int rank, const std::string& token,
                       Deadline deadline, const Rendezvous::Gone& gone) {
  std::string hello(reinterpret_cast<const char*>(&kHelloMagic), 4);
  hello.append(reinterpret_cast<const char*>(&rank), 4);
  hello += token;
  while (true) {
    Socket s = Socket::connect_to(host, port, deadline);
    char ack = 0;
    try {
      s.send_all(hello.data(), hello.size());
      if (s.wait_readable(deadline) && s.recv_all(&ack, 1) && ack == kHelloAck) return s;
    } catch (const Error&) {
      // Dropped before it answered: connect again.
    }
    check_gone(gone, {to}, rank);
    if (Clock::now() >= deadline) {
      ErrorDetail detail;
      detail.ranks = {to};
      throw Timeout("rendezvous timed out: rank " + std::to_string(to) +
                        " did not accept the connection of rank " + std::to_string(rank) + " at " + host + ":" +
                        std::to_string(port),
                    std::move(detail));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Accepts ranks rank+1 .. size-1 on `listener`; returns their sockets indexed by rank. Hellos are
// read side by side, each connection against its own short deadline, and a wrong one is dropped
// at once, so no stranger delays a real peer.
std::vector<Socket> accept_peers(const Socket& listener, int rank, int size, const std::string& token,
                                 Deadline deadline, const Rendezvous::Gone& gone) {
  std::vector<Socket> got(static_cast<std::size_t>(size));
  int missing = size - 1 - rank;
  const std::size_t hello_bytes = 8 + token.size();
  const char* magic = reinterpret_cast<const char*>(&kHelloMagic);
  Admission strangers(listener, kHelloSeconds, kMaxPendingHellos);
  std::vector<pollfd> fds;
  while (missing > 0) {
    std::vector<int> absent;
    for (int r = rank + 1; r < size; ++r) {
      if (!got[static_cast<std::size_t>(r)].valid()) absent.push_back(r);
    }
    check_gone(gone, absent, rank);
    if (Clock::now() >= deadline) {
      ErrorDetail detail;
      detail.ranks = absent;
      throw Timeout("rendezvous timed out: rank(s) " + join_ranks(absent) + " did not connect to rank " + std::to_string(rank),
                    std::move(detail));
    }
    fds.assign(1, pollfd{strangers.accepting() ? listener.fd() : -1, POLLIN, 0});
    for (auto& e : strangers.entries()) fds.push_back({e.sock.fd(), POLLIN, 0});
    const int wait_ms = gone ? std::min(strangers.poll_timeout_ms(deadline), kGoneCheckMs) : strangers.poll_timeout_ms(deadline);
    if (::poll(fds.data(), fds.size(), wait_ms) < 0) {
      if (errno != EINTR) throw Error(std::string("poll: ") + std::strerror(errno));
      continue;
    }
    for (std::size_t i = 0; i < strangers.entries().size(); ++i) {
      if (!fds[i + 1].revents) continue;
      Admission::Entry& e = strangers.entries()[i];
      // Exactly up to the end of the hello: the peer's first messages may follow it.
      const std::size_t had = e.in.size();
      e.in.resize(hello_bytes);
      ssize_t n = ::recv(e.sock.fd(), &e.in[had], hello_bytes - had, 0);
      e.in.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
      if (n == 0 || (n < 0 && errno != EINTR)) {
        e.sock.close();
        continue;
      }
      if (std::memcmp(e.in.data(), magic, std::min<std::size_t>(e.in.size(), 4)) != 0) {
        e.sock.close();  // not a peer hello
        continue;
      }
      int from = -1;
      if (e.in.size() >= 8) std::memcpy(&from, e.in.data() + 4, 4);
      if (e.in.size() >= 8 &&
          (from <= rank || from >= size || got[static_cast<std::size_t>(from)].valid())) {
        e.sock.close();  // not a rank we wait for
        continue;
      }
      if (e.in.size() < hello_bytes) continue;
      bool ok = same_secret(e.in.substr(8), token);
      try {
        if (ok) e.sock.send_all(&kHelloAck, 1);
      } catch (const Error&) {
        ok = false;
      }
      if (!ok) {
        e.sock.close();
        continue;
      }
      got[static_cast<std::size_t>(from)] = std::move(e.sock);
      --missing;
    }
    strangers.sweep();
    if (fds[0].revents) strangers.accept_ready();
  }
  return got;
}

// Connects to every lower rank and accepts every higher one: the sockets, by rank.
std::vector<Socket> accept_or_connect(const Socket& listener, const std::vector<std::string>& hosts,
                                      const std::vector<int>& ports, int rank, int size, const std::string& token,
                                      Deadline deadline, const Rendezvous::Gone& gone) {
  std::vector<Socket> lower(static_cast<std::size_t>(size));
  for (int r = 0; r < rank; ++r) {
    auto i = static_cast<std::size_t>(r);
    lower[i] = connect_to_peer(hosts[i], ports[i], r, rank, token, deadline, gone);
  }
  std::vector<Socket> sockets = accept_peers(listener, rank, size, token, deadline, gone);
  for (int r = 0; r < rank; ++r) sockets[static_cast<std::size_t>(r)] = std::move(lower[static_cast<std::size_t>(r)]);
  return sockets;
}

}  // namespace

Rendezvous::Rendezvous(const Identity& identity, Deadline deadline, Gone gone)
    : id_(identity),
      deadline_(deadline),
      gone_(std::move(gone)),
      prefix_(identity.job_id + "/"),
      server_(identity.rank == 0 && identity.elastic_min == 0 ? std::make_unique<StoreServer>(identity.master_addr, identity.master_port, identity.token)
                                 : nullptr),
      store_(identity.master_addr, identity.master_port, identity.token, deadline) {}

Rendezvous::~Rendezvous() = default;

void Rendezvous::set(const std::string& key, const std::string& value) { store_.set(prefix_ + key, value); }
std::string Rendezvous::get(const std::string& key, Deadline deadline) { return store_.get(prefix_ + key, deadline); }
bool Rendezvous::has(const std::string& key) { return store_.try_get(prefix_ + key).has_value(); }

Mesh Rendezvous::meet() {
  const int rank = id_.rank, size = id_.size;
  // 1. Publish who we are and where peers can reach us; the address of our store connection is
  //    the interface that routes towards rank 0, so peers on other hosts can reach it too.
  Socket listener = Socket::listen_on(store_.local_ip(), 0);
  if (rank == 0) set("payload", std::to_string(payload_from_env()));
  set("peer/" + std::to_string(rank),
      store_.local_ip() + " " + std::to_string(listener.local_port()) + " " + std::to_string(id_.node_rank));

  Mesh mesh;
  mesh.hosts.resize(static_cast<std::size_t>(size));
  mesh.nodes.resize(static_cast<std::size_t>(size));
  std::vector<int> port(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    std::string info;
    try {
      // Where ranks may be gone, asked between short looks; otherwise the store waits for us.
      while (gone_ && !has("peer/" + std::to_string(r)) && Clock::now() < deadline_) {
        check_gone(gone_, {r}, rank);
        std::this_thread::sleep_for(std::chrono::milliseconds(kAddressLookMs));
      }
      info = get("peer/" + std::to_string(r), deadline_);
    } catch (const Timeout&) {
      std::vector<int> missing;
      for (int q = 0; q < size; ++q) {
        if (!has("peer/" + std::to_string(q))) missing.push_back(q);
      }
      ErrorDetail detail;
      detail.ranks = missing;
      throw Timeout("rendezvous timed out after " + format_seconds(id_.start_timeout_s) + ": rank(s) " +
                        join_ranks(missing) + " of " + std::to_string(size) +
                        " did not arrive (did they start, with the same TNT_MASTER_ADDR/PORT and "
                        "TNT_JOB_ID?)",
                    std::move(detail));
    }
    std::istringstream in(info);
    auto i = static_cast<std::size_t>(r);
    in >> mesh.hosts[i] >> port[i] >> mesh.nodes[i];
  }
  mesh.payload = std::stoul(get("payload", deadline_));

  // 2. Full mesh of TCP connections: we connect to lower ranks and accept higher ones. Each
  //    connection starts with a hello proving the job token, acknowledged by the acceptor.
  mesh.sockets = accept_or_connect(listener, mesh.hosts, port, rank, size, id_.token, deadline_, gone_);
  return mesh;
}

void Rendezvous::finish() {
  // Rank 0 keeps its store alive until everybody has read what it needs.
  store_.add(prefix_ + "done", 1);
  if (server_) {
    while (std::stoll(get("done", deadline_)) < id_.size) {
      if (Clock::now() >= deadline_) throw Timeout("rendezvous did not complete");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace tnt
