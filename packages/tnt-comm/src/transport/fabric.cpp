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

#include "transport/gpi2.hpp"

namespace tnt {
namespace {

constexpr std::size_t kSinglePayload = 256 * 1024;  // a single rank's slots (it sends nothing)
constexpr int kSlots = 4;

}  // namespace

Fabric::Fabric(const Identity& identity)
    : rank_(identity.rank), size_(identity.size), nodes_(static_cast<std::size_t>(identity.size), identity.node_rank) {
  if (size_ != 1) throw InvalidArgument("a fabric of several ranks is built from their mesh");
  peers_.resize(1);
  segment_.layout.world = 1;
  segment_.layout.slot_bytes = kHeaderBytes + kSinglePayload;
  memory_ = MappedMemory::anonymous(segment_.layout.slots_offset());
  segment_.base = memory_.data();
}

Fabric::Fabric(const Identity& identity, Mesh mesh, Exchange& exchange, Deadline deadline)
    : rank_(identity.rank), size_(identity.size), nodes_(mesh.nodes) {
  peers_.resize(static_cast<std::size_t>(size_));
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("pipe failed");
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    auto i = static_cast<std::size_t>(r);
    peers_[i] = std::make_unique<Peer>();
    peers_[i]->rank = r;
    peers_[i]->sock = std::move(mesh.sockets[i]);
  }
  set_up(identity, mesh, exchange, deadline);
  receiver_ = std::thread([this] { receive_loop(); });
}

Fabric::~Fabric() {
  shutdown();
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

void Fabric::set_up(const Identity& id, const Mesh& mesh, Exchange& exchange, Deadline deadline) {
  const std::vector<std::string>& host = mesh.hosts;
  const std::vector<int>& node = mesh.nodes;
  const std::size_t payload = mesh.payload;

  // Choose each pair's transport and set up our segment. A forced transport (tcp, gpi2) joins
  //    every pair, within a host too; auto takes shared memory within a host and, between hosts,
  //    GPI-2 where it is built for InfiniBand/RoCE/OFI, TCP otherwise (over GPI-2's Ethernet device
  //    tcp measured faster: docs/comm.md). Every rank decides alike from the same node list.
  const bool many_hosts = std::any_of(node.begin(), node.end(), [&](int n) { return n != node[0]; });
  const std::string network = gpi2_build().network;
  const bool gpi2_between_hosts =
      id.transport == "auto" && id.gpi2_allowed && many_hosts && !network.empty() && network != "ethernet";
  const bool use_gpi2 = (id.transport == "gpi2" && id.gpi2_allowed) || gpi2_between_hosts;
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
  // The shared arena of the single-copy allreduce, where this rank has peers on its host. The
  // segment's key tells them its size ("ready" without one).
  auto arena_name = [&](int r) { return shm_name(r) + "-arena"; };
  if (any_shm && id.single_copy != "off" && SharedArena::shm_has_room()) {
    try {
      arena_ = std::make_shared<SharedArena>(arena_name(rank_), SharedArena::default_bytes());
    } catch (const Error&) {
      arena_.reset();  // the slot path needs none of it
    }
  }
  exchange.set("segment/" + std::to_string(rank_), arena_ ? "arena " + std::to_string(arena_->size()) : "ready");
#ifdef TNT_COMM_HAVE_GPI2
  if (use_gpi2) {
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
    gpi2_ = Gpi2Wire::start_job(rank_, size_, id.local_size, host, gpi2_peers, segment_, exchange, deadline, watch);
    for (int r : gpi2_peers) peers_[static_cast<std::size_t>(r)]->byes_due.store(2);
    gpi2_->start([this](int r) { goodbye_from(*peers_[static_cast<std::size_t>(r)]); });
  }
#endif

  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    Peer& peer = *peers_[static_cast<std::size_t>(r)];
    if (same_host[static_cast<std::size_t>(r)]) {
      const std::string segment = exchange.get("segment/" + std::to_string(r), deadline);
      peer.mapping = MappedMemory::open_shared(shm_name(r), bytes);
      if (arena_ && segment == "arena " + std::to_string(arena_->size())) {
        try {
          peer.arena = SharedArena::open_peer(arena_name(r), arena_->size());
        } catch (const Error&) {
          // (A limit on address space, say.) Then no rank of this host takes the single-copy path.
        }
      }
      peer.link = std::make_unique<ShmLink>(SegmentView{peer.mapping.data(), segment_.layout});
#ifdef TNT_COMM_HAVE_GPI2
    } else if (gpi2_) {
      peer.link = gpi2_->link_to(r);
#endif
    } else {
      peer.link = std::make_unique<TcpLink>(peer.rank, peer.sock, peer.send_mutex);
    }
  }
  // Once every local peer has mapped our segment, remove its name: a crash can leave no file. The
  // key also says whether we mapped every local peer's arena; the arenas join the single-copy
  // allreduce only where every rank of the host did, so all of them decide alike.
  bool all_arenas = arena_ != nullptr;
  for (int r = 0; r < size_; ++r) {
    if (same_host[static_cast<std::size_t>(r)] && peers_[static_cast<std::size_t>(r)]->arena.data() == nullptr) all_arenas = false;
  }
  exchange.set("mapped/" + std::to_string(rank_), all_arenas ? "arenas" : "1");
  for (int r = 0; r < size_; ++r) {
    if (same_host[static_cast<std::size_t>(r)] && exchange.get("mapped/" + std::to_string(r), deadline) != "arenas") {
      all_arenas = false;
    }
  }
  memory_.unlink();
  if (arena_) arena_->unlink();
  arenas_shared_ = all_arenas;
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

ErrorDetail Fabric::failure_detail() const {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  return failure_detail_;
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
       {ranks, d.operation, std::to_string(d.group), std::to_string(d.call), d.mine, d.theirs, d.peer_error, message}) {
    put_field(out, field);
  }
  return out;
}

