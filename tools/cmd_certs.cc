// fedlora certs: a development PKI for a secure federation (crypto/certs.h), as PEM files in one
// directory.
//
//   fedlora certs dev --dir pki --clients site-a,site-b     # ca, server and per-client pairs
//   fedlora server --config run.json --cert pki/server.pem --key pki/server.key --client-ca pki/ca.pem
//   fedlora client --server 127.0.0.1:50051 --ca pki/ca.pem --cert pki/site-a.pem --key pki/site-a.key ...
//   fedlora certs revoke --dir pki --cert pki/site-b.pem    # writes or extends pki/crl.pem (--crl)
//
// Verbs: dev, ca, server, client, revoke, pin, audit-key; `fedlora certs <verb> --help` lists each one's flags.
// Private keys are written with mode 0600, certificates and CRLs 0644, each file atomically. An
// existing key or CA is never overwritten without --force.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/file.h"
#include "core/status.h"
#include "crypto/certs.h"
#include "crypto/envelope.h"
#include "crypto/key_signature.h"
#include "crypto/x25519_pem.h"
#include "tools/common.h"

namespace fedlora::tools {
namespace {

using crypto::CertificateInfo;
using crypto::CertificateRequest;
using crypto::PemPair;

constexpr int64_t kDaySeconds = 86400;
// File names a client id may not take: they would collide with the CA's, server's or CRL's files.
constexpr const char* kReservedIds[] = {"ca", "server", "crl"};

std::string Join(const std::string& dir, const std::string& name) {
  return (std::filesystem::path(dir) / name).string();
}

// Writes a private key: a 0600 temporary file in the same directory, fsynced, renamed over `path`.
absl::Status WriteKeyFile(const std::string& path, std::string_view pem) {
  const std::filesystem::path p(path);
  // Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "." + name + "...".
  std::string name = ".";
  name.append(p.filename().string()).append(".tmp.XXXXXX");
  std::string tmp = (p.parent_path() / name).string();
  const int fd = ::mkstemp(tmp.data());  // mode 0600
  if (fd < 0) return ErrnoToStatus(errno, "mkstemp", tmp);
  int err = ::fchmod(fd, 0600) != 0 ? errno : WriteAll(fd, pem);
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(tmp.c_str());
    return ErrnoToStatus(err, "write", path);
  }
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  return FsyncDirectory(dir);
}

std::string FormatUtc(int64_t unix_s) {
  const time_t t = static_cast<time_t>(unix_s);
  struct tm tm {};
  char buf[32] = "?";
  if (gmtime_r(&t, &tm) != nullptr) std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Writes a pair (key first) and prints what was written.
absl::Status WritePair(const std::string& dir, const std::string& name, const PemPair& pair,
                       std::string_view kind) {
  const std::string cert_path = Join(dir, name + ".pem"), key_path = Join(dir, name + ".key");
  FEDLORA_ASSIGN_OR_RETURN(CertificateInfo info, crypto::ParseCertificate(pair.cert_pem));
  FEDLORA_RETURN_IF_ERROR(WriteKeyFile(key_path, pair.key_pem));
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(cert_path, pair.cert_pem));
  std::string names;
  for (const std::string& n : info.dns_names) absl::StrAppend(&names, names.empty() ? "" : ",", n);
  for (const std::string& n : info.ip_addresses)
    absl::StrAppend(&names, names.empty() ? "" : ",", n);
  std::printf("wrote %s: %.*s certificate '%s', serial %s, valid until %s%s\n", cert_path.c_str(),
              static_cast<int>(kind.size()), kind.data(), info.common_name.c_str(),
              info.serial_hex.c_str(), FormatUtc(info.not_after_unix_s).c_str(),
              names.empty() ? "" : (", for " + names).c_str());
  std::printf("wrote %s: its private key (mode 0600)\n", key_path.c_str());
  return absl::OkStatus();
}

// FailedPrecondition naming the first existing path, unless `force`.
absl::Status RefuseOverwrite(const std::vector<std::string>& paths, bool force) {
  if (force) return absl::OkStatus();
  for (const std::string& p : paths) {
    std::error_code ec;
    if (std::filesystem::exists(p, ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat(p, " already exists; pass --force to replace it"));
    }
  }
  return absl::OkStatus();
}

// Creates `dir` (mode 0700, it holds keys) when missing.
absl::Status EnsureDir(const std::string& dir) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec)) return absl::OkStatus();
  if (!std::filesystem::create_directories(dir, ec) || ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory ", dir, ": ", ec.message()));
  }
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all, ec);
  return absl::OkStatus();
}

