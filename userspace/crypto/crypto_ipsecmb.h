// The intel-ipsec-mb backend, as seen by the backend dispatch in crypto.cpp.
#pragma once

#include <memory>

#include "userspace/crypto/crypto.h"

namespace xesp {

// Whether this backend has the algorithms of a transform that is otherwise valid: AES-GCM and
// AES-CBC or NULL with HMAC-SHA1/SHA-2. ChaCha20-Poly1305 and AES-GMAC stay with OpenSSL.
bool ipsecmb_implements(const Transform &xf);

// Expects a transform that backend_supports(Backend::IpsecMb, xf) accepts.
Result<std::unique_ptr<SaCipher>> make_ipsecmb_cipher(const Transform &xf, bool esn);

}  // namespace xesp
