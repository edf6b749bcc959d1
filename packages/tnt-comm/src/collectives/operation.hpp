// Base of every collective: a resumable state machine the engine advances without blocking, plus
// the completion state a Work handle waits on.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/channel.hpp"
#include "collectives/descriptor.hpp"
#include "tnt_comm/timeline.hpp"
#include "transport/fabric.hpp"

namespace tnt {

// The members of the group an operation runs over, with channels by group index.
struct Members {
  Fabric* fabric = nullptr;
  std::vector<Channel*> channels;  // by group index; nullptr for ourselves
  std::vector<int> world_ranks;
  int me = 0;
  // Group indices by host (members that reach each other over shared memory), hosts in the order
  // of their first member; filled for groups, not for the subsets an algorithm makes.
  std::vector<std::vector<int>> hosts;
  bool host_aware = false;  // allreduce uses the host-aware algorithm when it fits (TNT_ALLREDUCE)
  bool via_leaders = false;  // small allreduces go through one leader per host (TNT_ALLREDUCE)
  bool shared_arenas = false;  // every member maps every other's arena: the single-copy path is open
  int size() const { return static_cast<int>(world_ranks.size()); }
  std::size_t payload_bytes() const { return fabric->payload_bytes(); }
};

// The messages an operation sends to one peer: a reserved range on the channel.
class SendStream {
 public:
  void open(Channel* channel, std::uint64_t key, std::uint64_t count) {
    channel_ = channel;
    key_ = key;
    count_ = count;
    base_ = channel->reserve_send(key, count);
  }
  bool ready() const { return next_ < count_ && channel_->can_send(key_, base_ + next_); }
  bool finished() const { return next_ == count_; }
  std::uint64_t sent() const { return next_; }
  void send(const Descriptor& desc, std::uint32_t tag, const void* data, std::size_t bytes) {
    MessageHeader header{desc, tag, static_cast<std::uint32_t>(bytes)};
    channel_->send(key_, header, data);
    ++next_;
  }

 private:
  Channel* channel_ = nullptr;
  std::uint64_t key_ = 0, base_ = 0, count_ = 0, next_ = 0;
};

// The messages an operation receives from one peer. Messages are examined in order; each is
// consumed once the operation no longer needs its payload.
class RecvStream {
 public:
  void open(Channel* channel, std::uint64_t key, std::uint64_t count, int peer_world_rank,
            int my_world_rank) {
    channel_ = channel;
    key_ = key;
    count_ = count;
    base_ = channel->reserve_recv(key, count);
    peer_ = peer_world_rank;
    me_ = my_world_rank;
  }
  // The next unexamined message if it has arrived (checked against `expect`), else nullptr.
  const MessageHeader* next(const Descriptor& expect, std::uint64_t* index);
  const std::byte* payload(const MessageHeader* header) const {
    return reinterpret_cast<const std::byte*>(header) + 64;
  }
  // The payload of message `index`, examined earlier and not consumed yet. An operation that keeps
  // a message across progress() calls looks it up again here: the engine may have moved it out of
  // its slot in between (Channel::relieve), so a pointer from next() is good only until it returns.
  const std::byte* payload_at(std::uint64_t index) const { return payload(channel_->peek(key_, base_ + index)); }
  void consume(std::uint64_t index) {
    channel_->consume(key_, base_ + index);
    ++consumed_;
  }
  bool finished() const { return consumed_ == count_; }
  bool all_examined() const { return examined_ == count_; }
  void claim() {
    if (channel_ != nullptr) channel_->claim(key_, base_ + count_);
  }
  int peer() const { return peer_; }

 private:
  Channel* channel_ = nullptr;
  std::uint64_t key_ = 0, base_ = 0, count_ = 0, examined_ = 0, consumed_ = 0;
  int peer_ = -1, me_ = -1;
};

class Operation {
 public:
  enum class Progress { idle, advanced, done };

  Operation(std::shared_ptr<const Members> members, Descriptor desc)
      : members_(std::move(members)),
        desc_(desc),
        sends_(static_cast<std::size_t>(members_->size())),
        recvs_(static_cast<std::size_t>(members_->size())) {}
  virtual ~Operation() = default;
  Operation(const Operation&) = delete;
  Operation& operator=(const Operation&) = delete;

