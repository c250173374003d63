// The ESP helpers the engine and decap.cpp share: the flow key of a packet, ECN on
// decapsulation. Encapsulation is in encap.cpp, decapsulation in decap.cpp.
#include "userspace/esp/esp.h"

#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

int ecn_decapsulate(uint8_t outer, uint8_t inner)
{
    if (outer == kEcnCe)
        return inner == kEcnNotEct ? -1 : kEcnCe;
    if (outer == kEcnEct1 && inner == kEcnEct0)
        return kEcnEct1;
    return inner;
}

void flow_from_header(const IpHeader &h, FlowKey *key)
{
    key->src = h.src();
    key->dst = h.dst();
    key->proto = h.proto;
    // Fragments are classified without ports: a non-first one has none, and every fragment
    // of a datagram must get the same treatment.
    key->fragment = h.fragment;
    key->proto_unknown = h.proto_unknown;
    key->sport = key->dport = 0;
    // The protocols whose ports the kernel's selectors read (decode_session4/6).
    bool ports = h.proto == kProtoTcp || h.proto == kProtoUdp || h.proto == kProtoSctp ||
                 h.proto == kProtoUdpLite || h.proto == kProtoDccp;
    if (ports && !h.fragment && h.l4_off + 4 <= h.total) {
        key->sport = get16(h.ip + h.l4_off);
        key->dport = get16(h.ip + h.l4_off + 2);
    }
}

bool parse_flow(const uint8_t *ip, uint32_t len, FlowKey *key)
{
    IpHeader h;
    if (parse_ip(ip, len, &h) != IpParse::Ok)
        return false;
    flow_from_header(h, key);
    return true;
}

}  // namespace xesp
