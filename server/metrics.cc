#include "server/metrics.h"

#include <fcntl.h>
#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "proto/address.h"

namespace fedlora {
namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4";
constexpr char kMetricsPath[] = "/metrics";
// Connections served at once, each on its own thread; one more is closed as it is accepted, never
// queued behind slow peers. Scrapes take milliseconds; a slow peer holds a thread for at most
// kKeepAliveIdleS idle, or kRequestDeadlineMs per request.
constexpr size_t kPoolThreads = 32;
// Connections one peer address may hold at once; more are closed as they are accepted. A scraper
// needs one; a peer dribbling bytes on many cannot take the threads other scrapers need.
constexpr int kMaxConnectionsPerPeer = 8;
// Longest wait for the next bytes of a request, and for room to write the response (httplib's
// read and write timeouts).
constexpr time_t kReadTimeoutS = 2;
constexpr time_t kWriteTimeoutS = 2;
// Longest wait for a request to start on a connection, the first one included, and the most
// requests one connection may make (httplib's keep-alive limits, sent in the Keep-Alive header).
constexpr time_t kKeepAliveIdleS = 2;
constexpr size_t kKeepAliveMaxRequests = 10;
// Longest one request may take from its first byte to the end of the response: a peer that
// dribbles a byte now and then is cut off however short its pauses (httplib's read timeout alone
// applies to each wait, so such a peer could hold a thread for as long as it liked).
constexpr int64_t kRequestDeadlineMs = 2000;
// Request bodies (none is expected) larger than this are refused with 413.
constexpr size_t kMaxBodyBytes = 64 << 10;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Set by the post-routing handler when the response being written refuses a malformed request
// (400, 413, ...): the connection is closed after it. Per thread: each connection is served on one
// pool thread from start to end.
thread_local bool t_close_after_response = false;

// One connection as httplib's request parser and response writer see it: buffered reads, and
// waits that end at the per-wait timeout, at the request deadline, or when the server stops
// (`stop_fd` becomes readable), whichever comes first. Once a wait has failed, or the peer closed or
// reset the connection, broken() is true (httplib does not always pass such a failure up).
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(int sock, int stop_fd, int64_t read_timeout_ms, int64_t write_timeout_ms)
      : sock_(sock),
        stop_fd_(stop_fd),
        read_timeout_ms_(read_timeout_ms),
        write_timeout_ms_(write_timeout_ms) {}

  void set_deadline_ms(int64_t deadline_ms) { deadline_ms_ = deadline_ms; }
  bool broken() const { return broken_; }
  // Whether a request starts within `timeout_ms` (bytes already buffered count).
  bool WaitForRequest(int64_t timeout_ms) const { return Buffered() || Wait(POLLIN, timeout_ms); }

  // TLS from here on: the server's side of the handshake on `ssl` (whose fd is this socket, made
  // non-blocking), within the waits' bounds. False when it fails or times out.
  bool AcceptTls(SSL* ssl) {
    ssl_ = ssl;
    return SslCall([ssl] { return SSL_accept(ssl); }, read_timeout_ms_) > 0;
  }

  bool is_readable() const override { return Buffered() || Wait(POLLIN, read_timeout_ms_); }
  bool is_writable() const override { return Wait(POLLOUT, write_timeout_ms_); }

