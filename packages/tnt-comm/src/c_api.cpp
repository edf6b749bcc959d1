// The C ABI table (c_api.h) over the one runtime.
#include "tnt_comm/c_api.h"

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <vector>

#include "tnt_comm/fusion.hpp"
#include "tnt_comm/group.hpp"
#include "tnt_comm/runtime.hpp"
#include "tnt_comm/types.hpp"

namespace {

// What this file relies on, checked when it compiles: the C++ enums take the C codes (codes.h), and
// the table is the version the header declares.
static_assert(static_cast<int32_t>(tnt::DType::float16) == TNT_COMM_FLOAT16 &&
                  static_cast<int32_t>(tnt::DType::bfloat16) == TNT_COMM_BFLOAT16 &&
                  static_cast<int32_t>(tnt::DType::float32) == TNT_COMM_FLOAT32 &&
                  static_cast<int32_t>(tnt::DType::float64) == TNT_COMM_FLOAT64 &&
                  static_cast<int32_t>(tnt::DType::int32) == TNT_COMM_INT32 &&
                  static_cast<int32_t>(tnt::DType::int64) == TNT_COMM_INT64 &&
                  static_cast<int32_t>(tnt::DType::uint8) == TNT_COMM_UINT8,
              "tnt::DType must take the element type codes of codes.h");
static_assert(static_cast<int32_t>(tnt::ReduceOp::sum) == TNT_COMM_SUM &&
                  static_cast<int32_t>(tnt::ReduceOp::prod) == TNT_COMM_PROD &&
                  static_cast<int32_t>(tnt::ReduceOp::min) == TNT_COMM_MIN &&
                  static_cast<int32_t>(tnt::ReduceOp::max) == TNT_COMM_MAX &&
                  static_cast<int32_t>(tnt::ReduceOp::avg) == TNT_COMM_AVG,
              "tnt::ReduceOp must take the reduction codes of codes.h");
static_assert(TNT_COMM_C_API_VERSION == 3, "the table below is version 3 of c_api.h");

// An error and the storage its C view points into.
class CError {
 public:
  explicit CError(const std::exception& e) : message_(e.what()) {
    view_.kind = kind_of(e);
    if (const auto* err = dynamic_cast<const tnt::Error*>(&e)) {
      const tnt::ErrorDetail& d = err->detail();
      ranks_.assign(d.ranks.begin(), d.ranks.end());
      operation_ = d.operation;
      mine_ = d.mine;
      theirs_ = d.theirs;
      peer_error_ = d.peer_error;
      view_.group = d.group;
      view_.call = d.call;
    }
    view_.message = message_.c_str();
    view_.ranks = ranks_.data();
    view_.num_ranks = static_cast<uint32_t>(ranks_.size());
    view_.operation = operation_.c_str();
    view_.mine = mine_.c_str();
    view_.theirs = theirs_.c_str();
    view_.peer_error = peer_error_.c_str();
  }
  CError(const CError&) = delete;
  CError& operator=(const CError&) = delete;
  const tnt_comm_error* view() const { return &view_; }

 private:
  static int32_t kind_of(const std::exception& e) {
    if (dynamic_cast<const tnt::CollectiveMismatch*>(&e)) return TNT_COMM_COLLECTIVE_MISMATCH;
    if (dynamic_cast<const tnt::PeerFailure*>(&e)) return TNT_COMM_PEER_FAILURE;
    if (dynamic_cast<const tnt::Timeout*>(&e)) return TNT_COMM_TIMEOUT;
    if (dynamic_cast<const tnt::InvalidArgument*>(&e)) return TNT_COMM_INVALID_ARGUMENT;
    if (dynamic_cast<const tnt::Error*>(&e)) return TNT_COMM_ERROR;
    return TNT_COMM_OTHER;
  }

  std::string message_, operation_, mine_, theirs_, peer_error_;
  std::vector<int32_t> ranks_;
  tnt_comm_error view_{};
};

thread_local std::unique_ptr<CError> t_last_error;

int fail(const std::exception& e) {
  t_last_error = std::make_unique<CError>(e);
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
    const CError c(e);
    done(ctx, c.view());
  }
}

