/* The small versioned C ABI of tnt-comm. Other native extensions (the TensorFlow op of tnt-keras)
 * fetch this table from the Python capsule `tnt_comm._core._C_API` (capsule name
 * "tnt_comm._C_API") and so share the one runtime of the process instead of loading a second copy.
 * Everything a caller needs is here or in codes.h, which it includes: the codes of element types,
 * reductions and error kinds, and errors as data (kind, blamed ranks, the call), so that no caller
 * reads them out of a message. */
#ifndef TNT_COMM_C_API_H
#define TNT_COMM_C_API_H

#include <stdint.h>

#include "tnt_comm/codes.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TNT_COMM_C_API_VERSION 3
#define TNT_COMM_C_API_CAPSULE "tnt_comm._C_API"

/* An error, as data (tnt::ErrorDetail). Its strings and ranks are valid only during the callback
 * that receives it, or, from last_error, until the next call of this table on the same thread. */
typedef struct tnt_comm_error {
  int32_t kind;          /* enum tnt_comm_error_kind */
  const char* message;   /* the whole sentence, as tnt-comm's exceptions say it */
  const int32_t* ranks;  /* world ranks to blame: dead, stalled or disagreeing */
  uint32_t num_ranks;    /* 0 where none is known */
  const char* operation; /* the call that stopped ("allreduce", ...); "" outside a call */
  uint64_t group;        /* that call's group id; 0 outside a call */
  int64_t call;          /* that call's number on its group; -1 outside a call */
  const char* mine;      /* mismatches: this rank's call, described; "" otherwise */
  const char* theirs;    /* mismatches: the blamed rank's call, described; "" otherwise */
  const char* peer_error; /* peer failures: what the blamed rank said it failed with as it left
                           * ("ValueError: ..."); "" where it said nothing (killed, or no error) */
} tnt_comm_error;

/* Called once per operation, from the progress thread; `error` is NULL on success. Must not
 * block. */
typedef void (*tnt_comm_done_fn)(void* ctx, const tnt_comm_error* error);

typedef struct tnt_comm_api_v3 {
  uint32_t version; /* TNT_COMM_C_API_VERSION */
  int (*rank)(void);
  int (*size)(void);
  /* Start an allreduce of `count` elements over the group whose id is `group` (tnt_comm's
   * Group.id, tnt::Group::id(); 0 for the world). The group must live on this rank: made with
   * new_group and not yet dropped. `src` may equal `dst`. Buffers must stay valid until `done`
   * runs. Returns 0 when started; otherwise nonzero and `done` is not called (see last_error). */
  int (*allreduce_async)(uint64_t group, const void* src, void* dst, uint64_t count, int32_t dtype,
                         int32_t op, tnt_comm_done_fn done, void* ctx);
  /* Start a broadcast of `count` elements from the group's rank `root`, in place. As above. */
  int (*broadcast_async)(uint64_t group, void* buf, uint64_t count, int32_t dtype, int32_t root,
                         tnt_comm_done_fn done, void* ctx);
  /* The last failed call of this table on this thread. */
  const tnt_comm_error* (*last_error)(void);
  /* A block of `bytes` in this rank's shared arena, which the ranks of its host map (the memory of
   * tnt_comm.shared_empty): a large allreduce whose input and output lie there on every rank of a
   * one-host group skips a copy. Sets *block to NULL where the rank has no arena (then use your
   * own memory); returns nonzero on failure (the arena or /dev/shm full: see last_error). Every
   * rank must place an allreduce's buffers alike, or the call fails as a collective mismatch. */
  int (*alloc_shared)(uint64_t bytes, void** block);
  /* Returns a block of alloc_shared (NULL is ignored). Any thread. */
  void (*free_shared)(void* block);
  /* Tensor fusion, the one implementation tnt_comm's FusedAllreduce also uses. The layout of a
   * fused buffer of `n` tensors of `counts[i]` elements of `dtype`: tensor i starts at element
   * offsets[i], a multiple of 64 bytes, zeros fill the gaps. Returns the buffer's elements
   * (0 with last_error set for an unknown dtype). */
  uint64_t (*fused_layout)(uint32_t n, const uint64_t* counts, int32_t dtype, uint64_t* offsets);
  /* Copies the n tensors into `dst` as fused_layout lays them out (zeroing the gaps), each times
   * *scale where scale is not NULL (floating dtypes: the scale and each product rounded to the
   * dtype; a scale of 0 gives zeros even for NaN inputs), then starts the allreduce of dst in
   * place, as allreduce_async does. The copy is done when this returns. */
  int (*fused_allreduce_async)(uint64_t group, uint32_t n, const void* const* srcs, const uint64_t* counts,
                               void* dst, int32_t dtype, int32_t op, const float* scale, tnt_comm_done_fn done,
                               void* ctx);
} tnt_comm_api_v3;

/* Returns the table. The runtime initialises from the environment on the first call that needs
 * it; a failure there is reported like any other (nonzero return, last_error). */
const tnt_comm_api_v3* tnt_comm_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TNT_COMM_C_API_H */
