// Allreduce and reduce-scatter algorithms (see algorithms.hpp).
#include <cstring>

#include "collectives/algorithms.hpp"
#include "reduce/kernels.hpp"

namespace tnt {
namespace {

constexpr std::uint32_t kResultTag = 0x80000000u;

class AllreduceOneShot final : public Operation {
 public:
  AllreduceOneShot(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out, std::size_t count, DType dtype,
                   ReduceOp op)
      : Operation(std::move(m), d),
        in_(in),
        out_(out),
        count_(count),
        dtype_(dtype),
        op_(op),
        got_(static_cast<std::size_t>(members_->size()), nullptr),
        index_(static_cast<std::size_t>(members_->size()), 0) {}

  void reserve() override {
    for (int p = 0; p < members_->size(); ++p) {
      if (p != members_->me) open(p, 1, 1);
    }
  }

  Progress progress() override {
    bool advanced = false;
    const std::size_t bytes = count_ * dtype_size(dtype_);
    for (int p = 0; p < members_->size(); ++p) {
      auto i = static_cast<std::size_t>(p);
      if (p == members_->me) continue;
      if (sends_[i].ready()) {
        sends_[i].send(desc_, 0, in_, bytes);
        advanced = true;
      }
      if (got_[i] == nullptr) {
        if (const MessageHeader* h = recvs_[i].next(desc_, &index_[i])) {
          got_[i] = h;
          ++received_;
          advanced = true;
        }
      }
    }
    if (received_ + 1 < members_->size()) return advanced ? Progress::advanced : Progress::idle;
    // Reduce only once our input has gone to everyone: out may alias in.
    for (const auto& s : sends_) {
      if (!s.finished()) return advanced ? Progress::advanced : Progress::idle;
    }
    std::vector<const void*> inputs(static_cast<std::size_t>(members_->size()));
    for (int p = 0; p < members_->size(); ++p) {
      auto i = static_cast<std::size_t>(p);
      inputs[i] = p == members_->me ? in_ : recvs_[i].payload(got_[i]);
    }
    reduce(dtype_, op_, out_, inputs.data(), members_->size(), count_);
    for (int p = 0; p < members_->size(); ++p) {
      if (p != members_->me) recvs_[static_cast<std::size_t>(p)].consume(index_[static_cast<std::size_t>(p)]);
    }
    return Progress::done;
  }

 private:
  const void* in_;
  void* out_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
  std::vector<const MessageHeader*> got_;
  std::vector<std::uint64_t> index_;
  int received_ = 0;
};

// Region m of the buffer is owned by member m; it is processed in payload-sized chunks.
class ReduceToOwners final : public Operation {
 public:
  ReduceToOwners(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out_full, void* out_mine,
                 std::vector<std::size_t> offsets, DType dtype, ReduceOp op, bool gather)
      : Operation(std::move(m), d),
        in_(static_cast<const std::byte*>(in)),
        out_full_(static_cast<std::byte*>(out_full)),
        out_mine_(static_cast<std::byte*>(out_mine)),
        offsets_(std::move(offsets)),
        dtype_(dtype),
        op_(op),
        gather_(gather) {
    const auto n = static_cast<std::size_t>(members_->size());
    const auto me = static_cast<std::size_t>(members_->me);
    my_chunks_ = chunks(length(me));
    pending_.assign(my_chunks_ * n, nullptr);
    pending_index_.assign(my_chunks_ * n, 0);
    arrived_.assign(my_chunks_, 0);
    first_sent_.assign(n, 0);
    results_sent_.assign(n, 0);
  }

  void reserve() override {
    for (int p = 0; p < members_->size(); ++p) {
      if (p == members_->me) continue;
      const std::uint64_t theirs = chunks(length(static_cast<std::size_t>(p)));
      open(p, theirs + (gather_ ? my_chunks_ : 0), my_chunks_ + (gather_ ? theirs : 0));
    }
  }

