#include "membership.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <set>
#include <optional>
#include <sstream>
#include <thread>

#include "rendezvous/store.hpp"
#include "tnt_comm/types.hpp"

namespace tnt {
namespace {

// Beyond a stall timeout, what the agreement gives a member vouched for to arrive: the probe that
// follows its own timeout (at most 2 s) and a loaded machine's delay.
constexpr double kLateSurvivorS = 3.0;

// Store keys (under "<job_base>/elastic/"): "lost/<id>" for life, the rest per generation.
std::string key(const std::string& job_base, const std::string& rest) { return job_base + "/elastic/" + rest; }
std::string gen_key(const std::string& job_base, int generation, const std::string& rest) {
  return key(job_base, "g" + std::to_string(generation) + "/" + rest);
}

// "id:node,id:node" <-> Generation.
std::string encode(const Generation& m) {
  std::string out;
  for (std::size_t i = 0; i < m.ids.size(); ++i) {
    out += (i ? "," : "") + std::to_string(m.ids[i]) + ":" + std::to_string(m.nodes[i]);
  }
  return out;
}

Generation decode(const std::string& text, int generation) {
  Generation m;
  m.generation = generation;
  std::istringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const std::size_t colon = item.find(':');
    m.ids.push_back(std::stoi(item.substr(0, colon)));
    m.nodes.push_back(std::stoi(item.substr(colon + 1)));
  }
  return m;
}

StoreClient connect(const Identity& identity) {
  return StoreClient(identity.master_addr, identity.master_port, identity.token, deadline_after(10));
}

// What a survivor says at the store: "<node>;<ids>;<ids>;<ids>": its host, the members it saw
// fail, the members it vouches for (they answered its probe from the call it timed out in), and
// the members whose link to it closed without a goodbye (their process ended).
struct Said {
  int node = 0;
  std::set<int> accused, vouched, closed;
};

std::set<int> parse_ids(const std::string& text) {
  std::set<int> ids;
  std::istringstream in(text);
  std::string id;
  while (std::getline(in, id, ',')) {
    if (!id.empty()) ids.insert(std::stoi(id));
  }
  return ids;
}

Said parse_said(const std::string& text) {
  std::vector<std::string> fields;
  std::istringstream in(text);
  std::string field;
  while (std::getline(in, field, ';')) fields.push_back(field);
  Said said;
  said.node = std::stoi(fields.at(0));
  if (fields.size() > 1) said.accused = parse_ids(fields[1]);
  if (fields.size() > 2) said.vouched = parse_ids(fields[2]);
  if (fields.size() > 3) said.closed = parse_ids(fields[3]);
  return said;
}

// "<id>,<id>," for the ranks of `now` among `ranks`, leaving out `self` and ranks out of range.
std::string ids_of(const std::vector<int>& ranks, const Generation& now, int self) {
  std::string out;
  for (int r : ranks) {
    if (r == self || r < 0 || r >= static_cast<int>(now.ids.size())) continue;
    out += std::to_string(now.ids[static_cast<std::size_t>(r)]) + ",";
  }
  return out;
}

}  // namespace

