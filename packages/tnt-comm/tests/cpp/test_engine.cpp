// The runtime end to end in real processes (fork): engine, channels, shm and TCP links, every
// collective, fusion, failure handling, and finalize() waiting for a peer to read its last message.
// Run under ASan/UBSan and TSan by the nox sessions.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "collectives/channel.hpp"
#include "tnt_comm/tnt_comm.hpp"

using namespace tnt;

namespace {

// Closes a file descriptor when it goes out of scope.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// A port nobody holds now, for a job's rank 0 to listen on. Picked below 10240 as tests/ranks.py
// does, and for the same reason: the kernel hands ports of its ephemeral range (Linux: 32768-60999)
// to outgoing connections, and once one of them took the port a job had derived from its pid
// before rank 0 bound it; tnt-comm picks GPI-2's ports from 10240 to 32767.
int free_port() {
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(2048, 10239);
  for (int attempt = 0; attempt < 64; ++attempt) {
    const int port = pick(rng);
    Fd s{::socket(AF_INET, SOCK_STREAM, 0)};
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s.fd >= 0 && ::bind(s.fd, reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0) return port;
  }
  throw std::runtime_error("no free port between 2048 and 10239 in 64 tries");
}

// A rank of job `job` over `transport` ("mixed": two fake hosts, shm within and TCP between).
Identity identity(int rank, int size, int port, const std::string& transport, const std::string& job) {
  Identity id;
  id.rank = rank;
  id.size = size;
  id.local_rank = rank;
  id.local_size = size;
  id.node_rank = transport == "mixed" ? rank % 2 : 0;
  id.master_port = port;
  id.job_id = job + std::to_string(::getppid()) + transport + std::to_string(port);
  id.token = "secret";
  id.transport = transport == "mixed" ? "auto" : transport;
  id.timeout_s = 60;
  return id;
}

// Forks `size` ranks that each return rank_main(rank) as their exit code; true if all exit 0.
bool run_ranks(int size, const std::function<int(int)>& rank_main) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t started : pids) ::kill(started, SIGKILL);
      for (pid_t started : pids) ::waitpid(started, nullptr, 0);
      return false;
    }
    if (pid == 0) {
      int rc = 1;
      try {
        rc = rank_main(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    pids.push_back(pid);
  }
  // A rank that fails ends the job, as tnt-launch would: its peers would otherwise wait for it
  // until their start timeout (300 s), longer than ctest allows the whole test.
  bool ok = true;
  while (!pids.empty()) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) break;
    pids.erase(std::remove(pids.begin(), pids.end(), pid), pids.end());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    if (ok) {
      std::fprintf(stderr, "a rank (pid %d) failed: ending the others\n", static_cast<int>(pid));
      for (pid_t other : pids) ::kill(other, SIGKILL);  // not yet reaped: still our children
    }
    ok = false;
  }
  return ok;
}

