// The registered memory of a rank (GASPI's "segment"): a doorbell, one notification word per
// (peer, kind) and the message slots peers write into. Shared memory when peers on this host map
// it, private memory otherwise.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/doorbell.hpp"

namespace tnt {

struct SegmentLayout {
  static constexpr std::size_t kLine = 64;

  int world = 1;
  int slots = 4;                   // message slots per source rank
  std::size_t slot_bytes = 0;      // header + payload

  // Notification ids: `arrived(src)` counts messages src has written into our slots;
  // `acked(src)` counts our messages to src that src has consumed.
  static std::uint32_t arrived(int src) { return 2u * static_cast<std::uint32_t>(src); }
  static std::uint32_t acked(int src) { return 2u * static_cast<std::uint32_t>(src) + 1; }
  std::uint32_t notes() const { return 2u * static_cast<std::uint32_t>(world); }

  std::size_t note_offset(std::uint32_t note) const { return 2 * kLine + note * kLine; }
  std::size_t slots_offset() const {
    std::size_t end = note_offset(notes());
    return (end + 4095) / 4096 * 4096;
  }
  std::size_t slot_offset(int src, std::uint64_t index) const {
    return slots_offset() +
           (static_cast<std::size_t>(src) * static_cast<std::size_t>(slots) +
            static_cast<std::size_t>(index % static_cast<std::uint64_t>(slots))) *
               slot_bytes;
  }
  std::size_t total() const {
    return slots_offset() + static_cast<std::size_t>(world) * static_cast<std::size_t>(slots) * slot_bytes;
  }
};

// Typed access to the control words of a segment's memory.
struct SegmentView {
  std::byte* base = nullptr;
  SegmentLayout layout;

  std::atomic<std::uint32_t>* bell() const { return reinterpret_cast<std::atomic<std::uint32_t>*>(base); }
  std::atomic<std::uint32_t>* sleepers() const {
    return reinterpret_cast<std::atomic<std::uint32_t>*>(base + SegmentLayout::kLine);
  }
  Doorbell doorbell() const { return Doorbell(bell(), sleepers()); }
  std::atomic<std::uint64_t>* note(std::uint32_t id) const {
    return reinterpret_cast<std::atomic<std::uint64_t>*>(base + layout.note_offset(id));
  }
};

// An mmap'ed region, RAII. A created POSIX shared-memory object is unlinked by unlink() (as soon as
// every peer has mapped it) or, at the latest, by the destructor.
class MappedMemory {
 public:
  MappedMemory() = default;
  // With `keep_fd`, the object's descriptor is handed back there (the caller closes it) instead of
  // closed: for memory that is reserved piece by piece later (fallocate).
  static MappedMemory create_shared(const std::string& name, std::size_t bytes, int* keep_fd = nullptr);
  static MappedMemory open_shared(const std::string& name, std::size_t bytes);
  static MappedMemory anonymous(std::size_t bytes);
  ~MappedMemory();
  MappedMemory(MappedMemory&& other) noexcept { *this = std::move(other); }
  MappedMemory& operator=(MappedMemory&& other) noexcept;
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  void unlink();
  // Unlinks the name but keeps the memory mapped until the process ends: for memory a library we
  // cannot stop cleanly (GPI-2) may still write into.
  void keep_until_exit();

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  std::string owned_name_;  // set while we own a not yet unlinked shm object
};

}  // namespace tnt
