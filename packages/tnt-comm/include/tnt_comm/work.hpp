// Handle of a non-blocking operation, in the spirit of torch.distributed's Work.
#pragma once

#include <memory>
#include <optional>

namespace tnt {

class Operation;
class Engine;

class Work {
 public:
  Work() = default;
  Work(std::shared_ptr<Operation> op, Engine* engine) : op_(std::move(op)), engine_(engine) {}

  // Blocks until the operation completes; rethrows its error. With a timeout (seconds), returns
  // false if it has not completed by then (the operation keeps running).
  bool wait(std::optional<double> timeout_s = std::nullopt);
  bool is_completed() const;
  // True when the operation finished with an error (is_completed() is then true as well).
  bool failed() const;
  // Rethrows the operation's error, if any.
  void rethrow() const;

 private:
  std::shared_ptr<Operation> op_;
  Engine* engine_ = nullptr;
};

}  // namespace tnt
