// The single-copy allreduce, for members of one host whose shared arenas (transport/arena.hpp)
// every member maps. Member m owns region m of the buffer: it reads region m of every member's
// input where it lies, reduces the inputs in member order a cache-sized piece at a time, and
// writes each piece of the result straight into every member's output. Every rank so reads its
// share of all inputs once and writes its share of all outputs once: the 2 S bytes per rank of
// the machine's bound, against the slot path's 4.5 S (docs/benchmarks.md).
//
// It runs where every rank's input and output lie in its arena (tnt_comm.shared_empty, the fused
// buffers of tnt-keras). Other buffers take the slot path: staging them through the arena measured
// slower than it (16 MiB on 2 ranks: 4.5-5.2 ms against 4.1-4.8 ms), whose slots stay in the cache.
//
// Two small messages per pair:
//   posted  (tag 0): where my input and output lie in my arena; my input is ready.
//   written (tag 1): my region of the result is in your output, and I read nothing more of yours.
// A member is done once it wrote its region everywhere and every peer said `written`. In place
// (in == out) is safe: region q of a member's buffer is read and then written only by member q,
// a piece at a time.
#include <algorithm>
#include <cstring>

#include "collectives/algorithms.hpp"
#include "reduce/kernels.hpp"

namespace tnt {
namespace {

enum Tag : std::uint32_t { kPosted = 0, kWritten = 1 };

// Results are reduced into the member's own output a piece of this size at a time and copied to
// the peers from there while the piece is still in the cache.
constexpr std::size_t kPieceBytes = 64 * 1024;
// Bytes reduced per progress() call, so the engine serves other operations in between.
constexpr std::size_t kStepBytes = 1024 * 1024;

struct Posted {
  std::uint64_t in = 0;   // offsets in the sender's arena
  std::uint64_t out = 0;
};

class SingleCopyAllreduce final : public Operation {
 public:
  SingleCopyAllreduce(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out, std::size_t count,
                      DType dtype, ReduceOp op)
      : Operation(std::move(m), d),
        in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        bytes_(count * dtype_size(dtype)),
        elem_(dtype_size(dtype)),
        dtype_(dtype),
        op_(op),
        n_(static_cast<std::size_t>(members_->size())),
        me_(static_cast<std::size_t>(members_->me)),
        peers_(n_) {
    // Regions of whole 64-byte lines where the buffer allows: no two owners write one cache line.
    const std::size_t line = std::max<std::size_t>(1, 64 / elem_);
    const std::size_t lines = (count + line - 1) / line;
    offsets_.assign(n_ + 1, 0);
    for (std::size_t r = 0; r < n_; ++r) {
      const std::size_t take = lines / n_ + (r < lines % n_ ? 1 : 0);
      offsets_[r + 1] = std::min(count, offsets_[r] / elem_ + take * line) * elem_;
    }
    for (std::size_t p = 0; p < n_; ++p) peers_[p].arena = members_->fabric->arena_of(members_->world_ranks[p]);
    // Where peers find our input and put our output (the group checked that both lie in the arena).
    const SharedArena& arena = *members_->fabric->arena();
    posted_offsets_.in = arena.offset_of(in_, bytes_).value();
    posted_offsets_.out = arena.offset_of(out_, bytes_).value();
  }

  void reserve() override {
    for (std::size_t p = 0; p < n_; ++p) {
      if (p != me_) open(static_cast<int>(p), 2, 2);
    }
  }

  Progress progress() override {
    bool advanced = receive();
    if (send(kPosted)) advanced = true;
    if (posted_ == n_ - 1 && reduced_ < length(me_)) {
      reduce_step();
      advanced = true;
    }
    const bool region_done = posted_ == n_ - 1 && reduced_ == length(me_);
    if (region_done && send(kWritten)) advanced = true;
    if (region_done && written_ == n_ - 1 && streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  struct Peer {
    std::byte* arena = nullptr;     // the member's arena as mapped here
    std::uint64_t in = 0, out = 0;  // where its input and output lie there
    std::uint32_t sent = 0;         // our messages to it so far (the next tag to send)
  };

  std::size_t length(std::size_t m) const { return offsets_[m + 1] - offsets_[m]; }

  bool receive() {
    bool advanced = false;
    for (std::size_t p = 0; p < n_; ++p) {
      if (p == me_) continue;
      std::uint64_t index;
      while (const MessageHeader* h = recvs_[p].next(desc_, &index)) {
        if (h->tag == kPosted) {
          Posted where;
          std::memcpy(&where, recvs_[p].payload(h), sizeof where);
          peers_[p].in = where.in;
          peers_[p].out = where.out;
          ++posted_;
        } else {
          ++written_;
        }
        recvs_[p].consume(index);
        advanced = true;
      }
    }
    return advanced;
  }

  // Sends message `tag` to every peer that is owed it.
  bool send(Tag tag) {
    bool advanced = false;
    for (std::size_t k = 1; k < n_; ++k) {
      const std::size_t p = (me_ + k) % n_;
      Peer& peer = peers_[p];
      if (peer.sent != tag || !sends_[p].ready()) continue;
      if (tag == kPosted) {
        sends_[p].send(desc_, tag, &posted_offsets_, sizeof posted_offsets_);
      } else {
        sends_[p].send(desc_, tag, nullptr, 0);
      }
      ++peer.sent;
      advanced = true;
    }
    return advanced;
  }

  // Reduces up to kStepBytes more of our region into our output and copies each piece on to the
  // peers' outputs.
  void reduce_step() {
    inputs_.resize(n_);
    const std::size_t region = length(me_);
    const std::size_t stop = std::min(region, reduced_ + kStepBytes);
    while (reduced_ < stop) {
      const std::size_t piece = std::min(kPieceBytes, region - reduced_);
      const std::size_t at = offsets_[me_] + reduced_;
      for (std::size_t p = 0; p < n_; ++p) {
        inputs_[p] = p == me_ ? in_ + at : peers_[p].arena + peers_[p].in + at;
      }
      std::byte* result = out_ + at;
      reduce(dtype_, op_, result, inputs_.data(), static_cast<int>(n_), piece / elem_);
      for (std::size_t k = 1; k < n_; ++k) {
        const std::size_t p = (me_ + k) % n_;
        std::memcpy(peers_[p].arena + peers_[p].out + at, result, piece);
      }
      reduced_ += piece;
    }
  }

  const std::byte* in_;
  std::byte* out_;
  std::size_t bytes_, elem_;
  DType dtype_;
  ReduceOp op_;
  std::size_t n_, me_;
  std::vector<Peer> peers_;           // by member index; ours unused
  std::vector<std::size_t> offsets_;  // byte offsets of the regions, n + 1 entries
  std::vector<const void*> inputs_;
  Posted posted_offsets_;             // ours, as sent
  std::size_t posted_ = 0;            // peers whose `posted` arrived
  std::size_t written_ = 0;           // peers whose `written` arrived
  std::size_t reduced_ = 0;           // bytes of our region done
};

}  // namespace

bool single_copy_fits(const Members& members, std::size_t bytes) {
  return bytes >= kSingleCopyBytes && members.size() >= 2 && members.hosts.size() == 1 && members.shared_arenas;
}

std::shared_ptr<Operation> make_allreduce_single_copy(std::shared_ptr<const Members> members, Descriptor desc,
                                                      const void* in, void* out, std::size_t count, DType dtype,
                                                      ReduceOp op) {
  return std::make_shared<SingleCopyAllreduce>(std::move(members), desc, in, out, count, dtype, op);
}

}  // namespace tnt