  // Claims the operation's message ranges on its channels; called in submission order.
  virtual void reserve() = 0;
  // Advances as far as possible without waiting; throws on a protocol error.
  virtual Progress progress() = 0;
  // Which ranks the operation still waits for (for timeout messages), as text and as world ranks.
  std::string waiting_for() const;
  virtual std::vector<int> waiting_ranks() const { return peers_unfinished(false); }
  // World ranks that still have to send us a message of this operation or take one from us
  // (messages that arrived but wait for others to be used do not count).
  virtual std::vector<int> needs_more_from() const { return peers_unfinished(true); }

  const Descriptor& descriptor() const { return desc_; }
  // Whether a caller is blocked in this very call (set at submission).
  bool blocking() const { return blocking_; }
  void set_blocking(bool blocking) { blocking_ = blocking; }
  // Tells each channel which of its arriving messages this operation will take (driver side, at
  // the moment the engine takes the operation in, in submission order).
  virtual void claim_receives() {
    for (auto& r : recvs_) r.claim();
  }

  void finish(std::exception_ptr error);
  // The timeline (engine/timeline.hpp): when the operation was submitted and taken in; an operation
  // submitted while the timeline was on is recorded when it finishes.
  void mark_submitted(std::int64_t ns) { submitted_ns_ = ns; }
  void mark_started(std::int64_t ns) {
    if (submitted_ns_ != 0) started_ns_ = ns;
  }
  // What the timeline calls it: for an operation a caller submitted, its algorithm ("direct", ...);
  // for a phase of one, the part it plays ("ring across hosts", ...). A string literal.
  void set_label(const char* label) { label_ = label; }
  const char* label() const { return label_; }
  bool completed() const { return done_.load(std::memory_order_acquire); }
  // Waits on the completion (another thread drives); false if `seconds` passed first.
  bool wait_completion(double seconds);
  std::exception_ptr error() const;
  void set_callback(std::function<void(std::exception_ptr)> callback) { callback_ = std::move(callback); }

 protected:
  // The timeline: from now on the operation runs its phase `name` (a string literal); recorded only
  // for an operation submitted while the timeline was on.
  void enter_phase(const char* name) {
    if (submitted_ns_ != 0) phase_marks_.emplace_back(name, timeline::now_ns());
  }

  // Chunking: how many messages `bytes` of payload take (at least one, so empty operations still
  // synchronise), and the bytes of chunk `i`.
  std::uint64_t chunks(std::size_t bytes) const {
    std::size_t p = members_->payload_bytes();
    return bytes == 0 ? 1 : (bytes + p - 1) / p;
  }
  std::size_t chunk_bytes(std::size_t bytes, std::uint64_t i) const {
    std::size_t p = members_->payload_bytes();
    std::size_t start = static_cast<std::size_t>(i) * p;
    return start >= bytes ? 0 : std::min(p, bytes - start);
  }

  // Opens the streams to and from group member `m`, by default on the stream of the operation's
  // group (its descriptor's key).
  void open(int m, std::uint64_t send_count, std::uint64_t recv_count) {
    open(m, send_count, desc_.group, recv_count, desc_.group);
  }
  void open(int m, std::uint64_t send_count, std::uint64_t send_key, std::uint64_t recv_count,
            std::uint64_t recv_key) {
    Channel* ch = members_->channels[static_cast<std::size_t>(m)];
    sends_[static_cast<std::size_t>(m)].open(ch, send_key, send_count);
    recvs_[static_cast<std::size_t>(m)].open(ch, recv_key, recv_count,
                                             members_->world_ranks[static_cast<std::size_t>(m)],
                                             members_->world_ranks[static_cast<std::size_t>(members_->me)]);
  }
  bool streams_finished() const;
  // Members whose streams with us are unfinished; with `count_arrived`, a receive whose messages
  // all arrived counts as finished.
  std::vector<int> peers_unfinished(bool count_arrived) const;

  std::shared_ptr<const Members> members_;  // shared by every operation of the group
  Descriptor desc_;
  std::vector<SendStream> sends_;  // by group index
  std::vector<RecvStream> recvs_;

 private:
  bool blocking_ = false;
  std::int64_t submitted_ns_ = 0, started_ns_ = 0;
  const char* label_ = "";
  std::vector<std::pair<const char*, std::int64_t>> phase_marks_;
  std::atomic<bool> done_{false};
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::exception_ptr error_;
  std::function<void(std::exception_ptr)> callback_;
};

}  // namespace tnt
