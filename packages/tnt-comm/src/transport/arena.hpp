// A rank's shared arena: memory every rank of its host maps, so that the single-copy allreduce
// (collectives/single_copy.cpp) reads peers' inputs and writes their results in place. Buffers
// users allocate here (tnt_comm.shared_empty, the C ABI's alloc_shared) take part without a copy;
// other buffers are staged through a block of it. The arena is a POSIX shared-memory object as
// large as the machine's memory, reserved page by page as allocations first reach it (fallocate,
// so a full /dev/shm is an error at allocation instead of a SIGBUS later) and kept reserved for
// reuse until the process ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "transport/segment.hpp"

namespace tnt {

class SharedArena {
 public:
  // Creates the arena under `name`; peers open it with open_peer(name) until unlink().
  SharedArena(const std::string& name, std::size_t bytes);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // The virtual size every arena of a job gets: the machine's memory, at least 1 GiB.
  static std::size_t default_bytes();
  // Whether /dev/shm has room for what the single-copy path typically needs; where it does not
  // (a container's 64 MiB default), the job keeps to the slot path instead of failing later.
  static bool shm_has_room();
  // Maps a peer's arena (same size).
  static MappedMemory open_peer(const std::string& name, std::size_t bytes);

  std::size_t size() const { return memory_.size(); }
  std::byte* base() const { return memory_.data(); }
  // A block of at least `bytes` (page-aligned); throws tnt::Error, with the fix, when the arena or
  // /dev/shm is full.
  std::byte* allocate(std::size_t bytes);
  void release(std::byte* block);
  // The offset of [p, p + bytes) in the arena, if it lies wholly inside.
  std::optional<std::size_t> offset_of(const void* p, std::size_t bytes) const;
  void unlink() { memory_.unlink(); }
  // Bytes backed by reserved pages: the high-water mark of the blocks in use.
  std::size_t reserved() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return reserved_;
  }

 private:
  int fd_ = -1;  // declared first: memory_'s initialiser sets it
  MappedMemory memory_;
  mutable std::mutex mutex_;
  std::map<std::size_t, std::size_t> free_;  // offset -> bytes, coalesced
  std::map<std::size_t, std::size_t> used_;  // offset -> bytes
  std::size_t reserved_ = 0;                 // [0, reserved_) is backed by pages
};

}  // namespace tnt
