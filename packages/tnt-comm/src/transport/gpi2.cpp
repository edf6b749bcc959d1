#include "transport/gpi2.hpp"

#ifdef TNT_COMM_HAVE_GPI2
#include <GASPI.h>
#include <GPI2_VERSION.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <thread>
#include <utility>

// GPI-2 1.6's gaspi_config_set does not take the Ethernet device's port, so it is set in GPI-2's
// exported configuration, as gaspi_config_set would, before gaspi_proc_init reads it.
extern "C" gaspi_config_t glb_gaspi_cfg;
#endif

#ifdef TNT_COMM_HAVE_GPI2
namespace {

// The counter GPI-2 reads for its clock (GPI2_Sys.h: gaspi_get_cycles), read the same way.
std::uint64_t gpi2_counter() {
#if defined(__x86_64__)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t t;
  asm volatile("isb; mrs %0, cntvct_el0" : "=r"(t));
  return t;
#elif defined(__PPC64__)
  std::uint64_t t;
  asm volatile("mftb %0" : "=r"(t));
  return t;
#else
  return 0;
#endif
}

// The counter and CLOCK_MONOTONIC_RAW read at one moment: the tightest of a few brackets.
std::pair<double, double> counter_and_clock() {
  double best_spread = 1e300, counter = 0, ns = 0;
  for (int i = 0; i < 5; ++i) {
    timespec t{};
    const std::uint64_t before = gpi2_counter();
    ::clock_gettime(CLOCK_MONOTONIC_RAW, &t);
    const std::uint64_t after = gpi2_counter();
    const auto spread = static_cast<double>(after - before);
    if (spread < best_spread) {
      best_spread = spread;
      counter = static_cast<double>(before) + spread / 2;
      ns = static_cast<double>(t.tv_sec) * 1e9 + static_cast<double>(t.tv_nsec);
    }
  }
  return {counter, ns};
}

float counter_mhz() {
  const auto [c0, t0] = counter_and_clock();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto [c1, t1] = counter_and_clock();
  return t1 > t0 && c1 > c0 ? static_cast<float>((c1 - c0) / ((t1 - t0) / 1000.0)) : 0.0f;
}

}  // namespace

// GPI-2 turns its cycle counter into milliseconds (its timeouts, gaspi_time_get) at a rate that
// gaspi_proc_init measures by busy-waiting 500 times, 1.3 s of CPU in every process (GPI-2 1.6,
// GPI2_Sys.c), which on a host of many ranks is seconds of start-up. GPI-2 calls this function
// through its PLT, and libtnt_comm comes before libGPI2 in every lookup scope that loads GPI-2
// through tnt-comm, so this definition is the one it gets: the same rate, read across a 20 ms
// sleep. Where that reading fails, GPI-2's own measurement runs as before.
extern "C" float _gaspi_sample_cpu_freq(void);
extern "C" __attribute__((visibility("default"))) float gaspi_get_cpufreq(void) {
  static const float mhz = [] {
    const float measured = counter_mhz();
    return measured > 0.0f ? measured : _gaspi_sample_cpu_freq();
  }();
  return mhz;
}
#endif

