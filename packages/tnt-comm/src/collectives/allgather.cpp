// Allgather(v): every member streams its block to every other member.
#include <cstring>
#include <numeric>

#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

class Allgatherv final : public Operation {
 public:
  Allgatherv(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out, std::vector<std::size_t> bytes)
      : Operation(std::move(m), d),
        in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        bytes_(std::move(bytes)),
        offsets_(bytes_.size() + 1, 0) {
    std::partial_sum(bytes_.begin(), bytes_.end(), offsets_.begin() + 1);
  }

  void reserve() override {
    const std::uint64_t mine = chunks(bytes_[static_cast<std::size_t>(members_->me)]);
    for (int p = 0; p < members_->size(); ++p) {
      if (p != members_->me) open(p, mine, chunks(bytes_[static_cast<std::size_t>(p)]));
    }
  }

  Progress progress() override {
    bool advanced = false;
    const auto me = static_cast<std::size_t>(members_->me);
    const std::size_t p_bytes = members_->payload_bytes();
    if (!copied_) {
      std::byte* dst = out_ + offsets_[me];
      if (dst != in_ && bytes_[me] > 0) std::memmove(dst, in_, bytes_[me]);
      copied_ = true;
      advanced = true;
    }
    for (std::size_t p = 0; p < sends_.size(); ++p) {
      if (p == me) continue;
      while (sends_[p].ready()) {
        const std::uint64_t c = sends_[p].sent();
        sends_[p].send(desc_, static_cast<std::uint32_t>(c), out_ + offsets_[me] + c * p_bytes,
                       chunk_bytes(bytes_[me], c));
        advanced = true;
      }
      std::uint64_t index;
      while (const MessageHeader* h = recvs_[p].next(desc_, &index)) {
        if (h->bytes > 0) std::memcpy(out_ + offsets_[p] + static_cast<std::size_t>(h->tag) * p_bytes,
                    recvs_[p].payload(h), h->bytes);
        recvs_[p].consume(index);
        advanced = true;
      }
    }
    if (streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  const std::byte* in_;
  std::byte* out_;
  std::vector<std::size_t> bytes_;
  std::vector<std::size_t> offsets_;
  bool copied_ = false;
};

}  // namespace

std::shared_ptr<Operation> make_allgatherv(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                           void* out, std::vector<std::size_t> bytes) {
  return std::make_shared<Allgatherv>(std::move(members), desc, in, out, std::move(bytes));
}

}  // namespace tnt
