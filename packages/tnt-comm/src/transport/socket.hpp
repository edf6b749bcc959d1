// RAII TCP sockets with deadlines, used by the store and the peer links.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <deque>
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
  // Takes one waiting connection without blocking (on a non-blocking listener); when there is
  // none, returns an invalid socket and sets `error` to the errno (EAGAIN: nobody waiting).
  Socket accept_now(int& error) const;
  void set_nonblocking() const;
  void send_all(const void* data, std::size_t bytes) const;
  void send_iov(struct iovec* iov, int count) const;
  // Reads exactly `bytes`; false on orderly EOF before the first byte, throws on error or EOF midway.
  bool recv_all(void* data, std::size_t bytes) const;
  // Waits until readable or the deadline; false on timeout.
  bool wait_readable(Deadline deadline) const;
  // Bytes sent (a FIN included) that the peer's TCP has not acknowledged yet; 0 once the
  // connection is reset or closed, when none ever will be.
  std::size_t unacknowledged_bytes() const;

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

// Connections taken from a listener that have not yet proven, by a hello carrying the job token,
// that they belong to the job. Each must finish its hello before a short deadline and only `cap`
// (less under a low file limit) may wait at once, a newcomer past it closing the oldest, so idle,
// slow or flooding connections can neither hold up a real peer nor use up the file descriptors.
class Admission {
 public:
  struct Entry {
    Socket sock;
    Deadline deadline;
    std::string in;  // the hello bytes read so far
  };

  // Makes `listener` non-blocking; it must outlive this object.
  Admission(const Socket& listener, double hello_s, std::size_t cap);

  // False for a moment after the process ran out of descriptors: do not poll the listener then.
  bool accepting() const { return Clock::now() >= paused_until_; }
  // Takes what waits on the listener, a bounded batch per call so pending hellos get read between.
  void accept_ready();
  // Forgets the entries whose socket the caller closed or moved out, and closes the expired ones.
  // Call it after handling a poll round (entries are polled by index, so they stay put until then).
  void sweep();
  // How long poll may sleep before an entry expires, a pause ends or `limit` passes (-1: forever).
  int poll_timeout_ms(Deadline limit = Deadline::max()) const;
  std::deque<Entry>& entries() { return entries_; }

 private:
  const Socket& listener_;
  double hello_s_;
  std::size_t cap_;
  std::deque<Entry> entries_;  // oldest first, so deadlines ascend
  Deadline paused_until_{};
};

// Compares a presented token with the real one in time that does not depend on where they differ.
bool same_secret(const std::string& presented, const std::string& secret);

}  // namespace tnt
