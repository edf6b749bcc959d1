#include "job.hpp"

#include <sched.h>

#include <cstdio>
#include <thread>

#include "collectives/channel.hpp"
#include "engine/engine.hpp"
#include "rendezvous/rendezvous.hpp"
#include "transport/fabric.hpp"

namespace tnt {
namespace {

int cpus_available() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

}  // namespace

Job::Job(const Identity& identity, std::function<std::vector<int>()> gone) : identity_(identity) {
  if (identity_.size == 1) {
    fabric_ = std::make_unique<Fabric>(identity_);
  } else {
    try {
      const Deadline deadline = deadline_after(identity_.start_timeout_s);
      Rendezvous rendezvous(identity_, deadline, std::move(gone));
      fabric_ = std::make_unique<Fabric>(identity_, rendezvous.meet(), rendezvous, deadline);
      rendezvous.finish();
    } catch (const Timeout& e) {
      // Every timeout of the start says which limit it ran into, and how to raise it.
      throw Timeout(std::string(e.what()) + " (the start may take " + format_seconds(identity_.start_timeout_s) +
                        ": raise TNT_START_TIMEOUT_S, tnt-launch --start-timeout, if ranks start slowly)",
                    e.detail());
    }
  }
  channels_.resize(static_cast<std::size_t>(identity_.size));
  for (int r = 0; r < identity_.size; ++r) {
    if (r != identity_.rank) {
      channels_[static_cast<std::size_t>(r)] =
          std::make_unique<Channel>(identity_.rank, r, &fabric_->link(r), fabric_->segment());
    }
  }
  const bool oversubscribed = identity_.local_size > cpus_available();
  std::vector<Channel*> channels;
  for (const auto& c : channels_) channels.push_back(c.get());
  engine_ = std::make_unique<Engine>(*fabric_, std::move(channels), identity_.timeout_s, oversubscribed);
}

Job::~Job() {
  // Order matters: the engine stops driving before the links it drives go away.
  engine_.reset();
  fabric_->shutdown();
}

std::uint64_t Job::next_group_id(std::uint64_t ranks_hash) {
  std::lock_guard<std::mutex> lock(groups_mutex_);
  const std::uint64_t nth = groups_made_[ranks_hash]++;
  // The first group of a rank list keeps the plain hash; later ones mix in their number.
  return nth == 0 ? ranks_hash : ranks_hash ^ ((nth + 1) * 0xbf58476d1ce4e5b9ull);
}

// A collective completes on this rank once it has what it needs, which may be before its peers
// have what this rank sent them: over TCP or GPI-2 those bytes can still sit in this host's socket
// buffers. A process that exited then could lose them (a socket closed with unread data is reset,
// and the reset drops what was not yet transmitted), and a peer still in that collective would
// wait for data that never comes. So this rank leaves once every peer has consumed its messages
// (acknowledgements are sent as messages are consumed) or has said goodbye itself, having then
// consumed all it ever will.
void Job::settle() {
  const Deadline until = deadline_after(identity_.timeout_s);
  Doorbell bell = fabric_->doorbell();
  while (!fabric_->failed()) {
    const std::uint32_t seen = bell.value();
    std::string waiting;
    for (int r = 0; r < identity_.size; ++r) {
      const Channel* c = channels_[static_cast<std::size_t>(r)].get();
      if (c != nullptr && c->unconsumed() > 0 && !fabric_->heard_goodbye(r)) {
        waiting += (waiting.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (waiting.empty()) return;
    if (Clock::now() >= until) {
      std::fprintf(stderr,
                   "tnt_comm: rank %d leaves after waiting %s (the collective timeout) for rank(s) %s to "
                   "read the last messages it sent them; they may report it as failed\n",
                   identity_.rank, format_seconds(identity_.timeout_s).c_str(), waiting.c_str());
      return;
    }
    // Acknowledgements ring the doorbell; a goodbye heard over TCP may not, hence the bound.
    bell.sleep(seen, std::min(0.01, std::max(0.0, seconds_left(until))));
  }
}

}  // namespace tnt
