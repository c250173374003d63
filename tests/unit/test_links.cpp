// The Ethernet addresses an interface takes frames for (rtnl::accepted_macs): its own and its
// upper devices', which the classifier lets through where it drops frames to other stations'.
// The integration test (tests/topo/test_gateway.sh) puts a macvlan on a gateway's interface.
#include <catch2/catch.hpp>

#include <net/if.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "userspace/kernel/rtnl.h"

using namespace xesp;
using Mac = std::array<uint8_t, 6>;

namespace {

Mac mac(uint8_t last)
{
    return {0x02, 0, 0, 0, 0, last};
}

// A device that is up; `last` 0: not Ethernet.
rtnl::Link link(uint32_t ifindex, uint8_t last, const char *kind = "", uint32_t lower = 0,
                uint32_t master = 0)
{
    rtnl::Link l;
    l.ifindex = ifindex;
    l.flags = IFF_UP;
    l.ether = last != 0;
    if (l.ether)
        l.mac = mac(last);
    std::strncpy(l.kind.data(), kind, l.kind.size() - 1);
    l.lower = lower;
    l.master = master;
    return l;
}

}  // namespace

TEST_CASE("accepted MACs: the device's own, then those of the macvlans and VLANs on it")
{
    std::vector<rtnl::Link> links = {
        link(1, 0),                    // lo: not Ethernet
        link(2, 2, "veth"),            // the interface
        link(3, 3, "macvlan", 2, 14),  // a macvlan on it, a port of bridge 14
        link(4, 2, "vlan", 2),         // a VLAN on it with its address
        link(5, 5, "vlan", 2),         // a VLAN with an address of its own
        link(6, 6, "vlan", 3),         // a VLAN on the macvlan
        link(7, 7, "veth"),            // a device beside it
        link(8, 8, "macvlan", 7),      // ... and a macvlan on that
        link(9, 0, "gre", 2),          // an IP tunnel over it: no Ethernet address
        link(10, 10, "gretap", 2),     // an Ethernet tunnel over it: not its frames
        link(11, 11, "macvtap", 2),    // a guest's MAC: the guest's frames
        link(12, 12, "veth", 2),       // its veth peer in this namespace
        link(13, 13, "vlan", 11),      // a VLAN on the macvtap
        link(14, 14, "bridge"),        // a bridge with the macvlan as its port
    };
    auto u = rtnl::accepted_macs(links, 2);
    CHECK(u.macs == std::vector<Mac>{mac(2), mac(3), mac(5)});  // not 6: above a macvlan
    CHECK(u.devices == std::vector<uint32_t>{3, 4, 5, 6, 9, 10, 11, 12, 13, 14});
    CHECK(rtnl::accepted_macs(links, 7).macs == std::vector<Mac>{mac(7), mac(8)});
    // The macvlan itself takes what is above it.
    CHECK(rtnl::accepted_macs(links, 3).macs == std::vector<Mac>{mac(3), mac(6), mac(14)});
    CHECK(rtnl::accepted_macs(links, 1).macs.empty());   // not Ethernet
    CHECK(rtnl::accepted_macs(links, 42).macs.empty());  // not there
    // A macvlan that is down takes no frames, nor does what is stacked on it.
    links[2].flags = 0;
    u = rtnl::accepted_macs(links, 2);
    CHECK(u.macs == std::vector<Mac>{mac(2), mac(5)});
    CHECK(u.devices == std::vector<uint32_t>{3, 4, 5, 6, 9, 10, 11, 12, 13, 14});
}

TEST_CASE("accepted MACs: a bridge or bond above, not a VRF; a bounded depth, no loop")
{
    std::vector<rtnl::Link> links = {
        link(2, 2, "veth", 0, 20),    // the interface, a port of bond 20
        link(20, 20, "bond"),         // the bond
        link(21, 21, "vlan", 20),     // a VLAN on the bond
        link(22, 22, "macvlan", 21),  // a macvlan on that VLAN
        link(23, 23, "vlan", 22),     // one level too deep
    };
    static_assert(rtnl::kUpperDepth == 3);
    auto u = rtnl::accepted_macs(links, 2);
    CHECK(u.macs == std::vector<Mac>{mac(2), mac(20), mac(21), mac(22)});
    CHECK(u.devices == std::vector<uint32_t>{20, 21, 22});
    links = {link(2, 2, "veth", 0, 30), link(30, 30, "bridge")};
    CHECK(rtnl::accepted_macs(links, 2).macs == std::vector<Mac>{mac(2), mac(30)});
    links = {link(2, 2, "veth", 0, 40), link(40, 40, "vrf")};
    CHECK(rtnl::accepted_macs(links, 2).macs == std::vector<Mac>{mac(2)});
    // Devices that name each other: each is looked at once.
    links = {link(2, 2, "vlan", 3), link(3, 3, "vlan", 2)};
    CHECK(rtnl::accepted_macs(links, 2).macs == std::vector<Mac>{mac(2), mac(3)});
}

TEST_CASE("dump_links: this namespace's devices, lo among them and not Ethernet")
{
    rtnl::Requests rq;
    REQUIRE(rq.open(1));
    std::vector<rtnl::Link> links;
    auto dump = [&] { return rtnl::dump_links(rq, links, 5); };
    REQUIRE(dump() == 0);
    const uint32_t lo = if_nametoindex("lo");
    REQUIRE(lo);
    size_t found = 0;
    for (const auto &l : links)
        if (l.ifindex == lo) {
            ++found;
            CHECK_FALSE(l.ether);
            CHECK((l.flags & IFF_LOOPBACK));
            CHECK(l.lower == 0);
            CHECK(l.master == 0);
        }
    CHECK(found == 1);
    // A second request on the same socket: the dump ended where it should.
    REQUIRE(dump() == 0);
    CHECK(!links.empty());
}
