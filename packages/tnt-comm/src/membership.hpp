// Who the ranks of an elastic job are, generation by generation, and how the survivors of a lost
// rank agree on the next generation at the job's store (which the launcher holds: it outlives every
// rank). Runtime::shrink (runtime.hpp) uses it between tearing the old job down and meeting anew.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common.hpp"
#include "rendezvous/store.hpp"
#include "tnt_comm/identity.hpp"

namespace tnt {

// One generation of an elastic job. A member keeps its id for life: the rank it had in generation
// 0 (the launcher's TNT_RANK); its rank in a generation is its place in `ids`.
struct Generation {
  int generation = 0;
  std::vector<int> ids;    // by rank
  std::vector<int> nodes;  // TNT_NODE_RANK, by rank: which members share a host
};

// The survivors' agreement on the next generation, at the store of `identity` under the keys of
// the job `job_base` (generation 0's TNT_JOB_ID):
//  - each survivor says it is alive (with its node), which members it saw fail (`lost_ranks`,
//    ranks of `now`, and those `seen_lost` names as the agreement goes on) and which it vouches
//    for (`answered_ranks`: alive, held up in the call it timed out in); the launcher marks every
//    member whose process ended;
//  - once every member of `now` is alive, ended or seen failing by a member alive (and vouched for
//    by none), or at `deadline` (a stall timeout and 3 s later where a member vouched for has not
//    come), any survivor proposes, in rank order, the members alive whose process did not
//    end, leaving out one that a member taken before accuses or is accused by (of two sides that
//    lost each other, the side of the lowest rank goes on); the store keeps the first proposal
//    (a claim), so every survivor gets the same answer, also one that saw less.
// Returns the next generation; it may leave this rank out (a rank that was taken for lost).
Generation agree_on_survivors(const Identity& identity, const std::string& job_base, const Generation& now,
                              const std::vector<int>& lost_ranks, const std::vector<int>& answered_ranks,
                              Deadline deadline, const std::function<std::vector<int>()>& seen_lost = {});

// A meeting of the survivors (generation `generation`) that one of them gave up: its meet failed
// (a member ended, or did not come), so the others need not wait for the deadline either, and all
// agree again. `abandon` says so at the store; `abandoned` asks, on one connection kept open.
class Meeting {
 public:
  Meeting(const Identity& identity, const std::string& job_base, int generation);
  bool abandoned();
  void abandon();

 private:
  StoreClient store_;
  std::string key_;
};

// A replacement process (`id`, on `node`) asks to join the elastic job and waits, without a limit
// (its launcher ends it with the job), until a generation admits it; returns that generation.
Generation wait_for_admission(const Identity& identity, const std::string& job_base, int id);

// The members' side, on their rank 0 (the others learn the outcome from it): the replacements
// that asked to join since the last call, appended to `now` as the next generation, decided at the
// store and told to them; `now` itself where none asked.
Generation admit_joiners(const Identity& identity, const std::string& job_base, const Generation& now);

// The next generation as the store holds it (`now`'s ranks other than 0 read what rank 0 decided).
Generation decided_after(const Identity& identity, const std::string& job_base, const Generation& now);

// This member's identity in `next`: its rank, the ranks of its host, and the generation's job id,
// which names the rendezvous keys and shared-memory files apart from those of earlier generations.
Identity identity_in(const Identity& identity, const std::string& job_base, const Generation& next, int id);

// The ranks in `generation` of the members `ids` that are in it.
std::vector<int> ranks_of(const std::vector<int>& ids, const Generation& generation);

// "generation 2: members 0, 1, 3" (for messages).
std::string describe(const Generation& members);

}  // namespace tnt
