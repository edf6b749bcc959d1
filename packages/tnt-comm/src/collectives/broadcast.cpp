// Broadcast: the root streams its buffer in chunks to every other member.
#include <cstring>

#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

class Broadcast final : public Operation {
 public:
  Broadcast(std::shared_ptr<const Members> m, Descriptor d, void* buf, std::size_t bytes, int root)
      : Operation(std::move(m), d), buf_(static_cast<std::byte*>(buf)), bytes_(bytes), root_(root) {}

  void reserve() override {
    const std::uint64_t n = chunks(bytes_);
    if (members_->me == root_) {
      for (int p = 0; p < members_->size(); ++p) {
        if (p != root_) open(p, n, 0);
      }
    } else {
      open(root_, 0, n);
    }
  }

  Progress progress() override {
    bool advanced = false;
    const std::size_t p_bytes = members_->payload_bytes();
    if (members_->me == root_) {
      for (auto& s : sends_) {
        while (s.ready()) {
          const std::uint64_t c = s.sent();
          s.send(desc_, static_cast<std::uint32_t>(c), buf_ + c * p_bytes, chunk_bytes(bytes_, c));
          advanced = true;
        }
      }
    } else {
      RecvStream& r = recvs_[static_cast<std::size_t>(root_)];
      std::uint64_t index;
      while (const MessageHeader* h = r.next(desc_, &index)) {
        if (h->bytes > 0) std::memcpy(buf_ + static_cast<std::size_t>(h->tag) * p_bytes, r.payload(h), h->bytes);
        r.consume(index);
        advanced = true;
      }
    }
    if (streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  std::byte* buf_;
  std::size_t bytes_;
  int root_;
};

}  // namespace

std::shared_ptr<Operation> make_broadcast(std::shared_ptr<const Members> members, Descriptor desc, void* buf,
                                          std::size_t bytes, int root) {
  return std::make_shared<Broadcast>(std::move(members), desc, buf, bytes, root);
}

}  // namespace tnt
