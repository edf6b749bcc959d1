// Small helpers used across the library: clocks and deadlines.
#pragma once

#include <chrono>
#include <string>

namespace tnt {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline deadline_after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                            std::chrono::duration<double>(seconds));
}

inline double seconds_left(Deadline deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

}  // namespace tnt
