#include "userspace/esp/engine.h"

#include <algorithm>
#include <cstring>

#include "bpf/abi_check.h"
#include "userspace/esp/icmp.h"
#include "userspace/base/wire.h"

namespace xesp {

using namespace wire;

size_t SaKeyHash::operator()(const SaKey &k) const
{
    uint64_t h = k.spi * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < k.dst.size(); i += 4)
        h = (h ^ get32(k.dst.b.data() + i)) * 0x100000001b3ull;
    return size_t(h ^ (h >> 29));
}

size_t SaKeyHash::operator()(const FlowSaKey &k) const
{
    uint64_t h = k.reqid * 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < k.src.size(); i += 4)
        h = (h ^ get32(k.src.b.data() + i) ^ uint64_t(get32(k.dst.b.data() + i)) << 32) *
            0x100000001b3ull;
    return size_t(h ^ (h >> 29));
}

uint32_t SaTable::add(std::shared_ptr<Sa> sa)
{
    const SaConfig &c = sa->config();
    uint32_t id = uint32_t(sas_.size());
    ids_[sa.get()] = id;
    by_spi_[SaKey{c.dst, c.spi}] = sa.get();
    if (c.dir != Dir::In) {
        // The newest SA for a flow wins, as after a rekey.
        by_flow_[FlowSaKey{c.src, c.dst, c.reqid}] = sa.get();
        by_flow_[FlowSaKey{c.src, c.dst, 0}] = sa.get();
    }
    sas_.push_back(std::move(sa));
    return id;
}

uint32_t SaTable::id_of(const Sa &sa) const
{
    auto it = ids_.find(&sa);
    return it == ids_.end() ? kNoId : it->second;
}

std::shared_ptr<Sa> SaTable::share(const SaConfig &cfg) const
{
    Sa *sa = find_in(cfg.dst, cfg.spi);
    if (!sa || !same_sa(sa->config(), cfg))
        return nullptr;
    return sas_[ids_.find(sa)->second];
}

Sa *SaTable::find_in(const IpAddr &dst, uint32_t spi) const
{
    auto it = by_spi_.find(SaKey{dst, spi});
    return it == by_spi_.end() ? nullptr : it->second;
}

Sa *SaTable::find_out(const PolicyTmpl &tmpl, const FlowKey &flow) const
{
    // Transport templates may leave the addresses out: they are the packet's own.
    const IpAddr &src = tmpl.src.family ? tmpl.src : flow.src;
    const IpAddr &dst = tmpl.dst.family ? tmpl.dst : flow.dst;
    Sa *sa = nullptr;
    if (tmpl.spi) {
        sa = find_in(dst, tmpl.spi);
    } else {
        auto it = by_flow_.find(FlowSaKey{src, dst, tmpl.reqid});
        sa = it == by_flow_.end() ? nullptr : it->second;
    }
    if (sa &&
        (sa->config().src != src || sa->config().mode != tmpl.mode || sa->config().dir == Dir::In))
        return nullptr;
    return sa;
}

bool tmpl_matches(const PolicyTmpl &t, const SaConfig &sa)
{
    return (!t.spi || t.spi == sa.spi) && (!t.reqid || t.reqid == sa.reqid) && t.mode == sa.mode &&
           (!t.src.family || t.src == sa.src) && (!t.dst.family || t.dst == sa.dst);
}

