#include "collectives/operation.hpp"

#include "tnt_comm/timeline.hpp"

#include "tnt_comm/types.hpp"

namespace tnt {

const MessageHeader* RecvStream::next(const Descriptor& expect, std::uint64_t* index) {
  if (examined_ == count_) return nullptr;
  const MessageHeader* header = channel_->peek(key_, base_ + examined_);
  if (header == nullptr) return nullptr;
  if (header->desc.same_call(expect) && header->desc.thread != expect.thread) {
    throw CollectiveMismatch(
        "collective mismatch: rank " + std::to_string(me_) + " made " + expect.describe() +
        " from one thread while rank " + std::to_string(peer_) +
        " made it from a thread of another name: the ranks paired calls of different threads. A "
        "group takes its calls from one thread at a time, the same (same-named) thread on every rank; "
        "give each thread its own group (new_group)",
        expect.detail({peer_}));
  }
  if (header->desc != expect) {
    ErrorDetail detail = expect.detail({peer_});
    detail.mine = expect.describe();
    detail.theirs = header->desc.describe();
    throw CollectiveMismatch("collective mismatch: rank " + std::to_string(me_) + " called " +
                             expect.describe() + " while rank " + std::to_string(peer_) +
                             " called " + header->desc.describe() +
                             (expect.kind == Kind::p2p
                                  ? " (every send needs a recv of the same dtype and count on the "
                                    "other rank, in the same order)"
                              : expect.shared != header->desc.shared
                                  ? " (one passed input and output from tnt_comm.shared_empty, the other did not: "
                                    "a large allreduce on one host takes another algorithm for shared buffers, so "
                                    "allocate them alike on every rank)"
                                  : " (every rank must call the same collectives in the same order)"),
                             std::move(detail));
  }
  *index = examined_++;
  return header;
}

bool Operation::streams_finished() const {
  for (const auto& s : sends_) {
    if (!s.finished()) return false;
  }
  for (const auto& r : recvs_) {
    if (!r.finished()) return false;
  }
  return true;
}

std::vector<int> Operation::peers_unfinished(bool count_arrived) const {
  std::vector<int> ranks;
  for (std::size_t m = 0; m < recvs_.size(); ++m) {
    if (static_cast<int>(m) == members_->me) continue;
    const bool receiving = count_arrived ? !recvs_[m].all_examined() : !recvs_[m].finished();
    if (receiving || !sends_[m].finished()) ranks.push_back(members_->world_ranks[m]);
  }
  return ranks;
}

std::string Operation::waiting_for() const {
  std::string who;
  for (int r : waiting_ranks()) who += (who.empty() ? "rank " : ", rank ") + std::to_string(r);
  return who.empty() ? "nothing" : who;
}

void Operation::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load()) return;
    error_ = error;
    if (submitted_ns_ != 0) {
      timeline::Event event;
      event.name = desc_.kind_name();
      event.group = desc_.group;
      event.call = desc_.seq;
      event.bytes = desc_.kind == Kind::barrier ? 0 : desc_.count * dtype_size(static_cast<DType>(desc_.dtype));
      event.submitted_ns = submitted_ns_;
      event.started_ns = started_ns_ != 0 ? started_ns_ : submitted_ns_;
      event.ended_ns = timeline::now_ns();
      event.blocking = blocking_;
      event.failed = error != nullptr;
      event.algorithm = label_;
      for (const auto& [name, ns] : phase_marks_) event.phases.push_back({name, ns});
      timeline::add(std::move(event));
    }
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  if (callback_) callback_(error);
}

bool Operation::wait_completion(double seconds) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return done_.load(); });
}

std::exception_ptr Operation::error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

}  // namespace tnt
