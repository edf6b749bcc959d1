// Claims on GPI-2's ports: all or none, per block of 8 ports, and gone with their holder.
#include <unistd.h>

#include "check.hpp"
#include "transport/gpi2_ports.hpp"

using namespace tnt;

int main() {
  // Above the range tnt-comm and tnt-launch pick bases from, so no job claims these blocks: a
  // claim is a name, whether or not its ports exist (TCP's end at 65535).
  const int base = 40000 + 8 * (::getpid() % 2000);
  CHECK(port_claim_name(base + 5) == "tnt-gpi2-ports:" + std::to_string(base));
  {
    PortClaim first = PortClaim::take(base, 2);
    CHECK(first.held());
    CHECK(!PortClaim::take(base, 2).held());
    CHECK(!PortClaim::take(base + 256, 1).held());  // its offset 0 is the first claim's offset 256
    CHECK(PortClaim::take(base + 8, 2).held());     // the next blocks
  }
  CHECK(PortClaim::take(base, 2).held());  // released with the first claim
  {
    // Nine sockets reach into a second block at every offset.
    PortClaim wide = PortClaim::take(base, 9);
    CHECK(wide.held());
    CHECK(!PortClaim::take(base + 8, 1).held());
    CHECK(PortClaim::take(base + 16, 1).held());
  }
  {
    // All or none: when one block is held elsewhere, the blocks taken before it are let go.
    PortClaim upper = PortClaim::take(base + 512, 1);  // blocks base+512, +768, +1024
    CHECK(upper.held());
    CHECK(!PortClaim::take(base, 1).held());        // needs base+512 too
    CHECK(PortClaim::take(base - 256, 1).held());   // base-256, base, base+256: all free again
  }
  return finish("test_gpi2_ports");
}
