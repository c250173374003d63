// Reading and writing capture files with libpcap, and locating the IP packet in a frame.
#pragma once

#include <pcap/pcap.h>

#include <cstdint>
#include <string>

#include "userspace/base/result.h"

namespace xesp {

class PcapReader {
public:
    static Result<PcapReader> open(const std::string &path);
    PcapReader(PcapReader &&o) noexcept : p_(o.p_) { o.p_ = nullptr; }
    ~PcapReader();

    // Next frame; false at the end. data stays valid until the next call.
    bool next(const uint8_t **data, uint32_t *len, struct timeval *ts);
    int linktype() const { return pcap_datalink(p_); }
    pcap_t *handle() const { return p_; }

private:
    explicit PcapReader(pcap_t *p) : p_(p) {}
    pcap_t *p_;
};

class PcapWriter {
public:
    static Result<PcapWriter> open(const std::string &path, int linktype);
    PcapWriter(PcapWriter &&o) noexcept : p_(o.p_), d_(o.d_)
    {
        o.p_ = nullptr;
        o.d_ = nullptr;
    }
    ~PcapWriter();
    void write(const uint8_t *data, uint32_t len, const struct timeval &ts);

private:
    PcapWriter(pcap_t *p, pcap_dumper_t *d) : p_(p), d_(d) {}
    pcap_t *p_;
    pcap_dumper_t *d_;
};

// Where the IP packet starts in a frame of this link type: the Ethernet header with up to two
// VLAN tags is skipped. Returns false if the frame carries no IPv4/IPv6 packet.
bool locate_ip(int linktype, const uint8_t *frame, uint32_t len, uint32_t *l3_off);

// Writes the ethertype of the last Ethernet/VLAN header for an IP packet of this version
// (the family changes when a tunnel carries IPv6 in IPv4 or the other way round).
void set_ethertype(uint8_t *l2, uint32_t l2_len, uint8_t ip_version);

}  // namespace xesp
