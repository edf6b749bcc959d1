#include "store/store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tnt_comm/types.hpp"

// Wire format: a client first sends "TNT1" + u32 length + token and gets one byte 'K' back
// (a wrong token closes the connection). Requests are op(1) + u32 klen + key + u32 vlen + value;
// replies are u32 length + value. Ops: 'S' set, 'G' get (reply held until the key exists),
// 'T' try-get (reply "0" or "1"+value), 'A' add (value and reply are decimal integers).

namespace tnt {
namespace {

constexpr char kMagic[4] = {'T', 'N', 'T', '1'};
constexpr std::uint32_t kMaxField = 1u << 20;

void put_u32(std::string& out, std::uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }

std::string frame(const std::string& value) {
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  return out + value;
}

struct Client {
  Socket sock;
  std::string in;
  bool authenticated = false;
};

}  // namespace

StoreServer::StoreServer(const std::string& host, int port, std::string token)
    : listener_(Socket::listen_on(host, port)), token_(std::move(token)) {
  port_ = listener_.local_port();
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw Error("pipe failed");
  thread_ = std::thread([this] { serve(); });
}

StoreServer::~StoreServer() {
  char c = 'q';
  if (::write(wake_[1], &c, 1) < 0) { /* thread still stops at close below */ }
  if (thread_.joinable()) thread_.join();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void StoreServer::serve() {
  std::map<std::string, std::string> data;
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<std::pair<Client*, std::string>> waiting;  // pending 'G' requests

  auto reply = [](Client& c, const std::string& value) {
    try {
      std::string out = frame(value);
      c.sock.send_all(out.data(), out.size());
    } catch (const Error&) {
      c.sock.close();
    }
  };

  // Parses complete requests from c.in; returns false when the client must be dropped.
  auto handle = [&](Client& c) -> bool {
    while (true) {
      if (!c.authenticated) {
        if (c.in.size() < 8) return true;
        std::uint32_t len;
        std::memcpy(&len, c.in.data() + 4, 4);
        if (std::memcmp(c.in.data(), kMagic, 4) != 0 || len > kMaxField) return false;
        if (c.in.size() < 8 + len) return true;
        if (c.in.compare(8, len, token_) != 0 || len != token_.size()) {
          char no = 'R';
          c.sock.send_all(&no, 1);
          return false;
        }
        c.in.erase(0, 8 + len);
        c.authenticated = true;
        char ok = 'K';
        c.sock.send_all(&ok, 1);
        continue;
      }
      if (c.in.size() < 5) return true;
      std::uint32_t klen;
      std::memcpy(&klen, c.in.data() + 1, 4);
      if (klen > kMaxField) return false;
      if (c.in.size() < 9 + klen) return true;
      std::uint32_t vlen;
      std::memcpy(&vlen, c.in.data() + 5 + klen, 4);
      if (vlen > kMaxField) return false;
      if (c.in.size() < 9 + klen + vlen) return true;
      char op = c.in[0];
      std::string key = c.in.substr(5, klen);
      std::string value = c.in.substr(9 + klen, vlen);
      c.in.erase(0, 9 + klen + vlen);
      if (op == 'S') {
        data[key] = value;
        reply(c, "");
        for (auto it = waiting.begin(); it != waiting.end();) {
          if (it->second == key) {
            reply(*it->first, value);
            it = waiting.erase(it);
          } else {
            ++it;
          }
        }
      } else if (op == 'G') {
        auto it = data.find(key);
        if (it != data.end()) {
          reply(c, it->second);
        } else {
          waiting.emplace_back(&c, key);
        }
      } else if (op == 'T') {
        auto it = data.find(key);
        reply(c, it == data.end() ? std::string("0") : "1" + it->second);
      } else if (op == 'A') {
        std::int64_t now = 0;
        auto it = data.find(key);
        if (it != data.end()) now = std::stoll(it->second);
        now += std::stoll(value);
        data[key] = std::to_string(now);
        reply(c, data[key]);
      } else {
        return false;
      }
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    fds.push_back({wake_[0], POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (auto& c : clients) fds.push_back({c->sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), -1) < 0) continue;
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      try {
        clients.push_back(std::make_unique<Client>(Client{listener_.accept(Clock::now()), "", false}));
      } catch (const Error&) {
        // A connection that vanished before accept: nothing to do.
      }
    }
    std::vector<Client*> dropped;
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Client& c = *clients[i - 2];
      char buf[4096];
      ssize_t n = ::recv(c.sock.fd(), buf, sizeof buf, 0);
      bool keep = n > 0;
      if (keep) {
        c.in.append(buf, static_cast<std::size_t>(n));
        try {
          keep = handle(c) && c.sock.valid();
        } catch (const std::exception&) {
          keep = false;
        }
      }
      if (!keep) dropped.push_back(&c);
    }
    for (Client* c : dropped) {
      for (auto it = waiting.begin(); it != waiting.end();) {
        it = it->first == c ? waiting.erase(it) : it + 1;
      }
      for (auto it = clients.begin(); it != clients.end(); ++it) {
        if (it->get() == c) {
          clients.erase(it);
          break;
        }
      }
    }
  }
}

StoreClient::StoreClient(const std::string& host, int port, const std::string& token,
                         Deadline deadline)
    : host_(host), port_(port), token_(token) {
  while (true) {
    sock_ = Socket::connect_to(host, port, deadline);
    std::string hello(kMagic, 4);
    put_u32(hello, static_cast<std::uint32_t>(token.size()));
    hello += token;
    sock_.send_all(hello.data(), hello.size());
    char ok = 0;
    if (sock_.wait_readable(deadline) && sock_.recv_all(&ok, 1) && ok == 'K') return;
    if (ok == 'R') {
      throw Error("the rendezvous store at " + host + ":" + std::to_string(port) +
                  " rejected this rank: its TNT_JOB_TOKEN differs from rank 0's (start every "
                  "rank with the same job environment, e.g. through tnt-launch)");
    }
    if (Clock::now() >= deadline) throw Timeout("the rendezvous store did not answer");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string StoreClient::request(char op, const std::string& key, const std::string& value,
                                 Deadline deadline) {
  std::string out(1, op);
  put_u32(out, static_cast<std::uint32_t>(key.size()));
  out += key;
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  out += value;
  sock_.send_all(out.data(), out.size());
  if (!sock_.wait_readable(deadline)) throw Timeout("store request '" + key + "' timed out");
  std::uint32_t len = 0;
  if (!sock_.recv_all(&len, 4)) throw Error("the rendezvous store (rank 0) closed the connection");
  std::string reply(len, '\0');
  if (len > 0 && !sock_.recv_all(reply.data(), len)) throw Error("the rendezvous store closed");
  return reply;
}

void StoreClient::set(const std::string& key, const std::string& value) {
  request('S', key, value, deadline_after(60));
}

std::string StoreClient::get(const std::string& key, Deadline deadline) {
  try {
    return request('G', key, "", deadline);
  } catch (const Timeout&) {
    // The held request would answer later and desynchronise the stream: start afresh.
    *this = StoreClient(host_, port_, token_, deadline_after(10));
    throw;
  }
}

std::optional<std::string> StoreClient::try_get(const std::string& key) {
  std::string r = request('T', key, "", deadline_after(60));
  if (r.empty() || r[0] != '1') return std::nullopt;
  return r.substr(1);
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  return std::stoll(request('A', key, std::to_string(delta), deadline_after(60)));
}

}  // namespace tnt
