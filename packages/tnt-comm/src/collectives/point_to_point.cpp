// Send and receive: the sender streams its buffer in chunks on the pair's data stream; once the
// receiver has taken every chunk it acknowledges on the pair's control stream, and only then does
// the send complete. So both sides see the other's call before returning: a recv of another size
// or dtype raises CollectiveMismatch in this call on both ranks, instead of one call later. Two
// ranks blocked in send to each other can never complete (nobody receives): a blocked send that
// finds the peer's blocked send waiting for it raises at once, on both ranks.
#include <cstring>

#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

// Control messages (acknowledgements) travel on their own stream, so they never queue behind the
// data of a later send in the other direction (isend/irecv pairs posted in either order).
constexpr std::uint64_t kControlSalt = 0x632be59bd9b4e019ull;
// Set in the tag of data sent by a blocking send: its caller waits for this very message.
constexpr std::uint32_t kBlockedSender = tags::kSecondKind;

class Send final : public Operation {
 public:
  Send(std::shared_ptr<const Members> m, Descriptor d, const void* buf, std::size_t bytes, int peer)
      : Operation(std::move(m), d), buf_(static_cast<const std::byte*>(buf)), bytes_(bytes), peer_(peer) {
    ack_desc_ = desc_;
    ack_desc_.group ^= kControlSalt;
  }

  void reserve() override { open(peer_, chunks(bytes_), desc_.group, 1, ack_desc_.group); }

  Progress progress() override {
    bool advanced = false;
    const auto p = static_cast<std::size_t>(peer_);
    SendStream& s = sends_[p];
    while (s.ready()) {
      const std::uint64_t c = s.sent();
      s.send(desc_, static_cast<std::uint32_t>(c) | (blocking() ? kBlockedSender : 0),
             buf_ + c * members_->payload_bytes(), chunk_bytes(bytes_, c));
      advanced = true;
    }
    advanced |= take_ack();
    if (streams_finished()) return Progress::done;
    if (!advanced && blocking()) check_not_crossed();
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  bool take_ack() {
    std::uint64_t index;
    RecvStream& acks = recvs_[static_cast<std::size_t>(peer_)];
    if (acks.next(ack_desc_, &index) == nullptr) return false;
    acks.consume(index);
    return true;
  }

  // Throws if the peer is blocked in a send to us that no recv of ours will take.
  void check_not_crossed() {
    Channel* channel = members_->channels[static_cast<std::size_t>(peer_)];
    const MessageHeader* theirs = channel->first_unclaimed(desc_.group);
    if (theirs == nullptr || (theirs->tag & kBlockedSender) == 0) return;
    // A peer that took our data acked it before its next send, and a channel delivers in order: if
    // that send landed after we last looked for the ack, the ack is here now. Not crossed: the next
    // progress() finds the send done.
    if (take_ack()) return;
    const int me = members_->world_ranks[static_cast<std::size_t>(members_->me)];
    const int peer = members_->world_ranks[static_cast<std::size_t>(peer_)];
    throw CollectiveMismatch("collective mismatch: rank " + std::to_string(me) + " called send to rank " +
                             std::to_string(peer) + " while rank " + std::to_string(peer) +
                             " called send to rank " + std::to_string(me) +
                             ", and neither posted a recv: both would wait forever (post one "
                             "side's recv first, or use isend/irecv)",
                             desc_.detail({peer}));
  }

  const std::byte* buf_;
  std::size_t bytes_;
  int peer_;
  Descriptor ack_desc_;
};

class Recv final : public Operation {
 public:
  Recv(std::shared_ptr<const Members> m, Descriptor d, void* buf, std::size_t bytes, int peer)
      : Operation(std::move(m), d), buf_(static_cast<std::byte*>(buf)), bytes_(bytes), peer_(peer) {
    ack_desc_ = desc_;
    ack_desc_.group ^= kControlSalt;
  }

  void reserve() override { open(peer_, 1, ack_desc_.group, chunks(bytes_), desc_.group); }

  Progress progress() override {
    bool advanced = false;
    const auto p = static_cast<std::size_t>(peer_);
    RecvStream& r = recvs_[p];
    std::uint64_t index;
    while (const MessageHeader* h = r.next(desc_, &index)) {
      const std::size_t chunk = h->tag & tags::kChunkMask;
      if (h->bytes > 0) std::memcpy(buf_ + chunk * members_->payload_bytes(), r.payload(h), h->bytes);
      r.consume(index);
      advanced = true;
    }
    if (r.finished() && sends_[p].ready()) {
      sends_[p].send(ack_desc_, 0, nullptr, 0);
      advanced = true;
    }
    if (streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  std::byte* buf_;
  std::size_t bytes_;
  int peer_;
  Descriptor ack_desc_;
};

}  // namespace

std::shared_ptr<Operation> make_send(std::shared_ptr<const Members> members, Descriptor desc, const void* buf,
                                     std::size_t bytes, int peer) {
  return std::make_shared<Send>(std::move(members), desc, buf, bytes, peer);
}

std::shared_ptr<Operation> make_recv(std::shared_ptr<const Members> members, Descriptor desc, void* buf, std::size_t bytes,
                                     int peer) {
  return std::make_shared<Recv>(std::move(members), desc, buf, bytes, peer);
}

}  // namespace tnt
