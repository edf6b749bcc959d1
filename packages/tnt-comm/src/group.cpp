#include "tnt_comm/group.hpp"

#include <algorithm>
#include <numeric>

#include "collectives/algorithms.hpp"
#include "engine/engine.hpp"
#include "job.hpp"
#include "transport/fabric.hpp"

namespace tnt {
namespace {

constexpr std::uint64_t kP2PSalt = 0x9e3779b97f4a7c15ull;
// Up to this many bytes per peer, allreduce uses the one-round algorithm.
constexpr std::size_t kOneShotBytes = 64 * 1024;

std::uint64_t hash_ranks(const std::vector<int>& ranks) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (int r : ranks) {
    h ^= static_cast<std::uint64_t>(r) + 1;
    h *= 1099511628211ull;
  }
  return h;
}

thread_local std::uint64_t t_thread_tag = 0;

}  // namespace

void set_thread_name(const std::string& name) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) {
    h ^= c;
    h *= 1099511628211ull;
  }
  t_thread_tag = name.empty() ? 0 : (h | 1);
}

Group::Group(const std::shared_ptr<Job>& job, std::vector<int> world_ranks)
    : job_(job), world_rank_(job->rank()), ranks_(std::move(world_ranks)) {
  if (ranks_.empty()) throw InvalidArgument("a group needs at least one rank");
  std::vector<int> sorted = ranks_;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    throw InvalidArgument("a group lists a rank twice");
  }
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] < 0 || ranks_[i] >= job->size()) {
      throw InvalidArgument("rank " + std::to_string(ranks_[i]) + " is not in the world of " +
                            std::to_string(job->size()) + " ranks");
    }
    if (ranks_[i] == job->rank()) my_index_ = static_cast<int>(i);
  }
  id_ = job->next_group_id(hash_ranks(ranks_));
  send_seq_.assign(ranks_.size(), 0);
  recv_seq_.assign(ranks_.size(), 0);
}

std::shared_ptr<Job> Group::live(const char* what) const {
  std::shared_ptr<Job> rt = job_.lock();
  if (!rt) {
    throw Error(std::string(what) + ": this group belongs to a job that has ended here: tnt_comm was "
                "finalized (no collective can run in this process any more), or the elastic job re-formed "
                "(shrink, admit): use the new world, and make groups again");
  }
  return rt;
}

const std::shared_ptr<const Members>& Group::members(Job& rt) {
  if (members_) return members_;
  auto m = std::make_shared<Members>();
  m->fabric = &rt.fabric();
  m->world_ranks = ranks_;
  m->me = my_index_;
  m->channels.reserve(ranks_.size());
  for (int r : ranks_) m->channels.push_back(r == world_rank_ ? nullptr : rt.channel(r));
  // Hosts as this rank sees them: a member is on our host when we reach it over shared memory.
  // Every rank sees the same partition, because links are chosen per pair from the node ranks.
  std::vector<int> host_of(ranks_.size(), -1);
  for (std::size_t i = 0; i < ranks_.size(); ++i) {
    if (host_of[i] >= 0) continue;
    host_of[i] = static_cast<int>(m->hosts.size());
    m->hosts.push_back({static_cast<int>(i)});
    for (std::size_t j = i + 1; j < ranks_.size(); ++j) {
      if (host_of[j] < 0 && rt.fabric().same_host(ranks_[i], ranks_[j])) {
        host_of[j] = host_of[i];
        m->hosts.back().push_back(static_cast<int>(j));
      }
    }
  }
  m->host_aware = rt.identity().allreduce != "flat" && host_aware_fits(*m);
  m->via_leaders = rt.identity().allreduce != "flat" && leaders_fit(*m);
  m->shared_arenas = std::all_of(ranks_.begin(), ranks_.end(), [&](int r) { return rt.fabric().arena_of(r) != nullptr; });
  members_ = std::move(m);
  return members_;
}

Descriptor Group::next(std::uint32_t kind, DType dtype, ReduceOp op, int root, std::uint64_t count) {
  Descriptor d;
  d.group = id_;
  d.seq = seq_++;
  d.kind = static_cast<Kind>(kind);
  d.dtype = static_cast<std::int32_t>(dtype);
  d.op = static_cast<std::int32_t>(op);
  d.root = root;
  d.count = count;
  d.thread = t_thread_tag;
  return d;
}

