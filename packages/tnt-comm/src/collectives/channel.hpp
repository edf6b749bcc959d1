// An ordered message stream to and from one peer, built on the link's write+notify: messages go
// into a ring of slots in the receiver's segment; the receiver acknowledges consumed messages so
// the sender may reuse their slots.
//
// A channel carries many independent streams, one per key (a group's collectives, its
// point-to-point data, its point-to-point control messages). Order is kept within a stream only:
// operations reserve message indices of their stream when they are submitted, the sender writes
// each stream's messages in that order, and the receiver sorts arrivals by the key in their header.
// So two threads that each drive their own group never depend on the order in which the other
// thread's operations were submitted, on this rank or on the peer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
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
  std::uint64_t reserve_send(std::uint64_t key, std::uint64_t count);
  std::uint64_t reserve_recv(std::uint64_t key, std::uint64_t count);

  // The rest is used by the driver only (under the engine's drive lock).
  // Whether message `index` of stream `key` is next to go out and a slot is free for it.
  bool can_send(std::uint64_t key, std::uint64_t index);
  void send(std::uint64_t key, const MessageHeader& header, const void* payload);

  // The header of message `index` of stream `key` if it has arrived, else nullptr. Its payload
  // follows it.
  const MessageHeader* peek(std::uint64_t key, std::uint64_t index);
  // Frees the slot of that message (messages may be consumed out of order within the window).
  void consume(std::uint64_t key, std::uint64_t index);
  // When every slot the peer writes into holds a message not consumed yet, so that the peer can
  // send nothing more, copies those messages into memory of this rank's own and frees their
  // slots. Without this, operations of different groups that share this pair of ranks could wait
  // on each other: one group's messages that cannot be used yet would hold back the slots another
  // group's messages need. peek() then finds them where they went; a pointer it returned earlier
  // no longer points to them (operations keep indices).
  void relieve();
  // Messages written to the peer that it has not consumed yet (read once the engine is drained).
  std::uint64_t unconsumed() const { return sent_ - acked_->load(std::memory_order_acquire); }
  // Operations taken in by the engine will read stream `key` up to message `end`.
  void claim(std::uint64_t key, std::uint64_t end);
  // The first arrived message of stream `key` that no operation taken in will read, else nullptr.
  const MessageHeader* first_unclaimed(std::uint64_t key);

 private:
  struct Reserved {
    std::uint64_t key = 0, send = 0, recv = 0;
  };
  struct Stream {
    std::uint64_t key = 0;
    std::uint64_t sent = 0;               // messages of this stream written to the peer
    std::uint64_t claimed = 0;            // messages the engine's operations will read
    std::uint64_t first = 0;              // stream index of arrived.front()
    std::deque<std::uint64_t> arrived;    // channel indices of this stream's unconsumed arrivals
    std::deque<bool> consumed;            // in step with `arrived`
  };
  Reserved& reserved(std::uint64_t key);
  Stream& stream(std::uint64_t key);
  void sort_arrivals();
  const MessageHeader* header_at(std::uint64_t channel_index) const {
    if (!relieved_.empty()) {
      auto it = relieved_.find(channel_index);
      if (it != relieved_.end()) return reinterpret_cast<const MessageHeader*>(it->second.data());
    }
    return reinterpret_cast<const MessageHeader*>(mine_.base + mine_.layout.slot_offset(peer_, channel_index));
  }
  // Advances `consumed_` over the freed slots and tells the peer.
  void release();
  // Whether the peer can send us nothing more until a message is consumed or relieved.
  bool window_full();

  int me_;
  int peer_;
  int slots_;
  Link* link_;
  SegmentView mine_;
  const std::atomic<std::uint64_t>* acked_;    // our messages the peer consumed
  const std::atomic<std::uint64_t>* arrived_;  // the peer's messages in our slots
  std::vector<Reserved> reserved_;             // submit side
  std::vector<Stream> streams_;                // driver side
  std::size_t last_stream_ = 0;                // lookup cache: streams alternate rarely
  std::uint64_t sent_ = 0;                     // messages written to the peer, all streams
  std::uint64_t sorted_ = 0;                   // arrivals already filed under their stream
  std::uint64_t consumed_ = 0;                 // every message below this one is consumed
  std::vector<bool> done_;                     // freed flags of the window after `consumed_`
  // Messages moved out of their slots by relieve(), by channel index: header line, then payload.
  std::unordered_map<std::uint64_t, std::vector<std::byte>> relieved_;
};

}  // namespace tnt
