// Send and receive: a chunked stream between two members.
#include <cstring>

#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

class Send final : public Operation {
 public:
  Send(std::shared_ptr<const Members> m, Descriptor d, const void* buf, std::size_t bytes, int peer)
      : Operation(std::move(m), d), buf_(static_cast<const std::byte*>(buf)), bytes_(bytes), peer_(peer) {}

  void reserve() override { open(peer_, chunks(bytes_), 0); }

  Progress progress() override {
    bool advanced = false;
    SendStream& s = sends_[static_cast<std::size_t>(peer_)];
    while (s.ready()) {
      const std::uint64_t c = s.sent();
      s.send(desc_, static_cast<std::uint32_t>(c), buf_ + c * members_->payload_bytes(),
             chunk_bytes(bytes_, c));
      advanced = true;
    }
    if (s.finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  const std::byte* buf_;
  std::size_t bytes_;
  int peer_;
};

class Recv final : public Operation {
 public:
  Recv(std::shared_ptr<const Members> m, Descriptor d, void* buf, std::size_t bytes, int peer)
      : Operation(std::move(m), d), buf_(static_cast<std::byte*>(buf)), bytes_(bytes), peer_(peer) {}

  void reserve() override { open(peer_, 0, chunks(bytes_)); }

  Progress progress() override {
    bool advanced = false;
    RecvStream& r = recvs_[static_cast<std::size_t>(peer_)];
    std::uint64_t index;
    while (const MessageHeader* h = r.next(desc_, &index)) {
      if (h->bytes > 0) std::memcpy(buf_ + static_cast<std::size_t>(h->tag) * members_->payload_bytes(), r.payload(h),
                  h->bytes);
      r.consume(index);
      advanced = true;
    }
    if (r.finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  std::byte* buf_;
  std::size_t bytes_;
  int peer_;
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
