#include "transport/gpi2_ports.hpp"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "tnt_comm/types.hpp"

namespace tnt {

namespace {

constexpr int kBlock = 8;
constexpr int kOffsets[] = {0, 256, 512};

// Binds the abstract socket `name` into `out`: false when someone else holds it. Where this host
// forbids abstract sockets (a security policy may), nothing can be claimed: true, `out` left empty,
// and the job picks its ports as before the claims, by their being free.
bool claim_block(const std::string& name, Socket& out) {
  Socket s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    const int error = errno;
    if (error == EMFILE || error == ENFILE) {
      throw Error("gpi2: no descriptor left to claim GPI-2's ports (" + std::string(std::strerror(error)) +
                  "): raise the limit (ulimit -n) or close descriptors");
    }
    return true;
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // Abstract: the name starts with a NUL byte and is exactly as long as the length says.
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), length) != 0) return errno != EADDRINUSE;
  out = std::move(s);
  return true;
}

}  // namespace

bool port_free(int port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return false;
  const int on = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);  // as GPI-2 binds
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return ::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

std::string port_claim_name(int port) {
  return "tnt-gpi2-ports:" + std::to_string(port / kBlock * kBlock);
}

PortClaim PortClaim::take(int base, int sockets) {
  PortClaim claim;
  for (int offset : kOffsets) {
    const int first = base + offset, last = first + sockets - 1;
    for (int block = first / kBlock * kBlock; block <= last; block += kBlock) {
      Socket held;
      if (!claim_block(port_claim_name(block), held)) return PortClaim{};  // releases what it took
      if (held.valid()) claim.blocks_.push_back(std::move(held));
    }
  }
  claim.granted_ = true;
  return claim;
}

ChosenPortBase choose_gpi2_port_base(int sockets) {
  // Below the ephemeral ports (32768 and up), which any outgoing connection may take. A base may be
  // any multiple of 8, tried from a random one, so that jobs starting together seldom even try the
  // same base; the claim settles it when they do.
  constexpr int kLow = 10240, kHigh = 32768 - 512 - 256, kBases = (kHigh - kLow) / kBlock;
  const int start = static_cast<int>(std::random_device{}() % kBases);
  for (int i = 0; i < kBases; ++i) {
    const int base = kLow + ((start + i) % kBases) * kBlock;
    PortClaim claim = PortClaim::take(base, sockets);
    if (!claim.held()) continue;
    bool free = true;
    for (int offset : kOffsets) {
      for (int s = 0; s < sockets && free; ++s) free = port_free(base + offset + s);
    }
    if (free) return {base, std::move(claim)};
  }
  throw Error("gpi2: no free ports between 10240 and 32767 for GPI-2 on this host");
}

}  // namespace tnt
