#include "transport/link.hpp"

#include <cstring>
#include <string>

#include "tnt_comm/types.hpp"

namespace tnt {

void ShmLink::write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                           std::uint64_t value) {
  std::byte* dst = peer_.base + offset;
  for (int i = 0; i < count; ++i) {
    std::memcpy(dst, pieces[i].data, pieces[i].bytes);
    dst += pieces[i].bytes;
  }
  peer_.note(note)->store(value, std::memory_order_release);
  peer_.doorbell().ring();
}

void TcpLink::write_notify(std::size_t offset, const Piece* pieces, int count, std::uint32_t note,
                           std::uint64_t value) {
  FrameHeader header{FrameHeader::write_notify, note, value, offset, 0};
  iovec iov[4];
  int n = 1;
  for (int i = 0; i < count && n < 4; ++i) {
    if (pieces[i].bytes == 0) continue;
    iov[n].iov_base = const_cast<void*>(pieces[i].data);
    iov[n].iov_len = pieces[i].bytes;
    header.bytes += pieces[i].bytes;
    ++n;
  }
  iov[0].iov_base = &header;
  iov[0].iov_len = sizeof header;
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    sock_.send_iov(iov, n);
  } catch (const PeerFailure&) {
    throw;
  } catch (const Error& e) {
    throw PeerFailure(peer_rank_, "rank " + std::to_string(peer_rank_) + " failed: its connection broke (" +
                                      e.what() + "; the process died or was killed; see its own output for the cause)");
  }
}

}  // namespace tnt
