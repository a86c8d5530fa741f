// Internal to fedlora::crypto: OpenSSL's error queue as text for the statuses this module returns.
#pragma once

#include <string>

namespace fedlora::crypto {

// This thread's queued OpenSSL errors, oldest first, "; "-separated, emptying the queue; "no
// OpenSSL error queued" when there is none.
std::string DrainOpenSslErrors();

}  // namespace fedlora::crypto
