// tnt-comm's allreduce as an XLA FFI handler for CPUs: a compiled Keras-JAX step sums its gradients
// and metric states across ranks without leaving for Python. XLA hands the handler its buffers, so
// the arrays are read where they lie; the sums are written into XLA's result buffers.
//
// One call sums a list of arrays in the buckets Python planned (tnt_comm.plan_buckets, the attribute
// `bucket_ends`): every bucket starts before any is waited for. Its first operand and first result
// are an `order` scalar that Python threads from each call of a step to the next, so that XLA runs
// a step's calls in the order the step made them (a data dependency, whatever its scheduler does).
// With `rows` >= 0 the call first sums the ranks' row counts and scales every array by this rank's
// share rows / total while packing it (a share of 0 gives zeros, also for NaN gradients).
//
// Everything crosses into tnt-comm through its C ABI table (c_api.h), handed over once from Python
// (tnt_jax_set_api), so this library shares the process' one tnt-comm runtime.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tnt_comm/c_api.h"
#include "tnt_comm/error_data.hpp"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

std::atomic<const tnt_comm_api_v3*> g_api{nullptr};

// The last failure of a call, as the JSON of tnt_comm.error_data's fields: XLA passes only a message
// on, and Python raises tnt-comm's own exception from this (tnt_jax_take_failure).
std::mutex g_failure_mutex;
std::string g_failure;

ffi::Error Failed(const tnt_comm_error& e) {
  {
    std::lock_guard<std::mutex> lock(g_failure_mutex);
    g_failure = tnt::error_data_json(e);
  }
  return ffi::Error::Internal(std::string("tnt-comm: ") + e.message);
}

// The collectives of one call: counts the ones in flight, keeps the first failure.
class InFlight {
 public:
  static void Done(void* ctx, const tnt_comm_error* error) {
    auto* self = static_cast<InFlight*>(ctx);
    std::lock_guard<std::mutex> lock(self->mutex_);
    if (error != nullptr && self->failure_.empty()) {
      self->failure_ = tnt::error_data_json(*error);
      self->message_ = error->message;
    }
    if (--self->left_ == 0) self->all_done_.notify_all();
  }

  void Started() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++left_;
  }

  // Waits for every started collective (also after a failed start: they use this object).
  ffi::Error Wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    all_done_.wait(lock, [this] { return left_ == 0; });
    if (failure_.empty()) return ffi::Error::Success();
    {
      std::lock_guard<std::mutex> keep(g_failure_mutex);
      g_failure = failure_;
    }
    return ffi::Error::Internal("tnt-comm: " + message_);
  }

 private:
  std::mutex mutex_;
  std::condition_variable all_done_;
  int left_ = 0;
  std::string failure_;
  std::string message_;
};

int32_t DtypeCode(ffi::DataType type) {
  switch (type) {
    case ffi::DataType::F16: return TNT_COMM_FLOAT16;
    case ffi::DataType::BF16: return TNT_COMM_BFLOAT16;
    case ffi::DataType::F32: return TNT_COMM_FLOAT32;
    case ffi::DataType::F64: return TNT_COMM_FLOAT64;
    case ffi::DataType::S32: return TNT_COMM_INT32;
    case ffi::DataType::S64: return TNT_COMM_INT64;
    case ffi::DataType::U8: return TNT_COMM_UINT8;
    default: return -1;
  }
}

// A bucket's packed buffer: in tnt-comm's shared arena where the rank has one (a large allreduce
// there skips a copy), else on the heap. Kept between calls, by size: a step's buckets have the
// same sizes every time. Calls never overlap (g_call_mutex), so a buffer is never used twice at once.
class Buffers {
 public:
  void* Take(std::size_t bytes, std::size_t index) {
    auto& held = by_size_[bytes];
    while (held.size() <= index) held.push_back(Allocate(bytes));
    return held[index];
  }

 private:
  void* Allocate(std::size_t bytes) {
    void* block = nullptr;
    const tnt_comm_api_v3* api = g_api.load(std::memory_order_acquire);
    if (api->alloc_shared(bytes, &block) == 0 && block != nullptr) return block;
    heap_.emplace_back(bytes);
    return heap_.back().data();
  }

  std::map<std::size_t, std::vector<void*>> by_size_;
  std::vector<std::vector<std::byte>> heap_;  // never shrinks: the pointers above stay valid
};

std::mutex g_call_mutex;
Buffers g_buffers;