void Group::check(const char* what, DType dtype, std::size_t count, const void* a,
                  const void* b) const {
  if (my_index_ < 0) {
    throw InvalidArgument(std::string(what) + ": this rank (" + std::to_string(world_rank_) +
                          ") is not a member of the group");
  }
  if (!is_valid(dtype)) throw InvalidArgument(std::string(what) + ": unknown dtype");
  if (count > 0 && (a == nullptr || b == nullptr)) {
    throw InvalidArgument(std::string(what) + ": null buffer");
  }
}

void Group::check_peer(int peer, const char* what) const {
  if (peer < 0 || peer >= size()) {
    throw InvalidArgument(std::string(what) + ": rank " + std::to_string(peer) +
                          " is not in this group of " + std::to_string(size()) + " ranks");
  }
}

namespace {
bool in_arena(Job& rt, const void* p, std::size_t bytes) {
  const std::shared_ptr<SharedArena>& arena = rt.fabric().arena();
  return arena && arena->offset_of(p, bytes).has_value();
}
}  // namespace

template <typename Make>
Work Group::run(const char* what, bool blocking, Callback on_done, Make make) {
  std::shared_ptr<Job> rt = live(what);
  std::unique_lock<std::mutex> lock(order_mutex_);
  const std::thread::id me = std::this_thread::get_id();
  if (blocked_ > 0 && blocked_thread_ != me) refuse_second_thread(*rt, what);
  Work work = submit(*rt, make(*rt), !blocking, std::move(on_done));
  if (!blocking) return work;
  blocked_thread_ = me;
  ++blocked_;
  blocked_call_ = what;
  lock.unlock();
  struct Release {
    Group& group;
    ~Release() {
      std::lock_guard<std::mutex> hold(group.order_mutex_);
      --group.blocked_;
    }
  } release{*this};
  work.wait();
  return work;
}

void Group::refuse_second_thread(Job& rt, const char* what) {
  std::string ranks;
  for (int r : ranks_) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  const std::string message =
      "collective mismatch: two threads of rank " + std::to_string(world_rank_) + " used the group [" +
      ranks + "] at once (" + what + " while another thread waits in " + blocked_call_ +
      "). The ranks could pair different calls, so tnt-comm refuses this on every rank: a group "
      "takes its calls from one thread at a time; give each thread its own group (new_group)";
  ErrorDetail detail;
  detail.ranks = {world_rank_};
  detail.group = id_;
  rt.fabric().fail(FailureKind::mismatch, detail, message, true);
  throw CollectiveMismatch(message, std::move(detail));
}

Work Group::submit(Job& rt, const std::shared_ptr<Operation>& op, bool background,
                   Callback on_done) {
  if (on_done) op->set_callback(std::move(on_done));
  rt.engine().submit(op, background);
  return Work(op, job_);
}

namespace {

// The operation, named for the timeline by the algorithm chosen for it.
std::shared_ptr<Operation> labelled(std::shared_ptr<Operation> op, const char* algorithm) {
  op->set_label(algorithm);
  return op;
}

}  // namespace