// False where the text is not one encode_failure made (then nothing is taken from it).
bool decode_failure(const std::string& text, FailureKind* kind, ErrorDetail* d, std::string* message) {
  if (text.empty() || text[0] < '1' || text[0] > '4') return false;
  std::string f[8];
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
    out.peer_error = f[6];
    *kind = static_cast<FailureKind>(text[0] - '0');
    *d = std::move(out);
    *message = f[7];
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

void Fabric::throw_failure(const ErrorDetail& call, const std::string& doing) const {
  std::string message;
  ErrorDetail detail;
  {
    std::lock_guard<std::mutex> lock(failure_mutex_);
    message = failure_message_;
    detail = failure_detail_;
  }
  // A peer that left with an error of its own said what it was, not what we were doing: that is
  // ours to add ("rank 1 failed (ValueError: ...) while rank 0 was in allreduce(...)").
  const bool left_with_error = !detail.peer_error.empty() && !detail.ranks.empty() && detail.ranks.front() != rank_;
  if (detail.operation.empty()) {
    detail.operation = call.operation;
    detail.group = call.group;
    detail.call = call.call;
  }
  if (left_with_error && !doing.empty()) message += " while rank " + std::to_string(rank_) + " was in " + doing;
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

void Fabric::check_transport(const std::string& transport) {
  const bool have_gpi2 = !gpi2_build().version.empty();
  if (transport == "gpi2" && !have_gpi2) {
    throw InvalidArgument("TNT_TRANSPORT=gpi2: this build of tnt-comm has no GPI-2 transport (build "
                          "it with GPI2_ROOT set, see docs/comm.md); use auto, shm or tcp");
  }
  if (transport != "auto" && transport != "shm" && transport != "tcp" && transport != "gpi2") {
    throw InvalidArgument("TNT_TRANSPORT=" + transport + " is not one of auto, shm, tcp" + (have_gpi2 ? ", gpi2" : ""));
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

std::vector<int> Fabric::vanished_peers() const {
  std::vector<int> out;
  for (const auto& peer : peers_) {
    if (peer && peer->vanished.load(std::memory_order_acquire)) out.push_back(peer->rank);
  }
  return out;
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
    peer.vanished.store(true, std::memory_order_release);
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
