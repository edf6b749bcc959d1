#include "engine/engine.hpp"

#include "tnt_comm/timeline.hpp"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TNT_CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
#define TNT_CPU_RELAX() asm volatile("yield")
#else
#define TNT_CPU_RELAX() ((void)0)
#endif

namespace tnt {
namespace {

constexpr int kBlockedSpinUs = 1000;
// How long a rank whose write to a peer failed waits for its receiver to learn why the peer left.
constexpr double kPeerWordsWaitS = 2.0;
// After this long without progress, full message windows are relieved (Channel::relieve): long
// enough that a rank waiting on a slow peer in a large allreduce rarely copies anything, short
// enough that operations of different groups waiting on each other's slots lose little time.
constexpr auto kReliefAfter = std::chrono::milliseconds(10);

}  // namespace

Engine::Engine(Fabric& fabric, std::vector<Channel*> channels, double stall_timeout_s, bool oversubscribed)
    : fabric_(fabric),
      channels_(std::move(channels)),
      stall_timeout_s_(stall_timeout_s),
      oversubscribed_(oversubscribed) {
  fabric_.set_status([this](std::uint64_t key, std::uint64_t seq) { return status(key, seq); });
  thread_ = std::thread([this] { thread_main(); });
}

Engine::~Engine() {
  fabric_.set_status(nullptr);  // the receiver thread must not call into a dying engine
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
        fabric_.throw_failure(op->descriptor().detail({}), op->descriptor().describe());
      } catch (...) {
        op->finish(std::current_exception());
      }
      return;
    }
    op->reserve();
    op->set_blocking(!background);
    if (timeline::on()) op->mark_submitted(timeline::now_ns());
    if (op->descriptor().kind != Kind::p2p) {
      std::uint64_t& made = calls_made_[op->descriptor().group];
      made = std::max(made, op->descriptor().seq + 1);
    }
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
  const std::int64_t now = timeline::on() ? timeline::now_ns() : 0;
  for (auto& op : incoming_) {
    op->claim_receives();
    if (now != 0) op->mark_started(now);
    active_.push_back(std::move(op));
  }
  incoming_.clear();
  incoming_count_.store(0, std::memory_order_release);
}

void Engine::fail_all() {
  absorb_incoming();
  // What a peer sent before it died has landed (in our segment, or through the receiver before
  // it saw the connection close): an operation that has everything it needs still completes,
  // in order, so a rank does not fail a call its peer finished. The first that cannot stops this.
  for (auto& op : active_) {
    bool done = false;
    try {
      done = op->progress() == Operation::Progress::done;
    } catch (...) {
      done = false;
    }
    if (!done) break;
    op->finish(nullptr);
  }
  for (auto& op : active_) {
    if (op->completed()) continue;
    try {
      fabric_.throw_failure(op->descriptor().detail({}), op->descriptor().describe());  // the error, naming this call
    } catch (...) {
      op->finish(std::current_exception());
    }
  }
  active_.clear();
}

