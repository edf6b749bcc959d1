#include "tnt_comm/runtime.hpp"

#include <algorithm>
#include <iterator>
#include <mutex>

#include "engine/engine.hpp"
#include "job.hpp"
#include "membership.hpp"
#include "tnt_comm/group.hpp"
#include "transport/fabric.hpp"

namespace tnt {
namespace {

// The one process-wide runtime (docs/design.md: the only global mutable state of tnt-comm).
std::mutex g_mutex;
std::shared_ptr<Runtime> g_runtime;
bool g_finalized = false;

// Thrown out of a meeting of survivors that another of them gave up (Meeting::abandoned).
struct MeetingAbandoned : Error {
  MeetingAbandoned() : Error("another survivor gave the meeting up") {}
};

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
  if (identity.join_as >= 0) {
    // A replacement: it waits to be admitted, then meets the generation that admitted it.
    const Generation next = wait_for_admission(identity, identity.job_id, identity.join_as);
    meet(identity, identity.job_id, next.generation, next.ids, next.nodes, identity.join_as);
    return;
  }
  std::vector<int> members(static_cast<std::size_t>(identity.size));
  for (int r = 0; r < identity.size; ++r) members[static_cast<std::size_t>(r)] = r;
  g_runtime.reset(new Runtime(std::make_shared<Job>(identity), 0, std::move(members), identity.job_id));
}

Runtime::Runtime(std::shared_ptr<Job> job, int generation, std::vector<int> members, std::string job_base)
    : job_(std::move(job)), generation_(generation), members_(std::move(members)), job_base_(std::move(job_base)) {
  std::vector<int> all(static_cast<std::size_t>(job_->size()));
  for (int r = 0; r < job_->size(); ++r) all[static_cast<std::size_t>(r)] = r;
  world_ = std::make_shared<Group>(job_, std::move(all));
}

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

void Runtime::meet(const Identity& base, const std::string& job_base, int generation, const std::vector<int>& ids,
                   const std::vector<int>& nodes, int me, std::function<std::vector<int>()> gone_ids) {
  const Generation next{generation, ids, nodes};
  if (std::find(ids.begin(), ids.end(), me) == ids.end()) {
    throw Error("member " + std::to_string(me) + " (rank " + std::to_string(base.rank) +
                " before) was left out when the job re-formed (" + describe(next) +
                "): the others took it for lost, so it must leave the job");
  }
  Identity mine = identity_in(base, job_base, next, me);
  mine.start_timeout_s = std::min(base.start_timeout_s, base.timeout_s);  // no imports to wait for
  // GPI-2 starts once per process: a job that ran over it goes on over shared memory and TCP.
  if (mine.transport == "gpi2") mine.transport = "auto";
  mine.gpi2_allowed = false;
  std::function<std::vector<int>()> gone;  // the ranks in `next` of the members gone
  if (gone_ids) gone = [gone_ids, next] { return ranks_of(gone_ids(), next); };
  g_runtime.reset(new Runtime(std::make_shared<Job>(mine, std::move(gone)), generation, ids, job_base));
}

std::vector<int> Runtime::member_nodes() {
  std::vector<int> nodes;
  for (int r = 0; r < size(); ++r) nodes.push_back(fabric().node(r));
  return nodes;
}

Runtime& Runtime::shrink() {
  std::lock_guard<std::mutex> lock(g_mutex);
  refuse_after_finalize();
  if (!g_runtime) throw InvalidArgument("shrink: the runtime has not started, so no job lost a rank");
  const Identity identity = g_runtime->identity();
  if (identity.elastic_min == 0) {
    throw InvalidArgument("shrink re-forms an elastic job, and this one is not: start it with tnt-launch "
                          "--elastic MIN (TNT_ELASTIC=MIN), whose store outlives every rank");
  }
  Fabric& fabric = g_runtime->fabric();
  const FailureKind kind = fabric.failure_kind();
  if (kind == FailureKind::none) {
    throw InvalidArgument("shrink re-forms the job after it lost a rank, and no rank of it failed: call it "
                          "after a collective raised PeerFailure or Timeout");
  }
  if (kind != FailureKind::peer && kind != FailureKind::timeout) {
    throw Error("shrink cannot cure this job's failure, which is no lost rank (" +
                    std::string(kind == FailureKind::mismatch ? "ranks called different collectives" : "an error") +
                    "): re-formed, the same program would fail again",
                fabric.failure_detail());
  }
  Generation now{g_runtime->generation_, g_runtime->members_, g_runtime->member_nodes()};
  const std::string job_base = g_runtime->job_base_;
  const int me = now.ids[static_cast<std::size_t>(identity.rank)];
  const ErrorDetail failure = fabric.failure_detail();
  // This rank tells its peers the failure it re-forms after: one still in a call stops there, and
  // none takes this rank for dead when its links close.
  fabric.tell_failure();
  // The old generation stays until the new one has met: while the survivors agree and meet, every
  // member whose link to it closes without a goodbye has ended, and nobody waits a deadline for it
  // (ranks lost at once die one after another; one may die after it said it is alive).
  std::shared_ptr<Runtime> old = g_runtime;
  const Generation first = now;
  auto gone_ids = [old, first] {
    std::vector<int> ids;
    for (int r : old->fabric().vanished_peers()) ids.push_back(first.ids[static_cast<std::size_t>(r)]);
    return ids;
  };
  struct DropOld {  // then it goes: its links, segments and threads (groups hold it weakly)
    std::shared_ptr<Runtime>& old;
    ~DropOld() {
      if (g_runtime == old) g_runtime.reset();
    }
  } drop_old{old};
  const std::vector<int> answered = failure.answered;
  std::vector<int> lost = failure.ranks;
  Identity mine = identity;
  for (int attempt = 0;; ++attempt) {
    // Each agreement has its own deadline: after a failed meeting the survivors wait for each
    // other again, and the one that comes first must not go on alone.
    auto seen_lost = [&now, &gone_ids] { return ranks_of(gone_ids(), now); };
    const Generation next = agree_on_survivors(mine, job_base, now, lost, attempt == 0 ? answered : std::vector<int>{},
                                               deadline_after(identity.timeout_s), seen_lost);
    const bool kept = std::find(next.ids.begin(), next.ids.end(), me) != next.ids.end();
    if (kept && static_cast<int>(next.ids.size()) < identity.elastic_min) {
      ErrorDetail detail;
      detail.ranks = failure.ranks;
      throw PeerFailure(failure.ranks.empty() ? -1 : failure.ranks.front(), "the job lost ranks and " + std::to_string(next.ids.size()) + " are left (" + describe(next) +
                            "), fewer than the " + std::to_string(identity.elastic_min) +
                            " it needs (TNT_ELASTIC, tnt-launch --elastic): it ends",
                        std::move(detail));
    }
    if (!kept) meet(identity, job_base, next.generation, next.ids, next.nodes, me);  // throws: left out
    Meeting meeting(mine, job_base, next.generation);
    // While meeting, a member gone gives up at once, and so does everyone once one gave up.
    auto gone_or_given_up = [&meeting, &gone_ids] {
      if (meeting.abandoned()) throw MeetingAbandoned();
      return gone_ids();
    };
    try {
      meet(identity, job_base, next.generation, next.ids, next.nodes, me, gone_or_given_up);
      return *g_runtime;
    } catch (const MeetingAbandoned&) {
      // Another member gave up: agree again.
    } catch (const Error& e) {
      // A member was lost while the new generation met: agree again without it.
      if (e.detail().ranks.empty() || attempt >= identity.size) throw;
      meeting.abandon();
    }
    // Without accusing the ranks the meeting failed on: one may only have given up first (its
    // links closed as it left). The members gone are known by their old links; one that is not
    // gone but does not come is left out at the deadline.
    lost.clear();
    now = next;
    mine = identity_in(identity, job_base, next, me);
  }
}

bool Runtime::admit() {
  std::shared_ptr<Runtime> runtime;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    refuse_after_finalize();
    runtime = g_runtime;
  }
  if (!runtime) throw InvalidArgument("admit: the runtime has not started");
  const Identity identity = runtime->identity();
  if (identity.elastic_min == 0) return false;
  Fabric& fabric = runtime->fabric();
  if (fabric.failed()) fabric.throw_failure();
  Generation now{runtime->generation_, runtime->members_, runtime->member_nodes()};
  Generation next = now;
  std::int64_t grew = 0;
  if (identity.rank == 0) {
    next = admit_joiners(identity, runtime->job_base_, now);
    grew = next.generation != now.generation ? 1 : 0;
  }
  runtime->world().broadcast(&grew, 1, DType::int64, 0);
  if (grew == 0) return false;
  if (identity.rank != 0) next = decided_after(identity, runtime->job_base_, now);
  const int me = now.ids[static_cast<std::size_t>(identity.rank)];
  const std::string job_base = runtime->job_base_;
  // A planned change: the old generation ends as at finalize, every rank having read its messages.
  {
    Job& job = *runtime->job_;
    job.engine().drain();
    job.fabric().say_goodbye();
    job.settle();
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_runtime == runtime) g_runtime.reset();
  runtime.reset();
  meet(identity, job_base, next.generation, next.ids, next.nodes, me);
  return true;
}

int Runtime::generation() const { return generation_; }
std::vector<int> Runtime::members() const { return members_; }

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