  ssize_t read(char* ptr, size_t size) override {
    if (pos_ == end_) {
      ssize_t n;
      if (ssl_ != nullptr) {
        n = SslCall([this] { return SSL_read(ssl_, buf_, sizeof(buf_)); }, read_timeout_ms_);
      } else {
        if (!Wait(POLLIN, read_timeout_ms_)) return -1;
        do {
          n = recv(sock_, buf_, sizeof(buf_), 0);
        } while (n < 0 && errno == EINTR);
      }
      if (n <= 0) {
        broken_ = true;
        return n < 0 ? -1 : 0;
      }
      pos_ = 0;
      end_ = static_cast<size_t>(n);
    }
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (ssl_ != nullptr) {
      const int chunk = static_cast<int>(std::min<size_t>(size, 1 << 20));
      return SslCall([this, ptr, chunk] { return SSL_write(ssl_, ptr, chunk); }, write_timeout_ms_);
    }
    if (!Wait(POLLOUT, write_timeout_ms_)) return -1;
    ssize_t n;
    do {
      n = send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) broken_ = true;
    return n < 0 ? -1 : n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Name(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Name(getsockname, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  bool Buffered() const { return pos_ < end_ || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }

  // Runs an OpenSSL call until it makes progress: its result when positive; else, while it wants
  // to read or write, waits for the socket (at most `timeout_ms` a wait) and tries again. 0 when
  // the peer closed the TLS session, -1 on any other failure (broken() from then on).
  template <class Call>
  int SslCall(Call call, int64_t timeout_ms) {
    while (true) {
      ERR_clear_error();  // SSL_get_error reads this thread's error queue
      const int r = call();
      if (r > 0) return r;
      const int err = SSL_get_error(ssl_, r);
      if ((err == SSL_ERROR_WANT_READ && Wait(POLLIN, timeout_ms)) ||
          (err == SSL_ERROR_WANT_WRITE && Wait(POLLOUT, timeout_ms))) {
        continue;
      }
      ERR_clear_error();
      broken_ = true;
      return err == SSL_ERROR_ZERO_RETURN ? 0 : -1;
    }
  }

  // True when the socket is ready for `events` (or in error: the next call reports it) within
  // `timeout_ms` and before the deadline; false, and broken() from then on, on timeout or when the
  // server stops.
  bool Wait(short events, int64_t timeout_ms) const {
    const int64_t until = std::min(NowMs() + timeout_ms, deadline_ms_);
    while (true) {
      const int64_t left = until - NowMs();
      if (left <= 0) break;
      pollfd fds[2] = {{sock_, events, 0}, {stop_fd_, POLLIN, 0}};
      const int r = poll(fds, 2, static_cast<int>(left));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || fds[1].revents != 0) break;
      if (fds[0].revents != 0) return true;
    }
    broken_ = true;
    return false;
  }

  void Name(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    char host[NI_MAXHOST];
    char serv[NI_MAXSERV];
    if (get(sock_, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), serv, sizeof(serv),
                    NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
      ip = host;
      port = std::atoi(serv);
    }
  }

  const int sock_;
  const int stop_fd_;
  const int64_t read_timeout_ms_;
  const int64_t write_timeout_ms_;
  int64_t deadline_ms_ = 0;
  mutable bool broken_ = false;
  SSL* ssl_ = nullptr;  // not owned; null for plaintext
  char buf_[4096];
  size_t pos_ = 0;
  size_t end_ = 0;
};

// Answers a plaintext request on the HTTPS listener with a 400 that says to use HTTPS. What the
// peer sent so far is read first: a close with unread bytes would reset the connection and could
// cost the peer the answer.
void RefusePlaintext(int sock, ConnectionStream& stream) {
  char sink[4096];
  for (int i = 0; i < 16 && recv(sock, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  const std::string body = "this listener speaks HTTPS only (the server runs TLS): use https://\n";
  const std::string reply =
      absl::StrCat("HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n",
                   "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  stream.write(reply.data(), reply.size());
}

// Set on the accepting thread while it closes a connection over kPoolThreads: process_and_close_socket
// then closes the socket at once instead of serving it.
thread_local bool t_refuse_connection = false;

// httplib's task queue for the accepted connections: kPoolThreads workers, and no queue. A
// connection that finds every worker busy is refused (closed on the accepting thread).
class ConnectionPool : public httplib::TaskQueue {
 public:
  explicit ConnectionPool(size_t n) {
    for (size_t i = 0; i < n; ++i) threads_.emplace_back([this] { Work(); });
  }

  void enqueue(std::function<void()> fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!stopping_ && busy_ < threads_.size()) {
        ++busy_;
        jobs_.push_back(std::move(fn));
        cv_.notify_one();
        return;
      }
    }
    t_refuse_connection = true;
    fn();
    t_refuse_connection = false;
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        fn = std::move(jobs_.front());
        jobs_.pop_front();
      }
      fn();
      std::lock_guard<std::mutex> lock(mu_);
      --busy_;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  size_t busy_ = 0;  // jobs queued or running; never above the number of threads
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The peer's address without its port ("" when unknown).
std::string PeerAddress(int sock) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char host[NI_MAXHOST];
  if (getpeername(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) != 0) {
    return "";
  }
  return host;
}

// httplib's server with its own connection loop: the same keep-alive rules as httplib's (its limits
// are read from the settings below), plus the request deadline and the stop pipe.
class ScrapeServer : public httplib::Server {
 public:
  explicit ScrapeServer(int stop_fd) : stop_fd_(stop_fd) {}
  ~ScrapeServer() override {
    if (ssl_ctx_ != nullptr) SSL_CTX_free(ssl_ctx_);
  }
  // HTTPS with `ctx` (owned from here on); set before the server starts.
  void set_ssl_ctx(SSL_CTX* ctx) { ssl_ctx_ = ctx; }
  bool https() const { return ssl_ctx_ != nullptr; }

 private:
  bool process_and_close_socket(socket_t sock) override {
    const std::string peer = t_refuse_connection ? "" : PeerAddress(sock);
    if (t_refuse_connection || !AdmitPeer(peer)) {
      shutdown(sock, SHUT_RDWR);
      close(sock);
      return false;
    }
    const bool ok = Serve(sock);
    {
      // Before the close: a peer that reconnects once it sees the end finds its slot free.
      std::lock_guard<std::mutex> lock(peers_mu_);
      if (--peers_[peer] == 0) peers_.erase(peer);
    }
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return ok;
  }

  bool AdmitPeer(const std::string& peer) {
    std::lock_guard<std::mutex> lock(peers_mu_);
    int& n = peers_[peer];
    if (n >= kMaxConnectionsPerPeer) return false;
    ++n;
    return true;
  }

  bool Serve(socket_t sock) {
    ConnectionStream stream(sock, stop_fd_, read_timeout_sec_ * 1000 + read_timeout_usec_ / 1000,
                            write_timeout_sec_ * 1000 + write_timeout_usec_ / 1000);
    std::unique_ptr<SSL, void (*)(SSL*)> ssl(nullptr, SSL_free);
    if (ssl_ctx_ != nullptr) {
      // The handshake counts against the first request's deadline.
      ssl.reset(SSL_new(ssl_ctx_));
      if (ssl == nullptr || fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) | O_NONBLOCK) != 0 ||
          SSL_set_fd(ssl.get(), sock) != 1) {
        return false;
      }
      stream.set_deadline_ms(NowMs() + kRequestDeadlineMs);
      if (!stream.WaitForRequest(kRequestDeadlineMs)) return false;
      unsigned char first = 0;
      if (recv(sock, &first, 1, MSG_PEEK) == 1 && first != 0x16) {  // not a TLS handshake record
        RefusePlaintext(sock, stream);
        return false;
      }
      if (!stream.AcceptTls(ssl.get())) return false;
    }
    const auto setup = [&ssl](httplib::Request& req) { req.ssl = ssl.get(); };
    bool ok = false;
    for (size_t served = 0; served < keep_alive_max_count_; ++served) {
      stream.set_deadline_ms(NowMs() + int64_t{keep_alive_timeout_sec_} * 1000);
      if (!stream.WaitForRequest(int64_t{keep_alive_timeout_sec_} * 1000)) break;
      stream.set_deadline_ms(NowMs() + kRequestDeadlineMs);
      bool closed = false;
      t_close_after_response = false;
      ok = process_request(stream, /*close_connection=*/served + 1 == keep_alive_max_count_, closed,
                           setup);
      if (!ok || closed || stream.broken() || t_close_after_response) break;
    }
    if (ssl != nullptr && !stream.broken()) SSL_shutdown(ssl.get());  // one try: the close_notify
    return ok;
  }

  const int stop_fd_;
  SSL_CTX* ssl_ctx_ = nullptr;
  std::mutex peers_mu_;
  std::map<std::string, int> peers_;  // connections open per peer address
};

// What OpenSSL's error queue says, emptied.
std::string SslErrors() {
  std::string out;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

// The HTTPS context: the server's certificate and key; a client certificate asked for (naming the
// client CAs) and taken without a check, since /metrics is open to all and the page handler checks
// the certificate itself.
absl::StatusOr<SSL_CTX*> NewHttpsContext(const MetricsHttpOptions& o) {
  std::unique_ptr<SSL_CTX, void (*)(SSL_CTX*)> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (ctx == nullptr)
    return absl::InternalError(absl::StrCat("metrics HTTPS: SSL_CTX_new: ", SslErrors()));
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), o.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics HTTPS: cert_file ", o.cert_file, ": ", SslErrors()));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), o.key_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics HTTPS: key_file ", o.key_file, ": ", SslErrors()));
  }
  if (!o.client_ca_file.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.client_ca_file.c_str());
    if (names == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics HTTPS: client_ca_file ", o.client_ca_file, ": ", SslErrors()));
    }
    SSL_CTX_set_client_CA_list(ctx.get(), names);
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, [](int, X509_STORE_CTX*) { return 1; });
  return ctx.release();
}