absl::StatusOr<PemPair> LoadCa(const std::string& dir) {
  PemPair ca;
  for (auto [path, out] : {std::pair{Join(dir, "ca.pem"), &ca.cert_pem},
                           std::pair{Join(dir, "ca.key"), &ca.key_pem}}) {
    absl::StatusOr<std::string> bytes = ReadFileToString(path);
    if (!bytes.ok()) {
      return Annotate(bytes.status(), absl::StrCat("the CA (run 'fedlora certs ca --dir ", dir,
                                                   "' or 'fedlora certs dev' first)"));
    }
    *out = *std::move(bytes);
  }
  return ca;
}

absl::StatusOr<int64_t> NotAfter(int64_t days) {
  if (days < 1 || days > 36500) {
    return absl::InvalidArgumentError(
        absl::StrCat("--days ", days, " must be between 1 and 36500"));
  }
  return static_cast<int64_t>(std::time(nullptr)) + days * kDaySeconds;
}

// Empty when `id` may name a client certificate, else why not.
std::string BadClientId(const std::string& id) {
  if (!crypto::IsValidSiteId(id)) {
    return absl::StrCat("client id '", id.substr(0, 64),
                        "' is invalid: a site id is 1-128 characters of [A-Za-z0-9._@-]");
  }
  for (const char* reserved : kReservedIds) {
    if (id == reserved)
      return absl::StrCat("client id '", id, "' is reserved (it would overwrite ", id, ".pem)");
  }
  return "";
}

// Removes DIR/crl.pem after its CA was replaced (it could not be extended or verified any more).
void DropStaleCrl(const std::string& dir) {
  std::error_code ec;
  const std::string crl = Join(dir, "crl.pem");
  if (std::filesystem::remove(crl, ec))
    std::printf("removed %s: it was signed by the replaced CA\n", crl.c_str());
}

absl::StatusOr<PemPair> WriteCa(const std::string& dir, const std::string& name, int64_t days) {
  FEDLORA_ASSIGN_OR_RETURN(const int64_t not_after, NotAfter(days));
  CertificateRequest r;
  r.common_name = name;
  r.not_after_unix_s = not_after;
  FEDLORA_ASSIGN_OR_RETURN(PemPair ca, crypto::CreateCertificateAuthority(r));
  FEDLORA_RETURN_IF_ERROR(WritePair(dir, "ca", ca, "CA"));
  DropStaleCrl(dir);
  return ca;
}

absl::Status WriteServer(const std::string& dir, const PemPair& ca, const std::string& dns,
                         const std::string& ip, int64_t days) {
  CertificateRequest r;
  r.dns_names = SplitList(dns);
  r.ip_addresses = SplitList(ip);
  FEDLORA_ASSIGN_OR_RETURN(r.not_after_unix_s, NotAfter(days));
  FEDLORA_ASSIGN_OR_RETURN(PemPair server, crypto::IssueServerCertificate(ca, r));
  return WritePair(dir, "server", server, "server");
}

absl::Status WriteClient(const std::string& dir, const PemPair& ca, const std::string& id,
                         int64_t days) {
  CertificateRequest r;
  r.common_name = id;
  FEDLORA_ASSIGN_OR_RETURN(r.not_after_unix_s, NotAfter(days));
  FEDLORA_ASSIGN_OR_RETURN(PemPair client, crypto::IssueClientCertificate(ca, r));
  return WritePair(dir, id, client, "client");
}

std::vector<std::string> PairPaths(const std::string& dir, const std::string& name) {
  return {Join(dir, name + ".pem"), Join(dir, name + ".key")};
}

// ------------------------------------------------------------------------------------------------
// Verbs