Result<std::unique_ptr<Engine>> Engine::create(const Config &config, Backend backend,
                                               const EngineOptions &options, const Engine *prev)
{
    std::unique_ptr<Engine> e(new Engine());
    e->options_ = options;
    // SAs that stay as they were keep running; the others start afresh.
    for (const SaConfig &c : config.sas) {
        std::shared_ptr<Sa> sa = prev ? prev->sas_.share(c) : nullptr;
        if (!sa) {
            auto made = Sa::create(c, backend);
            if (!made)
                return make_error("sa dst " + c.dst.str() + " spi " + std::to_string(c.spi) + ": " +
                                  made.error().message);
            sa = std::move(*made);
            if (options.on_expire)
                sa->on_expire(options.on_expire);
            if (options.hold_new)
                sa->hold();
            Sa *kept = prev ? prev->sas_.find_in(c.dst, c.spi) : nullptr;
            if (kept && same_keys(kept->config(), c))
                e->inherit_.emplace_back(sa.get(), prev->sas_.all()[prev->sas_.id_of(*kept)]);
        }
        if (sa->config().lifetime.has_time())
            e->timed_.push_back(sa.get());
        e->sas_.add(std::move(sa));
    }
    for (const PolicyConfig &p : config.policies)
        e->spd_.add(p);
    e->policy_sa_.assign(e->spd_.size(), nullptr);
    for (uint32_t id = 0; id < e->spd_.size(); id++) {
        const PolicyConfig &p = *e->spd_.by_id(id);
        if (p.dir == Dir::Out && p.tmpl && p.tmpl->src.family && p.tmpl->dst.family)
            e->policy_sa_[id] = e->sas_.find_out(*p.tmpl, FlowKey{});  // flow not consulted
    }
    return e;
}

void Engine::take_over()
{
    for (auto &[sa, old] : inherit_)
        sa->replay().catch_up(old->replay());
    inherit_.clear();
    inherit_.shrink_to_fit();
}

void Engine::on_expire(Sa::ExpireFn fn)
{
    for (auto &sa : sas_.all())
        sa->on_expire(fn);
}

void Engine::check_time(uint64_t now)
{
    for (Sa *sa : timed_)
        sa->check_time(now);
}

