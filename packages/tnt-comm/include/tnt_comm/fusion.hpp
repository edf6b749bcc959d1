// Tensor fusion's plan: many small tensors packed into fewer large buckets, where each lies in a
// fused buffer, and the packing. Pure computation; FusedAllreduce (fused_allreduce.hpp) runs it
// over a group.
#pragma once

#include <cstddef>
#include <vector>

#include "tnt_comm/types.hpp"

namespace tnt {

struct TensorSpec {
  std::size_t count;  // elements
  DType dtype;
};

// Where tensors lie in a fused buffer: each at an element offset whose byte offset is a multiple of
// 64 (what TensorFlow's kernels and vector loads want of a view), with zeros between them.
struct FusedLayout {
  std::vector<std::size_t> counts;   // by tensor, in elements
  std::vector<std::size_t> offsets;  // by tensor, in elements
  std::size_t count = 0;             // elements of the whole buffer, padding included
};
// One fusion bucket: consecutive tensors of one dtype.
struct Bucket {
  std::vector<std::size_t> tensors;  // indices into the spec list
  FusedLayout layout;                // where they lie in the bucket's buffer
  DType dtype = DType::float32;
};

FusedLayout fused_layout(const std::vector<std::size_t>& counts, DType dtype);

// Copies tensor `i` of `layout` into the fused buffer `dst`, times `*scale` where scale is not null
// (floating dtypes only): the scale is rounded to the dtype first and each product is rounded to
// it, as a framework multiplying in that dtype does, and a scale of 0 gives zeros even for NaN or
// infinite inputs (a rank without samples). Also zeroes the padding after the tensor.
void pack_tensor(const FusedLayout& layout, std::size_t i, const void* src, DType dtype, const float* scale,
                 void* dst);

// Groups tensors, in the order given, into buckets: a bucket closes once it holds at least
// `threshold_bytes` (0: one tensor per bucket) or when the next tensor has another dtype.
std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& tensors, std::size_t threshold_bytes);

}  // namespace tnt
