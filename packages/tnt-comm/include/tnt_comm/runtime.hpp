// The one runtime of a process: its job (identity, links to every peer, progress engine: job.hpp),
// the world and the groups made over it. It is the only global mutable state of tnt-comm.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tnt_comm/group.hpp"
#include "tnt_comm/identity.hpp"

namespace tnt {

class Fabric;
class Engine;
class Channel;
class Job;

class Runtime {
 public:
  // Initialises the runtime from the environment on first call; later calls return it. After
  // finalize() it throws: a process runs one job, as with MPI_Init.
  static Runtime& init();
  static Runtime& init(const Identity& identity);
  // The runtime if initialised, else nullptr.
  static Runtime* get();
  // Waits for outstanding work, says goodbye to peers, waits until they have read what this rank
  // sent them (or have left too; at most the collective timeout) and tears everything down. Groups,
  // Work handles and FusedAllreduce objects kept beyond it raise Error instead of touching freed state.
  static void finalize();
  // For a rank about to exit because of an error of its own (an uncaught exception, described as
  // `error`, e.g. "ValueError: ..."): every peer's pending and later calls fail at once with a
  // PeerFailure that names this rank and quotes `error`, instead of waiting for it or taking its
  // exit for a goodbye. This rank's own later calls fail too; finalize() then says no goodbye.
  // Does nothing where the runtime does not run or has failed already.
  static void abandon(const std::string& error);
  // For an elastic job (TNT_ELASTIC=MIN, which tnt-launch --elastic sets) after it lost a rank (a
  // PeerFailure or Timeout): agrees with the other survivors on who is left, at the store the
  // launcher holds, tears this rank's part of the old job down and meets the others in a new
  // generation of it, with ranks 0..K-1 in the order of their old ranks. Every survivor must call
  // it. Groups, Work handles and FusedAllreduce objects of the old generation raise Error; the
  // world is new. Throws Error where this rank was left out (the others took it for lost),
  // PeerFailure where fewer than MIN ranks are left, InvalidArgument where the job is not elastic or
  // nothing failed, and Error for a failure that re-forming would not cure (a mismatch).
  static Runtime& shrink();
  // For an elastic job: admits the replacement processes (TNT_JOIN) that asked to join since the
  // last call, forming a new generation with them after the current ranks (their ranks unchanged).
  // Collective over the world, called at a point every rank reaches alike (tnt-keras: an epoch's
  // start): rank 0 looks at the store, one broadcast tells the others. Returns whether the world
  // changed; false at once in a job that is not elastic.
  static bool admit();

  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Identity& identity() const;
  int rank() const;
  int size() const;
  Group& world() { return *world_; }
  std::shared_ptr<Group> world_group() { return world_; }
  // A sub-group; every member must create it (creation itself does not communicate). Groups of
  // the same ranks are told apart by the order they are created in, which must be the same on
  // every member. Each group has its own ordered streams: one thread per group may run
  // collectives concurrently with other threads on other groups.
  std::shared_ptr<Group> new_group(std::vector<int> world_ranks);
  // The live group of this id (Group::id) that new_group made, the world for 0 or its own id;
  // null where no such group lives on this rank (the C ABI names groups by id).
  std::shared_ptr<Group> find_group(std::uint64_t id);
  // The generation of an elastic job (0 until the first shrink), and the member id of each world
  // rank: the rank it had in generation 0, kept for life.
  int generation() const;
  std::vector<int> members() const;
  // Transport used towards each world rank ("self", "shm" or "tcp").
  std::vector<std::string> transports() const;

  // A block of `bytes` in this rank's shared arena, which the ranks of its host map: allreduces
  // of buffers that lie there skip the staging copy of the single-copy path. Released when the
  // last copy of the pointer goes (it also keeps the arena mapped, beyond finalize()). Null where
  // the rank has no arena (no peer on its host, TNT_SINGLE_COPY=off, /dev/shm too small): use
  // ordinary memory then. Throws tnt::Error when the arena or /dev/shm is full.
  std::shared_ptr<void> allocate_shared(std::size_t bytes);

  // "auto" (host-aware across hosts where it fits) or "flat" (TNT_ALLREDUCE).
  const std::string& allreduce_algorithm() const;
  // The job's parts (job.hpp), for code inside tnt-comm and its tests.
  Fabric& fabric();
  Engine& engine();
  Channel* channel(int world_rank);

 private:
  Runtime(std::shared_ptr<Job> job, int generation, std::vector<int> members, std::string job_base);
  // Needs the global lock: creates the runtime unless it runs, refuses after finalize().
  static void start(const Identity& identity);
  // Needs the global lock: makes the runtime member `me` has in the elastic generation whose ids
  // and nodes are given (`base`: the identity it had, `job_base`: generation 0's job id); throws
  // where the generation left `me` out. `gone_ids` names members known to have ended meanwhile.
  static void meet(const Identity& base, const std::string& job_base, int generation, const std::vector<int>& ids,
                   const std::vector<int>& nodes, int me, std::function<std::vector<int>()> gone_ids = {});
  // This generation's members and their nodes, as the agreement takes them.
  std::vector<int> member_nodes();

  std::shared_ptr<Job> job_;  // groups and Work handles hold it weakly: finalize() drops it
  std::shared_ptr<Group> world_;
  int generation_ = 0;
  std::vector<int> members_;  // member id of each world rank
  std::string job_base_;      // generation 0's job id: the elastic store's keys live under it
  std::mutex groups_mutex_;
  std::map<std::uint64_t, std::weak_ptr<Group>> groups_by_id_;  // what new_group made
};

}  // namespace tnt
