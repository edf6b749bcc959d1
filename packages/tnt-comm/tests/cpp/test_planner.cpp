// Tensor fusion: bucket boundaries by threshold and dtype, in the order given; the fused buffer's
// layout; packing with and without a scale.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "check.hpp"
#include "reduce/kernels.hpp"
#include "tnt_comm/fusion.hpp"

using namespace tnt;

int main() {
  std::vector<TensorSpec> t = {{10, DType::float32}, {20, DType::float32}, {300, DType::float32},
                               {5, DType::float64},  {5, DType::float64},  {1, DType::float32}};
  auto none = plan_buckets(t, 0);
  CHECK(none.size() == t.size());
  auto small = plan_buckets(t, 100);  // closes once a bucket holds >= 100 bytes
  CHECK(small.size() == 4);
  CHECK((small[0].tensors == std::vector<std::size_t>{0, 1}));  // 40 + 80 bytes >= 100: closed
  CHECK((small[0].layout.offsets == std::vector<std::size_t>{0, 16}));  // 64-byte aligned: 16 floats
  CHECK(small[0].layout.count == 48);  // 16 + 20 rounded up to 32
  CHECK((small[1].tensors == std::vector<std::size_t>{2}));
  CHECK((small[2].tensors == std::vector<std::size_t>{3, 4}));  // a dtype change opens a bucket
  CHECK(small[2].dtype == DType::float64);
  CHECK((small[3].tensors == std::vector<std::size_t>{5}));
  auto huge = plan_buckets(t, 1u << 30);
  CHECK(huge.size() == 3);  // only dtype changes split
  auto exact = plan_buckets({{25, DType::float32}, {25, DType::float32}, {1, DType::float32}}, 100);
  CHECK(exact.size() == 3);  // exactly 100 bytes is enough to close a bucket
  CHECK(plan_buckets({}, 10).empty());
  bool threw = false;
  try {
    plan_buckets({{1, static_cast<DType>(42)}}, 0);
  } catch (const InvalidArgument&) {
    threw = true;
  }
  CHECK(threw);

  // Layout: every tensor at a multiple of 64 bytes.
  const FusedLayout d = fused_layout({3, 8, 0, 9}, DType::float64);
  CHECK((d.offsets == std::vector<std::size_t>{0, 8, 16, 16}) && d.count == 32);
  const FusedLayout h = fused_layout({33}, DType::float16);
  CHECK(h.count == 64);

  // Packing: copies, zeroes the padding (whatever was there), and scales as the dtype multiplies.
  std::vector<float> buf(48, 7.0f);
  const FusedLayout f = fused_layout({3, 20}, DType::float32);
  const float a[3] = {1, 2, 3};
  std::vector<float> b(20, 0.5f);
  const float third = 1.0f / 3.0f;
  pack_tensor(f, 0, a, DType::float32, nullptr, buf.data());
  pack_tensor(f, 1, b.data(), DType::float32, &third, buf.data());
  CHECK(buf[0] == 1 && buf[2] == 3 && buf[3] == 0 && buf[15] == 0);
  CHECK(f.count == 48);
  CHECK(buf[16] == 0.5f * third && buf[16 + 19] == 0.5f * third && buf[36] == 0 && buf[47] == 0);
  // A zero scale gives zeros even for NaN and infinity (a rank without samples).
  const float bad[3] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1};
  const float zero = 0.0f;
  pack_tensor(f, 0, bad, DType::float32, &zero, buf.data());
  CHECK(buf[0] == 0 && buf[1] == 0 && buf[2] == 0 && !std::signbit(buf[0]));
  // float16: the scale is rounded to half first, and each product to half (0.1 is not exact).
  const std::uint16_t x16[1] = {float_to_half(3.0f)};
  std::uint16_t y16[32];
  const float tenth = 0.1f;
  pack_tensor(fused_layout({1}, DType::float16), 0, x16, DType::float16, &tenth, y16);
  CHECK(y16[0] == float_to_half(3.0f * half_to_float(float_to_half(0.1f))));
  // A scale too small for float16 rounds to 0: zeros.
  const float tiny = 1e-9f;
  pack_tensor(fused_layout({1}, DType::float16), 0, x16, DType::float16, &tiny, y16);
  CHECK(y16[0] == 0);
  // Integers take no scale.
  const std::int32_t ints[2] = {1, 2};
  std::int32_t out[16];
  bool refused = false;
  try {
    pack_tensor(fused_layout({2}, DType::int32), 0, ints, DType::int32, &third, out);
  } catch (const InvalidArgument&) {
    refused = true;
  }
  CHECK(refused);
  return finish("planner");
}
