#include "transport/arena.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "tnt_comm/types.hpp"

namespace tnt {
namespace {

constexpr std::size_t kPage = 4096;
constexpr std::size_t kMinArena = std::size_t{1} << 30;
// Below this much free /dev/shm the arena is not set up (see shm_has_room).
constexpr std::size_t kMinFreeShm = std::size_t{1} << 30;

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::size_t SharedArena::default_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::size_t memory = pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page) : 0;
  return round_up(std::max(memory, kMinArena), kPage);
}

bool SharedArena::shm_has_room() {
  struct statvfs fs {};
  if (::statvfs("/dev/shm", &fs) != 0) return false;
  return static_cast<std::size_t>(fs.f_bavail) * fs.f_frsize >= kMinFreeShm;
}

SharedArena::SharedArena(const std::string& name, std::size_t bytes)
    : memory_(MappedMemory::create_shared(name, bytes, &fd_)) {
  free_[0] = memory_.size();
}

SharedArena::~SharedArena() {
  if (fd_ >= 0) ::close(fd_);
}

MappedMemory SharedArena::open_peer(const std::string& name, std::size_t bytes) {
  return MappedMemory::open_shared(name, bytes);
}

std::byte* SharedArena::allocate(std::size_t bytes) {
  const std::size_t want = round_up(std::max<std::size_t>(bytes, 1), kPage);
  std::lock_guard<std::mutex> lock(mutex_);
  // First fit: low offsets are reused first, so the reserved part stays as small as the peak use.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const std::size_t offset = it->first;
    const std::size_t end = offset + want;
    if (end > reserved_) {
      const int err = ::posix_fallocate(fd_, static_cast<off_t>(reserved_), static_cast<off_t>(end - reserved_));
      if (err != 0) {
        throw Error("tnt_comm's shared memory: cannot reserve " + std::to_string(end - reserved_) +
                    " more bytes in /dev/shm (" + std::strerror(err) + (err == ENOSPC ? "; enlarge /dev/shm, e.g. docker --shm-size" : "") +
                    "); or set TNT_SINGLE_COPY=off to copy through the fixed message slots instead");
      }
      reserved_ = end;
    }
    const std::size_t rest = it->second - want;
    free_.erase(it);
    if (rest > 0) free_[end] = rest;
    used_[offset] = want;
    return memory_.data() + offset;
  }
  throw Error("tnt_comm's shared memory: no free block of " + std::to_string(want) + " bytes in the arena of " +
              std::to_string(memory_.size()) + " bytes; free shared arrays no longer needed");
}

void SharedArena::release(std::byte* block) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto offset = static_cast<std::size_t>(block - memory_.data());
  auto used = used_.find(offset);
  if (used == used_.end()) return;
  std::size_t start = offset, bytes = used->second;
  used_.erase(used);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + bytes) {
    bytes += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      bytes += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = bytes;
}

std::optional<std::size_t> SharedArena::offset_of(const void* p, std::size_t bytes) const {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < memory_.data() || b + bytes > memory_.data() + memory_.size()) return std::nullopt;
  return static_cast<std::size_t>(b - memory_.data());
}

}  // namespace tnt