Engine::Dirn Engine::classify_esp(Pkt &p, const uint8_t *ip, uint32_t esp_off, bool udp,
                                  const IpAddr &dst, Sa **sa)
{
    if (esp_off + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    *sa = sas_.find_in(dst, get32(ip + esp_off));
    if (!*sa) {
        stats_.esp_unknown_spi++;  // somebody else's SA: the kernel's business
        return Dirn::None;
    }
    if (!inbound(**sa)) {
        p.set_drop(Drop::InReflected);
        return Dirn::None;
    }
    if ((*sa)->natt() != udp) {
        p.set_drop(Drop::InEncapMismatch);
        return Dirn::None;
    }
    p.l4 = uint16_t(esp_off);
    return Dirn::Decap;
}

bool Engine::inbound(const Sa &sa) const
{
    const SaConfig &c = sa.config();
    if (c.dir != Dir::Unspec)
        return c.dir == Dir::In;
    return !options_.local || std::find(options_.local->begin(), options_.local->end(), c.dst) !=
                                  options_.local->end();
}

// An IP header whose lengths lie. If it claims to carry ESP it is dropped and counted here;
// anything else is left to the kernel, which drops it too.
static Engine::Dirn bad_length(Pkt &p, uint8_t proto)
{
    if (proto == kProtoEsp || proto == kProtoUdp)
        p.set_drop(Drop::InBadLength);
    return Engine::Dirn::None;
}

Engine::Dirn Engine::classify(Pkt &p, Sa **sa)
{
    *sa = nullptr;
    uint8_t *ip = p.ip();
    IpHeader h;
    IpParse st = parse_ip(ip, p.len, &h);
    if (st == IpParse::NotIp)
        return Dirn::None;
    if (!lengths_ok(st))
        return bad_length(p, h.proto);
    p.len = h.total;  // drop link-layer padding
    if (st != IpParse::Ok)
        return Dirn::None;  // IPv6 extension headers cut short: the kernel's
    // ESP fragments are reassembled by the kernel first. All other fragments, UDP ones too
    // (ESP in UDP or not, only the first one has ports), go to the SPD: a protected flow's
    // fragments must not leave in the clear.
    if (h.fragment && h.proto == kProtoEsp)
        return Dirn::None;
    const uint32_t off = h.l4_off;
    if (h.proto == kProtoEsp)
        return classify_esp(p, ip, off, false, h.dst(), sa);
    if (!h.fragment && h.proto == kProtoUdp && off + kUdpLen <= p.len &&
        get16(ip + off + 2) == kNatTPort) {
        uint32_t payload = p.len - off - kUdpLen;
        const uint8_t *d = ip + off + kUdpLen;
        if (payload == 1 && d[0] == 0xff) {  // NAT keepalive (RFC 3948 2.3)
            stats_.keepalive++;
            return Dirn::None;
        }
        if (payload >= 4 && get32(d) == 0) {  // non-ESP marker: IKE (RFC 3948 2.2)
            stats_.ike++;
            return Dirn::None;
        }
        if (payload == 0)
            return Dirn::None;
        return classify_esp(p, ip, off + kUdpLen, true, h.dst(), sa);
    }

    FlowKey flow;
    flow_from_header(h, &flow);
    bool unsure = false;
    const PolicyConfig *pol = spd_.lookup(Dir::Out, flow, &unsure);
    if (unsure && !(pol && pol->tmpl)) {
        p.set_drop(Drop::FragmentUnclassifiable);
        return Dirn::None;
    }
    if (!pol)
        return check_unprotected(p, flow);
    if (pol->action == Action::Block) {
        p.set_drop(Drop::OutPolBlock);
        return Dirn::None;
    }
    if (!pol->tmpl)
        return Dirn::None;
    *sa = sas_.find_out(*pol->tmpl, flow);
    if (!*sa) {
        // Fail closed: the policy says protect, and there is nothing to protect it with.
        p.set_drop(Drop::OutNoStates);
        return Dirn::None;
    }
    return Dirn::Encap;
}

// Plaintext no outbound policy claims: if an inbound policy says it must arrive protected, it
// did not, and is dropped (RFC 4301 5.2; the kernel counts it as XfrmInTmplMismatch).
Engine::Dirn Engine::check_unprotected(Pkt &p, const FlowKey &flow)
{
    bool unsure = false;
    const PolicyConfig *pol = spd_.lookup(Dir::In, flow, &unsure);
    if (!pol)
        pol = spd_.lookup(Dir::Fwd, flow, &unsure);
    if (pol && pol->action == Action::Block)
        p.set_drop(Drop::InPolBlock);
    else if (pol && pol->tmpl)
        p.set_drop(Drop::InUnprotected);
    else if (unsure)
        p.set_drop(Drop::FragmentUnclassifiable);
    return Dirn::None;
}

// RFC 4301 5.2: what came out of an SA must be what an inbound policy expects from it. A
// packet no in or fwd policy covers is dropped (the kernel's XfrmInNoPols): an SA carries
// only the traffic a policy put in it, whichever peer holds its keys.
void Engine::inbound_policy_check(Sa &sa, Pkt &p)
{
    FlowKey flow;
    if (!parse_flow(p.ip(), p.len, &flow)) {
        p.set_drop(Drop::InBadInner);
        return;
    }
    const PolicyConfig *pol = spd_.lookup(Dir::In, flow);
    if (!pol)
        pol = spd_.lookup(Dir::Fwd, flow);
    if (!pol) {
        p.set_drop(Drop::InNoPolicy);
        return;
    }
    if (pol->action == Action::Block)
        p.set_drop(Drop::InPolBlock);
    else if (pol->tmpl ? !tmpl_matches(*pol->tmpl, sa.config()) : sa.tunnel())
        p.set_drop(Drop::InTmplMismatch);
}

// A packet that would not fit the egress link (or the SA's learnt path MTU) once encrypted,
// and may not be fragmented, is answered with the MTU that fits. One that may be fragmented
// (IPv4 without DF) goes on: its outer header has DF clear too.
bool Engine::too_big(Sa &sa, Pkt &p)
{
    uint32_t mtu = sa.outer_mtu(options_.link_mtu);
    if (!mtu)
        return false;
    uint32_t fits = sa.inner_mtu(mtu);
    if (p.len <= fits || may_fragment(p))
        return false;
    bool v4 = ip_version(p.ip()) == 4;
    IpAddr from = v4 ? options_.icmp_src4 : options_.icmp_src6;
    if (!from.family)
        from = sa.config().src;
    if (!icmp_too_big(p, from, fits))
        p.set_drop(Drop::OutTooBig);  // no address to answer from, or an ICMP error
    return true;
}

void Engine::account(Pkt &p, Sa *sa)
{
    switch (p.verdict) {
    case Verdict::TooBig:
        stats_.too_big++;
        break;
    case Verdict::TimeExceeded:  // the gateway's, never the engine's
        break;
    case Verdict::Pass:
        stats_.passed++;
        break;
    case Verdict::Encrypted:
        stats_.encrypted++;
        break;
    case Verdict::Decrypted:
        stats_.decrypted++;
        break;
    case Verdict::Drop:
        stats_.dropped++;
        stats_.drops.drop(p.drop);
        if (sa)
            sa->counters().drop(p.drop);
        break;
    }
}

// The part of process() and process_classified() after classification: packets that go to an
// SA are grouped by SA and direction (keeping their order within a group), each group goes
// through ESP in one burst, decrypted packets through the inbound policy check, and every
// packet is counted. n <= kMaxBurst.
void Engine::dispatch(Pkt *const *pkts, const Dirn *dirn, Sa *const *owner, size_t n)
{
    struct Group {
        Sa *sa;
        Dirn dirn;
        size_t n;
        Pkt *pkts[kMaxBurst];
    };
    Group groups[kMaxBurst];
    size_t ngroups = 0;
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        Sa *sa = owner[i];
        Dirn d = dirn[i];
        if (d == Dirn::None)
            continue;
        if (d == Dirn::Encap && too_big(*sa, p))
            continue;
        size_t g = 0;
        while (g < ngroups && !(groups[g].sa == sa && groups[g].dirn == d))
            g++;
        if (g == ngroups)
            groups[ngroups++] = Group{sa, d, 0, {}};
        groups[g].pkts[groups[g].n++] = &p;
    }
    for (size_t g = 0; g < ngroups; g++) {
        Group &gr = groups[g];
        if (gr.dirn == Dirn::Encap) {
            esp_encap_burst(*gr.sa, gr.pkts, gr.n);
        } else {
            esp_decap_burst(*gr.sa, gr.pkts, gr.n);
            for (size_t i = 0; i < gr.n; i++)
                if (gr.pkts[i]->verdict == Verdict::Decrypted)
                    inbound_policy_check(*gr.sa, *gr.pkts[i]);
        }
    }
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        // A new packet where the old one was: whatever link-layer header sat in front of it
        // has been overwritten or left behind.
        if (p.verdict == Verdict::Encrypted || p.verdict == Verdict::Decrypted ||
            p.verdict == Verdict::TooBig)
            p.l2_len = 0;
        account(p, owner[i]);
    }
}

