// The fused buffer: where tensors lie in it, and packing them in (with a scale).
#include <algorithm>
#include <cstring>

#include "reduce/kernels.hpp"
#include "tnt_comm/fusion.hpp"

namespace tnt {
namespace {

constexpr std::size_t kAlignBytes = 64;

template <typename T>
void scaled(const T* src, T* dst, std::size_t n, T s) {
  for (std::size_t k = 0; k < n; ++k) dst[k] = src[k] * s;
}

// Half precision: each product computed in float and rounded to the type, as Eigen's half and
// bfloat16 (TensorFlow, PyTorch on CPUs) multiply.
template <float (*ToFloat)(std::uint16_t), std::uint16_t (*FromFloat)(float)>
void scaled16(const std::uint16_t* src, std::uint16_t* dst, std::size_t n, float scale) {
  const float s = ToFloat(FromFloat(scale));
  for (std::size_t k = 0; k < n; ++k) dst[k] = FromFloat(ToFloat(src[k]) * s);
}

bool rounds_to_zero(DType dtype, float scale) {
  switch (dtype) {
    case DType::float16: return half_to_float(float_to_half(scale)) == 0.0f;
    case DType::bfloat16: return bfloat16_to_float(float_to_bfloat16(scale)) == 0.0f;
    default: return scale == 0.0f;
  }
}

}  // namespace

FusedLayout fused_layout(const std::vector<std::size_t>& counts, DType dtype) {
  if (!is_valid(dtype)) throw InvalidArgument("fused_layout: unknown dtype");
  const std::size_t align = std::max<std::size_t>(1, kAlignBytes / dtype_size(dtype));
  FusedLayout layout;
  layout.counts = counts;
  for (std::size_t c : counts) {
    layout.offsets.push_back(layout.count);
    layout.count += (c + align - 1) / align * align;
  }
  return layout;
}

void pack_tensor(const FusedLayout& layout, std::size_t i, const void* src, DType dtype, const float* scale,
                 void* dst) {
  const std::size_t elem = dtype_size(dtype);
  const std::size_t n = layout.counts[i];
  const std::size_t next = i + 1 < layout.offsets.size() ? layout.offsets[i + 1] : layout.count;
  auto* out = static_cast<std::byte*>(dst) + layout.offsets[i] * elem;
  // The padding is summed too, so it must be the same on every rank: zeros.
  std::memset(out + n * elem, 0, (next - layout.offsets[i] - n) * elem);
  if (n == 0) return;
  if (scale == nullptr) {
    std::memcpy(out, src, n * elem);
    return;
  }
  if (rounds_to_zero(dtype, *scale)) {
    std::memset(out, 0, n * elem);  // 0 for NaN and infinite inputs too (IEEE zero is all zero bits)
    return;
  }
  switch (dtype) {
    case DType::float32:
      scaled(static_cast<const float*>(src), reinterpret_cast<float*>(out), n, *scale);
      break;
    case DType::float64:
      scaled(static_cast<const double*>(src), reinterpret_cast<double*>(out), n, static_cast<double>(*scale));
      break;
    case DType::float16:
      scaled16<half_to_float, float_to_half>(static_cast<const std::uint16_t*>(src),
                                             reinterpret_cast<std::uint16_t*>(out), n, *scale);
      break;
    case DType::bfloat16:
      scaled16<bfloat16_to_float, float_to_bfloat16>(static_cast<const std::uint16_t*>(src),
                                                     reinterpret_cast<std::uint16_t*>(out), n, *scale);
      break;
    default:
      throw InvalidArgument("a scale applies to floating-point tensors only");
  }
}

}  // namespace tnt
