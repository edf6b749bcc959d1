// Tensor fusion: many small allreduces packed into fewer large ones.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "tnt_comm/group.hpp"
#include "tnt_comm/types.hpp"

namespace tnt {

struct TensorSpec {
  std::size_t count;  // elements
  DType dtype;
};

// One fusion bucket: consecutive tensors of one dtype.
struct Bucket {
  std::vector<std::size_t> tensors;  // indices into the spec list
  std::vector<std::size_t> offsets;  // element offset of each tensor inside the bucket
  std::size_t count = 0;
  DType dtype = DType::float32;
};

// Groups tensors, in the order given, into buckets: a bucket closes once it holds at least
// `threshold_bytes` (0: one tensor per bucket) or when the next tensor has another dtype.
std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& tensors, std::size_t threshold_bytes);

// Allreduce of a fixed list of tensors through fusion buckets, reusable step after step. A bucket
// starts as soon as its last tensor is handed over and every earlier bucket has started, so buckets
// start and complete in the same order on every rank whatever order tensors arrive in.
class FusedAllreduce {
 public:
  // `group` comes from Runtime::world_group() or new_group(); it is kept alive by this object.
  FusedAllreduce(Group& group, std::vector<TensorSpec> tensors, std::size_t threshold_bytes,
                 ReduceOp op);
  ~FusedAllreduce();

  std::size_t num_tensors() const { return tensors_.size(); }
  const std::vector<Bucket>& buckets() const { return buckets_; }

  // Hands tensor i over (its data is copied at once).
  void start(std::size_t i, const void* data);
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
