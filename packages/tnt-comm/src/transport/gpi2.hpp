// GPI-2 between hosts (compiled only when CMake found GPI-2): our segment is registered with
// GPI-2, a write is a gaspi_write_notify from a staging segment into the peer's segment, and a
// poller thread turns GPI-2's notifications into our notification words and doorbell rings.
// GPI-2 never notices a dead peer, so liveness, aborts and goodbyes stay on the Fabric's TCP mesh;
// every GPI-2 call here has a timeout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "tnt_comm/types.hpp"
#include "transport/exchange.hpp"
#include "transport/gpi2_ports.hpp"
#include "transport/link.hpp"
#include "transport/segment.hpp"

namespace tnt {

// The GPI-2 this tnt-comm was built against: version ("1.6.0"), install prefix and network
// ("ethernet", "infiniband", "roce", "ofi"); all "" when built without it.
struct Gpi2Build {
  std::string version, prefix, network;
};
Gpi2Build gpi2_build();

// Declared in every build so the Fabric's layout never depends on the build; only a build with
// GPI-2 defines more than its destructor.
class Gpi2Wire {
 public:
  // Starts GPI-2 in this process (every rank of the job must) and registers `mine` as segment 0.
  // GASPI_* variables the launcher did not set follow from `hosts` (every rank's address, from
  // the rendezvous); GPI-2's ports start at `port_base` (the job's TNT_GPI2_PORT_BASE, or rank 0's
  // choice: the same on every rank). GPI-2 can start once per process, as the runtime.
  // GPI-2 blocks in its start and never notices a dead peer: `watch` (tnt's own connections to
  // every peer) runs every 50 ms meanwhile and throws to end the start, naming the peer. Made by
  // start_job, which also raises the descriptor limit first.
  Gpi2Wire(int rank, int size, int local_size, const std::vector<std::string>& hosts,
           const std::string& port_base, SegmentView mine, Deadline deadline,
           const std::function<void()>& watch);
  // GPI-2's start for a job: agrees on the ports through `exchange`, starts GPI-2, connects to
  // the ranks in `peers` (those reached over GPI-2) and registers `mine` with them, in step with
  // them through `exchange`. `watch` as above. Every rank of the job calls it.
  static std::unique_ptr<Gpi2Wire> start_job(int rank, int size, int local_size, const std::vector<std::string>& hosts,
                                             const std::vector<int>& peers, SegmentView mine, Exchange& exchange,
                                             Deadline deadline, const std::function<void()>& watch);
  ~Gpi2Wire();
  Gpi2Wire(const Gpi2Wire&) = delete;
  Gpi2Wire& operator=(const Gpi2Wire&) = delete;

  // Connects GPI-2 to `peer` (once per pair), then gives it our segment; the peer may write to
  // us once both returned on both sides (the Fabric's store says so).
  void connect(int peer, Deadline deadline, const std::function<void()>& watch);
  void register_segment(int peer, Deadline deadline, const std::function<void()>& watch);
  // Starts turning notifications into our segment's notification words; `on_bye(peer)` runs on
  // the poller once everything `peer` wrote before its goodbye has landed.
  void start(std::function<void(int)> on_bye);
  // Tells `peer` through GPI-2 itself that we wrote our last: it lands after all our writes,
  // which a goodbye on the TCP connection could overtake.
  void say_bye(int peer);
  std::unique_ptr<Link> link_to(int peer);
  // Completes what we posted and stops the poller; GPI-2 itself runs until the process ends.
  void stop();

  // Waits until GPI-2 has handed every write we posted to the network, so that a finished call's
  // data reaches its peers even if this process is stopped (SIGSTOP) or killed right after.
  void complete_posted();

  // Posts one write (or a bare notification when `bytes` is 0); used by Gpi2Link.
  void write_notify(int peer, std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                    std::uint64_t value);

 private:
  void poll_loop();
  bool poll_once();
  // gaspi_wait on our queue, polled: GPI-2's own wait spins without yielding, which starves its
  // device thread (the one that sends) where ranks outnumber cores. Needs post_mutex_ held.
  void wait_queue(const char* what);

  int rank_;
  SegmentView mine_;
  bool oversubscribed_;
  MappedMemory staging_;          // per peer, a mirror of our slots in its segment
  std::size_t staging_per_peer_;  // bytes of one peer's staging region
  std::mutex post_mutex_;         // one queue, posted to by one thread at a time
  std::thread poller_;
  std::atomic<bool> stopping_{false};
  std::vector<std::uint64_t> seen_;  // last value delivered per notification id
  std::function<void(int)> on_bye_;
  bool stopped_ = false;
  PortClaim port_claim_;  // rank 0's claim on the ports it chose for the job, held while GPI-2 runs
};

class Gpi2Link final : public Link {
 public:
  Gpi2Link(Gpi2Wire& wire, int peer) : wire_(wire), peer_(peer) {}
  void write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                    std::uint64_t value) override {
    wire_.write_notify(peer_, offset, pieces, count, note, value);
  }
  const char* kind() const override { return "gpi2"; }

 private:
  Gpi2Wire& wire_;
  int peer_;
};

}  // namespace tnt
