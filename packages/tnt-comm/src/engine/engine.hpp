// The progress engine: operations start in submission order and are advanced together until they
// complete. One background thread drives non-blocking work; a blocking call drives on its own
// thread instead, so small collectives pay no thread hand-off. A driver with nothing to do spins
// briefly on its doorbell and then sleeps on it, so an idle runtime uses no CPU.
#pragma once

#include <atomic>
#include <map>
#include <string>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "collectives/operation.hpp"
#include "common.hpp"
#include "transport/fabric.hpp"

namespace tnt {

class Engine {
 public:
  // `channels`: this rank's channels by world rank (nullptr for itself), which the engine relieves
  // when no operation has progressed for a while (Channel::relieve).
  Engine(Fabric& fabric, std::vector<Channel*> channels, double stall_timeout_s, bool oversubscribed);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues `op`, reserving its channel ranges now. With `background`, the progress thread drives
  // it; otherwise the caller is expected to wait() on it.
  void submit(const std::shared_ptr<Operation>& op, bool background);
  // Until `op` completes (true) or the timeout passes (false); rethrows the op's error.
  bool wait(Operation& op, std::optional<double> timeout_s);
  // Waits for every queued operation (errors are left in their handles).
  void drain();

 private:
  void thread_main();
  // Needs drive_mutex_. Advances all operations until `target` completes (all of them if null)
  // or the deadline passes.
  bool drive(Operation* target, Deadline deadline);
  void absorb_incoming();
  void fail_all();
  // The fabric's failure as an exception (fallback if there is none).
  std::exception_ptr failure_or(std::exception_ptr fallback) const;
  // Spins, then sleeps on the doorbell until it moves past `seen` or `until` passes.
  void wait_for_doorbell(std::uint32_t seen, Deadline until, bool caller_blocked);
  // Fails the job if an operation still needs a peer that has finalized and left.
  void check_departed(const std::vector<bool>& gone);
  // Fails the job with a timeout that names the ranks holding `stuck` up, after asking them.
  void fail_stalled(const Operation& stuck);
  // The answer to a peer's probe: whether this rank made call `seq` of stream `key`.
  std::string status(std::uint64_t key, std::uint64_t seq);

  Fabric& fabric_;
  std::vector<Channel*> channels_;  // touched only by the driver
  double stall_timeout_s_;
  bool oversubscribed_;

  std::mutex submit_mutex_;
  std::vector<std::shared_ptr<Operation>> incoming_;
  std::atomic<std::size_t> incoming_count_{0};
  std::condition_variable thread_cv_;
  std::uint64_t background_requests_ = 0;
  bool stop_ = false;
  std::map<std::uint64_t, std::uint64_t> calls_made_;  // per collective stream: calls submitted

  std::mutex drive_mutex_;
  std::vector<std::shared_ptr<Operation>> active_;  // touched only by the driver
  std::thread thread_;
};

}  // namespace tnt
