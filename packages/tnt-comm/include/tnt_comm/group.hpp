// A group of ranks and the collectives that run over it. The world is the group of all ranks;
// sub-groups are made from a list of world ranks so users can build their own collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tnt_comm/types.hpp"
#include "tnt_comm/work.hpp"

namespace tnt {

class Job;
class Operation;
struct Descriptor;
struct Members;

// Runs on the thread that completes the operation (usually the progress thread); must not block.
using Callback = std::function<void(std::exception_ptr error)>;

// Names the calling thread for the cross-rank check of every call it makes: if two ranks pair
// calls made from threads of different names, both raise CollectiveMismatch instead of combining
// the wrong data. Unnamed threads (the default, and "") are not compared. tnt_comm's Python API
// names each Python thread it is called from after threading's name (the main thread stays
// unnamed), so threads created in the same order on every rank match.
void set_thread_name(const std::string& name);

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Made by Runtime::new_group and Runtime::world_group, over the runtime's job (a Group outlives
  // it safely: its calls then throw Error).
  Group(const std::shared_ptr<Job>& job, std::vector<int> world_ranks);

  int rank() const { return my_index_; }  // index of this process in the group, -1 if not a member
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& world_ranks() const { return ranks_; }
  std::uint64_t id() const { return id_; }

  // Non-blocking collectives. Buffers must stay valid until the Work completes. `in` may equal
  // `out` where both exist (in place). Counts are in elements.
  Work allreduce_async(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
                       Callback on_done = {});
  Work broadcast_async(void* buf, std::size_t count, DType dtype, int root, Callback on_done = {});
  // out receives size() blocks of `count` elements, in rank order.
  Work allgather_async(const void* in, void* out, std::size_t count, DType dtype);
  // counts[r] elements from rank r (counts must be equal on every rank); out holds their sum.
  Work allgatherv_async(const void* in, void* out, const std::vector<std::size_t>& counts,
                        DType dtype);
  // in holds size() blocks of `count` elements; out receives the reduced block of this rank.
  Work reduce_scatter_async(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);
  Work barrier_async();
  // Point-to-point; `peer` is a rank of this group. Messages between two ranks arrive in order.
  Work send_async(const void* buf, std::size_t count, DType dtype, int peer);
  Work recv_async(void* buf, std::size_t count, DType dtype, int peer);

  // Blocking forms: start, then progress on the calling thread until done.
  void allreduce(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);
  void broadcast(void* buf, std::size_t count, DType dtype, int root);
  void allgather(const void* in, void* out, std::size_t count, DType dtype);
  void allgatherv(const void* in, void* out, const std::vector<std::size_t>& counts, DType dtype);
  void reduce_scatter(const void* in, void* out, std::size_t count, DType dtype, ReduceOp op);
  void barrier();
  void send(const void* buf, std::size_t count, DType dtype, int peer);
  void recv(void* buf, std::size_t count, DType dtype, int peer);

 private:
  // The job, kept alive for the call; throws once the runtime was finalized.
  std::shared_ptr<Job> live(const char* what) const;
  // Every call: numbered and submitted under the group's order lock (so its sequence number and
  // its place on the channels agree), refused while another thread waits in a blocking call of
  // this group, and waited for when `blocking`.
  template <typename Make>
  Work run(const char* what, bool blocking, Callback on_done, Make make);
  [[noreturn]] void refuse_second_thread(Job& rt, const char* what);
  Work submit(Job& rt, const std::shared_ptr<Operation>& op, bool background, Callback on_done = {});
  void check(const char* what, DType dtype, std::size_t count, const void* a, const void* b) const;
  void check_peer(int peer, const char* what) const;
  Descriptor next(std::uint32_t kind, DType dtype, ReduceOp op, int root, std::uint64_t count);
  // Checks a send (`sending`) or recv and describes its message: the next of those between this
  // rank and `peer` in that direction.
  Descriptor next_p2p(const char* what, const void* buf, std::size_t count, DType dtype, int peer, bool sending);
  const std::shared_ptr<const Members>& members(Job& rt);
  // Each collective's operation, checked and sequenced; *_async and the blocking forms submit it.
  std::shared_ptr<Operation> allreduce_op(Job& rt, const void* in, void* out, std::size_t count, DType dtype,
                                          ReduceOp op);
  std::shared_ptr<Operation> broadcast_op(Job& rt, void* buf, std::size_t count, DType dtype, int root);
  std::shared_ptr<Operation> allgather_op(Job& rt, const void* in, void* out, std::size_t count, DType dtype);
  std::shared_ptr<Operation> allgatherv_op(Job& rt, const void* in, void* out,
                                           const std::vector<std::size_t>& counts, DType dtype);
  std::shared_ptr<Operation> reduce_scatter_op(Job& rt, const void* in, void* out, std::size_t count,
                                               DType dtype, ReduceOp op);
  std::shared_ptr<Operation> barrier_op(Job& rt);
  std::shared_ptr<Operation> send_op(Job& rt, const void* buf, std::size_t count, DType dtype, int peer);
  std::shared_ptr<Operation> recv_op(Job& rt, void* buf, std::size_t count, DType dtype, int peer);

  std::weak_ptr<Job> job_;
  int world_rank_ = -1;  // of this process
  std::vector<int> ranks_;
  int my_index_ = -1;
  std::uint64_t id_ = 0;
  std::uint64_t seq_ = 0;
  std::vector<std::uint64_t> send_seq_, recv_seq_;
  std::shared_ptr<const Members> members_;  // built on first use

  std::mutex order_mutex_;
  std::thread::id blocked_thread_;  // the thread in a blocking call, while blocked_ > 0
  int blocked_ = 0;
  std::string blocked_call_;
};

}  // namespace tnt
