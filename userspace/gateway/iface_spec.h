// An interface as the operator added it (`xesp iface add DEV role ROLE [mode MODE]`): what
// the state file keeps of it and what the daemon adds again at its next start.
#pragma once

#include <string>
#include <string_view>

#include "bpf/xdp_program.h"

namespace xesp {

// How a protected interface hands its plaintext to the gateway:
//   Xdp  the XDP program and AF_XDP sockets on the interface, packet by packet (best for
//        small packets and zero-copy NICs);
//   Tun  a tc program on the interface sends what an out policy protects to the gateway's
//        TUN device whole, as the sender's TSO made it, and what comes out of the tunnels goes
//        back through the TUN joined again (gateway_tun.cpp).
// A public interface is always Xdp.
enum class IfaceMode : uint8_t { Xdp, Tun };

inline const char *iface_mode_name(IfaceMode m)
{
    return m == IfaceMode::Tun ? "tun" : "xdp";
}

inline const char *iface_role_name(IfaceRole r)
{
    return r == IfaceRole::Public ? "public" : "protected";
}

struct IfaceSpec {
    std::string name;
    IfaceRole role = IfaceRole::Protected;
    IfaceMode mode = IfaceMode::Xdp;
    bool operator==(const IfaceSpec &o) const
    {
        return name == o.name && role == o.role && mode == o.mode;
    }
};

}  // namespace xesp
