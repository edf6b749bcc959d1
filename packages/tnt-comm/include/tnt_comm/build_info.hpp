// What this build of tnt-comm was compiled with; needs no running job.
#pragma once

#include <string>
#include <vector>

namespace tnt {

struct BuildInfo {
  std::vector<std::string> transports;  // "shm", "tcp", and "gpi2" where built with GPI-2
  // The GPI-2 it was built against: version ("1.6.0"), install prefix and network ("ethernet",
  // "infiniband", "roce", "ofi"); all "" when built without it.
  std::string gpi2_version, gpi2_prefix, gpi2_network;
};

BuildInfo build_info();

}  // namespace tnt
