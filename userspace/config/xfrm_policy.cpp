// Policies: the words of `ip xfrm policy add` read into a PolicyConfig, and written back.
#include "userspace/config/xfrm_policy.h"

#include <algorithm>
#include <array>
#include <set>

#include "userspace/config/xfrm_grammar.h"
#include "userspace/config/xfrm_selector.h"

namespace xesp {

namespace xfrm {

namespace {

// `tmpl [src A] [dst B] [proto esp] [spi S] [reqid R] [mode M] [level required]`
Result<PolicyTmpl> parse_tmpl(Cursor &c)
{
    PolicyTmpl t;
    std::set<std::string, std::less<>> seen;
    static const std::array<std::string_view, 7> kWords{"src",   "dst",  "proto", "spi",
                                                        "reqid", "mode", "level"};
    while (c.more()) {
        std::string_view w = c.peek();
        if (std::find(kWords.begin(), kWords.end(), w) == kWords.end() || seen.count(w))
            break;
        seen.insert(std::string(w));
        c.take();
        if (w == "src") {
            XESP_SET(t.src, c.address("tmpl src"));
        } else if (w == "dst") {
            XESP_SET(t.dst, c.address("tmpl dst"));
        } else if (w == "proto") {
            XESP_TRY(parse_xfrm_proto(c));
        } else if (w == "spi") {
            XESP_SET(t.spi, c.number("tmpl spi", UINT32_MAX));
        } else if (w == "reqid") {
            XESP_SET(t.reqid, c.number("tmpl reqid", UINT32_MAX));
        } else if (w == "mode") {
            XESP_SET(t.mode, parse_mode(c));
        } else {
            auto level = c.choice("level", {"required", "use"});
            if (!level)
                return level.error();
            if (*level == 1)
                return c.fail("tmpl level use (IPsec if an SA exists, else clear text) is not "
                              "supported; templates are level required");
        }
    }
    if (t.mode == Mode::Tunnel && (!t.src.family || !t.dst.family))
        return c.fail("a mode tunnel tmpl needs src ADDR and dst ADDR (the tunnel endpoints)");
    if (t.src.family && t.dst.family && t.src.family != t.dst.family)
        return c.fail("tmpl src " + t.src.str() + " and dst " + t.dst.str() +
                      " are of different families");
    return t;
}

struct PolicyDraft {
    PolicyConfig p;
    SelectorDraft sel;
    bool have_dir = false;
};

Result<void> parse_policy_word(Cursor &c, PolicyDraft &d, std::string_view w, bool id_only)
{
    auto used = selector_word(c, d.sel, w);
    if (!used)
        return used.error();
    if (*used)
        return {};
    if (w == "src" || w == "dst" || w == "proto" || w == "sport" || w == "dport") {
        std::string word(w);
        return c.fail("'" + word + "' is given twice");
    }
    if (w == "dir") {
        XESP_TRY(c.once(w));
        auto i = c.choice("dir", {"in", "out", "fwd"});
        if (!i)
            return i.error();
        d.p.dir = *i == 0 ? Dir::In : *i == 1 ? Dir::Out : Dir::Fwd;
        d.have_dir = true;
    } else if (w == "ptype") {
        XESP_TRY(c.once(w));
        auto i = c.choice("ptype", {"main", "sub"});
        if (!i)
            return i.error();
        if (*i == 1)
            return c.fail("ptype sub (MIGRATE sub-policies) is not supported; use ptype main");
    } else if (id_only) {
        return unknown_word(c, w, {"src", "dst", "proto", "sport", "dport", "dir", "ptype"});
    } else if (w == "priority") {
        XESP_TRY(c.once(w));
        XESP_SET(d.p.priority, c.number("priority", UINT32_MAX));
    } else if (w == "action") {
        XESP_TRY(c.once(w));
        auto i = c.choice("action", {"allow", "block"});
        if (!i)
            return i.error();
        d.p.action = *i == 0 ? Action::Allow : Action::Block;
    } else if (w == "tmpl") {
        if (d.p.tmpl)
            return c.fail("only one tmpl per policy is supported (no SA bundles)");
        XESP_SET(d.p.tmpl, parse_tmpl(c));
    } else if (w == "index") {
        return c.fail("'index' is not supported: policies are named by selector and dir");
    } else if (w == "limit" || w == "flag") {
        return c.fail("policy '" + std::string(w) + "' is not supported");
    } else {
        return unknown_word(c, w,
                            {"src", "dst", "proto", "sport", "dport", "dir", "priority", "action",
                             "tmpl", "ptype"});
    }
    return {};
}

}  // namespace

Result<PolicyConfig> parse_policy(Cursor &c, bool id_only)
{
    PolicyDraft d;
    while (c.more())
        XESP_TRY(parse_policy_word(c, d, c.take(), id_only));
    XESP_SET(d.p.sel, finish_selector(c, d.sel, "selector"));
    if (!d.have_dir)
        return c.fail("missing dir in|out|fwd");
    if (d.p.action == Action::Block && d.p.tmpl)
        return c.fail("action block drops the traffic; it takes no tmpl");
    return d.p;
}

}  // namespace xfrm

using xfrm::dir_word;
using xfrm::format_selector;

std::string format_policy(const PolicyConfig &p)
{
    std::string out =
        "policy add " + format_selector(p.sel) + " dir " + std::string(dir_word(p.dir));
    if (p.priority)
        out += " priority " + std::to_string(p.priority);
    if (p.action == Action::Block)
        out += " action block";
    if (p.tmpl) {
        const PolicyTmpl &t = *p.tmpl;
        out += " tmpl";
        if (t.src.family)
            out += " src " + t.src.str();
        if (t.dst.family)
            out += " dst " + t.dst.str();
        out += " proto esp";
        if (t.spi)
            out += " spi " + hex32(t.spi);
        if (t.reqid)
            out += " reqid " + std::to_string(t.reqid);
        out += t.mode == Mode::Tunnel ? " mode tunnel" : " mode transport";
    }
    return out;
}

std::string describe_policy(const Selector &sel, Dir dir)
{
    return "policy " + format_selector(sel) + " dir " + std::string(dir_word(dir));
}

}  // namespace xesp
