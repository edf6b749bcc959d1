#include "tnt_comm/build_info.hpp"

#include "transport/gpi2.hpp"

namespace tnt {

BuildInfo build_info() {
  BuildInfo info;
  info.transports = {"shm", "tcp"};
  const Gpi2Build gpi2 = gpi2_build();
  if (!gpi2.version.empty()) {
    info.transports.emplace_back("gpi2");
    info.gpi2_version = gpi2.version;
    info.gpi2_prefix = gpi2.prefix;
    info.gpi2_network = gpi2.network;
  }
  return info;
}

}  // namespace tnt
