// A futex-backed doorbell: every notification that lands in a rank's segment rings it, and a rank
// that has nothing to do sleeps on it instead of spinning. Works across processes because the
// words live in shared memory (non-private futexes).
#pragma once

#include <atomic>
#include <cstdint>

namespace tnt {

class Doorbell {
 public:
  Doorbell() = default;
  Doorbell(std::atomic<std::uint32_t>* bell, std::atomic<std::uint32_t>* sleepers)
      : bell_(bell), sleepers_(sleepers) {}

  void ring() const;
  std::uint32_t value() const { return bell_->load(std::memory_order_acquire); }
  // Sleeps until the bell no longer reads `seen`, or `timeout_s` passes.
  void sleep(std::uint32_t seen, double timeout_s) const;

 private:
  std::atomic<std::uint32_t>* bell_ = nullptr;
  std::atomic<std::uint32_t>* sleepers_ = nullptr;
};

}  // namespace tnt
