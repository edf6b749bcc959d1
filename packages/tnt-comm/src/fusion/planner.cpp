#include "tnt_comm/fusion.hpp"

namespace tnt {

std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& tensors, std::size_t threshold_bytes) {
  std::vector<Bucket> buckets;
  std::vector<std::vector<std::size_t>> counts;  // by bucket
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (!is_valid(t.dtype)) throw InvalidArgument("tensor " + std::to_string(i) + ": unknown dtype");
    if (buckets.empty() || buckets.back().dtype != t.dtype || bytes >= threshold_bytes || threshold_bytes == 0) {
      buckets.push_back(Bucket{});
      buckets.back().dtype = t.dtype;
      counts.emplace_back();
      bytes = 0;
    }
    buckets.back().tensors.push_back(i);
    counts.back().push_back(t.count);
    bytes += t.count * dtype_size(t.dtype);
  }
  for (std::size_t b = 0; b < buckets.size(); ++b) buckets[b].layout = fused_layout(counts[b], buckets[b].dtype);
  return buckets;
}

}  // namespace tnt
