#include "userspace/base/wiped.h"

namespace xesp {

// Not inlined, so that its frame lies below the caller's, over what the caller's callees left.
[[gnu::noinline]] void wipe_stack()
{
    unsigned char below[kWipedStack];
    explicit_bzero(below, sizeof below);
}

}  // namespace xesp