int RunDev(int argc, char** argv) {
  FlagSet flags(argv[0],
                "Writes a CA, a server certificate and one certificate per client into --dir.");
  std::string dir, clients = "site-a,site-b", dns = "localhost", ip = "127.0.0.1",
                   name = "fedlora dev CA";
  int64_t days = 30;
  bool force = false;
  flags.AddString("dir", &dir, "output directory (created when missing)", /*required=*/true);
  flags.AddString("clients", &clients,
                  "comma-separated client (site) ids: <id>.pem / <id>.key each");
  flags.AddString("dns", &dns, "comma-separated DNS names of the server certificate");
  flags.AddString("ip", &ip, "comma-separated IP addresses of the server certificate");
  flags.AddString("name", &name, "common name of the CA");
  flags.AddInt("days", &days, "validity of every certificate, days");
  flags.AddBool("force", &force,
                "replace existing files (a new CA invalidates everything it signed)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (absl::StatusOr<int64_t> valid = NotAfter(days); !valid.ok()) {
    return UsageError(argv[0], std::string(valid.status().message()));
  }
  const std::vector<std::string> ids = SplitList(clients);
  std::vector<std::string> targets = {Join(dir, "ca.pem"), Join(dir, "ca.key"),
                                      Join(dir, "crl.pem"), Join(dir, "server.pem"),
                                      Join(dir, "server.key")};
  for (size_t i = 0; i < ids.size(); ++i) {
    if (std::string bad = BadClientId(ids[i]); !bad.empty())
      return UsageError(argv[0], "--clients: " + bad);
    if (std::find(ids.begin(), ids.begin() + i, ids[i]) != ids.begin() + i) {
      return UsageError(argv[0], "--clients: '" + ids[i] + "' is listed twice");
    }
    for (const std::string& p : PairPaths(dir, ids[i])) targets.push_back(p);
  }
  absl::Status s = RefuseOverwrite(targets, force);
  if (s.ok()) s = EnsureDir(dir);
  absl::StatusOr<PemPair> ca = s.ok() ? WriteCa(dir, name, days) : absl::StatusOr<PemPair>(s);
  if (!ca.ok()) return Fail(argv[0], ca.status());
  s = WriteServer(dir, *ca, dns, ip, days);
  for (size_t i = 0; s.ok() && i < ids.size(); ++i) s = WriteClient(dir, *ca, ids[i], days);
  if (!s.ok()) return Fail(argv[0], s);
  std::printf("server: --cert %s --key %s --client-ca %s\n", Join(dir, "server.pem").c_str(),
              Join(dir, "server.key").c_str(), Join(dir, "ca.pem").c_str());
  if (absl::StatusOr<std::string> pin =
          crypto::CertificatePin(ReadFileToString(Join(dir, "server.pem")).value_or(""));
      pin.ok()) {
    std::printf("server key pin (clients' --server-pin): %s\n", pin->c_str());
  }
  if (!ids.empty()) {
    std::printf("client %s: --ca %s --cert %s --key %s\n", ids[0].c_str(),
                Join(dir, "ca.pem").c_str(), Join(dir, ids[0] + ".pem").c_str(),
                Join(dir, ids[0] + ".key").c_str());
  }
  return kExitOk;
}

int RunCa(int argc, char** argv) {
  FlagSet flags(argv[0], "Writes a new self-signed CA into --dir (ca.pem, ca.key).");
  std::string dir, name = "fedlora dev CA";
  int64_t days = 365;
  bool force = false;
  flags.AddString("dir", &dir, "output directory (created when missing)", /*required=*/true);
  flags.AddString("name", &name, "common name of the CA");
  flags.AddInt("days", &days, "validity, days");
  flags.AddBool("force", &force, "replace an existing CA (everything it signed stops working)");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (absl::StatusOr<int64_t> valid = NotAfter(days); !valid.ok()) {
    return UsageError(argv[0], std::string(valid.status().message()));
  }
  absl::Status s = RefuseOverwrite(PairPaths(dir, "ca"), force);
  if (s.ok()) s = EnsureDir(dir);
  absl::StatusOr<PemPair> ca = s.ok() ? WriteCa(dir, name, days) : absl::StatusOr<PemPair>(s);
  return ca.ok() ? kExitOk : Fail(argv[0], ca.status());
}

int RunServerCert(int argc, char** argv) {
  FlagSet flags(argv[0], "Issues a server certificate with --dir's CA (server.pem, server.key).");
  std::string dir, dns = "localhost", ip = "127.0.0.1";
  int64_t days = 30;
  bool force = false;
  flags.AddString("dir", &dir, "directory holding ca.pem and ca.key; output directory",
                  /*required=*/true);
  flags.AddString("dns", &dns, "comma-separated DNS names clients dial");
  flags.AddString("ip", &ip, "comma-separated IP addresses clients dial");
  flags.AddInt("days", &days, "validity, days");
  flags.AddBool("force", &force, "replace an existing server certificate and key");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (absl::StatusOr<int64_t> valid = NotAfter(days); !valid.ok()) {
    return UsageError(argv[0], std::string(valid.status().message()));
  }
  absl::Status s = RefuseOverwrite(PairPaths(dir, "server"), force);
  absl::StatusOr<PemPair> ca = s.ok() ? LoadCa(dir) : absl::StatusOr<PemPair>(s);
  if (ca.ok()) s = WriteServer(dir, *ca, dns, ip, days);
  return !ca.ok() ? Fail(argv[0], ca.status()) : s.ok() ? kExitOk : Fail(argv[0], s);
}

