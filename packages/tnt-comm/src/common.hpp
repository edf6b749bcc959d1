// Small helpers used across the library: clocks and deadlines.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace tnt {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Waits this long or longer (infinity included) have no deadline: a time point that far out
// would overflow the clock and land in the past.
constexpr double kForeverSeconds = 1e9;

inline Deadline deadline_after(double seconds, Deadline from = Clock::now()) {
  if (!(seconds < kForeverSeconds)) return Deadline::max();  // also NaN: never a deadline in the past
  if (seconds <= 0) return from;
  return from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// "10 s", "1.5 s" or "no limit", for messages.
inline std::string format_seconds(double seconds) {
  if (!(seconds < kForeverSeconds)) return "no limit";
  char text[32];
  std::snprintf(text, sizeof text, "%g s", seconds);
  return text;
}

inline double seconds_left(Deadline deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

}  // namespace tnt
