#include "userspace/pcap/pcap_io.h"

#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

Result<PcapReader> PcapReader::open(const std::string &path)
{
    char err[PCAP_ERRBUF_SIZE] = "";
    pcap_t *p = pcap_open_offline(path.c_str(), err);
    if (!p)
        return make_error("cannot read capture " + path + ": " + err);
    int lt = pcap_datalink(p);
    if (lt != DLT_EN10MB && lt != DLT_RAW && lt != DLT_IPV4 && lt != DLT_IPV6) {
        pcap_close(p);
        return make_error("capture " + path + ": link type " + std::to_string(lt) +
                          " is not supported (Ethernet or raw IP)");
    }
    return PcapReader(p);
}

PcapReader::~PcapReader()
{
    if (p_)
        pcap_close(p_);
}

bool PcapReader::next(const uint8_t **data, uint32_t *len, struct timeval *ts)
{
    struct pcap_pkthdr *h;
    const u_char *d;
    if (pcap_next_ex(p_, &h, &d) != 1)
        return false;
    *data = d;
    *len = h->caplen;
    *ts = h->ts;
    return true;
}

Result<PcapWriter> PcapWriter::open(const std::string &path, int linktype)
{
    pcap_t *p = pcap_open_dead(linktype, 65535);
    if (!p)
        return make_error("cannot create capture " + path);
    pcap_dumper_t *d = pcap_dump_open(p, path.c_str());
    if (!d) {
        std::string msg = "cannot write capture " + path + ": " + pcap_geterr(p);
        pcap_close(p);
        return make_error(msg);
    }
    return PcapWriter(p, d);
}

PcapWriter::~PcapWriter()
{
    if (d_)
        pcap_dump_close(d_);
    if (p_)
        pcap_close(p_);
}

void PcapWriter::write(const uint8_t *data, uint32_t len, const struct timeval &ts)
{
    struct pcap_pkthdr h {};
    h.ts = ts;
    h.caplen = h.len = len;
    pcap_dump(reinterpret_cast<u_char *>(d_), &h, data);
}

bool locate_ip(int linktype, const uint8_t *frame, uint32_t len, uint32_t *l3_off)
{
    if (linktype != DLT_EN10MB) {
        *l3_off = 0;
        return len > 0 && (ip_version(frame) == 4 || ip_version(frame) == 6);
    }
    uint32_t off = 12;
    for (int tags = 0; off + 2 <= len; tags++) {
        uint16_t type = get16(frame + off);
        if ((type == kEthVlan || type == kEthQinQ) && tags < 2) {
            off += 4;
            continue;
        }
        if (type != kEthIpv4 && type != kEthIpv6)
            return false;
        *l3_off = off + 2;
        return *l3_off < len;
    }
    return false;
}

void set_ethertype(uint8_t *l2, uint32_t l2_len, uint8_t ip_version)
{
    if (l2_len >= kEthLen)
        put16(l2 + l2_len - 2, ip_version == 6 ? kEthIpv6 : kEthIpv4);
}

}  // namespace xesp
