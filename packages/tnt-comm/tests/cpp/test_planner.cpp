// The fusion planner: bucket boundaries by threshold and dtype, in the order given.
#include "check.hpp"
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
  CHECK((small[0].offsets == std::vector<std::size_t>{0, 10}));
  CHECK(small[0].count == 30);
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
  return finish("planner");
}
