// The intel-ipsec-mb backend, as seen by the backend dispatch in crypto.cpp.
#pragma once

#include <memory>

#include "userspace/crypto/crypto.h"

namespace xesp {

// Whether this backend has the algorithms of a transform that is otherwise valid: AES-GCM and
// AES-CBC or NULL with HMAC-SHA1/SHA-2. ChaCha20-Poly1305 and AES-GMAC stay with OpenSSL.
bool ipsecmb_implements(const Transform &xf);

// Whether each thread that runs this backend's crypto gets a copy of the library of its own
// (crypto_ipsecmb.cpp), while there are copies to be had.
bool ipsecmb_private_copies();
// The code the calling thread's AES-128-GCM encryption runs, for tests: one copy's, so two
// threads with copies of their own give two addresses.
const void *ipsecmb_thread_code();

// Expects a transform that backend_supports(Backend::IpsecMb, xf) accepts.
Result<std::unique_ptr<SaCipher>> make_ipsecmb_cipher(const Transform &xf, bool esn);

}  // namespace xesp
