// The engine's classification: whether a packet is ESP for one of our SAs, plaintext an out
// policy protects, blocked, or not ours. It runs in steps that a whole burst takes together
// (classify_burst()), starting from the packet itself (classify_begin(), for process()) or from
// what the XDP classifier found (classified_from_meta(), classify_ids()). Also here: the
// inbound policy check of what comes out of an SA (RFC 4301 5.2).
#include <algorithm>
#include <cassert>
#include <cstring>

#include "bpf/abi_check.h"
#include "userspace/base/wire.h"
#include "userspace/esp/engine.h"

namespace xesp {

using namespace wire;

bool tmpl_matches(const PolicyTmpl &t, const SaConfig &sa)
{
    return (!t.spi || t.spi == sa.spi) && (!t.reqid || t.reqid == sa.reqid) && t.mode == sa.mode &&
           (!t.src.family || t.src == sa.src) && (!t.dst.family || t.dst == sa.dst);
}

Engine::Dirn Engine::classify_esp(const Tables &t, Pkt &p, const uint8_t *ip, uint32_t esp_off,
                                  bool udp, const IpAddr &dst, Sa **sa)
{
    if (esp_off + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    *sa = t.sas.find_in(dst, get32(ip + esp_off));
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
    return !options_.local || is_local(c.dst);
}

bool Engine::is_local(const IpAddr &a) const
{
    assert(options_.local);
    return std::binary_search(options_.local->begin(), options_.local->end(), a);
}

// An IP header whose lengths lie. If it claims to carry ESP it is dropped and counted here;
// anything else is left to the kernel, which drops it too.
static Engine::Dirn bad_length(Pkt &p, uint8_t proto)
{
    if (proto == kProtoEsp || proto == kProtoUdp)
        p.set_drop(Drop::InBadLength);
    return Engine::Dirn::None;
}

Engine::Dirn Engine::classify_begin(const Tables &t, Pkt &p, Step &s, Sa **sa,
                                    const Classified *plain_only)
{
    *sa = nullptr;
    s.stage = Step::Done;
    uint8_t *ip = p.ip();
    IpHeader h;
    IpParse st = parse_ip(ip, p.len, &h);
    if (plain_only && st != IpParse::Ok) {
        // Sent here because a policy protects it: what cannot be read goes nowhere.
        p.set_drop(Drop::OutBadInner);
        return Dirn::None;
    }
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
    if (h.fragment && h.proto == kProtoEsp && !plain_only)
        return Dirn::None;
    const uint32_t off = h.l4_off;
    if (plain_only) {
        flow_from_header(h, &s.flow);
        if (plain_only->whole_ports && h.fragment) {
            s.flow.sport = plain_only->sport;
            s.flow.dport = plain_only->dport;
            s.flow.fragment = s.flow.proto_unknown = false;
        }
        t.spd.prefetch(Dir::Out, s.flow, &s.probe);
        s.stage = Step::Policy;
        return Dirn::None;
    }
    if (h.proto == kProtoEsp)
        return classify_esp(t, p, ip, off, false, h.dst(), sa);
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
        return classify_esp(t, p, ip, off + kUdpLen, true, h.dst(), sa);
    }

    flow_from_header(h, &s.flow);
    t.spd.prefetch(Dir::Out, s.flow, &s.probe);
    s.stage = Step::Policy;
    return Dirn::None;
}

// A policy linked to its flow (OutFlow), asked for with the policy: the flow's SA is at hand
// for the Check step, with no lookup (OutSa) in between.
void Engine::from_link(Step &s, const PolicyTmpl &tmpl)
{
    s.out.spi = 0;
    s.out.mode = tmpl.mode;
    s.out.found = s.link;
    s.sa = s.link->newest;
    if (s.sa)
        s.sa->prefetch_state();
    s.stage = Step::Check;
}

namespace {

// Every line of a policy: its template ends past the first two wherever it starts in a line.
void prefetch_policy(const PolicyConfig *pol)
{
    if (!pol)
        return;
    const char *at = reinterpret_cast<const char *>(pol);
    for (size_t off = 0; off < sizeof(PolicyConfig); off += 64)
        __builtin_prefetch(at + off);
    __builtin_prefetch(at + sizeof(PolicyConfig) - 1);
}

}  // namespace

// One step of a packet's classification; each asks for what the next one reads. The steps
// after Policy are the same for process() and process_classified(): the policy's template,
// then the SA it names, then whether that SA may carry the packet.
Engine::Dirn Engine::classify_step(const Tables &t, Pkt &p, Step &s, Sa **sa)
{
    switch (s.stage) {
    case Step::Done:
        break;
    case Step::Policy:
        s.unsure = false;
        s.pol = t.spd.lookup(Dir::Out, s.flow, &s.unsure, s.probe, &s.link);
        prefetch_policy(s.pol);
        if (s.link)
            __builtin_prefetch(s.link);
        s.stage = Step::Tmpl;
        break;
    case Step::Tmpl: {
        s.stage = Step::Done;
        const PolicyConfig *pol = s.pol;
        if (s.unsure && !(pol && pol->tmpl)) {
            p.set_drop(Drop::FragmentUnclassifiable);
            return Dirn::None;
        }
        if (!pol)
            return check_unprotected(t, p, s.flow);
        if (pol->action == Action::Block) {
            p.set_drop(Drop::OutPolBlock);
            return Dirn::None;
        }
        if (!pol->tmpl)
            return Dirn::None;
        if (s.link) {
            from_link(s, *pol->tmpl);
            break;
        }
        s.out = t.sas.out_key(*pol->tmpl, s.flow);
        s.stage = Step::OutSa;
        break;
    }
    case Step::OutSa:
        s.sa = t.sas.out_candidate(s.out);
        s.stage = Step::Check;
        break;
    case Step::Check:
        s.stage = Step::Done;
        *sa = t.sas.out_check(s.sa, s.out);
        if (!*sa) {
            // Fail closed: the policy says protect, and there is nothing to protect it with.
            p.set_drop(Drop::OutNoStates);
            return Dirn::None;
        }
        return Dirn::Encap;
    case Step::ById:
        s.pol = t.spd.by_id(s.id, &s.link);
        prefetch_policy(s.pol);
        if (s.link)
            __builtin_prefetch(s.link);
        s.stage = Step::ByIdPolicy;
        break;
    case Step::ByIdPolicy:
        return resolve_encap(t, p, s, sa);
    case Step::DecapId:
        // The SA the classifier found: its runtime part, and the configuration the packet
        // is checked against, are asked for; resolve_decap() reads them.
        s.sa = t.sas.by_id(s.id);
        if (s.sa) {
            s.sa->prefetch_state();
            __builtin_prefetch(&s.sa->config());
            __builtin_prefetch(reinterpret_cast<const char *>(&s.sa->config()) + 64);
            s.stage = Step::DecapCheck;
            break;
        }
        s.stage = Step::Done;
        stats_.reclassified++;
        return classify(t, p, sa);  // an id a change has just removed: looked up again
    case Step::DecapCheck:
        return resolve_decap(p, s, sa);
    }
    return Dirn::None;
}

Engine::Dirn Engine::classify(const Tables &t, Pkt &p, Sa **sa)
{
    Step s;
    Dirn d = classify_begin(t, p, s, sa);
    while (s.stage != Step::Done)
        d = classify_step(t, p, s, sa);
    return d;
}

// The inbound policy for a packet that arrived (decrypted, or in the clear), as the kernel
// picks it: the fwd policies for what is forwarded, the in policies for what is delivered to
// the gateway (a broadcast address of its subnets too). Multicast and the limited broadcast,
// and everything where the gateway's addresses are not known (`xesp pcap` without --local),
// ask the in policies, then the fwd ones.
Dir Engine::inbound_dir(const FlowKey &flow, bool *then_fwd) const
{
    *then_fwd = !options_.local || is_group_dst(flow.dst);
    if (*then_fwd || is_local(flow.dst))
        return Dir::In;
    const auto &brd = options_.broadcast;
    return std::binary_search(brd.begin(), brd.end(), flow.dst) ? Dir::In : Dir::Fwd;
}

// What came out of an SA and the kernel's input would drop as a martian (martian(); an IPv4
// source that is the gateway's own address too, as fib_validate_source() refuses it with
// accept_local off, and, stricter, one of its broadcast addresses). Handed to the kernel's
// raw socket it would leave as a packet the gateway made: to a loopback address over lo, to
// a service bound there, from any of them onto a link. Where the gateway's addresses are not
// known, every destination is taken as its own, and no source as its.
bool Engine::decrypted_martian(const FlowKey &flow) const
{
    if (!options_.local)
        return martian(flow.src, flow.dst, true);
    if (martian(flow.src, flow.dst, is_local(flow.dst)))
        return true;
    const auto &brd = options_.broadcast;
    return flow.src.family == 4 &&
           (is_local(flow.src) || std::binary_search(brd.begin(), brd.end(), flow.src));
}

const PolicyConfig *Engine::inbound_policy(const Tables &t, const FlowKey &flow, bool *unsure) const
{
    bool then_fwd;
    const PolicyConfig *pol = t.spd.lookup(inbound_dir(flow, &then_fwd), flow, unsure);
    return pol || !then_fwd ? pol : t.spd.lookup(Dir::Fwd, flow, unsure);
}

// Plaintext no outbound policy claims: if an inbound policy says it must arrive protected, it
// did not, and is dropped (RFC 4301 5.2; the kernel counts it as XfrmInTmplMismatch).
Engine::Dirn Engine::check_unprotected(const Tables &t, Pkt &p, const FlowKey &flow)
{
    bool unsure = false;
    const PolicyConfig *pol = inbound_policy(t, flow, &unsure);
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
//
// For every packet of the burst that its SA decrypted, in three steps over the burst as in
// classify_burst(): each packet's flow, with the cells of its lookup asked for; the lookup,
// with the policy found asked for; the check. With traffic spread over thousands of tunnels
// the cells and the policy are misses, which then overlap.
void Engine::inbound_policy_checks(const Tables &t, Burst &b)
{
    if (b.dec.n == 0)
        return;
    struct Check {
        Pkt *p;
        const Sa *sa;
        const PolicyConfig *pol;
        Dir dir;
        bool then_fwd;
        FlowKey flow;
        Spd::Probe probe, fwd;  // for dir; for Dir::Fwd after it (then_fwd)
    };
    Check c[kMaxBurst];
    size_t n = 0;
    for (size_t g = 0; g < b.ngroups; g++) {
        const Burst::Group &gr = b.groups[g];
        if (gr.dirn != Dirn::Decap)
            continue;
        Pkt *const *gp = b.sorted + gr.first;
        for (size_t i = 0; i < gr.n; i++) {
            if (gp[i]->verdict != Verdict::Decrypted)
                continue;
            Check &k = c[n];
            if (!parse_flow(gp[i]->ip(), gp[i]->len, &k.flow)) {
                gp[i]->set_drop(Drop::InBadInner);
                continue;
            }
            if (decrypted_martian(k.flow)) {
                gp[i]->set_drop(Drop::InMartian);
                continue;
            }
            k.p = gp[i];
            k.sa = gr.sa;
            k.dir = inbound_dir(k.flow, &k.then_fwd);
            t.spd.prefetch(k.dir, k.flow, &k.probe);
            if (k.then_fwd)
                t.spd.prefetch(Dir::Fwd, k.flow, &k.fwd);
            n++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        Check &k = c[i];
        k.pol = t.spd.lookup(k.dir, k.flow, nullptr, k.probe);
        if (!k.pol && k.then_fwd)
            k.pol = t.spd.lookup(Dir::Fwd, k.flow, nullptr, k.fwd);
        prefetch_policy(k.pol);
    }
    for (size_t i = 0; i < n; i++) {
        const Check &k = c[i];
        if (!k.pol)
            k.p->set_drop(Drop::InNoPolicy);
        else if (k.pol->action == Action::Block)
            k.p->set_drop(Drop::InPolBlock);
        else if (k.pol->tmpl ? !tmpl_matches(*k.pol->tmpl, k.sa->config()) : k.sa->tunnel())
            k.p->set_drop(Drop::InTmplMismatch);
    }
}

// A burst is classified in steps, each over every packet of the burst, so that the cache
// misses of the packets overlap: with traffic spread over thousands of tunnels each lookup
// (policy, template, SA) is a miss, and one packet after another would wait for each.
void Engine::classify_burst(const Tables &t, Pkt *const *pkts, Step *steps, Dirn *dirn, Sa **owner,
                            size_t n)
{
    for (bool more = true; more;) {
        more = false;
        for (size_t i = 0; i < n; i++) {
            if (steps[i].stage == Step::Done)
                continue;
            dirn[i] = classify_step(t, *pkts[i], steps[i], &owner[i]);
            more |= steps[i].stage != Step::Done;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (dirn[i] != Dirn::None)
            owner[i]->prefetch_state();  // read by prepare_burst(), after the whole burst
}

// ESP the classifier matched to an SA (s.id, found in the step before: s.sa). The SA is
// checked against the packet's own (destination, SPI), the key it was found by: an id from
// before a reload may name another SA now.
Engine::Dirn Engine::resolve_decap(Pkt &p, Step &s, Sa **sa)
{
    s.stage = Step::Done;
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)) || s.l4 < h.hdr_len) {
        p.set_drop(Drop::InBadLength);
        return Dirn::None;
    }
    p.len = h.total;  // drop link-layer padding
    if (s.l4 + kEspHdrLen > p.len) {
        p.set_drop(Drop::InTruncated);
        return Dirn::None;
    }
    Sa *found = s.sa;  // by its id, in the step before
    if (found->config().spi != get32(p.ip() + s.l4) || found->config().dst != h.dst()) {
        p.set_drop(Drop::InNoStates);
        return Dirn::None;
    }
    *sa = found;
    if (!inbound(*found)) {
        p.set_drop(Drop::InReflected);
        return Dirn::None;
    }
    if (found->natt() != s.natt) {
        p.set_drop(Drop::InEncapMismatch);
        return Dirn::None;
    }
    p.l4 = s.l4;
    return Dirn::Decap;
}

// The SA that out policy pol protects a packet with: the newest SA its template names, or for a
// transport template without addresses the one for the packet's own addresses (from h, its IP
// header).
Sa *Engine::out_sa(const Tables &t, const PolicyConfig &pol, const IpHeader &h)
{
    FlowKey flow;
    if (!pol.tmpl->src.family || !pol.tmpl->dst.family) {
        flow.src = h.src();
        flow.dst = h.dst();
    }
    return t.sas.find_out(*pol.tmpl, flow);
}

// An out policy the classifier found (s.id, read in the ById step, which asked for the policy
// itself): its template then goes through the steps of classify_step().
Engine::Dirn Engine::resolve_encap(const Tables &t, Pkt &p, Step &s, Sa **sa)
{
    s.stage = Step::Done;
    const PolicyConfig *pol = s.pol;  // by_id(s.id)
    if (!pol) {  // an id a change has just removed: looked up again in these tables
        stats_.reclassified++;
        return classify(t, p, sa);
    }
    if (pol->dir != Dir::Out) {
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
    if (s.link) {
        from_link(s, *pol->tmpl);
        return Dirn::None;
    }
    FlowKey flow;
    if (!pol->tmpl->src.family || !pol->tmpl->dst.family) {
        flow.src = h.src();
        flow.dst = h.dst();
    }
    s.out = t.sas.out_key(*pol->tmpl, flow);
    s.stage = Step::OutSa;
    return Dirn::None;
}

uint32_t Engine::natt_inner_mtu(const Classified &c, const Pkt &p)
{
    const Tables &t = tables_.read();
    if (c.kind != Classified::Encap && c.kind != Classified::Plain)
        return 0;
    IpHeader h;
    if (!lengths_ok(parse_ip(p.ip(), p.len, &h)))
        return 0;
    const PolicyConfig *pol = nullptr;
    if (c.kind == Classified::Encap) {
        pol = t.spd.by_id(c.id);
    } else {
        FlowKey flow;
        flow_from_header(h, &flow);
        pol = t.spd.lookup(Dir::Out, flow);
    }
    if (!pol || pol->dir != Dir::Out || pol->action == Action::Block || !pol->tmpl)
        return 0;
    Sa *sa = out_sa(t, *pol, h);
    // Transport mode carries whole datagrams only (RFC 4303 3.3.4): its packets are not split
    // before encryption, the outer packet is fragmented instead.
    uint32_t mtu = sa && sa->natt() && sa->tunnel() ? sa->outer_mtu(options_.link_mtu) : 0;
    return mtu ? sa->inner_mtu(mtu) : 0;
}

uint32_t Engine::plain_inner_mtu(const uint8_t *ip, uint32_t len)
{
    const Tables &t = tables_.read();
    IpHeader h;
    if (parse_ip(ip, len, &h) != IpParse::Ok)
        return 0;
    FlowKey flow;
    flow_from_header(h, &flow);
    const PolicyConfig *pol = t.spd.lookup(Dir::Out, flow);
    if (!pol || pol->action == Action::Block || !pol->tmpl)
        return 0;
    Sa *sa = out_sa(t, *pol, h);
    uint32_t mtu = sa ? sa->outer_mtu(options_.link_mtu) : 0;
    return mtu ? sa->inner_mtu(mtu) : 0;
}

// The start of process_classified() for one burst: its packets looked up from their ids,
// and classified further where the ids left off, into b.
void Engine::classify_ids(const Tables &t, Pkt *const *pkts, const Classified *cls, size_t n,
                          Burst &b)
{
    Step steps[kMaxBurst];
    for (size_t i = 0; i < n; i++) {
        Pkt &p = *pkts[i];
        p.verdict = Verdict::Pass;
        b.owner[i] = nullptr;
        b.dirn[i] = Dirn::None;
        steps[i].stage = Step::Done;
        if (cls[i].kind == Classified::Decap) {
            steps[i].id = cls[i].id;
            steps[i].l4 = cls[i].l4;
            steps[i].natt = cls[i].natt;
            steps[i].stage = Step::DecapId;
            t.sas.prefetch_id(cls[i].id);
        } else if (cls[i].kind == Classified::Encap) {
            steps[i].id = cls[i].id;
            steps[i].stage = Step::ById;
            t.spd.prefetch_id(cls[i].id);
        } else if (cls[i].kind == Classified::Plain) {
            b.dirn[i] = classify_begin(t, p, steps[i], &b.owner[i], &cls[i]);
        }
    }
    b.pkts = pkts;
    b.n = n;
    classify_burst(t, pkts, steps, b.dirn, b.owner, n);
}

Classified plain_fragments(const uint8_t *ip, uint32_t len)
{
    Classified c{};
    c.kind = Classified::Plain;
    FlowKey flow;
    if (parse_flow(ip, len, &flow) && !flow.fragment) {
        c.whole_ports = true;
        c.sport = flow.sport;
        c.dport = flow.dport;
    }
    return c;
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