std::string Pem(X509* cert) {
  std::unique_ptr<BIO, void (*)(BIO*)> bio(BIO_new(BIO_s_mem()), BIO_free_all);
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) return "";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : "";
}

// The page handler's view of `req`.
HttpPageRequest PageRequest(const httplib::Request& req) {
  HttpPageRequest r;
  r.path = req.path;
  r.host = req.get_header_value("Host");
  r.peer_address = req.remote_addr;
  r.https = req.ssl != nullptr;
  if (req.ssl != nullptr) {
    if (X509* leaf = SSL_get0_peer_certificate(req.ssl)) r.client_cert_pem = Pem(leaf);
    // On the server's side the chain leaves the leaf out.
    if (STACK_OF(X509)* chain = SSL_get_peer_cert_chain(req.ssl)) {
      for (int i = 0; i < sk_X509_num(chain); ++i)
        r.client_chain_pem += Pem(sk_X509_value(chain, i));
    }
  }
  return r;
}

// Start's handlers: GET of /metrics and the page paths, 404 and 405 for the rest.
void Route(ScrapeServer& http, MetricsHttpServer::Renderer render, MetricsHttpOptions options) {
  const auto paths = std::make_shared<const std::vector<std::string>>(options.page_paths);
  const auto known = [paths](const std::string& path) {
    return path == kMetricsPath || std::find(paths->begin(), paths->end(), path) != paths->end();
  };
  const std::string served = absl::StrCat("GET ", kMetricsPath, paths->empty() ? "" : ", ",
                                          absl::StrJoin(*paths, ", "), "\n");
  http.Get(".*", [render = std::move(render), pages = std::move(options.pages), known, served](
                     const httplib::Request& req, httplib::Response& res) {
    if (req.path == kMetricsPath) {
      res.set_content(render(), kContentType);
    } else if (known(req.path) && pages) {
      HttpPageReply reply = pages(PageRequest(req));
      res.status = reply.status;
      for (auto& [name, value] : reply.headers) res.set_header(name, value);
      res.set_content(std::move(reply.body), reply.content_type);
    } else {
      res.status = 404;
      res.set_content(absl::StrCat("not found; this listener serves ", served), "text/plain");
    }
  });
  // Other methods: 405 on the paths served, 404 elsewhere. httplib reads (and bounds) a body before
  // these run, so a kept-alive connection stays in step.
  const httplib::Server::Handler refuse = [known, served](const httplib::Request& req,
                                                          httplib::Response& res) {
    res.status = known(req.path) ? 405 : 404;
    if (res.status == 405) res.set_header("Allow", "GET, HEAD");
    res.set_content(res.status == 405 ? absl::StrCat("only GET is allowed on ", req.path, "\n")
                                      : absl::StrCat("not found; this listener serves ", served),
                    "text/plain");
  };
  http.Post(".*", refuse)
      .Put(".*", refuse)
      .Patch(".*", refuse)
      .Delete(".*", refuse)
      .Options(".*", refuse);
  // Methods httplib parses but has no handler list for (CONNECT, TRACE, PRI).
  http.set_pre_routing_handler([refuse](const httplib::Request& req, httplib::Response& res) {
    static const char* const kRouted[] = {"GET",   "HEAD",   "POST",   "PUT",
                                          "PATCH", "DELETE", "OPTIONS"};
    if (std::find(std::begin(kRouted), std::end(kRouted), req.method) != std::end(kRouted)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    refuse(req, res);
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 200 || res.status == 404 || res.status == 405) return;
    t_close_after_response = true;
    res.headers.erase("Keep-Alive");
    res.headers.erase("Connection");
    res.set_header("Connection", "close");
  });
}

}  // namespace

