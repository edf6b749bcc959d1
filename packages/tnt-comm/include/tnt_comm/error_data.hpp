// A tnt_comm_error as JSON: the fields (kind code, message, ranks, the call, ...) that Python's
// tnt_comm.error_from_data turns back into the exception tnt-comm's own API would have raised.
// Header-only, for native callers of the C ABI (tnt-keras' TensorFlow op and JAX handler) that hand
// an error to Python through a channel of their own (a Status payload, a buffer Python reads).
#ifndef TNT_COMM_ERROR_DATA_HPP
#define TNT_COMM_ERROR_DATA_HPP

#include <cstdint>
#include <string>

#include "tnt_comm/c_api.h"

namespace tnt {

inline void append_json_string(std::string* out, const char* text) {
  out->push_back('"');
  for (const char* c = text; *c != '\0'; ++c) {
    const auto u = static_cast<unsigned char>(*c);
    if (*c == '"' || *c == '\\') {
      out->push_back('\\');
      out->push_back(*c);
    } else if (u < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 15]);
    } else {
      out->push_back(*c);
    }
  }
  out->push_back('"');
}

// {"kind": 3, "message": ..., "ranks": [2], "operation": ..., "group": ..., "call": ..., "mine": ...,
// "theirs": ..., "peer_error": ...}
inline std::string error_data_json(const tnt_comm_error& e) {
  std::string out = "{\"kind\": " + std::to_string(e.kind) + ", \"message\": ";
  append_json_string(&out, e.message);
  out += ", \"ranks\": [";
  for (std::uint32_t i = 0; i < e.num_ranks; ++i) out += (i ? ", " : "") + std::to_string(e.ranks[i]);
  out += "], \"operation\": ";
  append_json_string(&out, e.operation);
  out += ", \"group\": " + std::to_string(e.group) + ", \"call\": " + std::to_string(e.call) + ", \"mine\": ";
  append_json_string(&out, e.mine);
  out += ", \"theirs\": ";
  append_json_string(&out, e.theirs);
  out += ", \"peer_error\": ";
  append_json_string(&out, e.peer_error);
  out += "}";
  return out;
}

}  // namespace tnt

#endif  // TNT_COMM_ERROR_DATA_HPP