namespace tnt {

#ifndef TNT_COMM_HAVE_GPI2

Gpi2Build gpi2_build() { return {}; }

Gpi2Wire::~Gpi2Wire() = default;
void Gpi2Wire::complete_posted() {}

#else

Gpi2Build gpi2_build() {
  Gpi2Build out;
  out.version = std::to_string(GASPI_MAJOR_VERSION) + "." + std::to_string(GASPI_MINOR_VERSION) + "." +
                std::to_string(GASPI_REVISION);
  out.prefix = TNT_COMM_GPI2_PREFIX;
  gaspi_config_t config;
  if (gaspi_config_get(&config) == GASPI_SUCCESS) {
    switch (config.network) {
      case GASPI_IB: out.network = "infiniband"; break;
      case GASPI_ROCE: out.network = "roce"; break;
      case GASPI_ETHERNET: out.network = "ethernet"; break;
      case GASPI_OFI: out.network = "ofi"; break;
      default: out.network = "other"; break;
    }
  }
  return out;
}

namespace {

constexpr gaspi_segment_id_t kSegment = 0;  // our segment, the one peers write into
constexpr gaspi_segment_id_t kStaging = 1;  // local source of every write
constexpr gaspi_queue_id_t kQueue = 0;

// GPI-2 notifications are nonzero 32-bit values; ours are 64-bit counts that only grow by less
// than 2^30 between two polls. The low 31 bits travel, with the top bit set so the value is never
// 0, and the receiver adds the difference to what it has seen.
constexpr std::uint32_t kTopBit = 0x80000000u;
constexpr std::uint64_t kLowMask = 0x7fffffffu;

gaspi_timeout_t ms_left(Deadline deadline) {
  const double s = seconds_left(deadline);
  if (s <= 0) return GASPI_TEST;
  if (s > 1e9) return GASPI_BLOCK - 1;
  return static_cast<gaspi_timeout_t>(s * 1000.0) + 1;
}

// A timeout of one post or queue wait: long enough for a loaded host, short of a hang.
constexpr gaspi_timeout_t kPostMs = 10000;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// GPI-2 reads its ranks and machinefile from GASPI_* variables. Where the launcher did not set
// them, they follow from the rendezvous: every rank's host address, in rank order (GPI-2's socket
// is a rank's index among the ranks of the same machinefile line). Only rank 0 reads the
// machinefile, so only rank 0 writes one; it is removed once GPI-2 has started.
std::string prepare_environment(int rank, int size, const std::vector<std::string>& hosts) {
  const char* names[] = {"GASPI_MFILE", "GASPI_RANK", "GASPI_SOCKET", "GASPI_NRANKS"};
  int set = 0;
  for (const char* name : names) set += env(name) != nullptr;
  std::string machinefile;
  if (set == 0) {
    int socket = 0;
    for (int r = 0; r < rank; ++r) socket += hosts[static_cast<std::size_t>(r)] == hosts[static_cast<std::size_t>(rank)];
    if (rank == 0) {
      char path[] = "/tmp/tnt-gpi2-machines-XXXXXX";
      const int fd = ::mkstemp(path);
      if (fd < 0) throw Error(std::string("gpi2: cannot write a machinefile in /tmp: ") + std::strerror(errno));
      std::string text;
      for (const std::string& host : hosts) text += host + "\n";
      const bool written = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
      ::close(fd);
      machinefile = path;
      if (!written) {
        ::unlink(path);
        throw Error("gpi2: cannot write the machinefile " + machinefile);
      }
    }
    ::setenv("GASPI_MFILE", rank == 0 ? machinefile.c_str() : "/dev/null", 1);
    ::setenv("GASPI_RANK", std::to_string(rank).c_str(), 1);
    ::setenv("GASPI_SOCKET", std::to_string(socket).c_str(), 1);
    ::setenv("GASPI_NRANKS", std::to_string(size).c_str(), 1);
  } else if (set != 4) {
    throw InvalidArgument("TNT_TRANSPORT=gpi2 with only some of GASPI_MFILE, GASPI_RANK, GASPI_SOCKET, "
                          "GASPI_NRANKS set: set all four, or none (tnt-comm then derives them)");
  }
  if (std::atoi(env("GASPI_RANK")) != rank || std::atoi(env("GASPI_NRANKS")) != size) {
    throw InvalidArgument(std::string("GASPI_RANK=") + env("GASPI_RANK") + " GASPI_NRANKS=" +
                          env("GASPI_NRANKS") + " disagree with TNT_RANK=" + std::to_string(rank) +
                          " TNT_SIZE=" + std::to_string(size) + ": both must describe this rank");
  }
  return machinefile;
}

// The descriptors this process may still open, and its limit; nullopt when unlimited or unknown.
struct Descriptors {
  std::size_t free, limit;
};
std::optional<Descriptors> descriptors() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  std::error_code ec;
  std::size_t open = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++open;
  }
  const auto limit_fds = static_cast<std::size_t>(limit.rlim_cur);
  // Counting needs a descriptor itself: with none left, that is the answer.
  if (ec) {
    if (ec.value() == EMFILE || ec.value() == ENFILE) return Descriptors{0, limit_fds};
    return std::nullopt;
  }
  return Descriptors{limit_fds - std::min(open, limit_fds), limit_fds};
}

