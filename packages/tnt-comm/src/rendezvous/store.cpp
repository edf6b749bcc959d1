#include "rendezvous/store.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tnt_comm/types.hpp"

// Wire format: a client first sends "TNT1" + u32 length + token and gets one byte 'K' back
// (a wrong token gets 'R' and the connection is closed). Requests are op(1) + u32 klen + key +
// u32 vlen + value; replies are u32 length + value, or kRefused + u32 length + a message when the
// server drops a request it will not serve. Ops: 'S' set, 'G' get (reply held until the key
// exists), 'T' try-get (reply "0" or "1"+value), 'A' add (value and reply are decimal integers),
// 'C' claim (sets the key only where it is absent; the reply is the value it holds after: the first
// claim's, which is how clients that may race agree on one decision).

namespace tnt {
namespace {

constexpr char kMagic[4] = {'T', 'N', 'T', '1'};
constexpr std::size_t kHelloHeader = 8;
// Keys and values stay far below this; it bounds what one request can make the server buffer.
constexpr std::uint32_t kMaxField = 1u << 20;
constexpr std::uint32_t kRefused = 0xffffffffu;
constexpr std::uint32_t kMaxMessage = 4096;
// Longest token a stranger may present; anything longer is not worth reading.
constexpr std::size_t kMaxToken = 4096;
// A real client sends its hello right after connecting: strangers get this long to do so, and
// only this many may wait at once, so they cannot pin the server's descriptors.
constexpr double kHelloSeconds = 2.0;
constexpr std::size_t kMaxUnauthenticated = 64;

void put_u32(std::string& out, std::uint32_t v) { out.append(reinterpret_cast<char*>(&v), 4); }

std::uint32_t get_u32(const std::string& in, std::size_t at) {
  std::uint32_t v;
  std::memcpy(&v, in.data() + at, 4);
  return v;
}

std::string frame(const std::string& value) {
  std::string out;
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  return out + value;
}

struct Client {
  Socket sock;
  std::string in;
};

}  // namespace

StoreServer::StoreServer(const std::string& host, int port, std::string token)
    : listener_(Socket::listen_on(host, port)),
      strangers_(listener_, kHelloSeconds, kMaxUnauthenticated),
      token_(std::move(token)) {
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
  std::vector<std::unique_ptr<Client>> clients;  // authenticated ones
  std::vector<std::pair<Client*, std::string>> waiting;  // pending 'G' requests
  const std::size_t max_token = std::max(token_.size(), kMaxToken);

  auto reply = [](Client& c, const std::string& value) {
    try {
      std::string out = frame(value);
      c.sock.send_all(out.data(), out.size());
    } catch (const Error&) {
      c.sock.close();
    }
  };
  // Tells a client why its request is dropped (it cannot be skipped: the stream would lose sync).
  auto refuse = [](Client& c, const std::string& why) {
    std::string out;
    put_u32(out, kRefused);
    out += frame(why);
    try {
      c.sock.send_all(out.data(), out.size());
    } catch (const Error&) {
      // It is dropped either way.
    }
    return false;
  };
  auto too_long = [](const char* what, std::uint32_t bytes) {
    return std::string(what) + " of " + std::to_string(bytes) + " bytes is longer than the " +
           std::to_string(kMaxField) + "-byte limit of the rendezvous store";
  };

  // Reads the next part of a stranger's hello, exactly up to its end (nothing past it is taken).
  // A complete, right hello moves the connection to `clients`; a wrong one is answered and
  // closed, garbage is closed at once.
  auto read_hello = [&](Admission::Entry& e) {
    std::size_t want = kHelloHeader;
    if (e.in.size() >= kHelloHeader) want += get_u32(e.in, 4);
    const std::size_t had = e.in.size();
    e.in.resize(want);
    ssize_t n = ::recv(e.sock.fd(), &e.in[had], want - had, 0);
    e.in.resize(had + static_cast<std::size_t>(std::max<ssize_t>(n, 0)));
    if (n == 0 || (n < 0 && errno != EINTR)) return e.sock.close();
    if (std::memcmp(e.in.data(), kMagic, std::min<std::size_t>(e.in.size(), 4)) != 0) {
      return e.sock.close();
    }
    if (e.in.size() < kHelloHeader) return;
    const std::uint32_t len = get_u32(e.in, 4);
    if (len > max_token) return e.sock.close();
    if (e.in.size() < kHelloHeader + len) return;
    const bool ok = same_secret(e.in.substr(kHelloHeader), token_);
    const char answer = ok ? 'K' : 'R';
    try {
      e.sock.send_all(&answer, 1);
    } catch (const Error&) {
      return e.sock.close();
    }
    if (!ok) return e.sock.close();
    clients.push_back(std::make_unique<Client>(Client{std::move(e.sock), std::string()}));
  };

  // Serves the complete requests in c.in; false when the client must be dropped.
  auto handle = [&](Client& c) -> bool {
    while (true) {
      if (c.in.size() < 5) return true;
      const std::uint32_t klen = get_u32(c.in, 1);
      if (klen > kMaxField) return refuse(c, too_long("a key", klen));
      if (c.in.size() < 9 + std::size_t{klen}) return true;
      const std::uint32_t vlen = get_u32(c.in, 5 + klen);
      if (vlen > kMaxField) return refuse(c, too_long("a value", vlen));
      if (c.in.size() < 9 + std::size_t{klen} + vlen) return true;
      char op = c.in[0];
      std::string key = c.in.substr(5, klen);
      std::string value = c.in.substr(9 + klen, vlen);
      c.in.erase(0, 9 + std::size_t{klen} + vlen);
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
      } else if (op == 'C') {
        auto [it, first] = data.emplace(key, value);
        reply(c, it->second);
        for (auto w = waiting.begin(); first && w != waiting.end();) {
          if (w->second == key) {
            reply(*w->first, value);
            w = waiting.erase(w);
          } else {
            ++w;
          }
        }
      } else if (op == 'A') {
        std::int64_t now = 0;
        auto it = data.find(key);
        if (it != data.end()) now = std::stoll(it->second);
        now += std::stoll(value);
        data[key] = std::to_string(now);
        reply(c, data[key]);
      } else {
        return refuse(c, std::string("unknown request '") + op + "'");
      }
    }
  };

