// What the fabric gets from the rendezvous (rendezvous/): the connected mesh, and a key-value
// exchange shared by the ranks while they set up their segments and GPI-2. Declared here, below
// the rendezvous, so that the transport needs nothing from the layer that builds it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common.hpp"
#include "transport/socket.hpp"

namespace tnt {

// Every rank of the job, met and connected.
struct Mesh {
  std::vector<std::string> hosts;  // by rank: the address it published (the one that routes to rank 0)
  std::vector<int> nodes;          // by rank: its TNT_NODE_RANK
  std::size_t payload = 0;         // bytes of a message slot's payload: rank 0's choice, for all
  std::vector<Socket> sockets;     // by rank: a connection whose peer proved the job token (none to itself)
};

// Keys set by one rank and read by others during the start, within this job only.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits until the key exists; throws Timeout at the deadline.
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  virtual bool has(const std::string& key) = 0;
};

}  // namespace tnt