int RunClientCert(int argc, char** argv) {
  FlagSet flags(argv[0],
                "Issues a client certificate for one site with --dir's CA (<id>.pem, <id>.key).");
  std::string dir, id;
  int64_t days = 30;
  bool force = false;
  flags.AddString("dir", &dir, "directory holding ca.pem and ca.key; output directory",
                  /*required=*/true);
  flags.AddString("id", &id,
                  "the site id: the certificate's CN, 1-128 characters of [A-Za-z0-9._@-]", true);
  flags.AddInt("days", &days, "validity, days");
  flags.AddBool("force", &force, "replace an existing certificate and key of this id");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  if (absl::StatusOr<int64_t> valid = NotAfter(days); !valid.ok()) {
    return UsageError(argv[0], std::string(valid.status().message()));
  }
  if (std::string bad = BadClientId(id); !bad.empty()) return UsageError(argv[0], "--id: " + bad);
  absl::Status s = RefuseOverwrite(PairPaths(dir, id), force);
  absl::StatusOr<PemPair> ca = s.ok() ? LoadCa(dir) : absl::StatusOr<PemPair>(s);
  if (ca.ok()) s = WriteClient(dir, *ca, id, days);
  return !ca.ok() ? Fail(argv[0], ca.status()) : s.ok() ? kExitOk : Fail(argv[0], s);
}

absl::Status Revoke(const std::string& dir, const std::vector<std::string>& cert_files,
                    int64_t next_update_days) {
  if (cert_files.empty()) return absl::InvalidArgumentError("--cert names no file");
  if (next_update_days < 1 || next_update_days > 3650) {
    return absl::InvalidArgumentError(
        absl::StrCat("--next-update-days ", next_update_days, " must be between 1 and 3650"));
  }
  FEDLORA_ASSIGN_OR_RETURN(PemPair ca, LoadCa(dir));
  const std::string crl_path = Join(dir, "crl.pem");
  std::string existing;
  std::error_code ec;
  if (std::filesystem::exists(crl_path, ec)) {
    FEDLORA_ASSIGN_OR_RETURN(existing, ReadFileToString(crl_path));
  }
  std::vector<std::string> pems;
  std::vector<CertificateInfo> infos;
  for (const std::string& file : cert_files) {
    FEDLORA_ASSIGN_OR_RETURN(std::string pem, ReadFileToString(file));
    absl::StatusOr<CertificateInfo> info = crypto::ParseCertificate(pem);
    if (!info.ok()) return Annotate(info.status(), file);
    pems.push_back(std::move(pem));
    infos.push_back(*std::move(info));
  }
  absl::StatusOr<std::string> crl =
      crypto::RevokeCertificates(ca, existing, pems, next_update_days * kDaySeconds);
  if (!crl.ok())
    return Annotate(crl.status(),
                    existing.empty() ? "revoke" : absl::StrCat("extending ", crl_path));
  FEDLORA_ASSIGN_OR_RETURN(std::vector<std::string> listed,
                           crypto::RevokedSerials(*crl, ca.cert_pem));
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(crl_path, *crl));
  for (size_t i = 0; i < infos.size(); ++i) {
    std::printf("revoked %s: certificate '%s', serial %s\n", cert_files[i].c_str(),
                infos[i].common_name.c_str(), infos[i].serial_hex.c_str());
  }
  std::printf(
      "wrote %s: %zu revoked serial%s, next update %s (the server re-reads it on change and "
      "SIGHUP)\n",
      crl_path.c_str(), listed.size(), listed.size() == 1 ? "" : "s",
      FormatUtc(static_cast<int64_t>(std::time(nullptr)) + next_update_days * kDaySeconds).c_str());
  return absl::OkStatus();
}

int RunRevoke(int argc, char** argv) {
  FlagSet flags(argv[0], "Adds certificates to --dir's CRL (crl.pem), creating it when missing.");
  std::string dir, certs;
  int64_t next_update_days = 30;
  flags.AddString("dir", &dir, "directory holding ca.pem, ca.key and crl.pem", /*required=*/true);
  flags.AddString("cert", &certs,
                  "comma-separated PEM certificate files to revoke (issued by the CA)", true);
  flags.AddInt("next-update-days", &next_update_days, "the CRL's nextUpdate, days from now");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::Status s = Revoke(dir, SplitList(certs), next_update_days);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

struct Verb {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);
};

