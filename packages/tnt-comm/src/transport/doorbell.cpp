#include "transport/doorbell.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace tnt {

// The sleepers count closes the lost-wake-up race: a ringer bumps the bell and then reads the
// count; a sleeper bumps the count and then re-reads the bell. Sequential consistency makes at
// least one of them see the other.
void Doorbell::ring() const {
  bell_->fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_->load(std::memory_order_seq_cst) != 0) {
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(bell_), FUTEX_WAKE, INT_MAX, nullptr,
              nullptr, 0);
  }
}

void Doorbell::sleep(std::uint32_t seen, double timeout_s) const {
  if (timeout_s <= 0) return;
  sleepers_->fetch_add(1, std::memory_order_seq_cst);
  if (bell_->load(std::memory_order_seq_cst) == seen) {
    timespec ts{};
    ts.tv_sec = static_cast<time_t>(timeout_s);
    ts.tv_nsec = static_cast<long>((timeout_s - static_cast<double>(ts.tv_sec)) * 1e9);
    ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(bell_), FUTEX_WAIT, seen, &ts, nullptr,
              0);
  }
  sleepers_->fetch_sub(1, std::memory_order_seq_cst);
}

}  // namespace tnt
