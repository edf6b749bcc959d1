// Broadcast: the root streams its buffer in chunks to every other member; each member
// acknowledges once it has every chunk, and when all have, the root tells them the broadcast is
// complete. A member returns only after that, so every rank's call returns only when all ranks
// called the same broadcast: another root, count or dtype on any rank raises CollectiveMismatch
// in this call on every rank, not in the next one. Data flows at once (no handshake before it).
#include <cstring>

#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

class Broadcast final : public Operation {
 public:
  Broadcast(std::shared_ptr<const Members> m, Descriptor d, void* buf, std::size_t bytes, int root)
      : Operation(std::move(m), d), buf_(static_cast<std::byte*>(buf)), bytes_(bytes), root_(root) {}

  void reserve() override {
    chunks_ = chunks(bytes_);
    if (members_->me == root_) {
      for (int p = 0; p < members_->size(); ++p) {
        if (p != root_) open(p, chunks_ + 1, 1);
      }
    } else {
      open(root_, 1, chunks_ + 1);
    }
  }

  Progress progress() override {
    bool advanced = members_->me == root_ ? progress_root() : progress_member();
    if (streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  bool progress_root() {
    bool advanced = false;
    const std::size_t p_bytes = members_->payload_bytes();
    for (std::size_t p = 0; p < sends_.size(); ++p) {
      if (static_cast<int>(p) == root_) continue;
      SendStream& s = sends_[p];
      while (s.ready() && s.sent() < chunks_) {
        const std::uint64_t c = s.sent();
        s.send(desc_, static_cast<std::uint32_t>(c), buf_ + c * p_bytes, chunk_bytes(bytes_, c));
        advanced = true;
      }
      std::uint64_t index;
      if (recvs_[p].next(desc_, &index) != nullptr) {
        recvs_[p].consume(index);
        ++acks_;
        advanced = true;
      }
    }
    if (acks_ == members_->size() - 1) {
      for (std::size_t p = 0; p < sends_.size(); ++p) {
        if (static_cast<int>(p) != root_ && sends_[p].ready()) {
          sends_[p].send(desc_, tags::kComplete, nullptr, 0);
          advanced = true;
        }
      }
    }
    return advanced;
  }

  bool progress_member() {
    bool advanced = false;
    const auto root = static_cast<std::size_t>(root_);
    RecvStream& r = recvs_[root];
    std::uint64_t index;
    while (const MessageHeader* h = r.next(desc_, &index)) {
      if (h->tag < chunks_ && h->bytes > 0) {
        std::memcpy(buf_ + static_cast<std::size_t>(h->tag) * members_->payload_bytes(), r.payload(h), h->bytes);
      }
      if (h->tag < chunks_) ++received_;
      r.consume(index);
      advanced = true;
    }
    if (received_ == chunks_ && sends_[root].ready()) {
      sends_[root].send(desc_, tags::kAck, nullptr, 0);
      advanced = true;
    }
    return advanced;
  }

  std::byte* buf_;
  std::size_t bytes_;
  int root_;
  std::uint64_t chunks_ = 0;
  int acks_ = 0;                // root: members that have every chunk
  std::uint64_t received_ = 0;  // member: chunks received
};

}  // namespace

std::shared_ptr<Operation> make_broadcast(std::shared_ptr<const Members> members, Descriptor desc, void* buf,
                                          std::size_t bytes, int root) {
  return std::make_shared<Broadcast>(std::move(members), desc, buf, bytes, root);
}

}  // namespace tnt
