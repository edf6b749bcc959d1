// GPI-2's TCP ports on one host, and how concurrent jobs keep off each other's.
//
// A job's GPI-2 listens on base+socket, base+256+socket and base+512+socket for every socket (rank
// of the host). A port found free says nothing of a job that chose it a moment ago and has not
// bound it yet: two jobs starting together could both choose it, and one of them would fail. So
// whoever chooses a base claims it first: one abstract Unix socket per block of 8 ports, named
// "tnt-gpi2-ports:<the block's first port>", which the kernel keeps for the whole host (for its
// network namespace, exactly the ports' scope) until the holder closes it or dies. tnt-launch
// claims the same names for the bases it picks (tnt_launch/gpi2.py).
#pragma once

#include <string>
#include <vector>

#include "transport/socket.hpp"

namespace tnt {

// Whether TCP `port` can be bound on this host now, with SO_REUSEADDR as GPI-2 binds it.
bool port_free(int port);

// The abstract socket name claiming the block of 8 ports that holds `port`.
std::string port_claim_name(int port);

// A claim on every port of a GPI-2 base for some sockets; released when destroyed.
class PortClaim {
 public:
  PortClaim() = default;
  // Claims the blocks of `base`'s ports for `sockets` ranks, all or none: held() is false when
  // another process holds any of them. Throws when this process has no descriptor to spare.
  static PortClaim take(int base, int sockets);
  bool held() const { return granted_; }

 private:
  std::vector<Socket> blocks_;  // none where the host forbids abstract sockets
  bool granted_ = false;
};

// A base for `sockets` ranks whose ports are free on this host and claimed by no one, claimed for
// the caller, who keeps `claim` until GPI-2 has bound the ports (rank 0, for the job).
struct ChosenPortBase {
  int base;
  PortClaim claim;
};
ChosenPortBase choose_gpi2_port_base(int sockets);

}  // namespace tnt