  std::vector<pollfd> fds;
  while (true) {
    // Fixed slots: wake pipe, listener (fd -1, which poll skips, while accepting is paused), then
    // the strangers, then the clients.
    fds.assign({pollfd{wake_[0], POLLIN, 0},
                pollfd{strangers_.accepting() ? listener_.fd() : -1, POLLIN, 0}});
    for (auto& e : strangers_.entries()) fds.push_back({e.sock.fd(), POLLIN, 0});
    const std::size_t first_client = fds.size();
    for (auto& c : clients) fds.push_back({c->sock.fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), strangers_.poll_timeout_ms()) < 0) {
      // EINTR, or a transient shortage: never retry in a tight loop.
      if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (fds[0].revents) return;
    for (std::size_t i = 0; i < clients.size(); ++i) {
      if (!fds[first_client + i].revents) continue;
      Client& c = *clients[i];
      char buf[4096];
      ssize_t n = ::recv(c.sock.fd(), buf, sizeof buf, 0);
      if (n < 0 && errno == EINTR) continue;
      bool keep = n > 0;
      if (keep) {
        c.in.append(buf, static_cast<std::size_t>(n));
        try {
          keep = handle(c);
        } catch (const std::exception&) {
          keep = false;
        }
      }
      if (!keep) c.sock.close();
    }
    // Hellos after the clients: a client promoted here has no slot in this round's fds.
    for (std::size_t i = 0; i < strangers_.entries().size(); ++i) {
      if (fds[2 + i].revents) read_hello(strangers_.entries()[i]);
    }
    // Drop the clients that closed, failed or were refused (a failed reply also closes one).
    for (auto it = waiting.begin(); it != waiting.end();) {
      it = it->first->sock.valid() ? it + 1 : waiting.erase(it);
    }
    clients.erase(std::remove_if(clients.begin(), clients.end(),
                                 [](const std::unique_ptr<Client>& c) { return !c->sock.valid(); }),
                  clients.end());
    strangers_.sweep();
    if (fds[1].revents) strangers_.accept_ready();
  }
}

