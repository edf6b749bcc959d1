// The rendezvous store: a small TCP key-value service run by rank 0. Ranks publish their addresses
// here and wait for each other at start-up. Every connection must present the job token first,
// within a short deadline and among a bounded number of strangers, and keys and values are capped,
// so no connection from outside the job can stall the server, exhaust it or make it spin.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "common.hpp"
#include "transport/socket.hpp"

namespace tnt {

class StoreServer {
 public:
  StoreServer(const std::string& host, int port, std::string token);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;
  int port() const { return port_; }

 private:
  void serve();

  Socket listener_;
  Admission strangers_;  // connections that have not presented the token yet; serve() owns them
  int port_ = 0;
  std::string token_;
  int wake_[2] = {-1, -1};  // pipe that tells the thread to stop
  std::thread thread_;
};

class StoreClient {
 public:
  // Connects and authenticates, retrying until the deadline (rank 0 may start late).
  StoreClient(const std::string& host, int port, const std::string& token, Deadline deadline);

  void set(const std::string& key, const std::string& value);
  // Waits until the key exists; throws Timeout at the deadline.
  std::string get(const std::string& key, Deadline deadline);
  std::optional<std::string> try_get(const std::string& key);
  std::int64_t add(const std::string& key, std::int64_t delta);
  // Sets the key unless it exists; returns the value it holds then (the first claim's).
  std::string claim(const std::string& key, const std::string& value);
  // Local address of the connection: the address peers on other hosts can reach us at.
  std::string local_ip() const { return sock_.local_ip(); }

 private:
  std::string request(char op, const std::string& key, const std::string& value, Deadline deadline);

  std::string host_;
  int port_;
  std::string token_;
  Socket sock_;
};

}  // namespace tnt