bool Engine::drive(Operation* target, Deadline deadline) {
  Doorbell bell = fabric_.doorbell();
  Deadline moved = Clock::now();  // when a pass last advanced an operation
  std::vector<bool> gone;  // peers known to have left before this pass began
  while (true) {
    if (target != nullptr && target->completed()) return true;
    // Read before the pass: whatever such a peer sent had landed before it said goodbye.
    if (fabric_.departures() != 0) {
      gone.assign(static_cast<std::size_t>(fabric_.size()), false);
      for (int r = 0; r < fabric_.size(); ++r) gone[static_cast<std::size_t>(r)] = fabric_.departed(r);
    }
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
        if (p == Operation::Progress::done) fabric_.complete_writes();
      } catch (const CollectiveMismatch& e) {
        fabric_.fail(FailureKind::mismatch, e.detail(), e.what(), true);
        break;
      } catch (const PeerFailure& e) {
        // A write to a peer found its connection gone. The receiver thread names the cause within
        // moments, in the peer's own words where it left some (its abort frame arrived before its
        // connection closed): that is the failure to report, not our broken write.
        const Deadline until = deadline_after(kPeerWordsWaitS);
        while (!fabric_.failed() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        fabric_.fail(FailureKind::peer, op->descriptor().detail({e.rank()}), e.what(), true);
        break;
      } catch (const std::exception& e) {
        fabric_.fail(FailureKind::other, op->descriptor().detail({}), std::string("rank ") + std::to_string(fabric_.rank()) +
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
      moved = Clock::now();
      continue;
    }
    if (!gone.empty() && !active_.empty()) {
      check_departed(gone);
      if (fabric_.failed()) continue;
    }
    const Deadline now = Clock::now();
    const Deadline stall = deadline_after(stall_timeout_s_, moved);
    const Deadline relief = moved + kReliefAfter;
    if (now >= stall && !active_.empty()) {
      fail_stalled(*active_.front());
      continue;
    }
    if (now >= deadline) return false;
    // Quiet for a while: free the slots of peers that can send nothing more. Every message those
    // peers still have for us can then land, whatever order our operations use them in, so
    // operations that wait on each other across groups all complete. Full windows refilled while
    // we stay quiet are relieved as they fill (the peers' writes ring our doorbell).
    if (now >= relief) {
      for (Channel* c : channels_) {
        if (c != nullptr) c->relieve();
      }
    }
    wait_for_doorbell(seen, std::min({deadline, stall, now >= relief ? Deadline::max() : relief}),
                      target != nullptr);
  }
}

void Engine::wait_for_doorbell(std::uint32_t seen, Deadline until, bool caller_blocked) {
  Doorbell bell = fabric_.doorbell();
  // Spin first: a peer's next message is usually microseconds away. On an oversubscribed host,
  // yield on every turn so the peer we wait for can run on our core. A caller blocked in its call
  // has nothing else to do: it spins longer (a peer's part of a large allreduce on many ranks is
  // often over 50 us away), since every sleep costs the ringing peer a futex wake and the sleeper
  // a scheduler wake-up. The progress thread spins briefly: compute may want its core.
  const auto spin = std::chrono::microseconds(oversubscribed_ ? 200 : caller_blocked ? kBlockedSpinUs : 50);
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
  bell.sleep(seen, std::min(0.5, seconds_left(until)));
}

void Engine::check_departed(const std::vector<bool>& gone) {
  for (const auto& op : active_) {
    for (int r : op->needs_more_from()) {
      if (!gone[static_cast<std::size_t>(r)]) continue;
      fabric_.fail(FailureKind::peer, op->descriptor().detail({r}),
                   "rank " + std::to_string(r) + " finalized and left the job while rank " +
                       std::to_string(fabric_.rank()) + " still needs it in " + op->descriptor().describe() +
                       ": the ranks did not make the same calls (rank " + std::to_string(r) +
                       " made fewer); every rank must call the same collectives in the same order",
                   true);
      return;
    }
  }
}

std::string Engine::status(std::uint64_t key, std::uint64_t seq) {
  std::lock_guard<std::mutex> lock(submit_mutex_);
  auto it = calls_made_.find(key);
  const std::uint64_t made = it == calls_made_.end() ? 0 : it->second;
  if (made > seq) return "reached";
  return made == 0 ? "behind: it has made no call of that group yet"
                   : "behind: its last call of that group is #" + std::to_string(made - 1);
}

void Engine::fail_stalled(const Operation& stuck) {
  const Descriptor& desc = stuck.descriptor();
  const std::vector<int> waiting = stuck.waiting_ranks();
  // Ask the ranks we wait for: one that does not answer is stopped or hung; one that answers
  // but has not made this call is elsewhere in its program. Either holds the job up; the
  // others wait like us.
  std::vector<std::optional<std::string>> answers;
  if (!waiting.empty()) {
    const double ask_s = std::min(2.0, std::max(0.2, stall_timeout_s_ / 4));
    answers = fabric_.probe(waiting, desc.group, desc.kind == Kind::p2p ? 0 : desc.seq, ask_s);
  }
  std::string culprits, reasons;
  std::vector<int> blamed, answered;
  for (std::size_t i = 0; i < waiting.size(); ++i) {
    const std::string who = "rank " + std::to_string(waiting[i]);
    std::string why;
    if (!answers[i]) {
      why = who + " did not answer: its process is stopped (SIGSTOP, a debugger), its runtime hangs, or its host "
            "cannot be reached";
    } else if (answers[i]->rfind("behind", 0) == 0 && desc.kind != Kind::p2p) {
      why = who + " has not made this call: it is elsewhere in its program, " + answers[i]->substr(8);
    } else {
      answered.push_back(waiting[i]);
      continue;
    }
    blamed.push_back(waiting[i]);
    culprits += (culprits.empty() ? "" : ", ") + who;
    reasons += (reasons.empty() ? "" : "; ") + why;
  }
  std::string message = "rank " + std::to_string(fabric_.rank()) + " timed out: no progress for " +
                        format_seconds(stall_timeout_s_) + " in " + desc.describe();
  if (!culprits.empty()) {
    message += "; made no progress: " + culprits + " (" + reasons + ")";
  } else if (!waiting.empty()) {
    message += "; every rank it waits for has made this call";
  }
  message += "; waiting for " + stuck.waiting_for() + " (TNT_TIMEOUT_S sets this limit)";
  ErrorDetail detail = desc.detail(std::move(blamed));
  detail.answered = std::move(answered);
  fabric_.fail(FailureKind::timeout, std::move(detail), message, true);
}

bool Engine::wait(Operation& op, std::optional<double> timeout_s) {
  Deadline deadline = timeout_s ? deadline_after(*timeout_s) : Deadline::max();
  // A caller blocked on a non-blocking operation: the wait that keeps compute from going on.
  const std::int64_t waited_from = timeline::on() && !op.blocking() && !op.completed() ? timeline::now_ns() : 0;
  struct WaitRecord {
    const Operation& op;
    std::int64_t from;
    ~WaitRecord() {
      if (from == 0) return;
      timeline::Event event;
      event.name = "wait";
      event.group = op.descriptor().group;
      event.call = op.descriptor().seq;
      event.submitted_ns = event.started_ns = from;
      event.ended_ns = timeline::now_ns();
      timeline::add(std::move(event));
    }
  } record{op, waited_from};
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