void Engine::process(Pkt *const *pkts, size_t n)
{
    if (!inherit_.empty()) [[unlikely]]
        take_over();
    Dirn dirn[kMaxBurst];
    Sa *owner[kMaxBurst];
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        for (size_t i = 0; i < k; i++) {
            pkts[i]->verdict = Verdict::Pass;
            dirn[i] = classify(*pkts[i], &owner[i]);
        }
        dispatch(pkts, dirn, owner, k);
        pkts += k;
        n -= k;
    }
}

// ESP the classifier matched to SA c.id. The id is checked against the packet's own
// (destination, SPI), the key it was found by: an id from before a reload may name another
// SA now, or none.
Engine::Dirn Engine::resolve_decap(Pkt &p, const Classified &c, Sa **sa)
{
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)) || c.l4 < h.hdr_len) {
        p.set_drop(Drop::InBadLength);
        return Dirn::None;
    }
    p.len = h.total;  // drop link-layer padding
    if (c.l4 + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    const uint8_t *ip = p.ip();
    Sa *s = sas_.by_id(c.id);
    if (!s || s->config().spi != get32(ip + c.l4) || s->config().dst != h.dst()) {
        p.set_drop(Drop::InNoStates);
        return Dirn::None;
    }
    *sa = s;
    if (!inbound(*s)) {
        p.set_drop(Drop::InReflected);
        return Dirn::None;
    }
    if (s->natt() != c.natt) {
        p.set_drop(Drop::InEncapMismatch);
        return Dirn::None;
    }
    p.l4 = c.l4;
    return Dirn::Decap;
}

// The SA that out policy `id` (pol) protects a packet with: the one its template names, found
// at create(), or for a transport template without addresses the one for the packet's own
// addresses (from h, its IP header).
Sa *Engine::out_sa(uint32_t id, const PolicyConfig &pol, const IpHeader &h)
{
    if (Sa *sa = policy_sa_[id]; sa || (pol.tmpl->src.family && pol.tmpl->dst.family))
        return sa;
    FlowKey flow;
    flow.src = h.src();
    flow.dst = h.dst();
    return sas_.find_out(*pol.tmpl, flow);
}

