// The environment contract, read: what a rank learns from its launcher.
#include "tnt_comm/identity.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <string>

#include <unistd.h>

#include "tnt_comm/types.hpp"

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

// The first name of a Slurm node list ("gpu[07-09,12],login" -> "gpu07"): each bracket's first value.
std::string first_slurm_node(const std::string& list) {
  std::string first;
  int depth = 0;
  bool skipping = false;  // inside a bracket, after its first value
  for (char c : list) {
    if (depth == 0 && c == ',') break;
    if (c == '[') {
      ++depth;
      skipping = false;
    } else if (c == ']') {
      --depth;
    } else if (depth == 0) {
      first += c;
    } else if (!skipping) {
      if (c == ',' || c == '-') {
        skipping = true;
      } else {
        first += c;
      }
    }
  }
  return first;
}

// The tasks on node `node` of a step, from SLURM_STEP_TASKS_PER_NODE ("2(x3),1": nodes 0-2 run
// two tasks, node 3 one); -1 if the text cannot be read.
int slurm_tasks_on_node(const std::string& text, int node) {
  int at = 0;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(pos, end - pos);
    char* rest = nullptr;
    const long tasks = std::strtol(item.c_str(), &rest, 10);
    long repeat = 1;
    if (rest == item.c_str() || tasks < 1) return -1;
    if (*rest == '(') {
      if (rest[1] != 'x') return -1;
      char* close = nullptr;
      repeat = std::strtol(rest + 2, &close, 10);
      if (repeat < 1 || std::string(close) != ")") return -1;
    } else if (*rest != '\0') {
      return -1;
    }
    if (node < at + repeat) return static_cast<int>(tasks);
    at += static_cast<int>(repeat);
    pos = end + 1;
  }
  return -1;
}

// A task of a Slurm job step started without tnt-launch (`srun -n 4 python train.py`): the job
// is the step. Its ranks meet at the step's first node, on a port derived from the job and step ids
// (below the kernel's ephemeral range, and clear of GPI-2's 10240-32767 and Slurm's 6817-6819), so
// that nothing needs configuring; TNT_MASTER_ADDR, TNT_MASTER_PORT and TNT_JOB_TOKEN override.
void from_slurm_step(Identity& id, long tasks) {
  const std::string where = " (tnt forms the job of a Slurm step with " + std::to_string(tasks) +
                            " tasks from Slurm's variables; set TNT_SIZE=1 to run every task as a "
                            "job of its own)";
  for (const char* required : {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_NODELIST",
                               "SLURM_STEP_TASKS_PER_NODE", "SLURM_JOB_ID"}) {
    if (env(required) == nullptr) {
      throw InvalidArgument(std::string("SLURM_STEP_NUM_TASKS=") + std::to_string(tasks) + " but " + required +
                            " is not set: this task cannot tell which rank it is" + where);
    }
  }
  id.size = static_cast<int>(tasks);
  id.rank = static_cast<int>(env_int("SLURM_PROCID", 0, 0, id.size - 1));
  id.local_rank = static_cast<int>(env_int("SLURM_LOCALID", 0, 0, id.size - 1));
  id.node_rank = static_cast<int>(env_int("SLURM_NODEID", 0, 0, id.size - 1));
  const std::string per_node = env("SLURM_STEP_TASKS_PER_NODE");
  id.local_size = slurm_tasks_on_node(per_node, id.node_rank);
  if (id.local_size < 1 || id.local_rank >= id.local_size) {
    throw InvalidArgument("SLURM_STEP_TASKS_PER_NODE=" + per_node + " does not give node " +
                          std::to_string(id.node_rank) + " a task " + std::to_string(id.local_rank) + where);
  }
  const long job = env_int("SLURM_JOB_ID", 0, 0, 1L << 40);
  const long step = env_int("SLURM_STEP_ID", 0, 0, 1L << 40);
  const char* addr = env("TNT_MASTER_ADDR");
  id.master_addr = addr != nullptr ? addr : first_slurm_node(env("SLURM_STEP_NODELIST"));
  int port = 2048 + static_cast<int>((job * 131 + step) % 8192);
  if (port >= 6817 && port <= 6819) port += 3;
  id.master_port = static_cast<int>(env_int("TNT_MASTER_PORT", port, 1, 65535));
  id.job_id = "slurm-" + std::to_string(job) + "-" + std::to_string(step);
  // Known to whoever knows the job: set TNT_JOB_TOKEN (the same in every task) for a secret one.
  const char* token = env("TNT_JOB_TOKEN");
  id.token = token != nullptr ? token : id.job_id + "-uid" + std::to_string(::getuid());
}

// A rank started by tnt-launch: the whole environment contract.
void read_tnt_launch(Identity& id) {
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
  id.elastic_min = static_cast<int>(env_int("TNT_ELASTIC", 0, 0, id.size));
  id.join_as = static_cast<int>(env_int("TNT_JOIN", -1, 0, 1 << 20));
  if (id.join_as >= 0 && id.elastic_min == 0) {
    throw InvalidArgument("TNT_JOIN is set but TNT_ELASTIC is not: only an elastic job admits a replacement");
  }
}

// What holds for every job however it was formed: a job id fit for file names. The transport is
// read here and checked against what this build has by the transport layer (Fabric::check_transport).
void check_job_id_and_read_transport(Identity& id) {
  for (char c : id.job_id) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      throw InvalidArgument("TNT_JOB_ID may contain only letters, digits, '-' and '_'");
    }
  }
  if (const char* t = env("TNT_TRANSPORT")) id.transport = t;
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
  const bool slurm_step = env("TNT_SIZE") == nullptr && env("SLURM_STEP_ID") != nullptr;
  const long step_tasks = slurm_step ? env_int("SLURM_STEP_NUM_TASKS", 1, 1, 1 << 20) : 1;
  if (step_tasks > 1) {
    from_slurm_step(id, step_tasks);
  } else if (id.size == 1) {
    return id;
  } else {
    read_tnt_launch(id);
  }
  check_job_id_and_read_transport(id);
  return id;
}

}  // namespace tnt
