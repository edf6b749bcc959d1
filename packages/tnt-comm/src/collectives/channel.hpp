// An ordered message stream to and from one peer, built on the link's write+notify: messages go
// into a ring of slots in the receiver's segment; the receiver acknowledges consumed messages so
// the sender may reuse their slots. Operations reserve a range of message indices on a channel when
// they are submitted, so operations use each channel in submission order.
#pragma once

#include <cstdint>
#include <vector>

#include "collectives/descriptor.hpp"
#include "transport/link.hpp"
#include "transport/segment.hpp"

namespace tnt {

class Channel {
 public:
  Channel(int me, int peer, Link* link, const SegmentView& mine);

  int peer() const { return peer_; }
  // Reservations happen at submission, in submission order (under the engine's submit lock).
  std::uint64_t reserve_send(std::uint64_t count);
  std::uint64_t reserve_recv(std::uint64_t count);

  // Whether message `index` is next to go out and a slot is free for it.
  bool can_send(std::uint64_t index) const {
    return index == sent_ &&
           sent_ - acked_->load(std::memory_order_acquire) < static_cast<std::uint64_t>(slots_);
  }
  void send(const MessageHeader& header, const void* payload);

  // The header of message `index` if it has arrived, else nullptr. Its payload follows it.
  const MessageHeader* peek(std::uint64_t index) const {
    if (index >= arrived_->load(std::memory_order_acquire)) return nullptr;
    return reinterpret_cast<const MessageHeader*>(mine_.base + mine_.layout.slot_offset(peer_, index));
  }
  // Frees the slot of message `index` (messages may be consumed out of order within the window).
  void consume(std::uint64_t index);

 private:
  int me_;
  int peer_;
  int slots_;
  Link* link_;
  SegmentView mine_;
  const std::atomic<std::uint64_t>* acked_;    // our messages the peer consumed
  const std::atomic<std::uint64_t>* arrived_;  // the peer's messages in our slots
  std::uint64_t send_reserved_ = 0;
  std::uint64_t recv_reserved_ = 0;
  std::uint64_t sent_ = 0;
  std::uint64_t consumed_ = 0;  // every message below this one is consumed
  std::vector<bool> done_;      // consumed flags of the window after `consumed_`
};

}  // namespace tnt
