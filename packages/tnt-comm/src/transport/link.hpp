// The GASPI-shaped contract between collectives and wires: a one-sided write into a peer's
// segment followed by a notification, ordered per link. Collectives never see which wire it is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "transport/segment.hpp"
#include "transport/socket.hpp"

namespace tnt {

struct Piece {
  const void* data;
  std::size_t bytes;
};

class Link {
 public:
  virtual ~Link() = default;
  // Copies the pieces back to back into the peer's segment at `offset`, then sets the peer's
  // notification `note` to `value` (notifications only grow) and rings its doorbell.
  virtual void write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                            std::uint64_t value) = 0;
  virtual const char* kind() const = 0;
};

// Same host: the peer's segment is mapped here, so a write is a memcpy into it.
class ShmLink final : public Link {
 public:
  explicit ShmLink(SegmentView peer) : peer_(peer) {}
  void write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                    std::uint64_t value) override;
  const char* kind() const override { return "shm"; }

 private:
  SegmentView peer_;
};

// Frames on the peer's TCP connection; the peer's receiver thread lands the bytes in its segment.
struct FrameHeader {
  enum Type : std::uint32_t { write_notify = 1, abort = 2, bye = 3, probe = 4, probe_reply = 5 };
  std::uint32_t type;
  std::uint32_t note;
  std::uint64_t value;
  std::uint64_t offset;
  std::uint64_t bytes;
};

// A send that fails (the peer's end is gone) throws PeerFailure naming the peer.
class TcpLink final : public Link {
 public:
  TcpLink(int peer, const Socket& sock, std::mutex& send_mutex) : peer_rank_(peer), sock_(sock), mutex_(send_mutex) {}
  void write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                    std::uint64_t value) override;
  const char* kind() const override { return "tcp"; }

 private:
  int peer_rank_;
  const Socket& sock_;
  std::mutex& mutex_;
};

}  // namespace tnt
