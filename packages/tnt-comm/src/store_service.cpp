#include "tnt_comm/store.hpp"

#include "rendezvous/store.hpp"

namespace tnt {

StoreService::StoreService(const std::string& host, int port, const std::string& token)
    : server_(std::make_unique<StoreServer>(host, port, token)) {}

StoreService::~StoreService() = default;

int StoreService::port() const { return server_->port(); }

}  // namespace tnt
