// Who a rank is and how it connects and waits: what it learns from its launcher (the environment
// contract of docs/design.md).
#pragma once

#include <string>

namespace tnt {

// What a rank learns from the launcher (the environment contract: docs/design.md).
struct Identity {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  int local_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string job_id = "local";
  std::string token;
  std::string transport = "auto";  // auto | shm | tcp
  std::string allreduce = "auto";  // auto | flat (TNT_ALLREDUCE): host-aware across hosts, or never
  // auto | off (TNT_SINGLE_COPY): ranks of a host share arenas, where large allreduces of buffers
  // in them read and write the peers' buffers in place; or no arenas, always the message slots.
  std::string single_copy = "auto";
  double timeout_s = 300.0;  // TNT_TIMEOUT_S: how long a collective may go without progress
  // TNT_START_TIMEOUT_S: how long the start (every rank arriving, connecting, GPI-2 starting) may
  // take. Unset, the collective timeout but at least kMinStartTimeoutS: ranks start at the pace of
  // their imports (TensorFlow, a shared file system), which a short collective timeout says nothing about.
  double start_timeout_s = 300.0;
  static constexpr double kMinStartTimeoutS = 60.0;
  // TNT_ELASTIC: 0 (unset), or the fewest ranks the job may go on with. Elastic ranks meet at a
  // store that outlives every one of them (held by the launcher at TNT_MASTER_ADDR/PORT; rank 0
  // starts none), and after losing a rank the survivors may re-form the job (Runtime::shrink).
  int elastic_min = 0;
  // TNT_JOIN: -1 (unset), or the member id of a replacement process (tnt-launch --elastic MIN:MAX):
  // it waits at the store until the job admits it (Runtime::admit), then meets the job's ranks.
  int join_as = -1;
  // Whether GPI-2 may join pairs of ranks. It starts once per process, so an elastic job's
  // generations after the first (re-formed, or joined by a replacement) run without it: shared
  // memory within a host and TCP between hosts.
  bool gpi2_allowed = true;

  // Reads TNT_* variables; without TNT_SIZE, in a Slurm step of several tasks (plain srun), forms
  // the job from Slurm's variables; otherwise (or with TNT_SIZE=1) describes a single rank.
  static Identity from_environment();
};

}  // namespace tnt
