// Handle of a non-blocking operation, in the spirit of torch.distributed's Work.
#pragma once

#include <memory>
#include <optional>

namespace tnt {

class Operation;
class Job;

class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<Operation> op, std::weak_ptr<Job> job) : op_(std::move(op)), job_(std::move(job)) {}

  // Blocks until the operation completes; rethrows its error. With a timeout (seconds), returns
  // false if it has not completed by then (the operation keeps running). An infinite or huge
  // timeout waits without limit; NaN is refused. Safe after finalize(), which completes every
  // operation (those cut short with an Error).
  bool wait(std::optional<double> timeout_s = std::nullopt);
  bool is_completed() const;
  // True when the operation finished with an error (is_completed() is then true as well).
  bool failed() const;
  // Rethrows the operation's error, if any.
  void rethrow() const;

 private:
  std::shared_ptr<Operation> op_;
  std::weak_ptr<Job> job_;  // the runtime's: gone after finalize()
};

}  // namespace tnt