int child(int rank, int size, int port, const std::string& transport) {
  Runtime& rt = Runtime::init(identity(rank, size, port, transport, "cpptest"));
  Group& world = rt.world();
  for (std::size_t count : {std::size_t{0}, std::size_t{3}, std::size_t{10000}, std::size_t{200000}}) {
    std::vector<float> x(count, static_cast<float>(rank + 1)), y(count);
    world.allreduce(x.data(), y.data(), count, DType::float32, ReduceOp::sum);
    for (float v : y) CHECK(v == static_cast<float>(size * (size + 1) / 2));
    std::vector<double> b(count, rank == 1 ? 7.0 : 0.0);
    world.broadcast(b.data(), count, DType::float64, 1);
    for (double v : b) CHECK(v == 7.0);
    std::vector<std::int32_t> g(count * static_cast<std::size_t>(size));
    std::vector<std::int32_t> mine(count, rank);
    world.allgather(mine.data(), g.data(), count, DType::int32);
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(g[i] == static_cast<int>(i / std::max<std::size_t>(count, 1)));
  }
  // Many non-blocking operations in flight at once, finished in any order.
  std::vector<std::vector<std::int64_t>> bufs(8, std::vector<std::int64_t>(50000, rank));
  std::vector<Work> works;
  for (auto& buf : bufs) {
    works.push_back(world.allreduce_async(buf.data(), buf.data(), buf.size(), DType::int64, ReduceOp::max));
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (auto& buf : bufs) CHECK(buf[0] == size - 1 && buf.back() == size - 1);
  // Point to point around a ring.
  std::vector<float> token(1000, static_cast<float>(rank)), got(1000);
  Work s = world.send_async(token.data(), token.size(), DType::float32, (rank + 1) % size);
  world.recv(got.data(), got.size(), DType::float32, (rank + size - 1) % size);
  s.wait();
  CHECK(got[999] == static_cast<float>((rank + size - 1) % size));
  // Fusion.
  FusedAllreduce fused(world, {{100, DType::float32}, {5, DType::float32}, {70000, DType::float32}}, 512,
                       ReduceOp::sum);
  std::vector<std::vector<float>> ts = {std::vector<float>(100, 1), std::vector<float>(5, 2),
                                        std::vector<float>(70000, 3)};
  for (std::size_t i = 3; i-- > 0;) fused.start(i, ts[i].data());
  for (std::size_t i = 0; i < 3; ++i) {
    fused.wait(i, ts[i].data());
    CHECK(ts[i][0] == static_cast<float>((i + 1) * static_cast<std::size_t>(size)));
  }
  world.barrier();
  // Two threads, each with its own group of all ranks (told apart by creation order), run at the
  // same time: their streams are independent, so every sum is exact.
  std::vector<int> all(static_cast<std::size_t>(size));
  std::iota(all.begin(), all.end(), 0);
  auto first = rt.new_group(all);
  auto second = rt.new_group(all);
  auto hammer = [&](Group& g, float v, const char* name) {
    set_thread_name(name);
    for (int i = 0; i < 50; ++i) {
      std::vector<float> x(i % 2 ? 100 : 100000, v), y(x.size());
      g.allreduce(x.data(), y.data(), x.size(), DType::float32, ReduceOp::sum);
      CHECK(y.front() == v * static_cast<float>(size) && y.back() == v * static_cast<float>(size));
    }
  };
  std::thread t1(hammer, std::ref(*first), 1.0f, "first");
  std::thread t2(hammer, std::ref(*second), 100.0f, "second");
  t1.join();
  t2.join();
  world.barrier();
  // Non-blocking allreduces of several message windows each, in flight at once on three groups
  // of the same ranks (one in reversed order), started in the same order everywhere and waited
  // for in that order: a legal program, which needs the receivers to relieve full windows
  // (Channel::relieve) when one group's messages hold the slots another group's need.
  {
    std::vector<int> reversed(all.rbegin(), all.rend());
    std::vector<std::shared_ptr<Group>> groups = {rt.new_group(all), rt.new_group(reversed), rt.new_group(all)};
    const std::size_t sizes[] = {300001, 7, 120000, 300001, 52581, 200000, 1, 300001};
    std::vector<std::vector<double>> xs;
    std::vector<Work> inflight;
    for (std::size_t i = 0; i < 8; ++i) xs.emplace_back(sizes[i], static_cast<double>(rank + 1));
    for (std::size_t i = 0; i < 8; ++i) {
      Group& g = *groups[(i * 5 + 1) % groups.size()];
      inflight.push_back(g.allreduce_async(xs[i].data(), xs[i].data(), xs[i].size(), DType::float64, ReduceOp::sum));
    }
    for (std::size_t i = 0; i < 8; ++i) {
      inflight[i].wait();
      CHECK(xs[i].front() == size * (size + 1) / 2.0 && xs[i].back() == size * (size + 1) / 2.0);
    }
  }
  world.barrier();
  // Shared buffers (the single-copy allreduce where all ranks share a host and have an arena; the
  // slot path otherwise): in place and not, non-blocking on overlapping groups, sizes across
  // the threshold.
  {
    const std::size_t sizes[] = {300001, 40000, 1000003};
    std::vector<std::shared_ptr<void>> blocks;
    for (std::size_t n : sizes) {
      blocks.push_back(rt.allocate_shared(n * sizeof(double)));
      blocks.push_back(rt.allocate_shared(n * sizeof(double)));
    }
    if (blocks.front()) {
      std::vector<int> reversed(all.rbegin(), all.rend());
      std::vector<std::shared_ptr<Group>> groups = {rt.new_group(all), rt.new_group(reversed)};
      std::vector<Work> inflight;
      for (std::size_t i = 0; i < 3; ++i) {
        auto* in = static_cast<double*>(blocks[2 * i].get());
        auto* out = i == 1 ? in : static_cast<double*>(blocks[2 * i + 1].get());
        for (std::size_t k = 0; k < sizes[i]; ++k) in[k] = static_cast<double>(rank + 1) + static_cast<double>(k % 7);
        inflight.push_back(groups[i % 2]->allreduce_async(in, out, sizes[i], DType::float64, ReduceOp::sum));
      }
      for (std::size_t i = 0; i < 3; ++i) {
        inflight[i].wait();
        auto* out = static_cast<double*>(blocks[i == 1 ? 2 * i : 2 * i + 1].get());
        for (std::size_t k = 0; k < sizes[i]; k += 997) {
          CHECK(out[k] == size * (size + 1) / 2.0 + size * static_cast<double>(k % 7));
        }
      }
    }
  }
  world.barrier();
  Runtime::finalize();
  // After finalize, kept handles raise instead of touching freed state.
  bool refused = false;
  try {
    first->barrier();
  } catch (const Error&) {
    refused = true;
  }
  CHECK(refused);
  return check_failures() == 0 ? 0 : 1;
}

bool readable_within(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

bool run_job(int size, const std::string& transport) {
  const int port = free_port();
  const bool ok = run_ranks(size, [&](int r) { return child(r, size, port, transport); });
  std::printf("%d ranks over %s: %s\n", size, transport.c_str(), ok ? "ok" : "FAILED");
  std::fflush(stdout);  // or the next job's children would print it again as they exit
  return ok;
}

// finalize() waits until its peer has read the last message sent to it, or has left, or the
// collective timeout has passed. Rank 1 writes one message on its channel to rank 0 (as an
// operation's last send would) and finalizes, telling through a pipe when finalize() returned.
// Rank 0 then reads it half a second later ("read"), finalizes without reading it ("leave"), or
// never reads it and stays ("stay": rank 1's timeout is 0.3 s).
int settle_child(int rank, int port, const std::string& transport, const std::string& mode, int left_fd) {
  Identity id = identity(rank, 2, port, transport, "cppsettle");
  if (mode == "stay") id.timeout_s = 0.3;
  Runtime& rt = Runtime::init(id);
  const std::uint64_t key = 0x5e771e;  // a stream of its own
  if (rank == 1) {
    Channel& to_0 = *rt.channel(0);
    MessageHeader header{};
    header.desc.group = key;
    header.bytes = 4;
    const std::uint32_t payload = 0xfeed;
    CHECK(to_0.reserve_send(key, 1) == 0 && to_0.can_send(key, 0));
    to_0.send(key, header, &payload);
    Runtime::finalize();
    CHECK(::write(left_fd, "x", 1) == 1);
    return check_failures() == 0 ? 0 : 1;
  }
  Channel& from_1 = *rt.channel(1);
  const MessageHeader* got = nullptr;
  for (int i = 0; i < 30000 && got == nullptr; ++i) {
    got = from_1.peek(key, 0);
    if (got == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CHECK(got != nullptr);
  if (got == nullptr) return 1;
  if (mode == "read") {
    CHECK(!readable_within(left_fd, 500));  // rank 1 still waits in finalize()
    CHECK(*reinterpret_cast<const std::uint32_t*>(reinterpret_cast<const std::byte*>(got) + 64) == 0xfeed);
    from_1.consume(key, 0);
    CHECK(readable_within(left_fd, 30000));  // and leaves once its message was read
  } else if (mode == "leave") {
    Runtime::finalize();
    CHECK(readable_within(left_fd, 30000));  // long before rank 1's timeout (60 s)
  } else {
    CHECK(readable_within(left_fd, 30000));  // after its own timeout
  }
  Runtime::finalize();
  return check_failures() == 0 ? 0 : 1;
}

bool run_settle_job(const std::string& transport, const std::string& mode) {
  const int port = free_port();
  int left[2];
  if (::pipe(left) != 0) return false;
  const bool ok =
      run_ranks(2, [&](int r) { return settle_child(r, port, transport, mode, r == 1 ? left[1] : left[0]); });
  ::close(left[0]);
  ::close(left[1]);
  std::printf("finalize with an unread message over %s, peer %s: %s\n", transport.c_str(), mode.c_str(),
              ok ? "ok" : "FAILED");
  std::fflush(stdout);
  return ok;
}

}  // namespace

int main() {
  CHECK(run_job(2, "shm"));
  CHECK(run_job(3, "tcp"));
  CHECK(run_job(4, "mixed"));
  for (const char* transport : {"shm", "tcp"}) {
    for (const char* mode : {"read", "leave", "stay"}) CHECK(run_settle_job(transport, mode));
  }
  return finish("engine");
}