  Progress progress() override {
    bool advanced = receive();
    advanced = reduce_ready() || advanced;
    advanced = send() || advanced;
    if (reduced_ == my_chunks_ && streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  std::size_t length(std::size_t m) const { return offsets_[m + 1] - offsets_[m]; }

  bool receive() {
    bool advanced = false;
    const std::size_t n = static_cast<std::size_t>(members_->size());
    const std::size_t p_bytes = members_->payload_bytes();
    for (std::size_t p = 0; p < n; ++p) {
      if (static_cast<int>(p) == members_->me) continue;
      std::uint64_t index;
      while (const MessageHeader* h = recvs_[p].next(desc_, &index)) {
        advanced = true;
        if (h->tag & kResultTag) {
          const std::size_t c = h->tag & ~kResultTag;
          if (h->bytes > 0) std::memcpy(out_full_ + offsets_[p] + c * p_bytes, recvs_[p].payload(h), h->bytes);
          recvs_[p].consume(index);
        } else {
          const std::size_t slot = static_cast<std::size_t>(h->tag) * n + p;
          pending_[slot] = h;
          pending_index_[slot] = index;
          ++arrived_[h->tag];
        }
      }
    }
    return advanced;
  }

  bool reduce_ready() {
    bool advanced = false;
    const std::size_t n = static_cast<std::size_t>(members_->size());
    const std::size_t me = static_cast<std::size_t>(members_->me);
    const std::size_t p_bytes = members_->payload_bytes();
    inputs_.resize(n);
    while (reduced_ < my_chunks_ && arrived_[reduced_] + 1 == n) {
      const std::size_t c = reduced_;
      for (std::size_t p = 0; p < n; ++p) {
        inputs_[p] = p == me ? static_cast<const void*>(in_ + offsets_[me] + c * p_bytes)
                             : recvs_[p].payload(pending_[c * n + p]);
      }
      const std::size_t bytes = chunk_bytes(length(me), c);
      reduce(dtype_, op_, out_mine_ + c * p_bytes, inputs_.data(), static_cast<int>(n),
             bytes / dtype_size(dtype_));
      for (std::size_t p = 0; p < n; ++p) {
        if (p != me) recvs_[p].consume(pending_index_[c * n + p]);
      }
      ++reduced_;
      advanced = true;
    }
    return advanced;
  }

  bool send() {
    bool advanced = false;
    const std::size_t n = static_cast<std::size_t>(members_->size());
    const std::size_t me = static_cast<std::size_t>(members_->me);
    const std::size_t p_bytes = members_->payload_bytes();
    for (std::size_t p = 0; p < n; ++p) {
      if (p == me) continue;
      while (sends_[p].ready()) {
        // Results first: they are what the peer's last phase waits for.
        if (gather_ && results_sent_[p] < reduced_) {
          const std::size_t c = results_sent_[p]++;
          sends_[p].send(desc_, kResultTag | static_cast<std::uint32_t>(c), out_mine_ + c * p_bytes,
                         chunk_bytes(length(me), c));
        } else if (first_sent_[p] < chunks(length(p))) {
          const std::size_t c = first_sent_[p]++;
          sends_[p].send(desc_, static_cast<std::uint32_t>(c), in_ + offsets_[p] + c * p_bytes,
                         chunk_bytes(length(p), c));
        } else {
          break;
        }
        advanced = true;
      }
    }
    return advanced;
  }

  const std::byte* in_;
  std::byte* out_full_;
  std::byte* out_mine_;
  std::vector<std::size_t> offsets_;  // byte offsets of the regions, n + 1 entries
  DType dtype_;
  ReduceOp op_;
  bool gather_;
  std::uint64_t my_chunks_ = 0;
  std::uint64_t reduced_ = 0;
  std::vector<const MessageHeader*> pending_;  // [chunk * n + member]
  std::vector<std::uint64_t> pending_index_;
  std::vector<std::size_t> arrived_;  // peers' parts received, per chunk
  std::vector<std::uint64_t> first_sent_, results_sent_;
  std::vector<const void*> inputs_;
};

// Splits `count` elements into n regions whose byte sizes are multiples of the chunk size where
// possible, so every chunk but the last of a region is full.
std::vector<std::size_t> region_offsets(std::size_t count, std::size_t elem, int n) {
  std::vector<std::size_t> offsets(static_cast<std::size_t>(n) + 1, 0);
  const std::size_t base = count / static_cast<std::size_t>(n);
  const std::size_t extra = count % static_cast<std::size_t>(n);
  for (std::size_t m = 0; m < static_cast<std::size_t>(n); ++m) {
    offsets[m + 1] = offsets[m] + (base + (m < extra ? 1 : 0)) * elem;
  }
  return offsets;
}

}  // namespace

std::shared_ptr<Operation> make_allreduce_one_shot(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                                   void* out, std::size_t count, DType dtype,
                                                   ReduceOp op) {
  return std::make_shared<AllreduceOneShot>(std::move(members), desc, in, out, count, dtype, op);
}

std::shared_ptr<Operation> make_allreduce_direct(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                                 void* out, std::size_t count, DType dtype,
                                                 ReduceOp op) {
  auto offsets = region_offsets(count, dtype_size(dtype), members->size());
  void* mine = static_cast<std::byte*>(out) + offsets[static_cast<std::size_t>(members->me)];
  return std::make_shared<ReduceToOwners>(std::move(members), desc, in, out, mine,
                                          std::move(offsets), dtype, op, true);
}

std::shared_ptr<Operation> make_reduce_scatter(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                               void* out, std::size_t count, DType dtype,
                                               ReduceOp op) {
  const std::size_t n = static_cast<std::size_t>(members->size());
  std::vector<std::size_t> offsets(n + 1);
  for (std::size_t m = 0; m <= n; ++m) offsets[m] = m * count * dtype_size(dtype);
  return std::make_shared<ReduceToOwners>(std::move(members), desc, in, nullptr, out,
                                          std::move(offsets), dtype, op, false);
}

}  // namespace tnt