std::string short_of_descriptors(const Descriptors& d, const std::string& needed) {
  return "this process has " + std::to_string(d.free) + " of its " + std::to_string(d.limit) +
         " file descriptors free, and GPI-2 needs " + needed + "; raise the limit (ulimit -n) or close "
         "descriptors";
}

// GPI-2 opens a few dozen sockets and descriptors of its own and only reports a bare error when it
// cannot: say so when this process is close to its descriptor limit.
std::string descriptor_hint() {
  const std::optional<Descriptors> d = descriptors();
  if (!d || d->free > 64) return "";
  return ": " + short_of_descriptors(*d, "a few dozen");
}

// GPI-2 short of descriptors as it starts may retry for many minutes (its Ethernet device connects
// to itself with a fixed 1000 s timeout) rather than fail: refuse to start it that short. It opened
// 30 + 3 per GPI-2 peer on rank 0, the most of any rank (GPI-2 1.6, Ethernet, jobs of 2 to 8 ranks
// with every pair over GPI-2).
void require_descriptors(std::size_t peers) {
  const std::size_t needed = 40 + 4 * peers;
  const std::optional<Descriptors> d = descriptors();
  if (d && d->free < needed) {
    throw Error("gpi2: GPI-2 cannot start: " + short_of_descriptors(*d, "about " + std::to_string(needed)));
  }
}

void check(gaspi_return_t ret, const std::string& what) {
  if (ret == GASPI_SUCCESS) return;
  if (ret == GASPI_TIMEOUT) throw Timeout("gpi2: " + what + " timed out" + descriptor_hint());
  throw Error("gpi2: " + what + " failed (GPI-2 error " + std::to_string(static_cast<int>(ret)) + ")" +
              descriptor_hint());
}

// Moves GPI-2's ports to this job's own range, starting at `base`: the service network listens at
// base+socket and base+256+socket, the Ethernet device at base+512+socket (socket: the rank's
// index among the ranks of its host). Returns whether GPI-2 runs over its Ethernet device.
bool configure(const std::string& base) {
  char* end = nullptr;
  const long b = std::strtol(base.c_str(), &end, 10);
  if (base.empty() || *end != '\0' || b < 1024 || b > 65535 - 1024) {
    throw InvalidArgument("TNT_GPI2_PORT_BASE=" + base +
                          " is not a port in [1024, 64511] (the job uses 1024 ports above it)");
  }
  gaspi_config_t config;
  check(gaspi_config_get(&config), "reading the configuration");
  config.logger = 0;
  config.build_infrastructure = GASPI_TOPOLOGY_NONE;  // we connect to the peers we need
  config.sn_port = static_cast<gaspi_uint>(b);
  check(gaspi_config_set(config), "setting the configuration");
  const bool ethernet = config.network == GASPI_ETHERNET;
  if (ethernet) glb_gaspi_cfg.dev_config.params.tcp.port = static_cast<gaspi_uint>(b + 512);
  return ethernet;
}

}  // namespace

// GPI-2 opens a few dozen descriptors as it starts and, short of them, raises the soft limit to
// the hard one itself, but only in some of its calls: raise it first, so none of them runs short.
void raise_descriptor_limit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
}

// Runs a blocking GPI-2 call on a thread of its own while `watch` checks, every 50 ms, that the
// job is still whole. When watch throws, the call is left behind: its thread holds nothing of
// ours (the task owns its state) and ends at the call's own timeout, or with the process.
gaspi_return_t watched(std::function<gaspi_return_t()> call, const std::function<void()>& watch) {
  auto task = std::make_shared<std::packaged_task<gaspi_return_t()>>(std::move(call));
  std::future<gaspi_return_t> result = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  while (result.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) watch();
  return result.get();
}

