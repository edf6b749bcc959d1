// The timeline: when each operation was submitted, taken in by the engine and completed, and how
// long callers were blocked waiting, recorded only while it is switched on (for a job's trace:
// tnt_comm.timeline_start). Off, an operation pays one relaxed atomic load.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tnt::timeline {

// A part of an operation that runs after the one before it (the host-aware allreduce's reduction
// within the host, its ring across hosts, ...): it begins at begin_ns and ends where the next begins,
// the last where the operation ends.
struct Phase {
  std::string name;
  std::int64_t begin_ns = 0;
};

struct Event {
  std::string name;  // "allreduce", ..., or "wait" (a caller blocked on an operation)
  std::string algorithm;  // how it ran ("direct", "host-aware", ...), where there is a choice
  std::uint64_t group = 0;
  std::uint64_t call = 0;  // the call's number in its group
  std::uint64_t bytes = 0;
  std::int64_t submitted_ns = 0;  // steady clock (CLOCK_MONOTONIC), as time.monotonic_ns()
  std::int64_t started_ns = 0;    // when the engine took it in (behind the operations before it)
  std::int64_t ended_ns = 0;
  bool blocking = false;  // a blocking call (the caller drives it), not a non-blocking one
  bool failed = false;
  std::vector<Phase> phases;  // empty where the algorithm runs as one piece
};

bool on();
void set(bool enabled);
std::int64_t now_ns();
void add(Event event);
// The events recorded so far, oldest first; the record is emptied.
std::vector<Event> take();

}  // namespace tnt::timeline