ffi::Error Sum(ffi::AnyBuffer order_in, ffi::RemainingArgs arrays, ffi::Result<ffi::AnyBuffer> order_out,
               ffi::RemainingRets sums, ffi::Span<const int64_t> bucket_ends, int64_t rows) {
  const tnt_comm_api_v3* api = g_api.load(std::memory_order_acquire);
  if (api == nullptr) return ffi::Error::Internal("tnt_sum: tnt_comm's C ABI was not handed over");
  if (arrays.size() != sums.size()) return ffi::Error::InvalidArgument("tnt_sum: as many results as arrays");
  std::lock_guard<std::mutex> call(g_call_mutex);
  std::memcpy(order_out->untyped_data(), order_in.untyped_data(), order_in.size_bytes());

  float share = 1.0f;
  if (rows >= 0) {  // this rank's share of the global batch: rows / (every rank's rows)
    std::int64_t total = rows;
    InFlight count;
    count.Started();
    if (api->allreduce_async(0, &total, &total, 1, TNT_COMM_INT64, TNT_COMM_SUM, InFlight::Done, &count) != 0) {
      return Failed(*api->last_error());
    }
    if (ffi::Error e = count.Wait(); e.failure()) return e;
    share = total > 0 ? static_cast<float>(rows) / static_cast<float>(total) : 0.0f;
  }
  const float* scale = rows >= 0 ? &share : nullptr;

  struct Bucket {
    std::size_t first, end;
    void* fused;  // nullptr: summed straight into the one result
    std::vector<std::uint64_t> offsets;
    std::size_t element;
  };
  std::vector<Bucket> buckets;
  InFlight flight;
  ffi::Error started = ffi::Error::Success();
  std::size_t first = 0;
  for (int64_t end_signed : bucket_ends) {
    const auto end = static_cast<std::size_t>(end_signed);
    if (end <= first || end > arrays.size()) {
      started = ffi::Error::InvalidArgument("tnt_sum: bucket_ends must rise to the number of arrays");
      break;
    }
    // (An invalid bucket stops the loop, not the call: the buckets already started must end first.)
    std::vector<const void*> srcs;
    std::vector<std::uint64_t> counts;
    ffi::DataType type = ffi::DataType::INVALID;
    for (std::size_t i = first; i < end && started.success(); ++i) {
      auto array = arrays.get<ffi::AnyBuffer>(i);
      if (array.has_error()) {
        started = array.error();
      } else if (i != first && array->element_type() != type) {
        started = ffi::Error::InvalidArgument("tnt_sum: one dtype per bucket");
      } else {
        type = array->element_type();
        srcs.push_back(array->untyped_data());
        counts.push_back(array->element_count());
      }
    }
    auto out = sums.get<ffi::AnyBuffer>(first);
    if (started.success() && out.has_error()) started = out.error();
    const int32_t dtype = DtypeCode(type);
    if (started.success() && dtype < 0) {
      started = ffi::Error::InvalidArgument("tnt_sum: an element type tnt-comm cannot sum");
    }
    if (started.failure()) break;
    Bucket bucket{first, end, nullptr, std::vector<std::uint64_t>(end - first), ffi::ByteWidth(type)};
    const std::uint64_t fused_count =
        api->fused_layout(static_cast<std::uint32_t>(end - first), counts.data(), dtype, bucket.offsets.data());
    int rc;
    flight.Started();
    if (end - first == 1 && scale == nullptr) {
      rc = api->allreduce_async(0, srcs[0], (*out)->untyped_data(), counts[0], dtype, TNT_COMM_SUM, InFlight::Done,
                                &flight);
    } else {
      // One tensor whose layout needs no padding is packed (scaled) straight into its result.
      bucket.fused = (end - first == 1 && fused_count == counts[0])
                         ? (*out)->untyped_data()
                         : g_buffers.Take(fused_count * bucket.element, buckets.size());
      rc = api->fused_allreduce_async(0, static_cast<std::uint32_t>(end - first), srcs.data(), counts.data(),
                                      bucket.fused, dtype, TNT_COMM_SUM, scale, InFlight::Done, &flight);
      if (bucket.fused == (*out)->untyped_data()) bucket.fused = nullptr;
    }
    if (rc != 0) {
      InFlight::Done(&flight, nullptr);  // it never started
      started = Failed(*api->last_error());
      break;
    }
    buckets.push_back(std::move(bucket));
    first = end;
  }
  if (started.success() && first != arrays.size()) {
    started = ffi::Error::InvalidArgument("tnt_sum: bucket_ends must end at the number of arrays");
  }
  ffi::Error waited = flight.Wait();  // in flight or not, nothing may still write into them
  if (started.failure()) return started;
  if (waited.failure()) return waited;
  for (const Bucket& bucket : buckets) {
    if (bucket.fused == nullptr) continue;
    for (std::size_t i = bucket.first; i < bucket.end; ++i) {
      auto out = sums.get<ffi::AnyBuffer>(i);
      if (out.has_error()) return out.error();
      std::memcpy((*out)->untyped_data(),
                  static_cast<const std::byte*>(bucket.fused) + bucket.offsets[i - bucket.first] * bucket.element,
                  (*out)->size_bytes());
    }
  }
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(TntSum, Sum,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets()
                                  .Attr<ffi::Span<const int64_t>>("bucket_ends")
                                  .Attr<int64_t>("rows"));

// Hands tnt_comm's C ABI table (from the capsule tnt_comm._core._C_API) to this library. Returns 0
// on success (also when the same table is handed again), 1 for a null table, 2 for a table of
// another ABI version, 3 when a different table was already set.
extern "C" __attribute__((visibility("default"))) int tnt_jax_set_api(const void* table) {
  const auto* api = static_cast<const tnt_comm_api_v3*>(table);
  if (api == nullptr) return 1;
  if (api->version != TNT_COMM_C_API_VERSION) return 2;
  const tnt_comm_api_v3* expected = nullptr;
  if (g_api.compare_exchange_strong(expected, api, std::memory_order_acq_rel)) return 0;
  return expected == api ? 0 : 3;
}

// The ABI version this library was compiled for, for error messages.
extern "C" __attribute__((visibility("default"))) int tnt_jax_api_version(void) { return TNT_COMM_C_API_VERSION; }

// Copies the last failure's JSON (NUL-terminated) into `out` and forgets it; returns its length, 0
// where there is none, or the length needed (without writing) where `capacity` is too small.
extern "C" __attribute__((visibility("default"))) std::size_t tnt_jax_take_failure(char* out, std::size_t capacity) {
  std::lock_guard<std::mutex> lock(g_failure_mutex);
  const std::size_t n = g_failure.size();
  if (n == 0 || n + 1 > capacity) return n;
  std::memcpy(out, g_failure.c_str(), n + 1);
  g_failure.clear();
  return n;
}
