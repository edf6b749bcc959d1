// Reduction kernels: out = op(inputs[0], ..., inputs[n-1]) elementwise, always in input order, so
// every rank that reduces the same inputs gets bitwise-identical results.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tnt_comm/types.hpp"

namespace tnt {

// `out` may alias any input. avg divides the sum by n (integers: truncating division).
void reduce(DType dtype, ReduceOp op, void* out, const void* const* inputs, int n, std::size_t count);

// buf /= n elementwise, as avg's last step (integers: truncating division).
void divide(DType dtype, void* buf, int n, std::size_t count);

// IEEE half and bfloat16 conversions (round to nearest even), exposed for the tests.
float half_to_float(std::uint16_t h);
std::uint16_t float_to_half(float f);
float bfloat16_to_float(std::uint16_t b);
std::uint16_t float_to_bfloat16(float f);

}  // namespace tnt
