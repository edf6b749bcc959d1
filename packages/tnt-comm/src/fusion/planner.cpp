#include "tnt_comm/fusion.hpp"

namespace tnt {

std::vector<Bucket> plan_buckets(const std::vector<TensorSpec>& tensors, std::size_t threshold_bytes) {
  std::vector<Bucket> buckets;
  std::size_t bytes = 0;
  bool open = false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorSpec& t = tensors[i];
    if (!is_valid(t.dtype)) throw InvalidArgument("tensor " + std::to_string(i) + ": unknown dtype");
    if (!open || buckets.back().dtype != t.dtype || bytes >= threshold_bytes || threshold_bytes == 0) {
      buckets.push_back(Bucket{});
      buckets.back().dtype = t.dtype;
      bytes = 0;
      open = true;
    }
    Bucket& b = buckets.back();
    b.tensors.push_back(i);
    b.offsets.push_back(b.count);
    b.count += t.count;
    bytes += t.count * dtype_size(t.dtype);
  }
  return buckets;
}

}  // namespace tnt
