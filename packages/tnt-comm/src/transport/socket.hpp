// RAII TCP sockets with deadlines, used by the store and the peer links.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <string>

#include "common.hpp"

namespace tnt {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Connects to host:port, retrying refused connections until the deadline.
  static Socket connect_to(const std::string& host, int port, Deadline deadline);
  // Listens on host:port (port 0 picks a free one).
  static Socket listen_on(const std::string& host, int port);

  // Waits for a connection until the deadline; throws Timeout.
  Socket accept(Deadline deadline) const;
  void send_all(const void* data, std::size_t bytes) const;
  void send_iov(struct iovec* iov, int count) const;
  // Reads exactly `bytes`; false on orderly EOF before the first byte, throws on error or EOF midway.
  bool recv_all(void* data, std::size_t bytes) const;
  // Waits until readable or the deadline; false on timeout.
  bool wait_readable(Deadline deadline) const;

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int local_port() const;
  std::string local_ip() const;
  void close();
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace tnt
