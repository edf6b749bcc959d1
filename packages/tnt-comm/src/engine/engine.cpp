#include "engine/engine.hpp"

#include <sched.h>

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TNT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TNT_CPU_RELAX() asm volatile("yield")
#else
#define TNT_CPU_RELAX() ((void)0)
#endif

namespace tnt {

Engine::Engine(Fabric& fabric, double stall_timeout_s, bool oversubscribed)
    : fabric_(fabric), stall_timeout_s_(stall_timeout_s), oversubscribed_(oversubscribed) {
  thread_ = std::thread([this] { thread_main(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(submit_mutex_);
    stop_ = true;
  }
  thread_cv_.notify_all();
  fabric_.doorbell().ring();
  if (thread_.joinable()) thread_.join();
  // Whatever is left (a failed job is not drained) completes with an error, so no Work handle
  // waits on an engine that is gone.
  std::lock_guard<std::mutex> lock(drive_mutex_);
  absorb_incoming();
  auto gone = std::make_exception_ptr(Error("tnt_comm was finalized before this operation completed"));
  for (auto& op : active_) op->finish(fabric_.failed() ? failure_or(gone) : gone);
  active_.clear();
}

std::exception_ptr Engine::failure_or(std::exception_ptr fallback) const {
  try {
    fabric_.throw_failure();
  } catch (...) {
    return std::current_exception();
  }
  return fallback;
}

void Engine::submit(const std::shared_ptr<Operation>& op, bool background) {
  {
    std::lock_guard<std::mutex> lock(submit_mutex_);
    if (fabric_.failed()) {
      try {
        fabric_.throw_failure();
      } catch (...) {
        op->finish(std::current_exception());
      }
      return;
    }
    op->reserve();
    op->set_blocking(!background);
    incoming_.push_back(op);
    incoming_count_.fetch_add(1, std::memory_order_release);
    if (background) ++background_requests_;
  }
  if (background) thread_cv_.notify_one();
  // A driver sleeping on other operations must notice the new one.
  fabric_.doorbell().ring();
}

void Engine::absorb_incoming() {
  if (incoming_count_.load(std::memory_order_acquire) == 0) return;
  std::lock_guard<std::mutex> lock(submit_mutex_);
  for (auto& op : incoming_) {
    op->claim_receives();
    active_.push_back(std::move(op));
  }
  incoming_.clear();
  incoming_count_.store(0, std::memory_order_release);
}

void Engine::fail_all() {
  std::exception_ptr error;
  try {
    fabric_.throw_failure();
  } catch (...) {
    error = std::current_exception();
  }
  absorb_incoming();
  for (auto& op : active_) op->finish(error);
  active_.clear();
}

bool Engine::drive(Operation* target, Deadline deadline) {
  Doorbell bell = fabric_.doorbell();
  Deadline stall = deadline_after(stall_timeout_s_);
  while (true) {
    if (target != nullptr && target->completed()) return true;
    absorb_incoming();
    if (fabric_.failed()) {
      fail_all();  // finishes `target` too, if it was active
      if (target == nullptr) return true;  // nothing left to drain: never spin on a dead fabric
      continue;
    }
    if (target == nullptr && active_.empty()) return true;

    const std::uint32_t seen = bell.value();
    bool advanced = false;
    for (auto& op : active_) {
      Operation::Progress p;
      try {
        p = op->progress();
      } catch (const CollectiveMismatch& e) {
        fabric_.fail(FailureKind::mismatch, -1, e.what(), true);
        break;
      } catch (const std::exception& e) {
        fabric_.fail(FailureKind::other, -1, std::string("rank ") + std::to_string(fabric_.rank()) +
                                                 ": " + e.what(), true);
        break;
      }
      if (p == Operation::Progress::done) {
        op->finish(nullptr);
        advanced = true;
      } else if (p == Operation::Progress::advanced) {
        advanced = true;
      }
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [](const auto& op) { return op->completed(); }),
                  active_.end());
    if (advanced || fabric_.failed()) {
      stall = deadline_after(stall_timeout_s_);
      continue;
    }
    const Deadline now = Clock::now();
    if (now >= stall && !active_.empty()) {
      const Operation& stuck = *active_.front();
      fabric_.fail(FailureKind::timeout, -1,
                   "rank " + std::to_string(fabric_.rank()) + " timed out: no progress for " +
                       format_seconds(stall_timeout_s_) + " in " +
                       stuck.descriptor().describe() + ", waiting for " + stuck.waiting_for() +
                       " (TNT_TIMEOUT_S sets this limit)",
                   true);
      continue;
    }
    if (now >= deadline) return false;
    wait_for_doorbell(seen, deadline, stall);
  }
}

void Engine::wait_for_doorbell(std::uint32_t seen, Deadline deadline, Deadline stall) {
  Doorbell bell = fabric_.doorbell();
  // Spin first: a peer's next message is usually microseconds away. On an oversubscribed host,
  // yield on every turn so the peer we wait for can run on our core.
  const auto spin = std::chrono::microseconds(oversubscribed_ ? 200 : 50);
  const Deadline spin_end = Clock::now() + spin;
  for (int i = 0;; ++i) {
    if (bell.value() != seen) return;
    if (oversubscribed_) {
      sched_yield();
    } else {
      TNT_CPU_RELAX();
    }
    if ((i & 15) == 15 && Clock::now() >= spin_end) break;
  }
  Deadline until = std::min(deadline, stall);
  bell.sleep(seen, std::min(0.5, seconds_left(until)));
}

bool Engine::wait(Operation& op, std::optional<double> timeout_s) {
  Deadline deadline = timeout_s ? deadline_after(*timeout_s) : Deadline::max();
  while (!op.completed()) {
    if (drive_mutex_.try_lock()) {
      std::lock_guard<std::mutex> lock(drive_mutex_, std::adopt_lock);
      if (!drive(&op, deadline)) break;
    } else {
      // The progress thread is driving; it finishes our operation too.
      op.wait_completion(std::min(0.01, std::max(0.0, seconds_left(deadline))));
    }
    if (!op.completed() && Clock::now() >= deadline) break;
  }
  if (!op.completed()) return false;
  if (auto error = op.error()) std::rethrow_exception(error);
  return true;
}

void Engine::drain() {
  std::lock_guard<std::mutex> lock(drive_mutex_);
  drive(nullptr, Deadline::max());
}

void Engine::thread_main() {
  std::uint64_t handled = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(submit_mutex_);
      thread_cv_.wait(lock, [&] { return stop_ || background_requests_ != handled; });
      if (stop_) return;
      handled = background_requests_;
    }
    std::lock_guard<std::mutex> lock(drive_mutex_);
    drive(nullptr, Deadline::max());
  }
}

}  // namespace tnt
