// The start of a job: every rank meets the others at rank 0's store (store.hpp), publishes where
// it can be reached, and connects to every peer over TCP, each connection proving the job token.
// What it builds (the Mesh) and the store's keys (as an Exchange) go to the transport's fabric.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "rendezvous/store.hpp"
#include "tnt_comm/identity.hpp"
#include "transport/exchange.hpp"

namespace tnt {

class Rendezvous : public Exchange {
 public:
  // Ranks of this job known to have ended while it meets (a re-formed elastic job: survivors see
  // the links of the generation before close), so that nobody waits the deadline for them.
  using Gone = std::function<std::vector<int>()>;
  // Starts the store on rank 0 (unless the job is elastic: its launcher holds the store) and
  // connects to it, retrying until `deadline`.
  Rendezvous(const Identity& identity, Deadline deadline, Gone gone = {});
  ~Rendezvous() override;
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  // Publishes this rank, waits for every other, and connects to all of them: to lower ranks, and
  // from higher ones.
  Mesh meet();
  // Every rank has read what it needs: rank 0 may stop its store after this (it waits for all).
  void finish();

  // The Exchange, under this job's prefix.
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, Deadline deadline) override;
  bool has(const std::string& key) override;

 private:
  const Identity& id_;
  Deadline deadline_;
  Gone gone_;
  std::string prefix_;
  std::unique_ptr<StoreServer> server_;  // rank 0 of a job that is not elastic only
  StoreClient store_;
};

}  // namespace tnt
