// Element types, reduction operators and the error classes shared by every part of tnt-comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tnt_comm/codes.h"

namespace tnt {

// The codes of the C ABI, which codes.h holds once.
enum class DType : std::int32_t {
  float16 = TNT_COMM_FLOAT16,
  bfloat16 = TNT_COMM_BFLOAT16,
  float32 = TNT_COMM_FLOAT32,
  float64 = TNT_COMM_FLOAT64,
  int32 = TNT_COMM_INT32,
  int64 = TNT_COMM_INT64,
  uint8 = TNT_COMM_UINT8,
};

enum class ReduceOp : std::int32_t {
  sum = TNT_COMM_SUM,
  prod = TNT_COMM_PROD,
  min = TNT_COMM_MIN,
  max = TNT_COMM_MAX,
  avg = TNT_COMM_AVG,
};

std::size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);
bool is_valid(DType dtype);
bool is_valid(ReduceOp op);

// What an error is about, as data, so that no caller has to read it out of the message.
struct ErrorDetail {
  std::vector<int> ranks;    // world ranks to blame: dead, stalled or disagreeing; empty if none is known
  std::string operation;     // the call that stopped ("allreduce", "send", ...); empty outside a call
  std::uint64_t group = 0;   // that call's group id (Group::id); 0 outside a call
  std::int64_t call = -1;    // that call's number on its group, from 0; -1 outside a call
  std::string mine, theirs;  // mismatches: this rank's call and the blamed rank's, described
  // A peer's failure: what the blamed rank said it failed with as it left ("ValueError: ..."); empty
  // where it said nothing (it was killed, or left without an error of its own).
  std::string peer_error;
  // A timeout: the ranks it waited for that answered its probe and were not to blame (in the same
  // call): alive, and held up like this rank. An elastic job's survivors wait for them (shrink).
  std::vector<int> answered;
};

// Base of every error the library raises.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorDetail detail = {})
      : std::runtime_error(what), detail_(std::move(detail)) {}
  const ErrorDetail& detail() const noexcept { return detail_; }

 private:
  ErrorDetail detail_;
};

// Ranks called different collectives at the same point (kind, dtype, op, count, root or order).
class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

// A peer process died or closed its connection; the runtime cannot be used any more.
class PeerFailure : public Error {
 public:
  PeerFailure(int rank, const std::string& what, ErrorDetail detail = {})
      : Error(what, with_rank(std::move(detail), rank)), rank_(rank) {}
  int rank() const { return rank_; }

 private:
  static ErrorDetail with_rank(ErrorDetail detail, int rank) {
    if (detail.ranks.empty() && rank >= 0) detail.ranks.push_back(rank);
    return detail;
  }
  int rank_;
};

// No progress was possible for TNT_TIMEOUT_S seconds (or a wait's own timeout ran out), or the
// ranks did not all start within TNT_START_TIMEOUT_S.
class Timeout : public Error {
 public:
  using Error::Error;
};

// Bad arguments: wrong dtype, sizes, ranks.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

}  // namespace tnt
