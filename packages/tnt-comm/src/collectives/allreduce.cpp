// Allreduce and reduce-scatter algorithms (see algorithms.hpp).
#include <algorithm>
#include <cstring>
#include <utility>

#include "collectives/algorithms.hpp"
#include "reduce/kernels.hpp"

namespace tnt {
namespace {

constexpr std::uint32_t kResultTag = tags::kSecondKind;  // the reduced result, not a peer's part

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
        index_(static_cast<std::size_t>(members_->size()), 0) {}

  void reserve() override {
    for (int p = 0; p < members_->size(); ++p) {
      if (p != members_->me) open(p, 1, 1);
    }
  }

  Progress progress() override {
    bool advanced = false;
    const std::size_t bytes = count_ * dtype_size(dtype_);
    const int n = members_->size();
    // From the next member on, as ReduceToOwners sends: the members' first writes go to n-1
    // different peers instead of all to member 0.
    for (int k = 1; k < n; ++k) {
      const int p = (members_->me + k) % n;
      auto i = static_cast<std::size_t>(p);
      if (sends_[i].ready()) {
        sends_[i].send(desc_, 0, in_, bytes);
        advanced = true;
      }
      if (!recvs_[i].all_examined() && recvs_[i].next(desc_, &index_[i]) != nullptr) {
        ++received_;
        advanced = true;
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
      inputs[i] = p == members_->me ? in_ : recvs_[i].payload_at(index_[i]);
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
  std::vector<std::uint64_t> index_;  // by member: its message's index, for payload_at()
  int received_ = 0;
};

// Recursive doubling, for small buffers on a power-of-two number of members: in round k each
// member exchanges its running result with member me ^ 2^k and combines the two, so after log2(n)
// rounds everyone holds the whole reduction. One message a round instead of the direct
// algorithm's 2(n-1) per call. Both members of a pair combine the lower member's value first,
// so every member evaluates the same tree of operations and gets the same bits.
class RecursiveDoubling final : public Operation {
 public:
  RecursiveDoubling(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out, std::size_t count,
                    DType dtype, ReduceOp op)
      : Operation(std::move(m), d), in_(in), out_(out), count_(count), dtype_(dtype), op_(op) {
    for (int span = 1; span < members_->size(); span <<= 1) ++rounds_;
  }

  void reserve() override {
    for (int k = 0; k < rounds_; ++k) open(partner(k), 1, 1);
  }

  Progress progress() override {
    bool advanced = false;
    const std::size_t bytes = count_ * dtype_size(dtype_);
    while (round_ < rounds_) {
      const auto p = static_cast<std::size_t>(partner(round_));
      // Round 0 sends the input, later rounds the running result in out; a send copies the data
      // out at once, so out may be overwritten right after it.
      if (!sends_[p].finished()) {
        if (!sends_[p].ready()) break;
        sends_[p].send(desc_, static_cast<std::uint32_t>(round_), round_ == 0 ? in_ : out_, bytes);
        advanced = true;
      }
      std::uint64_t index;
      const MessageHeader* h = recvs_[p].next(desc_, &index);
      if (h == nullptr) break;
      const void* mine = round_ == 0 ? in_ : out_;
      const void* theirs = recvs_[p].payload(h);
      const bool lower = members_->me < static_cast<int>(p);
      const void* inputs[2] = {lower ? mine : theirs, lower ? theirs : mine};
      reduce(dtype_, op_, out_, inputs, 2, count_);
      recvs_[p].consume(index);
      ++round_;
      advanced = true;
    }
    if (round_ == rounds_ && streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  int partner(int round) const { return members_->me ^ (1 << round); }

  const void* in_;
  void* out_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
  int rounds_ = 0;
  int round_ = 0;
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
          const std::size_t c = h->tag & tags::kChunkMask;
          if (h->bytes > 0) std::memcpy(out_full_ + offsets_[p] + c * p_bytes, recvs_[p].payload(h), h->bytes);
          recvs_[p].consume(index);
        } else {
          pending_index_[static_cast<std::size_t>(h->tag) * n + p] = index;
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
                             : recvs_[p].payload_at(pending_index_[c * n + p]);
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
    // Member me+1 first, me+2 next, and so on: were every member to start at member 0, all n-1
    // senders would write into one owner's slots at once while the other owners waited, and the
    // owners would be served one after the other (on 16 cores and ranks, 1 MiB took 16-32% longer).
    for (std::size_t k = 1; k < n; ++k) {
      const std::size_t p = (me + k) % n;
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
  std::vector<std::uint64_t> pending_index_;  // [chunk * n + member]: the part's message index
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

// A ring: member r sends only to r+1 and receives only from r-1. In n-1 reduce-scatter steps each
// block travels once around the ring, gaining one member's part per hop; in n-1 allgather steps
// the finished blocks travel around once more. Every member sends 2(n-1)/n of the buffer to a
// single peer, so over TCP no send waits behind a busy peer while another link idles. Blocks are
// cut into payload-sized chunks, and a chunk moves on as soon as it arrived (pipelined).
class RingAllreduce final : public Operation {
 public:
  RingAllreduce(std::shared_ptr<const Members> m, Descriptor d, const void* in, void* out, std::size_t count,
                DType dtype, ReduceOp op)
      : Operation(std::move(m), d),
        in_(static_cast<const std::byte*>(in)),
        out_(static_cast<std::byte*>(out)),
        dtype_(dtype),
        op_(op),
        n_(static_cast<std::size_t>(members_->size())),
        me_(static_cast<std::size_t>(members_->me)),
        offsets_(region_offsets(count, dtype_size(dtype), members_->size())) {
    std::size_t longest = 0;
    for (std::size_t b = 0; b < n_; ++b) longest = std::max(longest, length(b));
    chunks_ = chunks(longest);
    total_ = 2 * (n_ - 1) * chunks_;
  }

  void reserve() override {
    const int next = static_cast<int>((me_ + 1) % n_), prev = static_cast<int>((me_ + n_ - 1) % n_);
    if (next == prev) {
      open(next, total_, total_);
    } else {
      open(next, total_, 0);
      open(prev, 0, total_);
    }
  }

  Progress progress() override {
    bool advanced = false;
    const std::size_t next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
    const std::size_t p_bytes = members_->payload_bytes();
    // Receive in order: message k is step k / chunks_ (reduce-scatter for the first n-1 steps,
    // allgather after), chunk k % chunks_.
    std::uint64_t index;
    while (processed_ < total_) {
      const MessageHeader* h = recvs_[prev].next(desc_, &index);
      if (h == nullptr) break;
      const std::uint64_t step = processed_ / chunks_, c = processed_ % chunks_;
      const std::size_t b = block(step < n_ - 1 ? me_ + 2 * n_ - step - 1 : me_ + 2 * n_ - (step - (n_ - 1)));
      const std::size_t bytes = chunk_bytes(length(b), c);
      std::byte* target = out_ + offsets_[b] + c * p_bytes;
      if (step < n_ - 1) {
        const void* inputs[2] = {in_ + offsets_[b] + c * p_bytes, recvs_[prev].payload(h)};
        reduce(dtype_, op_, target, inputs, 2, bytes / dtype_size(dtype_));
      } else if (bytes > 0) {
        std::memcpy(target, recvs_[prev].payload(h), bytes);
      }
      recvs_[prev].consume(index);
      ++processed_;
      advanced = true;
    }
    // Send in order: message k needs nothing for the first step, else message k - chunks_ received.
    while (sends_[next].ready()) {
      const std::uint64_t k = sends_[next].sent();
      if (k >= chunks_ && processed_ <= k - chunks_) break;
      const std::uint64_t step = k / chunks_, c = k % chunks_;
      const std::byte* source;
      std::size_t b;
      if (step < n_ - 1) {
        b = block(me_ + 2 * n_ - step);
        source = (step == 0 ? in_ : out_) + offsets_[b] + c * p_bytes;
      } else {
        b = block(me_ + 2 * n_ + 1 - (step - (n_ - 1)));
        source = out_ + offsets_[b] + c * p_bytes;
      }
      sends_[next].send(desc_, static_cast<std::uint32_t>(k), source, chunk_bytes(length(b), c));
      advanced = true;
    }
    if (processed_ == total_ && streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }

 private:
  std::size_t block(std::size_t i) const { return i % n_; }
  std::size_t length(std::size_t b) const { return offsets_[b + 1] - offsets_[b]; }

  const std::byte* in_;
  std::byte* out_;
  DType dtype_;
  ReduceOp op_;
  std::size_t n_, me_;
  std::vector<std::size_t> offsets_;
  std::uint64_t chunks_ = 1, total_ = 0, processed_ = 0;
};

// Runs operations one after the other as one: the phases of the host-aware allreduce, each over
// its own subset of the group (its own members and stream key).
class Phases final : public Operation {
 public:
  Phases(std::shared_ptr<const Members> m, Descriptor d, std::vector<std::shared_ptr<Operation>> phases)
      : Operation(std::move(m), d), phases_(std::move(phases)) {}

  // Every phase's messages are reserved at once, in the same order on every rank.
  void reserve() override {
    for (auto& phase : phases_) phase->reserve();
  }
  void claim_receives() override {
    for (auto& phase : phases_) phase->claim_receives();
  }
  Progress progress() override {
    bool advanced = false;
    while (current_ < phases_.size()) {
      if (entered_ <= current_) {  // the timeline's mark, once per phase, when it first runs
        enter_phase(phases_[current_]->label());
        entered_ = current_ + 1;
      }
      const Progress p = phases_[current_]->progress();
      if (p != Progress::done) return advanced || p == Progress::advanced ? Progress::advanced : Progress::idle;
      ++current_;
      advanced = true;
    }
    return Progress::done;
  }
  std::vector<int> waiting_ranks() const override {
    return current_ < phases_.size() ? phases_[current_]->waiting_ranks() : std::vector<int>{};
  }
  std::vector<int> needs_more_from() const override {
    return current_ < phases_.size() ? phases_[current_]->needs_more_from() : std::vector<int>{};
  }

 private:
  std::vector<std::shared_ptr<Operation>> phases_;
  std::size_t current_ = 0, entered_ = 0;
};

// The last phase of an average over phases: they sum, and this divides once by the group's size,
// as the kernels' avg does (a phase's avg would average averages, wrong when hosts differ in size
// and along a ring, which adds two inputs at a time).
class Divide final : public Operation {
 public:
  Divide(std::shared_ptr<const Members> m, Descriptor d, void* buf, std::size_t count, DType dtype)
      : Operation(std::move(m), d), buf_(buf), count_(count), dtype_(dtype) {}
  void reserve() override {}
  Progress progress() override {
    divide(dtype_, buf_, members_->size(), count_);
    return Progress::done;
  }

 private:
  void* buf_;
  std::size_t count_;
  DType dtype_;
};

// The op each phase of a multi-phase allreduce runs: avg sums, and finish_phases divides once.
ReduceOp phase_op(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// The phases as one operation, ending in the division when the caller asked for avg.
std::shared_ptr<Operation> finish_phases(std::shared_ptr<const Members> members, Descriptor desc,
                                         std::vector<std::shared_ptr<Operation>> phases, ReduceOp op, void* out,
                                         std::size_t count, DType dtype) {
  if (op == ReduceOp::avg) {
    phases.push_back(std::make_shared<Divide>(members, desc, out, count, dtype));
    phases.back()->set_label("divide");
  }
  return std::make_shared<Phases>(std::move(members), desc, std::move(phases));
}

// The members of the group at `indices` (one of which is us), as a group of their own.
std::shared_ptr<const Members> subset(const Members& all, const std::vector<int>& indices) {
  auto m = std::make_shared<Members>();
  m->fabric = all.fabric;
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const auto g = static_cast<std::size_t>(indices[i]);
    m->channels.push_back(all.channels[g]);
    m->world_ranks.push_back(all.world_ranks[g]);
    if (indices[i] == all.me) m->me = static_cast<int>(i);
  }
  return m;
}

// A stream key of its own for each phase, the same on every rank (splitmix64 of group and phase).
std::uint64_t phase_key(std::uint64_t group, std::uint64_t phase) {
  std::uint64_t z = group + phase * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

bool host_aware_fits(const Members& members) {
  const auto& hosts = members.hosts;
  if (hosts.size() < 2 || hosts.front().size() < 2) return false;
  return std::all_of(hosts.begin(), hosts.end(), [&](const auto& h) { return h.size() == hosts.front().size(); });
}

namespace {

// Our host's index in members.hosts and our index on it.
std::pair<std::size_t, std::size_t> my_place(const Members& members) {
  for (std::size_t k = 0; k < members.hosts.size(); ++k) {
    const auto& h = members.hosts[k];
    const auto it = std::find(h.begin(), h.end(), members.me);
    if (it != h.end()) return {k, static_cast<std::size_t>(it - h.begin())};
  }
  throw Error("allreduce: this rank is on none of its group's hosts");
}

}  // namespace

bool leaders_fit(const Members& members) {
  const std::size_t hosts = members.hosts.size();
  return hosts >= 2 && hosts <= 8 && hosts < static_cast<std::size_t>(members.size());
}

std::shared_ptr<Operation> make_allreduce_via_leaders(std::shared_ptr<const Members> members, Descriptor desc,
                                                      const void* in, void* out, std::size_t count, DType dtype,
                                                      ReduceOp op) {
  const auto [my_host, my_local] = my_place(*members);
  const auto& host = members->hosts[my_host];
  auto local = subset(*members, host);
  // The leader (the host's first member) owns the whole buffer; the others own empty regions.
  std::vector<std::size_t> offsets(host.size() + 1, count * dtype_size(dtype));
  offsets[0] = 0;

  Descriptor within = desc, between = desc, spread = desc;
  within.group = phase_key(desc.group, 4);
  between.group = phase_key(desc.group, 5);
  spread.group = phase_key(desc.group, 6);
  spread.kind = Kind::broadcast;
  spread.root = 0;

  std::vector<std::shared_ptr<Operation>> phases;
  phases.push_back(
      std::make_shared<ReduceToOwners>(local, within, in, nullptr, out, offsets, dtype, phase_op(op), false));
  phases.back()->set_label("reduce to the leader");
  if (my_local == 0) {
    std::vector<int> leaders;
    for (const auto& h : members->hosts) leaders.push_back(h.front());
    phases.push_back(make_allreduce_one_shot(subset(*members, leaders), between, out, out, count, dtype, phase_op(op)));
    phases.back()->set_label("allreduce among leaders");
  }
  phases.push_back(make_broadcast(local, spread, out, count * dtype_size(dtype), 0));
  phases.back()->set_label("broadcast within the host");
  return finish_phases(std::move(members), desc, std::move(phases), op, out, count, dtype);
}

std::shared_ptr<Operation> make_allreduce_host_aware(std::shared_ptr<const Members> members, Descriptor desc,
                                                     const void* in, void* out, std::size_t count, DType dtype,
                                                     ReduceOp op) {
  const std::size_t elem = dtype_size(dtype);
  const auto [my_host, my_local] = my_place(*members);
  const auto& host = members->hosts[my_host];
  std::vector<int> peers_of_my_index;  // member my_local of every host, in host order
  for (const auto& h : members->hosts) peers_of_my_index.push_back(h[my_local]);
  auto local = subset(*members, host);
  auto across = subset(*members, peers_of_my_index);

  const auto offsets = region_offsets(count, elem, static_cast<int>(host.size()));
  std::byte* region = static_cast<std::byte*>(out) + offsets[my_local];
  const std::size_t region_count = (offsets[my_local + 1] - offsets[my_local]) / elem;

  Descriptor within = desc, between = desc, gather = desc;
  within.group = phase_key(desc.group, 1);
  between.group = phase_key(desc.group, 2);
  between.count = region_count;
  gather.group = phase_key(desc.group, 3);
  gather.kind = Kind::allgatherv;
  std::vector<std::size_t> bytes(host.size());
  for (std::size_t m = 0; m < host.size(); ++m) bytes[m] = offsets[m + 1] - offsets[m];

  std::vector<std::shared_ptr<Operation>> phases;
  phases.push_back(
      std::make_shared<ReduceToOwners>(local, within, in, nullptr, region, offsets, dtype, phase_op(op), false));
  phases.back()->set_label("reduce-scatter within the host");
  // Across hosts a ring: each rank talks to one rank of one other host (see RingAllreduce).
  phases.push_back(std::make_shared<RingAllreduce>(across, between, region, region, region_count, dtype, phase_op(op)));
  phases.back()->set_label("ring across hosts");
  phases.push_back(make_allgatherv(local, gather, region, out, std::move(bytes)));
  phases.back()->set_label("allgather within the host");
  return finish_phases(std::move(members), desc, std::move(phases), op, out, count, dtype);
}

std::shared_ptr<Operation> make_allreduce_one_shot(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                                   void* out, std::size_t count, DType dtype,
                                                   ReduceOp op) {
  return std::make_shared<AllreduceOneShot>(std::move(members), desc, in, out, count, dtype, op);
}

bool recursive_doubling_fits(const Members& members, DType dtype, std::size_t bytes) {
  const auto n = static_cast<std::size_t>(members.size());
  // Pairwise rounding would cost half-precision sums accuracy the one-pass kernels keep.
  const bool wide = dtype != DType::float16 && dtype != DType::bfloat16;
  // Every round moves the whole buffer: on 16 cores 64 KiB took 45-54 us this way on 8 ranks (the
  // one-shot 112-163 us), but 73-81 us on 16 ranks, where the direct algorithm took 54-57 us.
  const std::size_t limit = n <= 8 ? kRecursiveDoublingBytes : kRecursiveDoublingBytes * 8 / n;
  return n >= 4 && (n & (n - 1)) == 0 && members.hosts.size() == 1 && wide && bytes <= limit;
}

std::shared_ptr<Operation> make_allreduce_recursive_doubling(std::shared_ptr<const Members> members, Descriptor desc,
                                                             const void* in, void* out, std::size_t count, DType dtype,
                                                             ReduceOp op) {
  if (op == ReduceOp::avg) {
    // Sum pairwise, then divide once (averaging pairs would divide log2(n) times).
    auto sum = std::make_shared<RecursiveDoubling>(members, desc, in, out, count, dtype, ReduceOp::sum);
    sum->set_label("sum");
    return finish_phases(std::move(members), desc, {sum}, op, out, count, dtype);
  }
  return std::make_shared<RecursiveDoubling>(std::move(members), desc, in, out, count, dtype, op);
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
