#include "tnt_comm/timeline.hpp"

#include <atomic>
#include <chrono>
#include <mutex>
#include <utility>

namespace tnt::timeline {
namespace {

std::atomic<bool> enabled{false};
std::mutex mutex;
std::vector<Event>& events() {
  static std::vector<Event> recorded;
  return recorded;
}

}  // namespace

bool on() { return enabled.load(std::memory_order_relaxed); }

void set(bool value) { enabled.store(value, std::memory_order_relaxed); }

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void add(Event event) {
  std::lock_guard<std::mutex> lock(mutex);
  events().push_back(std::move(event));
}

std::vector<Event> take() {
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<Event> out;
  out.swap(events());
  return out;
}

}  // namespace tnt::timeline
