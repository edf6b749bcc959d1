// Factories of the collective algorithms; Group picks one by size and topology. Sizes are in
// bytes except where an element count is needed for reductions.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "collectives/operation.hpp"
#include "tnt_comm/types.hpp"

namespace tnt {

// Every rank sends its whole buffer to every other and reduces all of them locally: one
// round trip, for small buffers.
std::shared_ptr<Operation> make_allreduce_one_shot(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                                   void* out, std::size_t count, DType dtype,
                                                   ReduceOp op);
// Up to this many bytes recursive doubling runs on up to 8 members; on more, proportionally less.
constexpr std::size_t kRecursiveDoublingBytes = 64 * 1024;
// Whether recursive doubling applies: a power of two (>= 4) of members, all on one host, a dtype
// that is not half precision, and a buffer within kRecursiveDoublingBytes (scaled above 8 members).
bool recursive_doubling_fits(const Members& members, DType dtype, std::size_t bytes);
// log2(n) rounds, in each of which a member exchanges its running result with one partner: for
// small buffers on many ranks of one host, where the direct algorithm's 2(n-1) messages cost more
// than the data.
std::shared_ptr<Operation> make_allreduce_recursive_doubling(std::shared_ptr<const Members> members, Descriptor desc,
                                                             const void* in, void* out, std::size_t count, DType dtype,
                                                             ReduceOp op);
// Each rank owns one region: peers send it their part (reduce-scatter), it reduces the parts in
// rank order and sends the result back to everyone (allgather). Pipelined in chunks. Bandwidth
// optimal: every rank sends and receives 2(n-1)/n of the buffer.
std::shared_ptr<Operation> make_allreduce_direct(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                                 void* out, std::size_t count, DType dtype,
                                                 ReduceOp op);
// From this many bytes on, members of one host that may read each other's memory take the
// single-copy allreduce.
constexpr std::size_t kSingleCopyBytes = 256 * 1024;
// Whether the single-copy allreduce applies: every member on one host, all mapping each other's
// shared arenas (Members::shared_arenas; TNT_SINGLE_COPY), and a buffer of at least kSingleCopyBytes.
bool single_copy_fits(const Members& members, std::size_t bytes);
// Each member reduces its region straight from the peers' inputs and the peers copy the result
// straight from its output: every byte crosses between processes once (single_copy.cpp).
std::shared_ptr<Operation> make_allreduce_single_copy(std::shared_ptr<const Members> members, Descriptor desc,
                                                      const void* in, void* out, std::size_t count, DType dtype,
                                                      ReduceOp op);
// Whether the host-aware allreduce applies to the members' hosts: two or more hosts with the same
// number (>= 2) of members each.
bool host_aware_fits(const Members& members);
// Host-aware: reduce-scatter within each host (shared memory), then member l of every host
// allreduces region l with member l of the other hosts (a ring), then allgather within each host.
// Each host's link carries 2(H-1)/H of the buffer (H hosts) instead of the flat algorithm's
// 2(n-1)/n per rank times the ranks of the host. Every block is reduced once, by one rank, so all
// ranks get the same bits (summed within hosts first, then across hosts along the ring).
std::shared_ptr<Operation> make_allreduce_host_aware(std::shared_ptr<const Members> members, Descriptor desc,
                                                     const void* in, void* out, std::size_t count, DType dtype,
                                                     ReduceOp op);
// Whether the leaders' allreduce applies: two to eight hosts, at least one with two or more
// members (hosts may differ in size).
bool leaders_fit(const Members& members);
// For small buffers across hosts: every host sums onto its first member over shared memory, those
// leaders allreduce in one round trip (one-shot), and each leader broadcasts the result on its host.
// A host's link carries (H-1) buffers each way instead of the flat one-shot's (local members) x
// (remote members). Every leader adds the host sums in host order, so all ranks get the same bits.
std::shared_ptr<Operation> make_allreduce_via_leaders(std::shared_ptr<const Members> members, Descriptor desc,
                                                      const void* in, void* out, std::size_t count, DType dtype,
                                                      ReduceOp op);
// The first half of the direct allreduce: `in` holds n blocks of `count` elements; `out` gets our block.
std::shared_ptr<Operation> make_reduce_scatter(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                               void* out, std::size_t count, DType dtype,
                                               ReduceOp op);
std::shared_ptr<Operation> make_broadcast(std::shared_ptr<const Members> members, Descriptor desc, void* buf,
                                          std::size_t bytes, int root);
// bytes[m] from member m, concatenated in member order into `out`.
std::shared_ptr<Operation> make_allgatherv(std::shared_ptr<const Members> members, Descriptor desc, const void* in,
                                           void* out, std::vector<std::size_t> bytes);
std::shared_ptr<Operation> make_barrier(std::shared_ptr<const Members> members, Descriptor desc);
std::shared_ptr<Operation> make_send(std::shared_ptr<const Members> members, Descriptor desc, const void* buf,
                                     std::size_t bytes, int peer);
std::shared_ptr<Operation> make_recv(std::shared_ptr<const Members> members, Descriptor desc, void* buf, std::size_t bytes,
                                     int peer);

}  // namespace tnt
