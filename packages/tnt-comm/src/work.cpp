#include "tnt_comm/work.hpp"

#include "engine/engine.hpp"

namespace tnt {

bool Work::wait(std::optional<double> timeout_s) {
  if (!op_) return true;
  return engine_->wait(*op_, timeout_s);
}

bool Work::is_completed() const { return !op_ || op_->completed(); }

bool Work::failed() const { return op_ && op_->completed() && op_->error() != nullptr; }

void Work::rethrow() const {
  if (op_ && op_->completed()) {
    if (auto error = op_->error()) std::rethrow_exception(error);
  }
}

}  // namespace tnt
