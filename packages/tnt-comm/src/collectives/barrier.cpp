// Barrier: an empty message to and from every other member.
#include "collectives/algorithms.hpp"

namespace tnt {
namespace {

class Barrier final : public Operation {
 public:
  using Operation::Operation;

  void reserve() override {
    for (int p = 0; p < members_->size(); ++p) {
      if (p != members_->me) open(p, 1, 1);
    }
  }

  Progress progress() override {
    bool advanced = false;
    for (std::size_t p = 0; p < sends_.size(); ++p) {
      if (static_cast<int>(p) == members_->me) continue;
      if (sends_[p].ready()) {
        sends_[p].send(desc_, 0, nullptr, 0);
        advanced = true;
      }
      std::uint64_t index;
      if (recvs_[p].next(desc_, &index) != nullptr) {
        recvs_[p].consume(index);
        advanced = true;
      }
    }
    if (streams_finished()) return Progress::done;
    return advanced ? Progress::advanced : Progress::idle;
  }
};

}  // namespace

std::shared_ptr<Operation> make_barrier(std::shared_ptr<const Members> members, Descriptor desc) {
  return std::make_shared<Barrier>(std::move(members), desc);
}

}  // namespace tnt