Generation agree_on_survivors(const Identity& identity, const std::string& job_base, const Generation& now,
                              const std::vector<int>& lost_ranks, const std::vector<int>& answered_ranks,
                              Deadline deadline, const std::function<std::vector<int>()>& seen_lost) {
  const int me = now.ids[static_cast<std::size_t>(identity.rank)];
  StoreClient store = connect(identity);
  const std::string next_key = gen_key(job_base, now.generation, "next");
  std::set<int> lost(lost_ranks.begin(), lost_ranks.end()), closed;
  auto say_alive = [&] {
    auto text = [&](const std::set<int>& ranks) { return ids_of({ranks.begin(), ranks.end()}, now, identity.rank); };
    store.set(gen_key(job_base, now.generation, "alive/" + std::to_string(me)),
              std::to_string(identity.node_rank) + ";" + text(lost) + ";" + ids_of(answered_ranks, now, identity.rank) +
                  ";" + text(closed));
  };
  say_alive();
  // A member vouched for is alive but may come a stall timeout later (a slow handler before
  // shrink, a starved process): past `deadline`, the agreement waits that long more for it.
  const Deadline vouched_deadline =
      deadline == Deadline::max() ? deadline : deadline_after(identity.timeout_s + kLateSurvivorS, deadline);

  std::optional<std::string> decided;
  while (!(decided = store.try_get(next_key))) {
    // Ranks lost at once die one after another: each seen since is accused too, so the agreement
    // need not wait for the deadline to go on without it.
    if (seen_lost) {
      const std::size_t before = closed.size();
      for (int r : seen_lost()) closed.insert(r);
      if (closed.size() != before) say_alive();
    }
    // Who said what: members alive (with what they accuse), and members whose process ended: the
    // launcher saw it end, or a survivor's link to it closed (also after it said it is alive).
    std::map<int, Said> alive;
    std::set<int> ended, accused, vouched;
    for (int id : now.ids) {
      if (store.try_get(key(job_base, "lost/" + std::to_string(id)))) ended.insert(id);
      if (auto text = store.try_get(gen_key(job_base, now.generation, "alive/" + std::to_string(id)))) {
        alive[id] = parse_said(*text);
        accused.insert(alive[id].accused.begin(), alive[id].accused.end());
        vouched.insert(alive[id].vouched.begin(), alive[id].vouched.end());
        ended.insert(alive[id].closed.begin(), alive[id].closed.end());
      }
    }
    // Settled once every member said it is alive, ended, or was seen failing by a member alive and
    // vouched for by none; at the deadline, unless a member vouched for has not come yet.
    bool settled = true, awaited = false;
    for (int id : now.ids) {
      const bool heard = alive.count(id) || ended.count(id);
      settled = settled && (heard || (accused.count(id) && !vouched.count(id)));
      awaited = awaited || (!heard && vouched.count(id));
    }
    const Clock::time_point t = Clock::now();
    if (settled || (t >= deadline && (!awaited || t >= vouched_deadline))) {
      // In rank order, each member alive whose process did not end, unless it and a member taken
      // before accuse each other: two sides that lost each other (a cut link) do not both go on,
      // and the side of the lowest rank does.
      Generation proposal;
      proposal.generation = now.generation + 1;
      for (int id : now.ids) {
        if (!alive.count(id) || ended.count(id)) continue;
        bool clash = false;
        for (int taken : proposal.ids) {
          clash = clash || alive[taken].accused.count(id) || alive[id].accused.count(taken);
        }
        if (clash) continue;
        proposal.ids.push_back(id);
        proposal.nodes.push_back(alive[id].node);
      }
      decided = store.claim(next_key, encode(proposal));
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return decode(*decided, now.generation + 1);
}

Meeting::Meeting(const Identity& identity, const std::string& job_base, int generation)
    : store_(connect(identity)), key_(gen_key(job_base, generation, "abandoned")) {}

bool Meeting::abandoned() { return store_.try_get(key_).has_value(); }
void Meeting::abandon() { store_.set(key_, "1"); }

Generation wait_for_admission(const Identity& identity, const std::string& job_base, int id) {
  StoreClient store = connect(identity);
  const std::int64_t k = store.add(key(job_base, "joiners"), 1);
  store.set(key(job_base, "joiner/" + std::to_string(k)), std::to_string(id) + ":" + std::to_string(identity.node_rank));
  const int generation = std::stoi(store.get(key(job_base, "admitted/" + std::to_string(id)), Deadline::max()));
  return decode(store.get(gen_key(job_base, generation - 1, "next"), deadline_after(60)), generation);
}

Generation admit_joiners(const Identity& identity, const std::string& job_base, const Generation& now) {
  StoreClient store = connect(identity);
  const auto count = store.try_get(key(job_base, "joiners"));
  const auto seen = store.try_get(key(job_base, "joiners_seen"));
  const long n = count ? std::stol(*count) : 0, done = seen ? std::stol(*seen) : 0;
  Generation next = now;
  next.generation = now.generation + 1;
  for (long k = done + 1; k <= n; ++k) {
    const Generation joiner = decode(store.get(key(job_base, "joiner/" + std::to_string(k)), deadline_after(60)), 0);
    next.ids.insert(next.ids.end(), joiner.ids.begin(), joiner.ids.end());
    next.nodes.insert(next.nodes.end(), joiner.nodes.begin(), joiner.nodes.end());
  }
  if (next.ids.size() == now.ids.size()) return now;
  // The claim may find a decision there already: survivors of a failure that raced this admission.
  const std::string proposal = encode(next);
  const std::string decided = store.claim(gen_key(job_base, now.generation, "next"), proposal);
  if (decided != proposal) return decode(decided, next.generation);  // a failure's survivors decided first
  store.set(key(job_base, "joiners_seen"), std::to_string(n));
  for (std::size_t r = now.ids.size(); r < next.ids.size(); ++r) {
    store.set(key(job_base, "admitted/" + std::to_string(next.ids[r])), std::to_string(next.generation));
  }
  return next;
}

Generation decided_after(const Identity& identity, const std::string& job_base, const Generation& now) {
  StoreClient store = connect(identity);
  return decode(store.get(gen_key(job_base, now.generation, "next"), deadline_after(identity.timeout_s)),
                now.generation + 1);
}

Identity identity_in(const Identity& identity, const std::string& job_base, const Generation& next, int id) {
  Identity out = identity;
  const auto at = std::find(next.ids.begin(), next.ids.end(), id);
  out.rank = static_cast<int>(at - next.ids.begin());
  out.size = static_cast<int>(next.ids.size());
  out.local_rank = 0;
  out.local_size = 0;
  for (std::size_t r = 0; r < next.ids.size(); ++r) {
    if (next.nodes[r] != identity.node_rank) continue;
    if (static_cast<int>(r) < out.rank) ++out.local_rank;
    ++out.local_size;
  }
  out.job_id = job_base + "-g" + std::to_string(next.generation);
  return out;
}

std::vector<int> ranks_of(const std::vector<int>& ids, const Generation& generation) {
  std::vector<int> ranks;
  for (int id : ids) {
    const auto at = std::find(generation.ids.begin(), generation.ids.end(), id);
    if (at != generation.ids.end()) ranks.push_back(static_cast<int>(at - generation.ids.begin()));
  }
  return ranks;
}

std::string describe(const Generation& members) {
  std::string ids;
  for (std::size_t i = 0; i < members.ids.size(); ++i) ids += (i ? ", " : "") + std::to_string(members.ids[i]);
  return "generation " + std::to_string(members.generation) + ": members " + (ids.empty() ? "none" : ids);
}

}  // namespace tnt
