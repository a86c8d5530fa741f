#include "sim/cut_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/strings.h"

namespace fedlora::sim {
namespace {

// Writes all of buf[0, n) to a blocking socket. Loopback peers here (gRPC) always drain their
// sockets, so a blocking write finishes quickly.
bool WriteAll(int fd, const char* buf, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, buf, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    buf += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CutProxy>> CutProxy::Start(const std::string& upstream) {
  const size_t colon = upstream.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(upstream.substr(colon + 1), &port) ||
      port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("CutProxy: upstream '", upstream, "' is not host:port"));
  }
  const std::string host = upstream.substr(0, colon);
  if (host != "127.0.0.1" && host != "localhost") {
    return absl::InvalidArgumentError(
        absl::StrCat("CutProxy: upstream host '", host, "' is not 127.0.0.1"));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return absl::UnavailableError(absl::StrCat("CutProxy: socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 16) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("CutProxy: bind/listen on 127.0.0.1: ", std::strerror(err)));
  }
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("CutProxy: pipe: ", std::strerror(err)));
  }
  return std::unique_ptr<CutProxy>(
      new CutProxy(fd, ntohs(addr.sin_port), port, pipe_fds[0], pipe_fds[1]));
}

CutProxy::CutProxy(int listen_fd, int port, int upstream_port, int wake_fd_read, int wake_fd_write)
    : listen_fd_(listen_fd),
      port_(port),
      upstream_port_(upstream_port),
      wake_read_(wake_fd_read),
      wake_write_(wake_fd_write),
      thread_([this] { Loop(); }) {}

CutProxy::~CutProxy() {
  stop_.store(true);
  const char c = 0;
  (void)!::write(wake_write_, &c, 1);
  thread_.join();
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

std::string CutProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void CutProxy::ArmCut(int64_t bytes) { armed_.store(bytes < 1 ? 1 : bytes); }

void CutProxy::Loop() {
  struct Conn {
    int client = -1;
    int server = -1;
  };
  std::vector<Conn> conns;
  std::vector<char> buf(64 << 10);
  auto close_conn = [](Conn& c) {
    if (c.client >= 0) {
      ::shutdown(c.client, SHUT_RDWR);
      ::close(c.client);
    }
    if (c.server >= 0) {
      ::shutdown(c.server, SHUT_RDWR);
      ::close(c.server);
    }
    c.client = c.server = -1;
  };
  while (!stop_.load()) {
    std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}, {wake_read_, POLLIN, 0}};
    for (const Conn& c : conns) {
      fds.push_back({c.client, POLLIN, 0});
      fds.push_back({c.server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) break;
    if (fds[1].revents & POLLIN) {
      char drain[16];
      while (::read(wake_read_, drain, sizeof(drain)) > 0) {
      }
    }
    if (fds[0].revents & POLLIN) {
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        const int server = ConnectLoopback(upstream_port_);
        if (server < 0) {
          ::close(client);  // the client sees a reset and retries, as with a down server
        } else {
          const int one = 1;
          ::setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          conns.push_back({client, server});
        }
      }
    }
    bool cut = false;
    for (size_t i = 0; i < conns.size() && !cut; ++i) {
      Conn& c = conns[i];
      const short up_ev = fds[2 + 2 * i].revents, down_ev = fds[3 + 2 * i].revents;
      if (c.client < 0) continue;
      if (up_ev & (POLLIN | POLLHUP | POLLERR)) {
        const ssize_t n = ::read(c.client, buf.data(), buf.size());
        if (n <= 0) {
          close_conn(c);
          continue;
        }
        size_t forward = static_cast<size_t>(n);
        const int64_t left = armed_.load();
        if (left >= 0 && static_cast<int64_t>(forward) >= left) {
          forward = static_cast<size_t>(left);
          cut = true;
        } else if (left >= 0) {
          armed_.store(left - n);
        }
        if (!WriteAll(c.server, buf.data(), forward)) close_conn(c);
        if (cut) break;
      }
      if (c.server >= 0 && (down_ev & (POLLIN | POLLHUP | POLLERR))) {
        const ssize_t n = ::read(c.server, buf.data(), buf.size());
        if (n <= 0 || !WriteAll(c.client, buf.data(), static_cast<size_t>(n))) close_conn(c);
      }
    }
    if (cut) {
      for (Conn& c : conns) close_conn(c);
      armed_.store(-1);
      cuts_.fetch_add(1);
    }
    std::erase_if(conns, [](const Conn& c) { return c.client < 0; });
  }
  for (Conn& c : conns) close_conn(c);
}

}  // namespace fedlora::sim
