#include "transport/fabric.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>

#include "store/store.hpp"
#include "transport/gpi2.hpp"

namespace tnt {
namespace {

constexpr std::uint32_t kHelloMagic = 0x544e5448;  // "TNTH"
constexpr std::size_t kDefaultPayload = 256 * 1024;
constexpr int kSlots = 4;

std::size_t payload_from_env() {
  const char* v = std::getenv("TNT_CHUNK_KB");
  if (v == nullptr || *v == '\0') return kDefaultPayload;
  long kb = std::strtol(v, nullptr, 10);
  if (kb < 4 || kb > 64 * 1024) throw InvalidArgument("TNT_CHUNK_KB must be between 4 and 65536");
  return static_cast<std::size_t>(kb) * 1024;
}

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
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
                       Deadline deadline) {
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
    if (Clock::now() >= deadline) {
      throw Timeout("rendezvous timed out: rank " + std::to_string(to) +
                    " did not accept the connection of rank " + std::to_string(rank) + " at " +
                    host + ":" + std::to_string(port));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Accepts ranks rank+1 .. size-1 on `listener`; returns their sockets indexed by rank. Hellos are
// read side by side, each connection against its own short deadline, and a wrong one is dropped
// at once, so no stranger delays a real peer.
std::vector<Socket> accept_peers(const Socket& listener, int rank, int size, const std::string& token,
                                 Deadline deadline) {
  std::vector<Socket> got(static_cast<std::size_t>(size));
  int missing = size - 1 - rank;
  const std::size_t hello_bytes = 8 + token.size();
  const char* magic = reinterpret_cast<const char*>(&kHelloMagic);
  Admission strangers(listener, kHelloSeconds, kMaxPendingHellos);
  std::vector<pollfd> fds;
  while (missing > 0) {
    if (Clock::now() >= deadline) {
      std::vector<int> absent;
      for (int r = rank + 1; r < size; ++r) {
        if (!got[static_cast<std::size_t>(r)].valid()) absent.push_back(r);
      }
      ErrorDetail detail;
      detail.ranks = absent;
      throw Timeout("rendezvous timed out: rank(s) " + join(absent) + " did not connect to rank " + std::to_string(rank),
                    std::move(detail));
    }
    fds.assign(1, pollfd{strangers.accepting() ? listener.fd() : -1, POLLIN, 0});
    for (auto& e : strangers.entries()) fds.push_back({e.sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), strangers.poll_timeout_ms(deadline)) < 0) {
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

}  // namespace

Fabric::Fabric(const Identity& identity)
    : rank_(identity.rank), size_(identity.size), nodes_(static_cast<std::size_t>(identity.size), identity.node_rank) {
  peers_.resize(static_cast<std::size_t>(size_));
  if (size_ == 1) {
    segment_.layout.world = 1;
    segment_.layout.slot_bytes = kHeaderBytes + kDefaultPayload;
    memory_ = MappedMemory::anonymous(segment_.layout.slots_offset());
    segment_.base = memory_.data();
    return;
  }
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("pipe failed");
  try {
    rendezvous(identity);
  } catch (const Timeout& e) {
    // Every timeout of the start says which limit it ran into, and how to raise it.
    throw Timeout(std::string(e.what()) + " (the start may take " + format_seconds(identity.start_timeout_s) +
                      ": raise TNT_START_TIMEOUT_S, tnt-launch --start-timeout, if ranks start slowly)",
                  e.detail());
  }
  receiver_ = std::thread([this] { receive_loop(); });
}

Fabric::~Fabric() {
  shutdown();
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

void Fabric::rendezvous(const Identity& id) {
  const Deadline deadline = deadline_after(id.start_timeout_s);
  std::unique_ptr<StoreServer> server;
  if (rank_ == 0) server = std::make_unique<StoreServer>(id.master_addr, id.master_port, id.token);
  StoreClient store(id.master_addr, id.master_port, id.token, deadline);

  // 1. Publish who we are and where peers can reach us; the address of our store connection is
  //    the interface that routes towards rank 0, so peers on other hosts can reach it too.
  Socket listener = Socket::listen_on(store.local_ip(), 0);
  const std::string prefix = id.job_id + "/";
  if (rank_ == 0) store.set(prefix + "payload", std::to_string(payload_from_env()));
  store.set(prefix + "peer/" + std::to_string(rank_),
            store.local_ip() + " " + std::to_string(listener.local_port()) + " " +
                std::to_string(id.node_rank));

  std::vector<std::string> host(static_cast<std::size_t>(size_));
  std::vector<int> port(static_cast<std::size_t>(size_)), node(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    std::string info;
    try {
      info = store.get(prefix + "peer/" + std::to_string(r), deadline);
    } catch (const Timeout&) {
      std::vector<int> missing;
      for (int q = 0; q < size_; ++q) {
        if (!store.try_get(prefix + "peer/" + std::to_string(q))) missing.push_back(q);
      }
      ErrorDetail detail;
      detail.ranks = missing;
      throw Timeout("rendezvous timed out after " + format_seconds(id.start_timeout_s) + ": rank(s) " +
                        join(missing) + " of " + std::to_string(size_) +
                        " did not arrive (did they start, with the same TNT_MASTER_ADDR/PORT and "
                        "TNT_JOB_ID?)",
                    std::move(detail));
    }
    std::istringstream in(info);
    auto i = static_cast<std::size_t>(r);
    in >> host[i] >> port[i] >> node[i];
  }
  nodes_ = node;
  const std::size_t payload = std::stoul(store.get(prefix + "payload", deadline));

  // 2. Full mesh of TCP connections: we connect to lower ranks and accept higher ones. Each
  //    connection starts with a hello proving the job token, acknowledged by the acceptor.
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    peers_[static_cast<std::size_t>(r)] = std::make_unique<Peer>();
    peers_[static_cast<std::size_t>(r)]->rank = r;
  }
  for (int r = 0; r < rank_; ++r) {
    auto i = static_cast<std::size_t>(r);
    peers_[i]->sock = connect_to_peer(host[i], port[i], r, rank_, id.token, deadline);
  }
  std::vector<Socket> higher = accept_peers(listener, rank_, size_, id.token, deadline);
  for (int r = rank_ + 1; r < size_; ++r) {
    peers_[static_cast<std::size_t>(r)]->sock = std::move(higher[static_cast<std::size_t>(r)]);
  }

  // 3. Choose each pair's transport and set up our segment. A forced transport (tcp, gpi2) joins
  //    every pair, within a host too; auto takes shared memory within a host and, between hosts,
  //    GPI-2 where it is built for InfiniBand/RoCE/OFI, TCP otherwise (over GPI-2's Ethernet device
  //    tcp measured faster: docs/comm.md). Every rank decides alike from the same node list.
  const bool many_hosts = std::any_of(node.begin(), node.end(), [&](int n) { return n != node[0]; });
  const std::string network = gpi2_build().network;
  const bool gpi2_between_hosts = id.transport == "auto" && many_hosts && !network.empty() && network != "ethernet";
  const bool use_gpi2 = id.transport == "gpi2" || gpi2_between_hosts;
  std::vector<bool> same_host(static_cast<std::size_t>(size_), false);
  std::vector<int> gpi2_peers;
  bool any_shm = false;
  for (int r = 0; r < size_; ++r) {
    auto i = static_cast<std::size_t>(r);
    bool local = node[i] == id.node_rank;
    if (id.transport == "shm" && !local) {
      throw InvalidArgument("TNT_TRANSPORT=shm but rank " + std::to_string(r) +
                            " runs on another host; use auto or tcp");
    }
    same_host[i] = r != rank_ && local && (id.transport == "auto" || id.transport == "shm");
    any_shm = any_shm || same_host[i];
    if (r != rank_ && use_gpi2 && !same_host[i]) gpi2_peers.push_back(r);
  }
  segment_.layout.world = size_;
  segment_.layout.slots = kSlots;
  segment_.layout.slot_bytes = kHeaderBytes + payload;
  const std::size_t bytes = segment_.layout.total();
  auto shm_name = [&](int r) { return "/tnt-" + id.job_id + "-" + std::to_string(r); };
  memory_ = any_shm ? MappedMemory::create_shared(shm_name(rank_), bytes)
                    : MappedMemory::anonymous(bytes);
  segment_.base = memory_.data();
  store.set(prefix + "segment/" + std::to_string(rank_), "ready");
#ifdef TNT_COMM_HAVE_GPI2
  if (use_gpi2) {
    // Every rank starts GPI-2 (it meets all ranks of its machinefile), even one with no GPI-2
    // peer. Connections go from higher to lower ranks, as GPI-2's own static topology.
    // GPI-2 takes seconds to start on a loaded host: the start timeout (at least a minute unless
    // the user set TNT_START_TIMEOUT_S) covers it with the rest of the rendezvous.
    // GPI-2's ports: the job's TNT_GPI2_PORT_BASE (tnt-launch's or the user's), else a base rank 0
    // finds free on its host, the same for every rank.
    const char* fixed_base = std::getenv("TNT_GPI2_PORT_BASE");
    std::string port_base = fixed_base != nullptr ? fixed_base : "";
    if (port_base.empty()) {
      if (rank_ == 0) {
        const int here = static_cast<int>(std::count(host.begin(), host.end(), host[0]));
        store.set(prefix + "gpi2-port-base", std::to_string(gpi2_free_port_base(here)));
      }
      port_base = store.get(prefix + "gpi2-port-base", deadline);
    }
    // GPI-2 never notices a dead peer; our connection to every peer does, so a rank that dies
    // while GPI-2 starts ends the start at once, named, instead of at GPI-2's timeout.
    const auto watch = [&] {
      if (Clock::now() >= deadline) throw Timeout("rendezvous: GPI-2 did not start on every rank in time");
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        char byte;
        const ssize_t got = ::recv(peers_[static_cast<std::size_t>(r)]->sock.fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          throw PeerFailure(r, "rank " + std::to_string(r) + " (" + host[static_cast<std::size_t>(r)] +
                                   ") left the job while GPI-2 was starting");
        }
      }
    };
    const auto wait_for_key = [&](const std::string& key) {
      while (!store.try_get(prefix + key)) {
        watch();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    };
    gpi2_ = std::make_unique<Gpi2Wire>(rank_, size_, id.local_size, host, port_base, segment_, deadline, watch);
    for (int r : gpi2_peers) {
      if (r < rank_) gpi2_->connect(r, deadline, watch);
    }
    store.set(prefix + "gpi2-connected/" + std::to_string(rank_), "1");
    for (int r : gpi2_peers) {
      if (r > rank_) wait_for_key("gpi2-connected/" + std::to_string(r));
    }
    for (int r : gpi2_peers) gpi2_->register_segment(r, deadline, watch);
    store.set(prefix + "gpi2-registered/" + std::to_string(rank_), "1");
    for (int r : gpi2_peers) wait_for_key("gpi2-registered/" + std::to_string(r));
    for (int r : gpi2_peers) peers_[static_cast<std::size_t>(r)]->byes_due.store(2);
    gpi2_->start([this](int r) { goodbye_from(*peers_[static_cast<std::size_t>(r)]); });
  }
#endif

  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Peer& peer = *peers_[static_cast<std::size_t>(r)];
    if (same_host[static_cast<std::size_t>(r)]) {
      store.get(prefix + "segment/" + std::to_string(r), deadline);
      peer.mapping = MappedMemory::open_shared(shm_name(r), bytes);
      peer.link = std::make_unique<ShmLink>(SegmentView{peer.mapping.data(), segment_.layout});
#ifdef TNT_COMM_HAVE_GPI2
    } else if (gpi2_) {
      peer.link = gpi2_->link_to(r);
#endif
    } else {
      peer.link = std::make_unique<TcpLink>(peer.sock, peer.send_mutex);
    }
  }
  // 4. Once every local peer has mapped our segment, remove its name: a crash can leave no file.
  store.set(prefix + "mapped/" + std::to_string(rank_), "1");
  for (int r = 0; r < size_; ++r) {
    if (same_host[static_cast<std::size_t>(r)]) store.get(prefix + "mapped/" + std::to_string(r), deadline);
  }
  memory_.unlink();
  // Rank 0 keeps its store alive until everybody has read what it needs.
  store.add(prefix + "done", 1);
  if (server) {
    while (std::stoll(store.get(prefix + "done", deadline)) < size_) {
      if (Clock::now() >= deadline) throw Timeout("rendezvous did not complete");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

std::string Fabric::transport(int peer) const {
  if (peer == rank_) return "self";
  return peers_[static_cast<std::size_t>(peer)]->link->kind();
}

void Fabric::complete_gpi2_writes() {
  try {
    gpi2_->complete_posted();
  } catch (const Error&) {
    // GPI-2 fails writes to a peer that died, with a bare error; our own connection to that peer
    // names it within moments, and that is the failure to report.
    const Deadline until = deadline_after(2.0);
    while (!failed() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!failed()) throw;
  }
}

void Fabric::fail(FailureKind kind, ErrorDetail detail, const std::string& message, bool tell_peers) {
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    if (failure_.load() != FailureKind::none) return;
    failure_message_ = message;
    failure_detail_ = std::move(detail);
    failure_.store(kind, std::memory_order_release);
  }
  if (tell_peers) tell_failure();
  doorbell().ring();
}

namespace {

// The abort frame's text: the kind's digit, then the error's data and message as fields that each
// start with their length ("<bytes>:"), so that no field's text can be taken for another's.
void put_field(std::string& out, const std::string& field) {
  out += std::to_string(field.size()) + ":" + field;
}

bool take_field(const std::string& text, std::size_t& at, std::string* field) {
  const std::size_t colon = text.find(':', at);
  if (colon == std::string::npos || colon == at || colon - at > 12) return false;
  const unsigned long long bytes = std::stoull(text.substr(at, colon - at));
  if (bytes > text.size() - colon - 1) return false;
  *field = text.substr(colon + 1, bytes);
  at = colon + 1 + bytes;
  return true;
}

std::string encode_failure(FailureKind kind, const ErrorDetail& d, const std::string& message) {
  std::string ranks;
  for (int r : d.ranks) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
  std::string out(1, static_cast<char>('0' + static_cast<int>(kind)));
  for (const std::string& field :
       {ranks, d.operation, std::to_string(d.group), std::to_string(d.call), d.mine, d.theirs, message}) {
    put_field(out, field);
  }
  return out;
}

// False where the text is not one encode_failure made (then nothing is taken from it).
bool decode_failure(const std::string& text, FailureKind* kind, ErrorDetail* d, std::string* message) {
  if (text.empty() || text[0] < '1' || text[0] > '4') return false;
  std::string f[7];
  std::size_t at = 1;
  try {
    for (auto& field : f) {
      if (!take_field(text, at, &field)) return false;
    }
    ErrorDetail out;
    for (std::size_t i = 0; i < f[0].size();) {
      std::size_t end = f[0].find(',', i);
      if (end == std::string::npos) end = f[0].size();
      out.ranks.push_back(std::stoi(f[0].substr(i, end - i)));
      i = end + 1;
    }
    out.operation = f[1];
    out.group = std::stoull(f[2]);
    out.call = std::stoll(f[3]);
    out.mine = f[4];
    out.theirs = f[5];
    *kind = static_cast<FailureKind>(text[0] - '0');
    *d = std::move(out);
    *message = f[6];
    return true;
  } catch (const std::exception&) {  // std::stoi and friends on a malformed number
    return false;
  }
}

}  // namespace

void Fabric::tell_failure() {
  std::string text;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    text = encode_failure(failure_.load(), failure_detail_, failure_message_);
  }
  for (auto& peer : peers_) {
    if (peer && !peer->closed && peer->sock.valid()) send_frame(*peer, FrameHeader::abort, text);
  }
}

void Fabric::throw_failure(const ErrorDetail& call) const {
  std::string message;
  ErrorDetail detail;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    message = failure_message_;
    detail = failure_detail_;
  }
  if (detail.operation.empty()) {
    detail.operation = call.operation;
    detail.group = call.group;
    detail.call = call.call;
  }
  switch (failure_.load(std::memory_order_acquire)) {
    case FailureKind::mismatch: throw CollectiveMismatch(message, std::move(detail));
    case FailureKind::peer: {
      const int culprit = detail.ranks.empty() ? -1 : detail.ranks.front();
      throw PeerFailure(culprit, message, std::move(detail));
    }
    case FailureKind::timeout: throw Timeout(message, std::move(detail));
    default: throw Error(message, std::move(detail));
  }
}

void Fabric::send_frame(Peer& peer, FrameHeader::Type type, const std::string& text) {
  FrameHeader header{type, 0, 0, 0, text.size()};
  iovec iov[2] = {{&header, sizeof header}, {const_cast<char*>(text.data()), text.size()}};
  try {
    std::lock_guard<std::mutex> lock(peer.send_mutex);
    peer.sock.send_iov(iov, text.empty() ? 1 : 2);
  } catch (const Error&) {
    // The peer is gone already; its failure is reported by the receiver.
  }
}

void Fabric::goodbye_from(Peer& peer) {
  peer.left.store(true, std::memory_order_release);
  if (peer.byes_due.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  peer.departed.store(true, std::memory_order_release);
  departures_.fetch_add(1, std::memory_order_acq_rel);
  doorbell().ring();
}

bool Fabric::heard_goodbye(int rank) const {
  const auto& peer = peers_[static_cast<std::size_t>(rank)];
  return peer && peer->left.load(std::memory_order_acquire);
}

bool Fabric::departed(int rank) const {
  const auto& peer = peers_[static_cast<std::size_t>(rank)];
  return peer && peer->departed.load(std::memory_order_acquire);
}

void Fabric::set_status(Status status) {
  std::lock_guard<std::mutex> lock(status_mutex_);
  status_ = std::move(status);
}

std::vector<std::optional<std::string>> Fabric::probe(const std::vector<int>& ranks, std::uint64_t key,
                                                      std::uint64_t seq, double timeout_s) {
  std::unique_lock<std::mutex> lock(probe_mutex_);
  const std::uint32_t id = ++probe_id_;
  replies_.assign(static_cast<std::size_t>(size_), std::nullopt);
  lock.unlock();
  for (int r : ranks) {
    Peer& peer = *peers_[static_cast<std::size_t>(r)];
    FrameHeader header{FrameHeader::probe, id, key, seq, 0};
    iovec iov{&header, sizeof header};
    try {
      std::lock_guard<std::mutex> send_lock(peer.send_mutex);
      peer.sock.send_iov(&iov, 1);
    } catch (const Error&) {
      // Gone: it will not answer, which is what we learn.
    }
  }
  lock.lock();
  probe_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] {
    for (int r : ranks) {
      if (!replies_[static_cast<std::size_t>(r)]) return false;
    }
    return true;
  });
  std::vector<std::optional<std::string>> out;
  for (int r : ranks) out.push_back(replies_[static_cast<std::size_t>(r)]);
  return out;
}

void Fabric::receive_loop() {
  std::vector<pollfd> fds;
  std::vector<Peer*> owners;
  while (true) {
    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    owners.assign(1, nullptr);
    for (auto& peer : peers_) {
      if (peer && !peer->closed) {
        fds.push_back({peer->sock.fd(), POLLIN, 0});
        owners.push_back(peer.get());
      }
    }
    if (fds.size() == 1) return;
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) return;
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents) handle_frame(*owners[i]);
    }
  }
}