// Held by the caller while it starts a call: a group's last owner may drop it meanwhile.
std::shared_ptr<tnt::Group> group_of(uint64_t id) {
  std::shared_ptr<tnt::Group> group = tnt::Runtime::init().find_group(id);
  if (!group) {
    throw tnt::InvalidArgument("no group with id " + std::to_string(id) +
                               " lives on this rank (made with new_group and not dropped); 0 is the world");
  }
  return group;
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

int api_allreduce(uint64_t group, const void* src, void* dst, uint64_t count, int32_t dtype, int32_t op,
                  tnt_comm_done_fn done, void* ctx) {
  try {
    group_of(group)->allreduce_async(src, dst, count, static_cast<tnt::DType>(dtype), static_cast<tnt::ReduceOp>(op),
                                    [done, ctx](std::exception_ptr e) { report(done, ctx, e); });
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

int api_broadcast(uint64_t group, void* buf, uint64_t count, int32_t dtype, int32_t root, tnt_comm_done_fn done,
                  void* ctx) {
  try {
    group_of(group)->broadcast_async(buf, count, static_cast<tnt::DType>(dtype), root,
                                    [done, ctx](std::exception_ptr e) { report(done, ctx, e); });
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// The blocks alloc_shared handed out, by address: each keeps its part of the arena (and the
// arena's mapping) alive until free_shared.
std::mutex g_blocks_mutex;
std::unordered_map<void*, std::shared_ptr<void>>& blocks() {
  // Never destroyed (the one deliberate leak): tensors may be freed by threads still running at exit.
  static auto* held = new std::unordered_map<void*, std::shared_ptr<void>>();
  return *held;
}

int api_alloc_shared(uint64_t bytes, void** block) {
  try {
    *block = nullptr;
    std::shared_ptr<void> memory = tnt::Runtime::init().allocate_shared(bytes);
    if (!memory) return 0;
    std::lock_guard<std::mutex> lock(g_blocks_mutex);
    *block = memory.get();
    blocks().emplace(memory.get(), std::move(memory));
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

void api_free_shared(void* block) {
  if (block == nullptr) return;
  std::shared_ptr<void> memory;  // released after the unlock
  std::lock_guard<std::mutex> lock(g_blocks_mutex);
  auto it = blocks().find(block);
  if (it == blocks().end()) return;
  memory = std::move(it->second);
  blocks().erase(it);
}

tnt::FusedLayout layout_of(uint32_t n, const uint64_t* counts, int32_t dtype) {
  std::vector<std::size_t> sizes(counts, counts + n);
  return tnt::fused_layout(sizes, static_cast<tnt::DType>(dtype));
}

uint64_t api_fused_layout(uint32_t n, const uint64_t* counts, int32_t dtype, uint64_t* offsets) {
  try {
    const tnt::FusedLayout layout = layout_of(n, counts, dtype);
    for (uint32_t i = 0; i < n; ++i) offsets[i] = layout.offsets[i];
    return layout.count;
  } catch (const std::exception& e) {
    fail(e);
    return 0;
  }
}

int api_fused_allreduce(uint64_t group, uint32_t n, const void* const* srcs, const uint64_t* counts, void* dst,
                        int32_t dtype, int32_t op, const float* scale, tnt_comm_done_fn done, void* ctx) {
  try {
    std::shared_ptr<tnt::Group> g = group_of(group);
    const tnt::FusedLayout layout = layout_of(n, counts, dtype);
    for (uint32_t i = 0; i < n; ++i) tnt::pack_tensor(layout, i, srcs[i], static_cast<tnt::DType>(dtype), scale, dst);
    g->allreduce_async(dst, dst, layout.count, static_cast<tnt::DType>(dtype), static_cast<tnt::ReduceOp>(op),
                       [done, ctx](std::exception_ptr e) { report(done, ctx, e); });
    return 0;
  } catch (const std::exception& e) {
    return fail(e);
  }
}

const tnt_comm_error* api_last_error() {
  if (!t_last_error) {
    static const tnt_comm_error kNone = {TNT_COMM_ERROR, "no error", nullptr, 0, "", 0, -1, "", "", ""};
    return &kNone;
  }
  return t_last_error->view();
}

const tnt_comm_api_v3 kTable = {TNT_COMM_C_API_VERSION, api_rank,       api_size,
                                api_allreduce,          api_broadcast,  api_last_error,
                                api_alloc_shared,       api_free_shared, api_fused_layout,
                                api_fused_allreduce};

}  // namespace

extern "C" const tnt_comm_api_v3* tnt_comm_api(void) { return &kTable; }