std::unique_ptr<Gpi2Wire> Gpi2Wire::start_job(int rank, int size, int local_size, const std::vector<std::string>& hosts,
                                              const std::vector<int>& peers, SegmentView mine, Exchange& exchange,
                                              Deadline deadline, const std::function<void()>& watch) {
  // Every rank starts GPI-2 (it meets all ranks of its machinefile), even one with no GPI-2
  // peer. Connections go from higher to lower ranks, as GPI-2's own static topology.
  // GPI-2 takes seconds to start on a loaded host: the start timeout (at least a minute unless
  // the user set TNT_START_TIMEOUT_S) covers it with the rest of the rendezvous.
  // GPI-2's ports: the job's TNT_GPI2_PORT_BASE (tnt-launch's or the user's), else a base rank 0
  // finds free and unclaimed on its host, the same for every rank; rank 0 holds its claim on it
  // while GPI-2 runs (gpi2_ports.hpp). The claim takes descriptors too: raise the limit first.
  raise_descriptor_limit();
  const char* fixed_base = std::getenv("TNT_GPI2_PORT_BASE");
  std::string port_base = fixed_base != nullptr ? fixed_base : "";
  PortClaim claim;
  if (port_base.empty()) {
    if (rank == 0) {
      const int here = static_cast<int>(std::count(hosts.begin(), hosts.end(), hosts[0]));
      ChosenPortBase chosen = choose_gpi2_port_base(here);
      claim = std::move(chosen.claim);
      exchange.set("gpi2-port-base", std::to_string(chosen.base));
    }
    port_base = exchange.get("gpi2-port-base", deadline);
  }
  // After the port base is out, so that the other ranks see this rank fail as GPI-2 starts.
  require_descriptors(peers.size());
  const auto wait_for_key = [&](const std::string& key) {
    while (!exchange.has(key)) {
      watch();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  auto wire = std::make_unique<Gpi2Wire>(rank, size, local_size, hosts, port_base, mine, deadline, watch);
  wire->port_claim_ = std::move(claim);
  for (int r : peers) {
    if (r < rank) wire->connect(r, deadline, watch);
  }
  exchange.set("gpi2-connected/" + std::to_string(rank), "1");
  for (int r : peers) {
    if (r > rank) wait_for_key("gpi2-connected/" + std::to_string(r));
  }
  for (int r : peers) wire->register_segment(r, deadline, watch);
  exchange.set("gpi2-registered/" + std::to_string(rank), "1");
  for (int r : peers) wait_for_key("gpi2-registered/" + std::to_string(r));
  return wire;
}

Gpi2Wire::Gpi2Wire(int rank, int size, int local_size, const std::vector<std::string>& hosts,
                   const std::string& port_base, SegmentView mine, Deadline deadline,
                   const std::function<void()>& watch)
    : rank_(rank), mine_(mine), seen_(mine.layout.notes() + static_cast<std::size_t>(size), 0) {
  // start_job, which makes every wire, raised the descriptor limit before it chose the ports.
  const std::string machinefile = prepare_environment(rank, size, hosts);
  const bool ethernet = configure(port_base);
  // Each rank keeps a driver and this poller busy, and over the Ethernet device also GPI-2's own
  // thread that moves the data: where those outnumber the cores, the poller yields between polls.
  // (2 ranks on 2 cores over Ethernet: a 16-byte allreduce took 1.1 ms spinning, 0.37 ms yielding.)
  cpu_set_t cpus;
  oversubscribed_ =
      sched_getaffinity(0, sizeof cpus, &cpus) == 0 && local_size * (ethernet ? 3 : 2) > CPU_COUNT(&cpus);
  const gaspi_timeout_t ms = ms_left(deadline);
  const gaspi_return_t init = watched([ms] { return gaspi_proc_init(ms); }, watch);
  if (!machinefile.empty()) ::unlink(machinefile.c_str());
  if (init == GASPI_ERR_INITED) {
    throw Error("gpi2: GPI-2 was already started in this process; it starts once per process, so "
                "run each job in a new process");
  }
  if (init == GASPI_TIMEOUT) {
    throw Timeout("gpi2: GPI-2 did not start: not every rank joined within the timeout (is the "
                  "port range of TNT_GPI2_PORT_BASE free on every host?)");
  }
  if ((init == GASPI_ERR_DEVICE || init == GASPI_ERR_SN) && descriptor_hint().empty()) {
    throw Error("gpi2: GPI-2 could not open its ports (another job or connection holds them): give "
                "each job its own TNT_GPI2_PORT_BASE, below the ephemeral ports (tnt-launch does)");
  }
  check(init, "starting GPI-2 (GASPI_MFILE=" + std::string(env("GASPI_MFILE")) + ")");
  staging_per_peer_ = static_cast<std::size_t>(mine.layout.slots) * mine.layout.slot_bytes;
  staging_ = MappedMemory::anonymous(staging_per_peer_ * static_cast<std::size_t>(size));
  check(gaspi_segment_bind(kSegment, mine.base, mine.layout.total(), 0), "registering the segment");
  check(gaspi_segment_bind(kStaging, staging_.data(), staging_.size(), 0), "registering the staging memory");
}

Gpi2Wire::~Gpi2Wire() {
  try {
    stop();
  } catch (...) {
    // Destructors do not throw; stop() only fails after a failure already reported.
  }
}

void Gpi2Wire::connect(int peer, Deadline deadline, const std::function<void()>& watch) {
  const auto r = static_cast<gaspi_rank_t>(peer);
  const gaspi_timeout_t ms = ms_left(deadline);
  check(watched([r, ms] { return gaspi_connect(r, ms); }, watch), "connecting to rank " + std::to_string(peer));
}

void Gpi2Wire::register_segment(int peer, Deadline deadline, const std::function<void()>& watch) {
  const auto r = static_cast<gaspi_rank_t>(peer);
  // Registration goes over GPI-2's service connections, which both sides may be opening to each
  // other at once; a registration lost in that race fails at once and is tried again.
  gaspi_return_t ret;
  const auto attempt = [r, deadline] { return gaspi_segment_register(kSegment, r, ms_left(deadline)); };
  while ((ret = watched(attempt, watch)) == GASPI_ERROR && seconds_left(deadline) > 0 &&
         descriptor_hint().empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  check(ret,
        "giving rank " + std::to_string(peer) + " our segment");
}

void Gpi2Wire::start(std::function<void(int)> on_bye) {
  on_bye_ = std::move(on_bye);
  poller_ = std::thread([this] { poll_loop(); });
}

// Goodbyes use one notification id per source rank past ours: notes() + rank.
void Gpi2Wire::say_bye(int peer) {
  std::lock_guard<std::mutex> lock(post_mutex_);
  const auto id = static_cast<gaspi_notification_id_t>(mine_.layout.notes() + static_cast<std::uint32_t>(rank_));
  gaspi_notify(kSegment, static_cast<gaspi_rank_t>(peer), id, 1, kQueue, kPostMs);
  gaspi_wait(kQueue, kPostMs);
}

std::unique_ptr<Link> Gpi2Wire::link_to(int peer) { return std::make_unique<Gpi2Link>(*this, peer); }

void Gpi2Wire::write_notify(int peer, std::size_t offset, const Piece* pieces, int count,
                            std::uint32_t note, std::uint64_t value) {
  const auto r = static_cast<gaspi_rank_t>(peer);
  const auto encoded = static_cast<gaspi_notification_t>((value & kLowMask) | kTopBit);
  std::size_t bytes = 0;
  for (int i = 0; i < count; ++i) bytes += pieces[i].bytes;
  std::lock_guard<std::mutex> lock(post_mutex_);
  gaspi_return_t ret;
  while (true) {
    if (bytes == 0) {
      ret = gaspi_notify(kSegment, r, note, encoded, kQueue, kPostMs);
    } else {
      // Our messages land in the peer's slots for us; the same slot of our staging region for
      // that peer is free again once the peer has acknowledged the message that used it last.
      const std::size_t first = mine_.layout.slot_offset(rank_, 0);
      if (offset < first || offset + bytes > first + staging_per_peer_) {
        throw Error("gpi2: a write outside the slots of rank " + std::to_string(rank_));
      }
      const std::size_t local = static_cast<std::size_t>(peer) * staging_per_peer_ + (offset - first);
      std::byte* dst = staging_.data() + local;
      for (int i = 0; i < count; ++i) {
        std::memcpy(dst, pieces[i].data, pieces[i].bytes);
        dst += pieces[i].bytes;
      }
      ret = gaspi_write_notify(kStaging, local, r, kSegment, offset, bytes, note, encoded, kQueue, kPostMs);
    }
    if (ret != GASPI_QUEUE_FULL) break;
    wait_queue("completing writes to free the queue");
  }
  check(ret, "writing to rank " + std::to_string(peer) + " (or its host cannot be reached)");
  // Keep the queue from filling up: complete what was posted once it is half full.
  gaspi_number_t used = 0, max = 0;
  if (gaspi_queue_size(kQueue, &used) == GASPI_SUCCESS && gaspi_queue_size_max(&max) == GASPI_SUCCESS &&
      used * 2 >= max) {
    wait_queue("completing writes");
  }
}

void Gpi2Wire::complete_posted() {
  std::lock_guard<std::mutex> lock(post_mutex_);
  wait_queue("completing writes");
}

void Gpi2Wire::wait_queue(const char* what) {
  using namespace std::chrono;
  gaspi_number_t used = 0;
  if (gaspi_queue_size(kQueue, &used) == GASPI_SUCCESS && used == 0) return;
  const auto deadline = steady_clock::now() + milliseconds(kPostMs);
  while (true) {
    const gaspi_return_t ret = gaspi_wait(kQueue, GASPI_TEST);
    if (ret != GASPI_TIMEOUT) return check(ret, what);
    if (steady_clock::now() >= deadline) return check(ret, std::string(what) + " (or a peer's host cannot be reached)");
    std::this_thread::sleep_for(microseconds(20));
  }
}

bool Gpi2Wire::poll_once() {
  gaspi_notification_id_t first = 0;
  const gaspi_number_t notes = mine_.layout.notes();
  const auto all = static_cast<gaspi_number_t>(seen_.size());
  if (gaspi_notify_waitsome(kSegment, 0, all, &first, GASPI_TEST) != GASPI_SUCCESS) return false;
  bool any = false;
  std::vector<int> byes;
  for (gaspi_notification_id_t id = first; id < all; ++id) {
    gaspi_notification_t got = 0;
    if (gaspi_notify_reset(kSegment, id, &got) != GASPI_SUCCESS || got == 0) continue;
    any = true;
    if (id >= notes) {
      byes.push_back(static_cast<int>(id - notes));
      continue;
    }
    std::uint64_t& seen = seen_[id];
    const std::uint64_t delta = ((got & kLowMask) - (seen & kLowMask)) & kLowMask;
    // A value older than one already delivered (writes overtaking each other) changes nothing.
    if (delta == 0 || delta > kLowMask / 2) continue;
    seen += delta;
    mine_.note(id)->store(seen, std::memory_order_release);
  }
  if (any) mine_.doorbell().ring();
  if (!byes.empty()) {
    // A peer's writes land before its goodbye, but may have been set after this pass read their
    // ids: one more pass delivers them before the goodbye is passed on.
    poll_once();
    for (int peer : byes) on_bye_(peer);
  }
  return any;
}

// GPI-2 has no way to sleep until a notification lands, so the poller checks: back to back for
// 2 ms after anything landed (yielding the core where busy threads outnumber cores), every 50 us while a
// driver sleeps waiting for data, and otherwise every 1 ms, 5 ms once idle for 100 ms, and 10 ms once
// idle for a second (an idle rank then costs 0.2% of a core on a busy 2-core host, against 0.3-0.7%
// with 5 ms, and the first message after a pause waits up to 10 ms: little beside the pause).
void Gpi2Wire::poll_loop() {
  using namespace std::chrono;
  auto last = steady_clock::now();
  while (!stopping_.load(std::memory_order_acquire)) {
    if (poll_once()) {
      last = steady_clock::now();
      continue;
    }
    const auto idle = steady_clock::now() - last;
    if (idle < milliseconds(2)) {
      if (oversubscribed_) sched_yield();
      continue;
    }
    const bool waited_on = mine_.sleepers()->load(std::memory_order_relaxed) != 0;
    std::this_thread::sleep_for(waited_on                 ? microseconds(50)
                                : idle < milliseconds(100) ? microseconds(1000)
                                : idle < seconds(1)        ? microseconds(5000)
                                                           : microseconds(10000));
  }
}

void Gpi2Wire::stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true, std::memory_order_release);
  if (poller_.joinable()) poller_.join();
  {
    std::lock_guard<std::mutex> lock(post_mutex_);
    gaspi_wait(kQueue, 1000);
  }
  // No gaspi_proc_term: in GPI-2 1.6 it frees what its service thread still uses (that thread is
  // told to stop but not joined), which crashed ranks at exit. GPI-2 runs on until the process
  // ends, so the memory it may write into or read from stays mapped until then.
  staging_.keep_until_exit();
}

#endif  // TNT_COMM_HAVE_GPI2

}  // namespace tnt
