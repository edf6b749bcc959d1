// Reduction kernels against a naive reference, for every dtype and operator.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "check.hpp"
#include "reduce/kernels.hpp"

using namespace tnt;

template <class T>
void check_plain(DType dtype) {
  std::mt19937 rng(7);
  for (int n : {1, 2, 3, 5}) {
    for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{1023}, std::size_t{1024},
                              std::size_t{5000}}) {
      std::vector<std::vector<T>> in(static_cast<std::size_t>(n), std::vector<T>(count));
      for (auto& v : in)
        for (auto& x : v) x = static_cast<T>(rng() % 5 + 1);
      std::vector<const void*> ptrs;
      for (auto& v : in) ptrs.push_back(v.data());
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::min, ReduceOp::max, ReduceOp::avg}) {
        std::vector<T> out(count);
        reduce(dtype, op, out.data(), ptrs.data(), n, count);
        for (std::size_t i = 0; i < count; ++i) {
          T e = in[0][i];
          for (int k = 1; k < n; ++k) {
            T v = in[static_cast<std::size_t>(k)][i];
            if (op == ReduceOp::sum || op == ReduceOp::avg) e = static_cast<T>(e + v);
            if (op == ReduceOp::prod) e = static_cast<T>(e * v);
            if (op == ReduceOp::min) e = v < e ? v : e;
            if (op == ReduceOp::max) e = v > e ? v : e;
          }
          if (op == ReduceOp::avg) e = static_cast<T>(e / static_cast<T>(n));
          CHECK(out[i] == e);
        }
      }
    }
  }
}

void check_in_place_and_wraparound() {
  std::vector<std::uint8_t> a(100, 200), b(100, 100);
  const void* ptrs[] = {a.data(), b.data()};
  reduce(DType::uint8, ReduceOp::sum, a.data(), ptrs, 2, a.size());  // out aliases input 0
  CHECK(a[0] == static_cast<std::uint8_t>(300 % 256) && a[99] == 44);
  std::vector<std::int32_t> big{2147483647}, one{1};
  const void* iptrs[] = {big.data(), one.data()};
  reduce(DType::int32, ReduceOp::sum, big.data(), iptrs, 2, 1);
  CHECK(big[0] == -2147483647 - 1);  // wraps, no undefined behaviour
}

void check_half_types() {
  // Conversions round-trip every finite half exactly.
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    CHECK(float_to_half(half_to_float(static_cast<std::uint16_t>(h))) == h);
  }
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(float_to_half(65504.0f) == 0x7bff);
  CHECK(float_to_half(1e6f) == 0x7c00);
  CHECK(std::isnan(half_to_float(float_to_half(NAN))));
  CHECK(float_to_bfloat16(1.0f) == 0x3f80);
  CHECK(bfloat16_to_float(0x4040) == 3.0f);
  std::vector<std::uint16_t> x(3000, float_to_half(1.5f)), y(3000, float_to_half(2.25f)), out(3000);
  const void* ptrs[] = {x.data(), y.data()};
  reduce(DType::float16, ReduceOp::sum, out.data(), ptrs, 2, out.size());
  CHECK(half_to_float(out[2999]) == 3.75f);
  std::vector<std::uint16_t> bx(10, float_to_bfloat16(4.0f)), by(10, float_to_bfloat16(2.0f));
  const void* bptrs[] = {bx.data(), by.data()};
  reduce(DType::bfloat16, ReduceOp::avg, bx.data(), bptrs, 2, 10);
  CHECK(bfloat16_to_float(bx[9]) == 3.0f);
}

// divide() is avg's last step on its own: the same bits as avg over the inputs whose sum it divides.
void check_divide() {
  std::vector<std::int64_t> a{7, -7, 9}, zero(3, 0), avg(3);
  const void* ptrs[] = {a.data(), zero.data(), zero.data()};
  reduce(DType::int64, ReduceOp::avg, avg.data(), ptrs, 3, 3);
  divide(DType::int64, a.data(), 3, 3);
  CHECK(a == avg && a[0] == 2 && a[1] == -2 && a[2] == 3);  // truncating
  std::vector<std::uint16_t> h(5, float_to_half(3.0f));
  divide(DType::float16, h.data(), 4, h.size());
  CHECK(half_to_float(h[4]) == 0.75f);
  std::vector<float> f{1.0f, 2.0f};
  divide(DType::float32, f.data(), 3, f.size());
  CHECK(f[0] == 1.0f / 3.0f && f[1] == 2.0f / 3.0f);
}

int main() {
  check_plain<float>(DType::float32);
  check_plain<double>(DType::float64);
  check_plain<std::int32_t>(DType::int32);
  check_plain<std::int64_t>(DType::int64);
  check_in_place_and_wraparound();
  check_half_types();
  check_divide();
  return finish("kernels");
}
