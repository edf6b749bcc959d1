#include "tnt_comm/work.hpp"

#include <cmath>

#include "engine/engine.hpp"
#include "job.hpp"

namespace tnt {

bool Work::wait(std::optional<double> timeout_s) {
  if (timeout_s && std::isnan(*timeout_s)) throw InvalidArgument("Work.wait: the timeout is NaN");
  if (!op_) return true;
  if (!op_->completed()) {
    std::shared_ptr<Job> job = job_.lock();
    if (job) return job->engine().wait(*op_, timeout_s);
    // finalize() completes every operation before the runtime goes: only a wait racing it lands here.
    if (!op_->completed()) throw Error("Work.wait: tnt_comm was finalized while the operation was running");
  }
  if (auto error = op_->error()) std::rethrow_exception(error);
  return true;
}

bool Work::is_completed() const { return !op_ || op_->completed(); }

bool Work::failed() const { return op_ && op_->completed() && op_->error() != nullptr; }

void Work::rethrow() const {
  if (op_ && op_->completed()) {
    if (auto error = op_->error()) std::rethrow_exception(error);
  }
}

}  // namespace tnt
