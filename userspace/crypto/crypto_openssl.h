// The OpenSSL 3 backend, as seen by the backend dispatch in crypto.cpp.
#pragma once

#include <memory>

#include "userspace/crypto/crypto.h"

namespace xesp {

// Every transform that backend_supports() accepts. Expects a transform it has accepted.
Result<std::unique_ptr<SaCipher>> make_openssl_cipher(const Transform &xf, bool esn);

}  // namespace xesp
