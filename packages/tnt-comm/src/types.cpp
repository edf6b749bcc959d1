#include "tnt_comm/types.hpp"

namespace tnt {

bool is_valid(DType dtype) {
  auto v = static_cast<std::int32_t>(dtype);
  return v >= 0 && v <= static_cast<std::int32_t>(DType::uint8);
}

bool is_valid(ReduceOp op) {
  auto v = static_cast<std::int32_t>(op);
  return v >= 0 && v <= static_cast<std::int32_t>(ReduceOp::avg);
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::float16:
    case DType::bfloat16: return 2;
    case DType::float32:
    case DType::int32: return 4;
    case DType::float64:
    case DType::int64: return 8;
    case DType::uint8: return 1;
  }
  throw InvalidArgument("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
    case DType::uint8: return "uint8";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::prod: return "prod";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
    case ReduceOp::avg: return "avg";
  }
  return "unknown";
}

}  // namespace tnt
