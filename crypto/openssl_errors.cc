#include "crypto/openssl_errors.h"

#include <openssl/err.h>

namespace fedlora::crypto {

std::string DrainOpenSslErrors() {
  std::string text;
  char buf[256];
  while (const unsigned long code = ERR_get_error()) {
    ERR_error_string_n(code, buf, sizeof(buf));
    if (!text.empty()) text += "; ";
    text += buf;
  }
  return text.empty() ? "no OpenSSL error queued" : text;
}

}  // namespace fedlora::crypto