StoreClient::StoreClient(const std::string& host, int port, const std::string& token,
                         Deadline deadline)
    : host_(host), port_(port), token_(token) {
  std::string hello(kMagic, 4);
  put_u32(hello, static_cast<std::uint32_t>(token.size()));
  hello += token;
  std::string last_error = "no answer";
  while (true) {
    sock_ = Socket::connect_to(host, port, deadline);
    char ok = 0;
    try {
      sock_.send_all(hello.data(), hello.size());
      if (sock_.wait_readable(deadline) && sock_.recv_all(&ok, 1) && ok == 'K') return;
      last_error = "the connection was closed";
    } catch (const Error& e) {
      // A store flooded with connections may drop ours before reading it: try again.
      last_error = e.what();
    }
    if (ok == 'R') {
      throw Error("the rendezvous store at " + host + ":" + std::to_string(port) +
                  " rejected this rank: its TNT_JOB_TOKEN differs from rank 0's (start every "
                  "rank with the same job environment, e.g. through tnt-launch)");
    }
    if (Clock::now() >= deadline) {
      throw Timeout("the rendezvous store at " + host + ":" + std::to_string(port) +
                    " did not answer (" + last_error + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string StoreClient::request(char op, const std::string& key, const std::string& value,
                                 Deadline deadline) {
  for (const std::string* field : {&key, &value}) {
    if (field->size() > kMaxField) {
      throw InvalidArgument("store " + std::string(field == &key ? "key" : "value") + " of " +
                            std::to_string(field->size()) + " bytes for '" + key.substr(0, 64) +
                            "' is longer than the " + std::to_string(kMaxField) +
                            "-byte limit of the rendezvous store");
    }
  }
  std::string out(1, op);
  put_u32(out, static_cast<std::uint32_t>(key.size()));
  out += key;
  put_u32(out, static_cast<std::uint32_t>(value.size()));
  out += value;
  sock_.send_all(out.data(), out.size());
  if (!sock_.wait_readable(deadline)) throw Timeout("store request '" + key + "' timed out");
  std::uint32_t len = 0;
  // The store lives in rank 0: closed, it says that rank 0 has left (failed, or ended early).
  const auto rank_0_left = [] {
    return PeerFailure(0, "rank 0 left the job: the rendezvous store it holds closed the connection");
  };
  if (!sock_.recv_all(&len, 4)) throw rank_0_left();
  if (len == kRefused) {
    std::uint32_t mlen = 0;
    std::string why = "no reason given";
    if (sock_.recv_all(&mlen, 4) && mlen <= kMaxMessage) {
      why.assign(mlen, '\0');
      if (mlen > 0 && !sock_.recv_all(why.data(), mlen)) why = "no reason given";
    }
    throw Error("the rendezvous store refused the request for '" + key + "': " + why);
  }
  // A reply is at most a value plus try-get's one-byte flag; more means the peer is no store.
  if (len > kMaxField + 1) {
    throw Error("the rendezvous store at " + host_ + ":" + std::to_string(port_) +
                " announced a reply of " + std::to_string(len) +
                " bytes, more than any value can be: is TNT_MASTER_PORT used by another service?");
  }
  std::string reply(len, '\0');
  if (len > 0 && !sock_.recv_all(reply.data(), len)) throw rank_0_left();
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

std::string StoreClient::claim(const std::string& key, const std::string& value) {
  return request('C', key, value, deadline_after(60));
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  return std::stoll(request('A', key, std::to_string(delta), deadline_after(60)));
}

}  // namespace tnt
