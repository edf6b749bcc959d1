// What every message of an operation carries so that ranks can check they run the same collective.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tnt_comm/types.hpp"

namespace tnt {

enum class Kind : std::uint32_t {
  allreduce = 1,
  broadcast,
  allgather,
  allgatherv,
  reduce_scatter,
  barrier,
  p2p,
};

struct Descriptor {
  std::uint64_t group = 0;
  std::uint64_t seq = 0;
  Kind kind = Kind::barrier;
  std::int32_t dtype = 0;
  std::int32_t op = 0;
  std::int32_t root = 0;
  std::uint64_t count = 0;
  std::uint64_t thread = 0;  // hash of the calling thread's name (set_thread_name), 0 if unnamed
  // Allreduce: 1 where input and output lie in the rank's shared arena and the single-copy
  // algorithm runs (collectives/single_copy.cpp). Part of the call: every rank must agree.
  std::uint32_t shared = 0;

  bool same_call(const Descriptor& o) const {
    return group == o.group && seq == o.seq && kind == o.kind && dtype == o.dtype && op == o.op &&
           root == o.root && count == o.count && shared == o.shared;
  }
  bool operator==(const Descriptor& o) const { return same_call(o) && thread == o.thread; }
  bool operator!=(const Descriptor& o) const { return !(*this == o); }
  // e.g. "allreduce(float32, sum, count=10), call #3 of group 0x1f2e..."
  std::string describe() const;
  // "allreduce", "broadcast", ..., "send/recv"
  const char* kind_name() const;
  // An error's data about this call, blaming `ranks`.
  ErrorDetail detail(std::vector<int> ranks) const {
    ErrorDetail d;
    d.ranks = std::move(ranks);
    d.operation = kind_name();
    d.group = group;
    d.call = static_cast<std::int64_t>(seq);
    return d;
  }
};

// Sits at the start of every message slot.
struct MessageHeader {
  Descriptor desc;
  std::uint32_t tag;    // which piece of the operation this message is (see the tags below)
  std::uint32_t bytes;  // payload bytes that follow the header
};

// The tags of messages, one space for every algorithm: the low bits number an operation's chunks;
// the top bit marks a second kind of chunk (an allreduce's reduced result, a blocking sender's
// data); the two highest values are control messages without data.
namespace tags {
constexpr std::uint32_t kChunkMask = 0x7fffffffu;
constexpr std::uint32_t kSecondKind = 0x80000000u;  // allreduce: a result chunk; send: its caller blocks
constexpr std::uint32_t kAck = 0xfffffffeu;         // broadcast: a member has every chunk
constexpr std::uint32_t kComplete = 0xffffffffu;    // broadcast: every member has every chunk
}  // namespace tags
static_assert(sizeof(MessageHeader) <= 64, "a message header must fit its 64 bytes");

}  // namespace tnt
