#include <cstring>

#include "tnt_comm/fused_allreduce.hpp"
#include "tnt_comm/runtime.hpp"

namespace tnt {

struct FusedAllreduce::BucketState {
  std::shared_ptr<void> memory;  // the buffer: in the shared arena where the rank has one
  std::byte* buffer = nullptr;   // memory.get()
  std::vector<bool> started;  // by position in the bucket
  std::size_t started_count = 0;
  std::size_t waited_count = 0;
  bool launched = false;
  Work work;
};

FusedAllreduce::FusedAllreduce(Group& group, std::vector<TensorSpec> tensors,
                               std::size_t threshold_bytes, ReduceOp op)
    : tensors_(std::move(tensors)), op_(op) {
  try {
    group_ = group.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    throw InvalidArgument("FusedAllreduce: pass a group made by Runtime::world_group() or new_group()");
  }
  if (!is_valid(op)) throw InvalidArgument("FusedAllreduce: unknown reduction operator");
  buckets_ = plan_buckets(tensors_, threshold_bytes);
  bucket_of_.resize(tensors_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto state = std::make_unique<BucketState>();
    const std::size_t bytes = buckets_[b].layout.count * dtype_size(buckets_[b].dtype);
    Runtime* rt = Runtime::get();
    state->memory = rt != nullptr && bytes > 0 ? rt->allocate_shared(bytes) : nullptr;
    if (!state->memory) {
      auto own = std::make_shared<std::vector<std::byte>>(bytes);
      state->memory = std::shared_ptr<void>(own, own->data());  // owns the vector, points at its data
    }
    state->buffer = static_cast<std::byte*>(state->memory.get());
    state->started.assign(buckets_[b].tensors.size(), false);
    state_.push_back(std::move(state));
    for (std::size_t t : buckets_[b].tensors) bucket_of_[t] = b;
  }
}

FusedAllreduce::~FusedAllreduce() {
  // In-flight buckets write into our buffers: let them finish first.
  for (auto& s : state_) {
    if (s->launched) {
      try {
        s->work.wait();
      } catch (const Error&) {
        // Reported to whoever waited; nothing more to do while tearing down.
      }
    }
  }
}

namespace {
std::size_t position_in(const Bucket& b, std::size_t tensor) { return tensor - b.tensors.front(); }
}  // namespace

void FusedAllreduce::start(std::size_t i, const void* data, const float* scale) {
  if (i >= tensors_.size()) {
    throw InvalidArgument("FusedAllreduce.start: tensor " + std::to_string(i) + " of " +
                          std::to_string(tensors_.size()));
  }
  const std::size_t b = bucket_of_[i];
  BucketState& s = *state_[b];
  const std::size_t pos = position_in(buckets_[b], i);
  if (s.started[pos]) {
    throw InvalidArgument("FusedAllreduce.start: tensor " + std::to_string(i) +
                          " was already started in this round; wait for it first");
  }
  pack_tensor(buckets_[b].layout, pos, data, buckets_[b].dtype, scale, s.buffer);
  s.started[pos] = true;
  ++s.started_count;
  launch_ready_buckets();
}

void FusedAllreduce::launch_ready_buckets() {
  while (next_launch_ < buckets_.size()) {
    BucketState& s = *state_[next_launch_];
    const Bucket& b = buckets_[next_launch_];
    if (s.started_count != b.tensors.size()) return;
    s.work = group_->allreduce_async(s.buffer, s.buffer, b.layout.count, b.dtype, op_);
    s.launched = true;
    ++next_launch_;
  }
}

bool FusedAllreduce::is_ready(std::size_t i) const {
  if (i >= tensors_.size()) return false;
  const BucketState& s = *state_[bucket_of_[i]];
  return s.launched && s.work.is_completed();
}

void FusedAllreduce::wait(std::size_t i, void* out) {
  if (i >= tensors_.size()) {
    throw InvalidArgument("FusedAllreduce.wait: tensor " + std::to_string(i) + " of " +
                          std::to_string(tensors_.size()));
  }
  const std::size_t b = bucket_of_[i];
  BucketState& s = *state_[b];
  const std::size_t pos = position_in(buckets_[b], i);
  if (!s.started[pos]) {
    throw InvalidArgument("FusedAllreduce.wait: tensor " + std::to_string(i) + " was not started");
  }
  if (!s.launched) {
    throw InvalidArgument("FusedAllreduce.wait: tensor " + std::to_string(i) +
                          "'s bucket cannot start before every tensor of it and of earlier "
                          "buckets is started (this would deadlock)");
  }
  s.work.wait();
  const std::size_t elem = dtype_size(buckets_[b].dtype);
  std::memcpy(out, s.buffer + buckets_[b].layout.offsets[pos] * elem, tensors_[i].count * elem);
  s.started[pos] = false;
  if (++s.waited_count == buckets_[b].tensors.size()) {
    s.started_count = 0;
    s.waited_count = 0;
    s.launched = false;
    s.work = Work();
  }
  // A new round starts once every tensor of this one has been collected.
  if (++round_waited_ == tensors_.size()) {
    round_waited_ = 0;
    next_launch_ = 0;
  }
}

}  // namespace tnt
