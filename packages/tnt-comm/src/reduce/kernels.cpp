#include "reduce/kernels.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace tnt {

float half_to_float(std::uint16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_half(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);
    std::uint32_t e = abs >> 23;
    std::uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    std::uint32_t shift = 126 - e;  // 113 - e + 13
    std::uint32_t r = m >> shift;
    std::uint32_t rem = m & ((1u << shift) - 1);
    std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<std::uint16_t>(sign | r);
  }
  std::uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  std::uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<std::uint16_t>(sign | r);
}

float bfloat16_to_float(std::uint16_t b) {
  std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>(x >> 16);
}

namespace {

// Storage type T, accumulation type A, and how to move between them.
struct Half {
  using T = std::uint16_t;
  using A = float;
  static A load(T v) { return half_to_float(v); }
  static T store(A v) { return float_to_half(v); }
};
struct BFloat16 {
  using T = std::uint16_t;
  using A = float;
  static A load(T v) { return bfloat16_to_float(v); }
  static T store(A v) { return float_to_bfloat16(v); }
};
template <class V>
struct Plain {
  using T = V;
  using A = V;
  static A load(T v) { return v; }
  static T store(A v) { return v; }
};

// Integer sums and products wrap around (computed unsigned: no undefined behaviour).
template <class A>
A add(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <class A>
A mul(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

template <class Traits, ReduceOp Op>
void reduce_typed(void* out_v, const void* const* in_v, int n, std::size_t count) {
  using T = typename Traits::T;
  using A = typename Traits::A;
  constexpr std::size_t kBlock = 1024;  // accumulate a cache-resident block across all inputs
  A acc[kBlock];
  T* out = static_cast<T*>(out_v);
  for (std::size_t base = 0; base < count; base += kBlock) {
    const std::size_t m = std::min(kBlock, count - base);
    const T* first = static_cast<const T*>(in_v[0]) + base;
    for (std::size_t i = 0; i < m; ++i) acc[i] = Traits::load(first[i]);
    for (int k = 1; k < n; ++k) {
      const T* in = static_cast<const T*>(in_v[k]) + base;
      for (std::size_t i = 0; i < m; ++i) {
        A v = Traits::load(in[i]);
        if constexpr (Op == ReduceOp::sum || Op == ReduceOp::avg) {
          acc[i] = add(acc[i], v);
        } else if constexpr (Op == ReduceOp::prod) {
          acc[i] = mul(acc[i], v);
        } else if constexpr (Op == ReduceOp::min) {
          acc[i] = v < acc[i] ? v : acc[i];
        } else {
          acc[i] = v > acc[i] ? v : acc[i];
        }
      }
    }
    if constexpr (Op == ReduceOp::avg) {
      const A divisor = static_cast<A>(n);
      for (std::size_t i = 0; i < m; ++i) acc[i] = acc[i] / divisor;
    }
    for (std::size_t i = 0; i < m; ++i) out[base + i] = Traits::store(acc[i]);
  }
}

template <class Traits>
void reduce_op(ReduceOp op, void* out, const void* const* in, int n, std::size_t count) {
  switch (op) {
    case ReduceOp::sum: return reduce_typed<Traits, ReduceOp::sum>(out, in, n, count);
    case ReduceOp::prod: return reduce_typed<Traits, ReduceOp::prod>(out, in, n, count);
    case ReduceOp::min: return reduce_typed<Traits, ReduceOp::min>(out, in, n, count);
    case ReduceOp::max: return reduce_typed<Traits, ReduceOp::max>(out, in, n, count);
    case ReduceOp::avg: return reduce_typed<Traits, ReduceOp::avg>(out, in, n, count);
  }
  throw InvalidArgument("unknown reduction operator");
}

template <class Traits>
void divide_typed(void* buf_v, int n, std::size_t count) {
  using A = typename Traits::A;
  auto* buf = static_cast<typename Traits::T*>(buf_v);
  const A divisor = static_cast<A>(n);
  for (std::size_t i = 0; i < count; ++i) buf[i] = Traits::store(Traits::load(buf[i]) / divisor);
}

}  // namespace

void divide(DType dtype, void* buf, int n, std::size_t count) {
  if (n <= 0 || count == 0) return;
  switch (dtype) {
    case DType::float16: return divide_typed<Half>(buf, n, count);
    case DType::bfloat16: return divide_typed<BFloat16>(buf, n, count);
    case DType::float32: return divide_typed<Plain<float>>(buf, n, count);
    case DType::float64: return divide_typed<Plain<double>>(buf, n, count);
    case DType::int32: return divide_typed<Plain<std::int32_t>>(buf, n, count);
    case DType::int64: return divide_typed<Plain<std::int64_t>>(buf, n, count);
    case DType::uint8: return divide_typed<Plain<std::uint8_t>>(buf, n, count);
  }
  throw InvalidArgument("unknown dtype");
}

void reduce(DType dtype, ReduceOp op, void* out, const void* const* inputs, int n, std::size_t count) {
  if (n <= 0 || count == 0) return;
  switch (dtype) {
    case DType::float16: return reduce_op<Half>(op, out, inputs, n, count);
    case DType::bfloat16: return reduce_op<BFloat16>(op, out, inputs, n, count);
    case DType::float32: return reduce_op<Plain<float>>(op, out, inputs, n, count);
    case DType::float64: return reduce_op<Plain<double>>(op, out, inputs, n, count);
    case DType::int32: return reduce_op<Plain<std::int32_t>>(op, out, inputs, n, count);
    case DType::int64: return reduce_op<Plain<std::int64_t>>(op, out, inputs, n, count);
    case DType::uint8: return reduce_op<Plain<std::uint8_t>>(op, out, inputs, n, count);
  }
  throw InvalidArgument("unknown dtype");
}

}  // namespace tnt
