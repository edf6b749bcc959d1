// The C ABI table (c_api.h) over the one runtime.
#include "tnt_comm/c_api.h"

#include <string>

#include "tnt_comm/runtime.hpp"

namespace {

thread_local std::string t_last_error;

int fail(const std::exception& e) {
  t_last_error = e.what();
  return 1;
}

void report(tnt_comm_done_fn done, void* ctx, const std::exception_ptr& error) {
  if (!error) {
    done(ctx, nullptr);
    return;
  }
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    done(ctx, e.what());
  }
}

int api_rank() {
  try {
    return tnt::Runtime::init().rank();
  } catch (const std::exception& e) {
    fail(e);
    return -1;
  }
}
int api_size() {
  try {
    return tnt::Runtime::init().size();
  } catch (const std::exception& e) {
    fail(e);
    return -1;
  }
}

int api_allreduce(const void* src, void* dst, uint64_t count, int32_t dtype, int32_t op,
                  tnt_comm_done_fn done, void* ctx) {
  try {
    tnt::Runtime::init().world().allreduce_async(
        src, dst, count, static_cast<tnt::DType>(dtype), static_cast<tnt::ReduceOp>(op),
        [done, ctx](std::exception_ptr e) { report(done, ctx, e); });
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

int api_broadcast(void* buf, uint64_t count, int32_t dtype, int32_t root, tnt_comm_done_fn done,
                  void* ctx) {
  try {
    tnt::Runtime::init().world().broadcast_async(
        buf, count, static_cast<tnt::DType>(dtype), root,
        [done, ctx](std::exception_ptr e) { report(done, ctx, e); });
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

const char* api_last_error() { return t_last_error.c_str(); }

const tnt_comm_api_v1 kTable = {TNT_COMM_C_API_VERSION, api_rank,      api_size,
                                api_allreduce,          api_broadcast, api_last_error};

}  // namespace

extern "C" const tnt_comm_api_v1* tnt_comm_api(void) { return &kTable; }
