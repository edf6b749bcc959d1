#include "collectives/channel.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "tnt_comm/types.hpp"

namespace tnt {

const char* Descriptor::kind_name() const {
  static const char* kinds[] = {"?",          "allreduce", "broadcast", "allgather", "allgatherv",
                                "reduce_scatter", "barrier", "send/recv"};
  auto k = static_cast<std::uint32_t>(kind);
  return k < 8 ? kinds[k] : "?";
}

std::string Descriptor::describe() const {
  std::ostringstream out;
  out << kind_name() << "(";
  if (kind != Kind::barrier) {
    out << (is_valid(static_cast<DType>(dtype)) ? dtype_name(static_cast<DType>(dtype)) : "?");
    if (kind == Kind::allreduce || kind == Kind::reduce_scatter) {
      out << ", " << (is_valid(static_cast<ReduceOp>(op)) ? op_name(static_cast<ReduceOp>(op)) : "?");
    }
    if (kind == Kind::broadcast) out << ", root=" << root;
    out << ", count=" << count;
    if (shared != 0) out << ", shared buffers";
    if (kind == Kind::p2p) out << ", sent by group rank " << root;
  }
  if (kind == Kind::p2p) {
    out << "), message #" << seq << " between these two ranks";
  } else {
    out << "), call #" << seq << " of group 0x" << std::hex << group;
  }
  return out.str();
}

Channel::Channel(int me, int peer, Link* link, const SegmentView& mine)
    : me_(me),
      peer_(peer),
      slots_(mine.layout.slots),
      link_(link),
      mine_(mine),
      acked_(mine.note(SegmentLayout::acked(peer))),
      arrived_(mine.note(SegmentLayout::arrived(peer))),
      done_(static_cast<std::size_t>(mine.layout.slots), false) {}

Channel::Reserved& Channel::reserved(std::uint64_t key) {
  for (auto& r : reserved_) {
    if (r.key == key) return r;
  }
  Reserved fresh;
  fresh.key = key;
  reserved_.push_back(fresh);
  return reserved_.back();
}

Channel::Stream& Channel::stream(std::uint64_t key) {
  if (last_stream_ < streams_.size() && streams_[last_stream_].key == key) return streams_[last_stream_];
  for (std::size_t i = 0; i < streams_.size(); ++i) {
    if (streams_[i].key == key) {
      last_stream_ = i;
      return streams_[i];
    }
  }
  Stream fresh;
  fresh.key = key;
  streams_.push_back(std::move(fresh));
  last_stream_ = streams_.size() - 1;
  return streams_.back();
}

std::uint64_t Channel::reserve_send(std::uint64_t key, std::uint64_t count) {
  Reserved& r = reserved(key);
  std::uint64_t base = r.send;
  r.send += count;
  return base;
}

std::uint64_t Channel::reserve_recv(std::uint64_t key, std::uint64_t count) {
  Reserved& r = reserved(key);
  std::uint64_t base = r.recv;
  r.recv += count;
  return base;
}

bool Channel::can_send(std::uint64_t key, std::uint64_t index) {
  return sent_ - acked_->load(std::memory_order_acquire) < static_cast<std::uint64_t>(slots_) &&
         stream(key).sent == index;
}

void Channel::send(std::uint64_t key, const MessageHeader& header, const void* payload) {
  Piece pieces[2] = {{&header, sizeof header}, {payload, header.bytes}};
  // The payload starts a full header line after the slot start, keeping it 64-byte aligned.
  std::size_t offset = mine_.layout.slot_offset(me_, sent_);
  if (header.bytes == 0) {
    link_->write_notify(offset, pieces, 1, SegmentLayout::arrived(me_), sent_ + 1);
  } else {
    static const char pad[64] = {};
    Piece padded[3] = {pieces[0], {pad, 64 - sizeof header}, pieces[1]};
    link_->write_notify(offset, padded, 3, SegmentLayout::arrived(me_), sent_ + 1);
  }
  ++sent_;
  ++stream(key).sent;
}

void Channel::sort_arrivals() {
  const std::uint64_t arrived = arrived_->load(std::memory_order_acquire);
  for (; sorted_ < arrived; ++sorted_) {
    Stream& s = stream(header_at(sorted_)->desc.group);
    s.arrived.push_back(sorted_);
    s.consumed.push_back(false);
  }
}

const MessageHeader* Channel::peek(std::uint64_t key, std::uint64_t index) {
  sort_arrivals();
  Stream& s = stream(key);
  if (index < s.first || index - s.first >= s.arrived.size()) return nullptr;
  return header_at(s.arrived[static_cast<std::size_t>(index - s.first)]);
}

void Channel::claim(std::uint64_t key, std::uint64_t end) {
  Stream& s = stream(key);
  s.claimed = std::max(s.claimed, end);
}

const MessageHeader* Channel::first_unclaimed(std::uint64_t key) {
  sort_arrivals();
  Stream& s = stream(key);
  if (s.claimed < s.first || s.claimed - s.first >= s.arrived.size()) return nullptr;
  return header_at(s.arrived[static_cast<std::size_t>(s.claimed - s.first)]);
}

void Channel::consume(std::uint64_t key, std::uint64_t index) {
  Stream& s = stream(key);
  const auto at = static_cast<std::size_t>(index - s.first);
  const std::uint64_t channel_index = s.arrived[at];
  s.consumed[at] = true;
  while (!s.consumed.empty() && s.consumed.front()) {
    s.arrived.pop_front();
    s.consumed.pop_front();
    ++s.first;
  }
  if (!relieved_.empty() && relieved_.erase(channel_index) != 0) return;  // its slot was freed then
  done_[channel_index % static_cast<std::uint64_t>(slots_)] = true;
  release();
}

void Channel::release() {
  const std::uint64_t before = consumed_;
  while (consumed_ < sorted_ && done_[consumed_ % static_cast<std::uint64_t>(slots_)]) {
    done_[consumed_ % static_cast<std::uint64_t>(slots_)] = false;
    ++consumed_;
  }
  if (consumed_ != before) {
    try {
      link_->write_notify(0, nullptr, 0, SegmentLayout::acked(me_), consumed_);
    } catch (const Error&) {
      // The peer is gone; the receiver thread reports it.
    }
  }
}

bool Channel::window_full() {
  sort_arrivals();
  return sorted_ - consumed_ >= static_cast<std::uint64_t>(slots_);
}

void Channel::relieve() {
  if (!window_full()) return;
  for (std::uint64_t i = consumed_; i < sorted_; ++i) {
    const auto slot = static_cast<std::size_t>(i % static_cast<std::uint64_t>(slots_));
    if (done_[slot]) continue;
    const MessageHeader* h = header_at(i);
    // The header's line, then the payload, as in the slot (a bare header has no payload line).
    const std::size_t bytes = h->bytes == 0 ? sizeof(MessageHeader) : 64 + static_cast<std::size_t>(h->bytes);
    std::vector<std::byte> copy(std::max<std::size_t>(bytes, 64));
    std::memcpy(copy.data(), h, bytes);
    relieved_.emplace(i, std::move(copy));
    done_[slot] = true;
  }
  release();
}

}  // namespace tnt