std::shared_ptr<Operation> Group::allreduce_op(Job& rt, const void* in, void* out, std::size_t count,
                                               DType dtype, ReduceOp op) {
  check("allreduce", dtype, count, in, out);
  if (!is_valid(op)) throw InvalidArgument("allreduce: unknown reduction operator");
  Descriptor d = next(static_cast<std::uint32_t>(Kind::allreduce), dtype, op, 0, count);
  const std::size_t bytes = count * dtype_size(dtype);
  if (bytes <= kOneShotBytes && members(rt)->via_leaders) {
    return labelled(make_allreduce_via_leaders(members(rt), d, in, out, count, dtype, op), "via leaders");
  }
  // On one host, a power of two of members pairs up in log2(n) rounds: on 16 cores, 4 KiB took
  // 21-25 us with the direct algorithm on 16 ranks (Open MPI: 18 us) and 12 us this way, and
  // 64 KiB on 8 ranks 112-163 us with the one-shot, whose every member reduces n buffers
  // (docs/benchmarks.md).
  if (recursive_doubling_fits(*members(rt), dtype, bytes)) {
    return labelled(make_allreduce_recursive_doubling(members(rt), d, in, out, count, dtype, op), "recursive doubling");
  }
  if (bytes <= kOneShotBytes && size() <= 8) {
    return labelled(make_allreduce_one_shot(members(rt), d, in, out, count, dtype, op), "one-shot");
  }
  // Shared buffers (every rank's input and output in its arena) take the single-copy path; the
  // descriptor says so, so a rank whose buffers are not shared fails the call as a mismatch
  // instead of waiting for messages of another algorithm.
  if (single_copy_fits(*members(rt), bytes) && in_arena(rt, in, bytes) && in_arena(rt, out, bytes)) {
    d.shared = 1;
    return labelled(make_allreduce_single_copy(members(rt), d, in, out, count, dtype, op), "single-copy");
  }
  if (members(rt)->host_aware) {
    return labelled(make_allreduce_host_aware(members(rt), d, in, out, count, dtype, op), "host-aware");
  }
  return labelled(make_allreduce_direct(members(rt), d, in, out, count, dtype, op), "direct");
}

Work Group::allreduce_async(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                            Callback on_done) {
  return run("allreduce", false, std::move(on_done), [&](Job& rt) { return allreduce_op(rt, in, out, count, dtype, op); });
}

std::shared_ptr<Operation> Group::broadcast_op(Job& rt, void* buf, std::size_t count, DType dtype, int root) {
  check("broadcast", dtype, count, buf, buf);
  check_peer(root, "broadcast root");
  Descriptor d = next(static_cast<std::uint32_t>(Kind::broadcast), dtype, ReduceOp::sum, root, count);
  return make_broadcast(members(rt), d, buf, count * dtype_size(dtype), root);
}

std::shared_ptr<Operation> Group::allgather_op(Job& rt, const void* in, void* out, std::size_t count, DType dtype) {
  check("allgather", dtype, count, in, out);
  Descriptor d = next(static_cast<std::uint32_t>(Kind::allgather), dtype, ReduceOp::sum, 0, count);
  std::vector<std::size_t> bytes(ranks_.size(), count * dtype_size(dtype));
  return make_allgatherv(members(rt), d, in, out, std::move(bytes));
}

