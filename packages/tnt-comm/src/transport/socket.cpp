#include "transport/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tnt_comm/types.hpp"

namespace tnt {
namespace {

std::string errno_text(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

sockaddr_in resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    throw Error("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(result->ai_addr);
  ::freeaddrinfo(result);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return addr;
}

int poll_ms(Deadline deadline) {
  double left = seconds_left(deadline);
  if (left <= 0) return 0;
  return left > 1.0 ? 1000 : static_cast<int>(left * 1000) + 1;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.release();
  }
  return *this;
}

std::size_t Socket::unacknowledged_bytes() const {
  tcp_info info{};
  socklen_t length = sizeof info;
  if (fd_ < 0 || ::getsockopt(fd_, IPPROTO_TCP, TCP_INFO, &info, &length) != 0 || info.tcpi_state == TCP_CLOSE) {
    return 0;
  }
  int queued = 0;
  if (::ioctl(fd_, SIOCOUTQ, &queued) != 0 || queued < 0) return 0;
  return static_cast<std::size_t>(queued);
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket Socket::connect_to(const std::string& host, int port, Deadline deadline) {
  sockaddr_in addr = resolve(host, port);
  std::string last_error = "no attempt";
  while (true) {
    Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!sock.valid()) throw Error(errno_text("socket"));
    if (::connect(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      int one = 1;
      ::setsockopt(sock.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return sock;
    }
    last_error = std::strerror(errno);
    if (Clock::now() >= deadline) {
      throw Timeout("could not connect to " + host + ":" + std::to_string(port) + " (" +
                    last_error + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

Socket Socket::listen_on(const std::string& host, int port) {
  Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!sock.valid()) throw Error(errno_text("socket"));
  int one = 1;
  ::setsockopt(sock.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr = resolve(host, port);
  if (::bind(sock.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    throw Error(errno_text(("cannot listen on " + host + ":" + std::to_string(port)).c_str()));
  }
  if (::listen(sock.fd(), 256) != 0) throw Error(errno_text("listen"));
  return sock;
}

Socket Socket::accept(Deadline deadline) const {
  while (true) {
    if (!wait_readable(deadline)) throw Timeout("timed out waiting for a connection");
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return Socket(fd);
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) throw Error(errno_text("accept"));
  }
}

Socket Socket::accept_now(int& error) const {
  int fd = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    error = errno;
    return Socket();
  }
  error = 0;
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return Socket(fd);
}

void Socket::set_nonblocking() const {
  int flags = ::fcntl(fd_, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK) < 0) throw Error(errno_text("fcntl"));
}

bool Socket::wait_readable(Deadline deadline) const {
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    int ms = poll_ms(deadline);
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throw Error(errno_text("poll"));
    if (rc == 0 && Clock::now() >= deadline) return false;
  }
}

void Socket::send_all(const void* data, std::size_t bytes) const {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd_, p, bytes, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(errno_text("send"));
    }
    p += n;
    bytes -= static_cast<std::size_t>(n);
  }
}

void Socket::send_iov(struct iovec* iov, int count) const {
  msghdr msg{};
  while (count > 0) {
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(count);
    ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(errno_text("send"));
    }
    auto left = static_cast<std::size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

bool Socket::recv_all(void* data, std::size_t bytes) const {
  char* p = static_cast<char*>(data);
  std::size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::recv(fd_, p + got, bytes - got, 0);
    if (n == 0) {
      if (got == 0) return false;
      throw Error("connection closed in the middle of a message");
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (got == 0 && (errno == ECONNRESET || errno == EPIPE)) return false;
      throw Error(errno_text("recv"));
    }
    got += static_cast<std::size_t>(n);
  }
  return true;
}

int Socket::local_port() const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

std::string Socket::local_ip() const {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, buf, sizeof buf);
  return buf;
}

namespace {

// Accepts per call, and never more than the cap: a connection accepted in one round is then read
// in the next before a flood of newcomers could push it out.
constexpr std::size_t kAcceptBatch = 16;
// How long to stop accepting when the process has no descriptor left and none to free.
constexpr double kPauseSeconds = 0.1;

// Strangers may hold at most an eighth of the process's descriptors per listener, so that under a
// low file limit the job itself keeps enough for its own sockets and segments.
std::size_t stranger_cap(std::size_t wanted) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return wanted;
  return std::clamp<std::size_t>(static_cast<std::size_t>(limit.rlim_cur) / 8, 4, wanted);
}

}  // namespace

Admission::Admission(const Socket& listener, double hello_s, std::size_t cap)
    : listener_(listener), hello_s_(hello_s), cap_(stranger_cap(std::max<std::size_t>(cap, 4))) {
  listener_.set_nonblocking();
}

void Admission::accept_ready() {
  const std::size_t batch = std::min(kAcceptBatch, cap_);
  for (std::size_t i = 0; i < batch; ++i) {
    int error = 0;
    Socket sock = listener_.accept_now(error);
    if (sock.valid()) {
      if (entries_.size() >= cap_) entries_.pop_front();
      entries_.push_back(Entry{std::move(sock), deadline_after(hello_s_), std::string()});
      continue;
    }
    if (error == EAGAIN || error == EWOULDBLOCK) return;
    if (error == EINTR || error == ECONNABORTED || error == EPROTO) continue;
    // Out of descriptors (or memory): the listener stays readable, so retrying at once would spin.
    // Free a descriptor by closing the oldest stranger if there is one, else pause briefly.
    if ((error == EMFILE || error == ENFILE) && !entries_.empty()) {
      entries_.pop_front();
      continue;
    }
    paused_until_ = deadline_after(kPauseSeconds);
    return;
  }
}

void Admission::sweep() {
  const Deadline now = Clock::now();
  entries_.erase(std::remove_if(entries_.begin(), entries_.end(),
                                [&](const Entry& e) { return !e.sock.valid() || now >= e.deadline; }),
                 entries_.end());
}

int Admission::poll_timeout_ms(Deadline limit) const {
  Deadline next = limit;
  if (!entries_.empty()) next = std::min(next, entries_.front().deadline);
  if (!accepting()) next = std::min(next, paused_until_);
  if (next == Deadline::max()) return -1;
  double left = seconds_left(next);
  if (left <= 0) return 0;
  // Rounded up, so the wake-up comes after the deadline rather than just before it.
  return static_cast<int>(std::min(left, 3600.0) * 1000) + 1;
}

bool same_secret(const std::string& presented, const std::string& secret) {
  if (presented.size() != secret.size()) return false;
  unsigned char diff = 0;
  for (std::size_t i = 0; i < secret.size(); ++i) {
    diff |= static_cast<unsigned char>(presented[i] ^ secret[i]);
  }
  return diff == 0;
}

}  // namespace tnt
