// Tensor fusion over a group: a fixed list of tensors allreduced through the buckets fusion.hpp
// plans, reusable step after step.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "tnt_comm/fusion.hpp"
#include "tnt_comm/group.hpp"
#include "tnt_comm/types.hpp"

namespace tnt {

// Allreduce of a fixed list of tensors through fusion buckets, reusable step after step. A bucket
// starts as soon as its last tensor is handed over and every earlier bucket has started, so buckets
// start and complete in the same order on every rank whatever order tensors arrive in. Buckets
// lie in the rank's shared arena where it has one (Runtime::allocate_shared), so large ones take
// the single-copy allreduce.
class FusedAllreduce {
 public:
  // `group` comes from Runtime::world_group() or new_group(); it is kept alive by this object.
  FusedAllreduce(Group& group, std::vector<TensorSpec> tensors, std::size_t threshold_bytes,
                 ReduceOp op);
  ~FusedAllreduce();

  std::size_t num_tensors() const { return tensors_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Hands tensor i over (its data is copied at once), times *scale where scale is not null, as
  // pack_tensor scales: one pass over the data, instead of scaling it first.
  void start(std::size_t i, const void* data, const float* scale = nullptr);
  // Waits for tensor i's bucket and copies its reduced values to `out`.
  void wait(std::size_t i, void* out);
  // Whether tensor i's bucket has completed (false until it started).
  bool is_ready(std::size_t i) const;

 private:
  struct BucketState;
  void launch_ready_buckets();

  std::shared_ptr<Group> group_;
  std::vector<TensorSpec> tensors_;
  std::vector<Bucket> buckets_;
  ReduceOp op_;
  std::vector<std::size_t> bucket_of_;  // tensor -> bucket
  std::vector<std::unique_ptr<BucketState>> state_;
  std::size_t next_launch_ = 0;
  std::size_t round_waited_ = 0;
};

}  // namespace tnt