int RunPin(int argc, char** argv) {
  FlagSet flags(
      argv[0],
      "Prints a certificate's key pin: the SHA-256 of its public key, for clients' --server-pin.");
  std::string cert;
  flags.AddString("cert", &cert, "PEM certificate (the server's)", /*required=*/true);
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::StatusOr<std::string> pem = ReadFileToString(cert);
  absl::StatusOr<std::string> pin = pem.ok() ? crypto::CertificatePin(*pem) : pem.status();
  if (!pin.ok()) return Fail(argv[0], pin.status());
  std::printf("%s\n", pin->c_str());
  return kExitOk;
}

// The offline audit key pair (server/audit_trail.h): audit.pub for the server's
// audit_public_key_file, audit.key (0600) to keep off the server.
absl::Status AuditKey(const std::string& dir, bool force) {
  const std::string pub_path = Join(dir, "audit.pub"), key_path = Join(dir, "audit.key");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  FEDLORA_RETURN_IF_ERROR(RefuseOverwrite({key_path, pub_path}, force));
  FEDLORA_ASSIGN_OR_RETURN(crypto::X25519KeyPair pair, crypto::GenerateX25519KeyPair());
  FEDLORA_ASSIGN_OR_RETURN(std::string key_pem, crypto::X25519PrivateKeyToPem(pair.private_key));
  FEDLORA_ASSIGN_OR_RETURN(std::string pub_pem, crypto::X25519PublicKeyToPem(pair.public_key));
  FEDLORA_RETURN_IF_ERROR(WriteKeyFile(key_path, key_pem));
  FEDLORA_RETURN_IF_ERROR(WriteFileAtomically(pub_path, pub_pem));
  std::printf("wrote %s (X25519 private key, mode 0600: keep it offline, never on the server)\n",
              key_path.c_str());
  std::printf("wrote %s (set server.audit_public_key_file to it)\n", pub_path.c_str());
  return absl::OkStatus();
}

int RunAuditKey(int argc, char** argv) {
  FlagSet flags(argv[0],
                "Makes the offline audit key pair: --out/audit.pub for the server, --out/audit.key "
                "to keep offline.");
  std::string out;
  bool force = false;
  flags.AddString("out", &out, "directory to write audit.pub and audit.key to (created if missing)",
                  true);
  flags.AddBool("force", &force, "replace an existing audit key pair");
  if (auto code = ParseFlagsOrExit(flags, argc, argv)) return *code;
  absl::Status s = AuditKey(out, force);
  return s.ok() ? kExitOk : Fail(argv[0], s);
}

constexpr Verb kVerbs[] = {
    {"dev", "CA + server + client certificates for a local federation, in one go", RunDev},
    {"ca", "a new CA (ca.pem, ca.key)", RunCa},
    {"server", "a server certificate signed by the CA (server.pem, server.key)", RunServerCert},
    {"client", "a client certificate for one site id (<id>.pem, <id>.key)", RunClientCert},
    {"revoke", "add certificates to the CRL (crl.pem)", RunRevoke},
    {"pin", "print a certificate's key pin (for clients' --server-pin)", RunPin},
    {"audit-key", "the offline audit key pair (audit.pub, audit.key)", RunAuditKey},
};

void PrintVerbs(std::FILE* out) {
  std::fprintf(out,
               "usage: fedlora certs <verb> [flags]\nDevelopment PKI for mTLS between server and "
               "clients.\n\nverbs:\n");
  for (const Verb& v : kVerbs) std::fprintf(out, "  %-9s %s\n", v.name, v.summary);
  std::fprintf(out, "\n'fedlora certs <verb> --help' lists the flags of a verb.\n");
}

}  // namespace

int RunCerts(int argc, char** argv) {
  if (argc < 2) {
    PrintVerbs(stderr);
    return kExitUsage;
  }
  const std::string verb = argv[1];
  if (verb == "--help" || verb == "-h" || verb == "help") {
    PrintVerbs(stdout);
    return kExitOk;
  }
  for (const Verb& v : kVerbs) {
    if (verb == v.name) {
      std::string display = std::string(argv[0]) + " " + verb;
      argv[1] = display.data();
      return v.run(argc - 1, argv + 1);
    }
  }
  std::fprintf(stderr, "%s: unknown verb '%s'\n\n", argv[0], verb.c_str());
  PrintVerbs(stderr);
  return kExitUsage;
}

}  // namespace fedlora::tools
