#include "tnt_comm/runtime.hpp"

#include <iterator>
#include <mutex>

#include "engine/engine.hpp"
#include "job.hpp"
#include "tnt_comm/group.hpp"
#include "transport/fabric.hpp"

namespace tnt {
namespace {

// The one process-wide runtime (docs/design.md: the only global mutable state of tnt-comm).
std::mutex g_mutex;
std::shared_ptr<Runtime> g_runtime;
bool g_finalized = false;

void refuse_after_finalize() {
  if (g_finalized) {
    throw Error("tnt_comm was finalized: no collective can run after finalize(), and the runtime "
                "cannot start again in this process (call finalize() once, after the last collective)");
  }
}

}  // namespace

void Runtime::start(const Identity& identity) {
  refuse_after_finalize();
  if (g_runtime) return;
  Fabric::check_transport(identity.transport);
  std::shared_ptr<Runtime> runtime(new Runtime(std::make_shared<Job>(identity)));
  std::vector<int> all(static_cast<std::size_t>(identity.size));
  for (int r = 0; r < identity.size; ++r) all[static_cast<std::size_t>(r)] = r;
  runtime->world_ = std::make_shared<Group>(runtime->job_, std::move(all));
  g_runtime = std::move(runtime);
}

Runtime::Runtime(std::shared_ptr<Job> job) : job_(std::move(job)) {}

Runtime::~Runtime() = default;

const Identity& Runtime::identity() const { return job_->identity(); }
int Runtime::rank() const { return job_->rank(); }
int Runtime::size() const { return job_->size(); }
const std::string& Runtime::allreduce_algorithm() const { return job_->identity().allreduce; }
Fabric& Runtime::fabric() { return job_->fabric(); }
Engine& Runtime::engine() { return job_->engine(); }
Channel* Runtime::channel(int world_rank) { return job_->channel(world_rank); }

Runtime& Runtime::init() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_runtime) start(Identity::from_environment());
  return *g_runtime;
}

Runtime& Runtime::init(const Identity& identity) {
  std::lock_guard<std::mutex> lock(g_mutex);
  start(identity);
  return *g_runtime;
}

Runtime* Runtime::get() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_runtime.get();
}

void Runtime::finalize() {
  std::shared_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    runtime = std::move(g_runtime);
    if (runtime) g_finalized = true;
  }
  if (!runtime) return;
  Job& job = *runtime->job_;
  if (job.fabric().failed()) return;
  job.engine().drain();
  job.fabric().say_goodbye();
  job.settle();
}

void Runtime::abandon(const std::string& error) {
  std::shared_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    runtime = g_runtime;
  }
  if (!runtime || runtime->fabric().failed()) return;
  ErrorDetail detail;
  detail.ranks = {runtime->rank()};
  detail.peer_error = error;
  runtime->fabric().fail(FailureKind::peer, std::move(detail),
                         "rank " + std::to_string(runtime->rank()) + " failed (" + error + ")", true);
}

std::shared_ptr<Group> Runtime::new_group(std::vector<int> world_ranks) {
  auto group = std::make_shared<Group>(job_, std::move(world_ranks));
  std::lock_guard<std::mutex> lock(groups_mutex_);
  for (auto it = groups_by_id_.begin(); it != groups_by_id_.end();) {  // forget the groups that went
    it = it->second.expired() ? groups_by_id_.erase(it) : std::next(it);
  }
  groups_by_id_[group->id()] = group;
  return group;
}

std::shared_ptr<Group> Runtime::find_group(std::uint64_t id) {
  if (id == 0 || id == world_->id()) return world_;
  std::lock_guard<std::mutex> lock(groups_mutex_);
  auto it = groups_by_id_.find(id);
  return it == groups_by_id_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<void> Runtime::allocate_shared(std::size_t bytes) {
  std::shared_ptr<SharedArena> arena = fabric().arena();
  if (!arena) return nullptr;
  std::byte* block = arena->allocate(bytes);
  return std::shared_ptr<void>(block, [arena](void* p) { arena->release(static_cast<std::byte*>(p)); });
}

std::vector<std::string> Runtime::transports() const {
  std::vector<std::string> out;
  for (int r = 0; r < size(); ++r) out.push_back(job_->fabric().transport(r));
  return out;
}

}  // namespace tnt
