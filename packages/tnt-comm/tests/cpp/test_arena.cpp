// The shared arena's allocator: first fit, coalescing, reuse, and pages reserved only up to the
// high-water mark of the blocks in use.
#include <unistd.h>

#include <string>

#include "check.hpp"
#include "tnt_comm/types.hpp"
#include "transport/arena.hpp"

using namespace tnt;

int main() {
  const std::string name = "/tnt-arena-test-" + std::to_string(::getpid());
  constexpr std::size_t kMiB = 1 << 20;
  SharedArena arena(name, 64 * kMiB);
  MappedMemory peer_view = SharedArena::open_peer(name, 64 * kMiB);  // as a peer maps it
  arena.unlink();
  CHECK(arena.reserved() == 0);

  std::byte* a = arena.allocate(1);  // rounded up to a page
  std::byte* b = arena.allocate(3 * kMiB);
  std::byte* c = arena.allocate(kMiB);
  CHECK(a == arena.base());
  CHECK(b == a + 4096);
  CHECK(c == b + 3 * kMiB);
  CHECK(arena.reserved() == 4096 + 4 * kMiB);
  CHECK(arena.offset_of(b + 10, 100).value() == 4096 + 10);
  CHECK(!arena.offset_of(a + 64 * kMiB - 8, 16).has_value());  // runs past the end
  int outside = 0;
  CHECK(!arena.offset_of(&outside, sizeof outside).has_value());

  // Freed neighbours coalesce, and the hole is reused first (first fit): no more pages reserved.
  arena.release(b);
  arena.release(a);
  std::byte* d = arena.allocate(3 * kMiB + 4096);
  CHECK(d == a);
  CHECK(arena.reserved() == 4096 + 4 * kMiB);
  for (int i = 0; i < 100; ++i) arena.release(arena.allocate(2 * kMiB));  // above c, the same block each time
  CHECK(arena.reserved() == 4096 + 6 * kMiB);

  // Writes land in the shared object: the peer's mapping sees them.
  c[5] = std::byte{42};
  CHECK(peer_view.data()[(c - arena.base()) + 5] == std::byte{42});
  arena.release(c);
  arena.release(d);
  bool full = false;
  try {
    arena.allocate(65 * kMiB);
  } catch (const Error&) {
    full = true;
  }
  CHECK(full);
  std::byte* all = arena.allocate(64 * kMiB);  // everything coalesced back into one block
  CHECK(all == arena.base());
  arena.release(all);
  return finish("arena");
}