struct MetricsHttpServer::Impl {
  explicit Impl(int stop_read, int stop_write)
      : stop_read(stop_read), stop_write(stop_write), http(stop_read) {}
  ~Impl() {
    close(stop_read);
    close(stop_write);
  }
  const int stop_read;
  const int stop_write;  // written to once, at shutdown
  ScrapeServer http;
  std::thread thread;
  std::atomic<bool> listen_returned{false};
};

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& address, Renderer render, MetricsHttpOptions options) {
  std::string host;
  uint32_t port = 0;
  if (!SplitHostPort(address, &host, &port)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address '", address, "' is not host:port (IPv6 in brackets) with a port 0-65535"));
  }
  const bool bracketed = address.front() == '[';
  unsigned char ip[sizeof(in6_addr)];
  if (!bracketed && absl::AsciiStrToLower(host) == "localhost") host = "127.0.0.1";
  if (inet_pton(bracketed ? AF_INET6 : AF_INET, host.c_str(), ip) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address '", address,
                     "': the host must be an IPv4 literal such as 127.0.0.1, an "
                     "IPv6 literal in brackets such as [::1], or localhost"));
  }
  int stop_pipe[2];
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint ", address, ": pipe: ", std::strerror(errno)));
  }
  auto impl = std::make_unique<Impl>(stop_pipe[0], stop_pipe[1]);
  ScrapeServer& http = impl->http;
  if (!options.cert_file.empty() || !options.key_file.empty()) {
    FEDLORA_ASSIGN_OR_RETURN(SSL_CTX * ctx, NewHttpsContext(options));
    http.set_ssl_ctx(ctx);
  }
  Route(http, std::move(render), std::move(options));
  http.new_task_queue = [] { return new ConnectionPool(kPoolThreads); };
  http.set_read_timeout(kReadTimeoutS, 0);
  http.set_write_timeout(kWriteTimeoutS, 0);
  http.set_keep_alive_timeout(kKeepAliveIdleS);
  http.set_keep_alive_max_count(kKeepAliveMaxRequests);
  http.set_payload_max_length(kMaxBodyBytes);
  http.set_address_family(bracketed ? AF_INET6 : AF_INET);
  // SO_REUSEADDR, not httplib's default SO_REUSEPORT, which would let a second server share a busy
  // port (and split the scrapes) instead of failing to bind.
  http.set_socket_options([](socket_t sock) {
    const int one = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  });
  errno = 0;
  const int bound =
      port == 0 ? http.bind_to_any_port(host)
                : (http.bind_to_port(host, static_cast<int>(port)) ? static_cast<int>(port) : -1);
  if (bound <= 0) {
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint cannot bind ", address,
                     err != 0 ? absl::StrCat(": ", std::strerror(err)) : ""));
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    raw->http.listen_after_bind();
    raw->listen_returned.store(true);
  });
  // stop() does nothing until the accept loop runs, so the destructor must not come before.
  while (!http.is_running() && !raw->listen_returned.load())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (raw->listen_returned.load()) {
    raw->thread.join();
    return absl::UnavailableError(
        absl::StrCat("metrics endpoint ", address, " stopped as it started"));
  }
  return std::unique_ptr<MetricsHttpServer>(new MetricsHttpServer(bound, std::move(impl)));
}

MetricsHttpServer::MetricsHttpServer(int port, std::unique_ptr<Impl> impl)
    : port_(port), impl_(std::move(impl)) {}

bool MetricsHttpServer::https() const { return impl_->http.https(); }

MetricsHttpServer::~MetricsHttpServer() {
  // The stop pipe ends every wait of the connections in progress; stop() closes the listening
  // socket, after which listen_after_bind joins the pool and returns.
  const char byte = 1;
  (void)!::write(impl_->stop_write, &byte, 1);
  impl_->http.stop();
  impl_->thread.join();
}

}  // namespace fedlora