std::shared_ptr<Operation> Group::allgatherv_op(Job& rt, const void* in, void* out, const std::vector<std::size_t>& counts,
                             DType dtype) {
  if (counts.size() != ranks_.size()) {
    throw InvalidArgument("allgatherv: counts has " + std::to_string(counts.size()) +
                          " entries, the group " + std::to_string(ranks_.size()) + " ranks");
  }
  const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
  check("allgatherv", dtype, total, out, out);
  if (counts[static_cast<std::size_t>(std::max(my_index_, 0))] > 0 && in == nullptr) {
    throw InvalidArgument("allgatherv: null buffer");
  }
  Descriptor d = next(static_cast<std::uint32_t>(Kind::allgatherv), dtype, ReduceOp::sum, 0, total);
  std::vector<std::size_t> bytes(counts.size());
  for (std::size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * dtype_size(dtype);
  return make_allgatherv(members(rt), d, in, out, std::move(bytes));
}

std::shared_ptr<Operation> Group::reduce_scatter_op(Job& rt, const void* in, void* out, std::size_t count,
                                                    DType dtype, ReduceOp op) {
  check("reduce_scatter", dtype, count, in, out);
  if (!is_valid(op)) throw InvalidArgument("reduce_scatter: unknown reduction operator");
  Descriptor d = next(static_cast<std::uint32_t>(Kind::reduce_scatter), dtype, op, 0, count);
  return make_reduce_scatter(members(rt), d, in, out, count, dtype, op);
}

std::shared_ptr<Operation> Group::barrier_op(Job& rt) {
  check("barrier", DType::uint8, 0, nullptr, nullptr);
  Descriptor d = next(static_cast<std::uint32_t>(Kind::barrier), DType::uint8, ReduceOp::sum, 0, 0);
  return make_barrier(members(rt), d);
}

Descriptor Group::next_p2p(const char* what, const void* buf, std::size_t count, DType dtype, int peer,
                           bool sending) {
  check(what, dtype, count, buf, buf);
  check_peer(peer, what);
  if (peer == my_index_) {
    throw InvalidArgument(std::string(what) + ": a rank cannot " + (sending ? "send to" : "receive from") +
                          " itself");
  }
  Descriptor d;
  d.group = id_ ^ kP2PSalt;
  d.seq = (sending ? send_seq_ : recv_seq_)[static_cast<std::size_t>(peer)]++;
  d.kind = Kind::p2p;
  d.dtype = static_cast<std::int32_t>(dtype);
  d.root = sending ? my_index_ : peer;  // the sender's group rank
  d.count = count;
  d.thread = t_thread_tag;
  return d;
}

std::shared_ptr<Operation> Group::send_op(Job& rt, const void* buf, std::size_t count, DType dtype, int peer) {
  const Descriptor d = next_p2p("send", buf, count, dtype, peer, true);
  return make_send(members(rt), d, buf, count * dtype_size(dtype), peer);
}

std::shared_ptr<Operation> Group::recv_op(Job& rt, void* buf, std::size_t count, DType dtype, int peer) {
  const Descriptor d = next_p2p("recv", buf, count, dtype, peer, false);
  return make_recv(members(rt), d, buf, count * dtype_size(dtype), peer);
}

Work Group::broadcast_async(void* buf, std::size_t count, DType dtype, int root, Callback on_done) {
  return run("broadcast", false, std::move(on_done), [&](Job& rt) { return broadcast_op(rt, buf, count, dtype, root); });
}
Work Group::allgather_async(const void* in, void* out, std::size_t count, DType dtype) {
  return run("allgather", false, {}, [&](Job& rt) { return allgather_op(rt, in, out, count, dtype); });
}
Work Group::allgatherv_async(const void* in, void* out, const std::vector<std::size_t>& counts,
                             DType dtype) {
  return run("allgatherv", false, {}, [&](Job& rt) { return allgatherv_op(rt, in, out, counts, dtype); });
}
Work Group::reduce_scatter_async(const void* in, void* out, std::size_t count, DType dtype,
                                 ReduceOp op) {
  return run("reduce_scatter", false, {}, [&](Job& rt) { return reduce_scatter_op(rt, in, out, count, dtype, op); });
}
Work Group::barrier_async() {
  return run("barrier", false, {}, [&](Job& rt) { return barrier_op(rt); });
}
Work Group::send_async(const void* buf, std::size_t count, DType dtype, int peer) {
  return run("send", false, {}, [&](Job& rt) { return send_op(rt, buf, count, dtype, peer); });
}
Work Group::recv_async(void* buf, std::size_t count, DType dtype, int peer) {
  return run("recv", false, {}, [&](Job& rt) { return recv_op(rt, buf, count, dtype, peer); });
}

// Blocking forms drive the operation on the calling thread: no hand-off to the progress thread.
void Group::allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
  run("allreduce", true, {}, [&](Job& rt) { return allreduce_op(rt, in, out, count, dtype, op); });
}
void Group::broadcast(void* buf, std::size_t count, DType dtype, int root) {
  run("broadcast", true, {}, [&](Job& rt) { return broadcast_op(rt, buf, count, dtype, root); });
}
void Group::allgather(const void* in, void* out, std::size_t count, DType dtype) {
  run("allgather", true, {}, [&](Job& rt) { return allgather_op(rt, in, out, count, dtype); });
}
void Group::allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts,
                       DType dtype) {
  run("allgatherv", true, {}, [&](Job& rt) { return allgatherv_op(rt, in, out, counts, dtype); });
}
void Group::reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op) {
  run("reduce_scatter", true, {}, [&](Job& rt) { return reduce_scatter_op(rt, in, out, count, dtype, op); });
}
void Group::barrier() {
  run("barrier", true, {}, [&](Job& rt) { return barrier_op(rt); });
}
void Group::send(const void* buf, std::size_t count, DType dtype, int peer) {
  run("send", true, {}, [&](Job& rt) { return send_op(rt, buf, count, dtype, peer); });
}
void Group::recv(void* buf, std::size_t count, DType dtype, int peer) {
  run("recv", true, {}, [&](Job& rt) { return recv_op(rt, buf, count, dtype, peer); });
}

}  // namespace tnt
