#include "bpf/kernel_probe.h"

#include <cerrno>
#include <cstdarg>
#include <cstring>

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <linux/if_xdp.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "bpf/xdp_program.h"

namespace xesp {

namespace {

constexpr int kLoopbackIfindex = 1;

// What the classifier calls, and the first kernel that has it for that program type.
struct HelperNeed {
    bpf_prog_type type;
    bpf_func_id helper;
    const char *name;
    const char *since;
};

constexpr HelperNeed kHelpers[] = {
    {BPF_PROG_TYPE_XDP, BPF_FUNC_loop, "the bpf_loop helper (the policy walk)", "5.17"},
    // bpf_xdp_adjust_meta (4.15) is not needed: without it the verdict goes in the frame.
    {BPF_PROG_TYPE_XDP, BPF_FUNC_xdp_adjust_head, "the bpf_xdp_adjust_head helper", "4.10"},
    {BPF_PROG_TYPE_XDP, BPF_FUNC_redirect_map, "the bpf_redirect_map helper", "4.14"},
    {BPF_PROG_TYPE_XDP, BPF_FUNC_fib_lookup, "the bpf_fib_lookup helper in XDP", "4.18"},
    {BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_get_socket_cookie, "the bpf_get_socket_cookie helper in tc",
     "4.12"},
    {BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_skb_pull_data, "the bpf_skb_pull_data helper", "4.9"},
    {BPF_PROG_TYPE_SCHED_CLS, BPF_FUNC_redirect, "the bpf_redirect helper in tc", "4.4"},
};

Error missing(const std::string &what, const char *since, int err = 0)
{
    std::string m = "kernel " + kernel_release() + ": no " + what + " (Linux " + since +
                    " and later have it; xesp supports " + kOldestSupportedKernel + " and later)";
    if (err == EPERM || err == EACCES)
        m = "kernel probe: " + what + ": " + std::strerror(err) +
            " (needs CAP_BPF and CAP_NET_ADMIN: run as root)";
    return make_error(m, err);
}

// libbpf's own messages (the verifier log among them) stay out of the one-line answer.
int quiet(enum libbpf_print_level, const char *, va_list)
{
    return 0;
}

struct QuietLibbpf {
    libbpf_print_fn_t old = libbpf_set_print(quiet);
    ~QuietLibbpf() { libbpf_set_print(old); }
};

Result<void> probe_types()
{
    if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_XDP, nullptr) != 1)
        return missing("XDP programs", "4.8", errno);
    if (libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_SCHED_CLS, nullptr) != 1)
        return missing("tc BPF programs", "4.1", errno);
    if (libbpf_probe_bpf_map_type(BPF_MAP_TYPE_XSKMAP, nullptr) != 1)
        return missing("XSKMAP (AF_XDP socket map)", "4.18", errno);
    int fd = ::socket(AF_XDP, SOCK_RAW, 0);
    if (fd < 0)
        return missing("AF_XDP sockets (CONFIG_XDP_SOCKETS)", "4.18", errno);
    ::close(fd);
    for (const auto &h : kHelpers)
        if (libbpf_probe_bpf_helper(h.type, h.helper, nullptr) != 1)
            return missing(h.name, h.since, errno);
    return {};
}

// The classifier's XDP program on lo through a bpf_link (generic mode: lo has no driver
// mode), and its tc program on lo's clsact egress hook; both taken off again.
Result<void> probe_attach(const XdpProgram &prog)
{
    int link = bpf_link_create(prog.prog_fd(), kLoopbackIfindex, BPF_XDP, nullptr);
    if (link < 0 && errno != EBUSY && errno != EEXIST)
        return missing("XDP attachment through a bpf_link", "5.9", errno);
    if (link >= 0)
        ::close(link);

    LIBBPF_OPTS(bpf_tc_hook, hook, .ifindex = kLoopbackIfindex, .attach_point = BPF_TC_EGRESS);
    int err = bpf_tc_hook_create(&hook);
    bool created = err == 0;
    if (err && err != -EEXIST)
        return missing("tc clsact qdisc (module sch_ingress)", "4.5", -err);
    // A handle of its own: two daemons probing at once do not take each other's filter.
    LIBBPF_OPTS(bpf_tc_opts, opts, .prog_fd = prog.egress_prog_fd(), .handle = uint32_t(::getpid()),
                .priority = 0xe5e);
    err = bpf_tc_attach(&hook, &opts);
    if (err == 0) {
        opts.prog_fd = 0;
        opts.prog_id = 0;
        opts.flags = 0;
        bpf_tc_detach(&hook, &opts);
    }
    if (created) {
        hook.attach_point = bpf_tc_attach_point(BPF_TC_INGRESS | BPF_TC_EGRESS);
        bpf_tc_hook_destroy(&hook);
    }
    if (err)
        return missing("tc BPF classifier (module cls_bpf, direct action)", "4.4", -err);
    return {};
}

}  // namespace

std::string kernel_release()
{
    utsname u{};
    return ::uname(&u) == 0 ? u.release : "(unknown)";
}

Result<void> probe_kernel()
{
    QuietLibbpf q;
    if (auto r = probe_types(); !r)
        return r;
    XdpOptions small;
    small.max_sas = 16;
    small.max_policy_entries = 16;
    auto prog = XdpProgram::load(small);
    if (!prog) {
        int err = prog.error().code.value();
        if (err == EPERM)
            return missing("load the classifier", "", err);
        return make_error("kernel " + kernel_release() +
                              ": the verifier rejects the "
                              "classifier (xesp supports " +
                              kOldestSupportedKernel +
                              " and later; tested on Debian's 6.1 and 6.12)",
                          err);
    }
    return probe_attach(**prog);
}

}  // namespace xesp
