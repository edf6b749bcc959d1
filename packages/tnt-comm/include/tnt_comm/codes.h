/* The codes tnt-comm's C ABI (c_api.h) and its C++ types (types.hpp) share, held once: element
 * types, reductions and error kinds. Plain C, no declarations besides. */
#ifndef TNT_COMM_CODES_H
#define TNT_COMM_CODES_H

/* Element types (tnt::DType takes its values from here). Never renumbered. */
enum tnt_comm_dtype {
  TNT_COMM_FLOAT16 = 0,
  TNT_COMM_BFLOAT16 = 1,
  TNT_COMM_FLOAT32 = 2,
  TNT_COMM_FLOAT64 = 3,
  TNT_COMM_INT32 = 4,
  TNT_COMM_INT64 = 5,
  TNT_COMM_UINT8 = 6
};

/* Reductions (tnt::ReduceOp takes its values from here). Never renumbered. */
enum tnt_comm_op { TNT_COMM_SUM = 0, TNT_COMM_PROD = 1, TNT_COMM_MIN = 2, TNT_COMM_MAX = 3, TNT_COMM_AVG = 4 };

/* Error kinds: the classes of tnt::Error (and of tnt_comm's Python exceptions). */
enum tnt_comm_error_kind {
  TNT_COMM_ERROR = 1,               /* tnt::Error, none of the below */
  TNT_COMM_COLLECTIVE_MISMATCH = 2, /* ranks made different calls */
  TNT_COMM_PEER_FAILURE = 3,        /* a peer died, disconnected or left early */
  TNT_COMM_TIMEOUT = 4,             /* no progress within the limit */
  TNT_COMM_INVALID_ARGUMENT = 5,    /* bad arguments */
  TNT_COMM_OTHER = 6                /* not an error of tnt-comm's (std::bad_alloc, ...) */
};

#endif /* TNT_COMM_CODES_H */
