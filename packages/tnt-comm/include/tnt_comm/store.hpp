// The rendezvous store as a service of its own. An elastic job (TNT_ELASTIC) meets at a store that
// outlives every rank: tnt-launch holds one (in Python, beside its supervisor); other launchers can
// run this one (python -m tnt_comm.store) and hand its address to the ranks as TNT_MASTER_ADDR/PORT.
#pragma once

#include <memory>
#include <string>

namespace tnt {

class StoreServer;

class StoreService {
 public:
  // Listens on host:port (0: any free port) for clients that present `token`, in a thread of its own.
  StoreService(const std::string& host, int port, const std::string& token);
  ~StoreService();
  StoreService(const StoreService&) = delete;
  StoreService& operator=(const StoreService&) = delete;
  int port() const;

 private:
  std::unique_ptr<StoreServer> server_;
};

}  // namespace tnt
