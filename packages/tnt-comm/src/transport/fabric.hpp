// The connected set of peers of this rank: its segment, one link per peer (shm, tcp or gpi2,
// chosen per pair), the TCP connection to every peer that also carries liveness, abort and goodbye messages,
// and the failure state every wait checks.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tnt_comm/identity.hpp"
#include "transport/arena.hpp"
#include "transport/exchange.hpp"
#include "transport/gpi2.hpp"
#include "transport/link.hpp"
#include "transport/segment.hpp"
#include "transport/socket.hpp"

namespace tnt {

enum class FailureKind { none = 0, mismatch, peer, timeout, other };

class Fabric {
 public:
  static constexpr std::size_t kHeaderBytes = 64;

  // Refuses a transport (TNT_TRANSPORT) that is not one of auto, shm, tcp and gpi2, or gpi2 in a
  // build without GPI-2, naming what this build has; called before anything starts.
  static void check_transport(const std::string& transport);

  // A single rank's fabric: a segment, no peers.
  explicit Fabric(const Identity& identity);
  // The fabric of a job's ranks, met and connected by the rendezvous (`mesh`): chooses each pair's
  // link, sets up this rank's segment and, where used, GPI-2, agreeing with the others through
  // `exchange`, all before `deadline`.
  Fabric(const Identity& identity, Mesh mesh, Exchange& exchange, Deadline deadline);
  ~Fabric();
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const SegmentView& segment() const { return segment_; }
  std::size_t payload_bytes() const { return segment_.layout.slot_bytes - kHeaderBytes; }
  Link& link(int peer) { return *peers_[static_cast<std::size_t>(peer)]->link; }
  std::string transport(int peer) const;
  // Whether two world ranks run on the same host (the same TNT_NODE_RANK), whatever their link.
  bool same_host(int a, int b) const {
    return nodes_[static_cast<std::size_t>(a)] == nodes_[static_cast<std::size_t>(b)];
  }
  // The node rank (TNT_NODE_RANK) of a world rank.
  int node(int rank) const { return nodes_[static_cast<std::size_t>(rank)]; }
  // This rank's shared arena (transport/arena.hpp), or null: no peer on this host, too little
  // /dev/shm, or TNT_SINGLE_COPY=off.
  const std::shared_ptr<SharedArena>& arena() const { return arena_; }
  // Where a rank's arena is mapped here (our own for ourselves), or null. Non-null for every rank
  // of this host exactly when each of them set up an arena and mapped all the others', which every
  // rank of the host learns alike at start.
  std::byte* arena_of(int rank) const {
    if (!arenas_shared_) return nullptr;
    return rank == rank_ ? arena_->base() : peers_[static_cast<std::size_t>(rank)]->arena.data();
  }
  Doorbell doorbell() const { return segment_.doorbell(); }
  // Hands every write this rank posted to the network before a call completes (GPI-2 queues them
  // in its own thread; shm and tcp writes are already out when write_notify returns).
  void complete_writes() {
    if (gpi2_) complete_gpi2_writes();
  }

  // Records the first failure, wakes every waiter and, if asked, tells every peer (abort frame).
  void fail(FailureKind kind, ErrorDetail detail, const std::string& message, bool tell_peers);
  bool failed() const { return failure_.load(std::memory_order_acquire) != FailureKind::none; }
  FailureKind failure_kind() const { return failure_.load(std::memory_order_acquire); }
  // The recorded failure's fields (empty before one).
  ErrorDetail failure_detail() const;
  // Throws the recorded failure; `call` (operation, group, call number) fills in the call it
  // stopped where the failure itself names none (a peer's connection closed between calls), and
  // `doing` (that call, described) ends the sentence of a peer that left with an error of its own.
  [[noreturn]] void throw_failure(const ErrorDetail& call = {}, const std::string& doing = {}) const;

  // Tells every peer that this rank finalized and will send no more (unless the job failed).
  void say_goodbye();
  // Says goodbye unless done, closes the TCP connections once their last bytes have arrived and
  // stops the receiver thread.
  void shutdown();
  // Whether the peer said goodbye or its connection closed: it will read no more of our messages.
  bool heard_goodbye(int rank) const;

  // Peers that said goodbye (finalized) and so will never send again. The count only grows.
  std::uint32_t departures() const { return departures_.load(std::memory_order_acquire); }
  bool departed(int rank) const;
  // Peers whose connection closed without a goodbye so far: their process ended (in an elastic
  // job the survivors of a failure keep their links until they agree on who is left).
  std::vector<int> vanished_peers() const;
  // Sends the recorded failure to every peer still connected (an abort frame).
  void tell_failure();

  // Liveness probes, for naming the ranks that hold a stalled job up. `status` answers a peer's
  // probe on the receiver thread: whether this rank has made call `seq` of stream `key`.
  using Status = std::function<std::string(std::uint64_t key, std::uint64_t seq)>;
  void set_status(Status status);
  // Asks each rank about (key, seq) and waits up to `timeout_s`; an empty answer: no reply.
  std::vector<std::optional<std::string>> probe(const std::vector<int>& ranks, std::uint64_t key,
                                                std::uint64_t seq, double timeout_s);

 private:
  struct Peer {
    int rank = -1;
    Socket sock;
    std::mutex send_mutex;
    std::unique_ptr<Link> link;
    MappedMemory mapping;  // the peer's segment, for shm links
    MappedMemory arena;    // the peer's shared arena, where both have one
    bool said_bye = false;
    // Goodbyes still to come before the peer counts as departed: one on TCP, one more through
    // GPI-2 for a gpi2 link (it lands after the peer's last write; the TCP one may overtake it).
    std::atomic<int> byes_due{1};
    bool closed = false;
    std::atomic<bool> departed{false};
    std::atomic<bool> left{false};  // a goodbye of either kind arrived, or the connection closed
    std::atomic<bool> vanished{false};  // the connection closed without a goodbye
  };

  void complete_gpi2_writes();
  void set_up(const Identity& identity, const Mesh& mesh, Exchange& exchange, Deadline deadline);
  void goodbye_from(Peer& peer);
  void receive_loop();
  void handle_frame(Peer& peer);
  void send_frame(Peer& peer, FrameHeader::Type type, const std::string& text);
  // The closing handshake of a clean shutdown (see fabric.cpp).
  void close_gracefully();
  static constexpr double kClosingWaitS = 10.0;

  int rank_;
  int size_;
  std::vector<int> nodes_;  // node rank of every world rank, from the rendezvous
  MappedMemory memory_;
  SegmentView segment_;
  std::shared_ptr<SharedArena> arena_;  // shared with the buffers allocated in it
  bool arenas_shared_ = false;          // every rank of this host mapped every other's arena
  std::unique_ptr<Gpi2Wire> gpi2_;  // GPI-2 between hosts, when TNT_TRANSPORT=gpi2
  std::vector<std::unique_ptr<Peer>> peers_;  // indexed by world rank; our own entry is empty
  std::thread receiver_;
  int wake_[2] = {-1, -1};
  bool said_goodbye_ = false;
  bool shut_down_ = false;

  std::atomic<std::uint32_t> departures_{0};

  std::mutex status_mutex_;  // guards status_
  Status status_;
  std::mutex probe_mutex_;   // guards the probe state below
  std::condition_variable probe_cv_;
  std::uint32_t probe_id_ = 0;
  std::vector<std::optional<std::string>> replies_;  // by world rank, for probe_id_

  std::atomic<FailureKind> failure_{FailureKind::none};
  mutable std::mutex failure_mutex_;
  std::string failure_message_;
  ErrorDetail failure_detail_;
};

}  // namespace tnt
