// The environment contract, read: what a rank learns from its launcher.
#include "tnt_comm/identity.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include "tnt_comm/types.hpp"
#include "transport/gpi2.hpp"

namespace tnt {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

long env_int(const char* name, long fallback, long low, long high) {
  const char* v = env(name);
  if (v == nullptr) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < low || x > high) {
    throw InvalidArgument(std::string(name) + "=" + v + " is not an integer in [" +
                          std::to_string(low) + ", " + std::to_string(high) + "]");
  }
  return x;
}

// A positive number of seconds from the environment (inf: no limit), or `fallback` where unset.
double env_seconds(const char* name, double fallback) {
  const char* t = env(name);
  if (t == nullptr) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(t, &end);
  if (*end != '\0' || !(seconds > 0)) {
    throw InvalidArgument(std::string(name) + "=" + t + " is not a positive number of seconds (inf: no limit)");
  }
  return seconds;
}

}  // namespace

Identity Identity::from_environment() {
  Identity id;
  id.size = static_cast<int>(env_int("TNT_SIZE", 1, 1, 1 << 20));
  id.timeout_s = env_seconds("TNT_TIMEOUT_S", id.timeout_s);
  id.start_timeout_s = env_seconds("TNT_START_TIMEOUT_S", std::max(id.timeout_s, kMinStartTimeoutS));
  if (const char* a = env("TNT_ALLREDUCE")) id.allreduce = a;
  if (id.allreduce != "auto" && id.allreduce != "flat") {
    throw InvalidArgument("TNT_ALLREDUCE=" + id.allreduce +
                          " is not one of auto (host-aware across hosts, the default) or flat");
  }
  if (const char* s = env("TNT_SINGLE_COPY")) id.single_copy = s;
  if (id.single_copy != "auto" && id.single_copy != "off") {
    throw InvalidArgument("TNT_SINGLE_COPY=" + id.single_copy +
                          " is not one of auto (read peers' buffers in place where allowed, the default) or off");
  }
  if (id.size == 1) return id;
  for (const char* required : {"TNT_RANK", "TNT_MASTER_ADDR", "TNT_MASTER_PORT", "TNT_JOB_TOKEN"}) {
    if (env(required) == nullptr) {
      throw InvalidArgument(std::string("TNT_SIZE is set but ") + required +
                            " is not: start every rank with tnt-launch, which sets the whole "
                            "environment contract");
    }
  }
  id.rank = static_cast<int>(env_int("TNT_RANK", 0, 0, id.size - 1));
  id.local_rank = static_cast<int>(env_int("TNT_LOCAL_RANK", id.rank, 0, id.size - 1));
  id.local_size = static_cast<int>(env_int("TNT_LOCAL_SIZE", id.size, 1, id.size));
  id.node_rank = static_cast<int>(env_int("TNT_NODE_RANK", 0, 0, id.size - 1));
  id.master_addr = env("TNT_MASTER_ADDR");
  id.master_port = static_cast<int>(env_int("TNT_MASTER_PORT", 0, 1, 65535));
  id.token = env("TNT_JOB_TOKEN");
  if (const char* job = env("TNT_JOB_ID")) id.job_id = job;
  for (char c : id.job_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      throw InvalidArgument("TNT_JOB_ID may contain only letters, digits, '-' and '_'");
    }
  }
  if (const char* t = env("TNT_TRANSPORT")) id.transport = t;
  const bool have_gpi2 = !gpi2_build().version.empty();
  if (id.transport == "gpi2" && !have_gpi2) {
    throw InvalidArgument("TNT_TRANSPORT=gpi2: this build of tnt-comm has no GPI-2 transport (build "
                          "it with GPI2_ROOT set, see docs/comm.md); use auto, shm or tcp");
  }
  if (id.transport != "auto" && id.transport != "shm" && id.transport != "tcp" && id.transport != "gpi2") {
    throw InvalidArgument("TNT_TRANSPORT=" + id.transport + " is not one of auto, shm, tcp" +
                          (have_gpi2 ? ", gpi2" : ""));
  }
  return id;
}

}  // namespace tnt