void Fabric::handle_frame(Peer& peer) {
  auto peer_died = [&](const std::string& why) {
    peer.closed = true;
    peer.left.store(true, std::memory_order_release);
    if (peer.said_bye) return;
    ErrorDetail detail;
    detail.ranks = {peer.rank};
    fail(FailureKind::peer, std::move(detail),
         "rank " + std::to_string(peer.rank) + " failed: " + why +
             " (the process died or was killed; see its own output for the cause)",
         false);
  };
  FrameHeader h{};
  try {
    if (!peer.sock.recv_all(&h, sizeof h)) return peer_died("its connection closed");
    if (h.type == FrameHeader::write_notify) {
      if (h.offset + h.bytes > segment_.layout.total() || h.note >= segment_.layout.notes()) {
        return peer_died("it sent a malformed message");
      }
      if (h.bytes > 0 && !peer.sock.recv_all(segment_.base + h.offset, h.bytes)) {
        return peer_died("its connection closed");
      }
      segment_.note(h.note)->store(h.value, std::memory_order_release);
      doorbell().ring();
    } else if (h.type == FrameHeader::abort) {
      std::string text(h.bytes, '\0');
      if (h.bytes > 0 && !peer.sock.recv_all(text.data(), h.bytes)) return peer_died("closed");
      FailureKind kind = FailureKind::other;
      ErrorDetail detail;
      std::string message;
      if (!decode_failure(text, &kind, &detail, &message)) {
        detail.ranks = {peer.rank};
        message = "rank " + std::to_string(peer.rank) + " stopped the job with an unreadable abort message";
      }
      fail(kind, std::move(detail), message, false);
    } else if (h.type == FrameHeader::bye) {
      // It finalized: it drained its work and will send nothing more. Waits for it now fail.
      peer.said_bye = true;
      goodbye_from(peer);
    } else if (h.type == FrameHeader::probe) {
      std::string answer = "?";
      {
        std::lock_guard<std::mutex> lock(status_mutex_);
        if (status_) answer = status_(h.value, h.offset);
      }
      FrameHeader reply{FrameHeader::probe_reply, h.note, 0, 0, answer.size()};
      iovec iov[2] = {{&reply, sizeof reply}, {answer.data(), answer.size()}};
      try {
        std::lock_guard<std::mutex> lock(peer.send_mutex);
        peer.sock.send_iov(iov, 2);
      } catch (const Error&) {
        // The prober is gone; nothing to answer.
      }
    } else if (h.type == FrameHeader::probe_reply) {
      if (h.bytes > 4096) return peer_died("it sent a malformed message");
      std::string text(h.bytes, '\0');
      if (h.bytes > 0 && !peer.sock.recv_all(text.data(), h.bytes)) return peer_died("its connection closed");
      std::lock_guard<std::mutex> lock(probe_mutex_);
      if (h.note == probe_id_ && static_cast<std::size_t>(peer.rank) < replies_.size()) {
        replies_[static_cast<std::size_t>(peer.rank)] = std::move(text);
        probe_cv_.notify_all();
      }
    } else {
      peer_died("it sent an unknown message");
    }
  } catch (const Error& e) {
    peer_died(e.what());
  }
}

