#include "collectives/channel.hpp"

#include <sstream>

#include "tnt_comm/types.hpp"

namespace tnt {

std::string Descriptor::describe() const {
  static const char* kinds[] = {"?",          "allreduce", "broadcast", "allgather", "allgatherv",
                                "reduce_scatter", "barrier", "send/recv"};
  auto k = static_cast<std::uint32_t>(kind);
  std::ostringstream out;
  out << (k < 8 ? kinds[k] : "?") << "(";
  if (kind != Kind::barrier) {
    out << (is_valid(static_cast<DType>(dtype)) ? dtype_name(static_cast<DType>(dtype)) : "?");
    if (kind == Kind::allreduce || kind == Kind::reduce_scatter) {
      out << ", " << (is_valid(static_cast<ReduceOp>(op)) ? op_name(static_cast<ReduceOp>(op)) : "?");
    }
    if (kind == Kind::broadcast) out << ", root=" << root;
    out << ", count=" << count;
  }
  out << "), call #" << seq << " of group 0x" << std::hex << group;
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

std::uint64_t Channel::reserve_send(std::uint64_t count) {
  std::uint64_t base = send_reserved_;
  send_reserved_ += count;
  return base;
}

std::uint64_t Channel::reserve_recv(std::uint64_t count) {
  std::uint64_t base = recv_reserved_;
  recv_reserved_ += count;
  return base;
}

void Channel::send(const MessageHeader& header, const void* payload) {
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
}

void Channel::consume(std::uint64_t index) {
  done_[index % static_cast<std::uint64_t>(slots_)] = true;
  std::uint64_t before = consumed_;
  while (done_[consumed_ % static_cast<std::uint64_t>(slots_)]) {
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

}  // namespace tnt