Engine::Dirn Engine::resolve_encap(Pkt &p, const Classified &c, Sa **sa)
{
    const PolicyConfig *pol = spd_.by_id(c.id);
    if (!pol || pol->dir != Dir::Out) {
        p.set_drop(Drop::OutNoStates);  // not a policy that protects: nothing to encrypt with
        return Dirn::None;
    }
    if (pol->action == Action::Block) {
        p.set_drop(Drop::OutPolBlock);
        return Dirn::None;
    }
    if (!pol->tmpl)
        return Dirn::None;  // bypass
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h))) {
        p.set_drop(Drop::OutBadInner);
        return Dirn::None;
    }
    p.len = h.total;
    *sa = out_sa(c.id, *pol, h);
    if (!*sa) {
        // Fail closed: the policy says protect, and there is nothing to protect it with.
        p.set_drop(Drop::OutNoStates);
        return Dirn::None;
    }
    return Dirn::Encap;
}

uint32_t Engine::natt_inner_mtu(const Classified &c, const Pkt &p)
{
    if (c.kind != Classified::Encap)
        return 0;
    const PolicyConfig *pol = spd_.by_id(c.id);
    if (!pol || pol->dir != Dir::Out || pol->action == Action::Block || !pol->tmpl)
        return 0;
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)))
        return 0;
    Sa *sa = out_sa(c.id, *pol, h);
    // Transport mode carries whole datagrams only (RFC 4303 3.3.4): its packets are not split
    // before encryption, the outer packet is fragmented instead.
    uint32_t mtu = sa && sa->natt() && sa->tunnel() ? sa->outer_mtu(options_.link_mtu) : 0;
    return mtu ? sa->inner_mtu(mtu) : 0;
}

void Engine::process_classified(Pkt *const *pkts, const Classified *cls, size_t n)
{
    if (!inherit_.empty()) [[unlikely]]
        take_over();
    Dirn dirn[kMaxBurst];
    Sa *owner[kMaxBurst];
    while (n) {
        size_t k = n < kMaxBurst ? n : kMaxBurst;
        for (size_t i = 0; i < k; i++) {
            Pkt &p = *pkts[i];
            p.verdict = Verdict::Pass;
            owner[i] = nullptr;
            dirn[i] = cls[i].kind == Classified::Decap   ? resolve_decap(p, cls[i], &owner[i])
                      : cls[i].kind == Classified::Encap ? resolve_encap(p, cls[i], &owner[i])
                                                         : Dirn::None;  // Pass
        }
        dispatch(pkts, dirn, owner, k);
        pkts += k;
        cls += k;
        n -= k;
    }
}

bool classified_from_meta(const void *meta, size_t len, Pkt &p, Classified *c)
{
    if (!meta || len < sizeof(xesp_meta))
        return false;
    xesp_meta m;
    std::memcpy(&m, meta, sizeof m);
    if (m.magic != XESP_META_MAGIC ||
        (m.kind != XESP_META_DECAP && m.kind != XESP_META_ENCAP && m.kind != XESP_META_REPORT))
        return false;
    // Offsets count from the frame start, which is where l3 points until we move it.
    uint32_t start = p.l3 - p.l2_len, frame = p.l2_len + p.len;
    if (p.l2_len > p.l3 || m.l3_off >= frame || m.l4_off < m.l3_off || m.l4_off > frame)
        return false;
    p.l3 = start + m.l3_off;
    p.l2_len = m.l3_off;
    p.len = frame - m.l3_off;
    c->kind = m.kind == XESP_META_DECAP   ? Classified::Decap
              : m.kind == XESP_META_ENCAP ? Classified::Encap
                                          : Classified::Report;
    c->id = m.id;
    c->l4 = uint16_t(m.l4_off - m.l3_off);
    c->natt = m.kind == XESP_META_DECAP && (m.flags & XESP_META_F_NATT);
    return true;
}

}  // namespace xesp