void Fabric::say_goodbye() {
  if (said_goodbye_ || failed()) return;
  said_goodbye_ = true;
  for (auto& peer : peers_) {
#ifdef TNT_COMM_HAVE_GPI2
    if (peer && gpi2_ && peer->link && std::strcmp(peer->link->kind(), "gpi2") == 0) {
      gpi2_->say_bye(peer->rank);
    }
#endif
    if (peer && peer->sock.valid()) send_frame(*peer, FrameHeader::bye, "");
  }
}

// A socket closed while bytes it received are unread (a peer's late acknowledgement, say) is
// reset instead of closed, and the reset drops what it had not transmitted yet: our goodbye, or a
// peer would see a failure where we left. So: no more sends (the FIN follows our last frame), and
// the receiver reads on until the peer's TCP has acknowledged all we sent, or its side is gone.
void Fabric::close_gracefully() {
  if (!receiver_.joinable()) return;
  for (auto& peer : peers_) {
    if (peer && peer->sock.valid()) ::shutdown(peer->sock.fd(), SHUT_WR);
  }
  const Deadline until = deadline_after(kClosingWaitS);
  for (auto& peer : peers_) {
    if (!peer || !peer->sock.valid()) continue;
    while (peer->sock.unacknowledged_bytes() > 0 && !failed() && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

void Fabric::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (failed()) {
    // Not a clean goodbye: pass the failure on, so no peer mistakes our leaving for its cause.
    tell_failure();
  } else {
    say_goodbye();
    close_gracefully();
  }
  if (receiver_.joinable()) {
    char c = 'q';
    if (::write(wake_[1], &c, 1) < 0) { /* the thread also ends when all peers close */ }
    receiver_.join();
  }
#ifdef TNT_COMM_HAVE_GPI2
  if (gpi2_) {
    gpi2_->stop();
    memory_.keep_until_exit();  // GPI-2's threads, still running, know our segment
  }
#endif
}

}  // namespace tnt
