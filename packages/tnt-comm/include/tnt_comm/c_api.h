/* The small versioned C ABI of tnt-comm. Other native extensions (the TensorFlow op of tnt-keras)
 * fetch this table from the Python capsule `tnt_comm._core._C_API` (capsule name
 * "tnt_comm._C_API") and so share the one runtime of the process instead of loading a second copy. */
#ifndef TNT_COMM_C_API_H
#define TNT_COMM_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TNT_COMM_C_API_VERSION 1
#define TNT_COMM_C_API_CAPSULE "tnt_comm._C_API"

/* Called once per operation, from the progress thread; `error` is NULL on success, otherwise a
 * message valid only during the call. Must not block. */
typedef void (*tnt_comm_done_fn)(void* ctx, const char* error);

typedef struct tnt_comm_api_v1 {
  uint32_t version; /* TNT_COMM_C_API_VERSION */
  int (*rank)(void);
  int (*size)(void);
  /* Start an allreduce over the world of `count` elements. `dtype` and `op` take the values of
   * tnt::DType and tnt::ReduceOp. `src` may equal `dst`. Buffers must stay valid until `done` runs.
   * Returns 0 when started; otherwise nonzero and `done` is not called (see last_error). */
  int (*allreduce_async)(const void* src, void* dst, uint64_t count, int32_t dtype, int32_t op,
                         tnt_comm_done_fn done, void* ctx);
  /* Start a broadcast of `count` elements from `root`, in place. Same contract as above. */
  int (*broadcast_async)(void* buf, uint64_t count, int32_t dtype, int32_t root,
                         tnt_comm_done_fn done, void* ctx);
  /* The message of the last failed call on this thread. */
  const char* (*last_error)(void);
} tnt_comm_api_v1;

/* Returns the table. The runtime initialises from the environment on the first call that needs
 * it; a failure there is reported like any other (nonzero return, last_error). */
const tnt_comm_api_v1* tnt_comm_api(void);

#ifdef __cplusplus
}
#endif

#endif /* TNT_COMM_C_API_H */
