// A job's running parts on this rank, as Runtime::init assembles them: the identity, the fabric to
// every peer, one channel per peer and the progress engine. Groups and Work handles hold it through
// weak references, so that after finalize() their calls throw instead of touching freed state; the
// runtime (runtime.hpp) owns it, with the groups and the process-wide state around it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "tnt_comm/identity.hpp"

namespace tnt {

class Fabric;
class Engine;
class Channel;

class Job {
 public:
  // Meets the other ranks and connects to every one of them (a single rank: none), within the
  // identity's start timeout; `gone` (Rendezvous::Gone) names ranks known to have ended meanwhile.
  explicit Job(const Identity& identity, std::function<std::vector<int>()> gone = {});
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  const Identity& identity() const { return identity_; }
  int rank() const { return identity_.rank; }
  int size() const { return identity_.size; }
  Fabric& fabric() { return *fabric_; }
  Engine& engine() { return *engine_; }
  Channel* channel(int world_rank) { return channels_[static_cast<std::size_t>(world_rank)].get(); }
  // The identity of the next group of these ranks (hashed): groups of the same ranks are told apart
  // by the order they are created in, which must be the same on every member.
  std::uint64_t next_group_id(std::uint64_t ranks_hash);
  // Waits until every peer has consumed the messages this rank sent it, or has said goodbye.
  void settle();

 private:
  Identity identity_;
  std::unique_ptr<Fabric> fabric_;
  std::vector<std::unique_ptr<Channel>> channels_;
  std::unique_ptr<Engine> engine_;
  std::mutex groups_mutex_;
  std::map<std::uint64_t, std::uint64_t> groups_made_;  // by hash of the rank list
};

}  // namespace tnt
