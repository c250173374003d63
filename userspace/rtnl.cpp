#include "userspace/rtnl.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <cstring>
#include <string>

namespace xesp {

RtnlRequests::~RtnlRequests()
{
    if (nl_)
        mnl_socket_close(nl_);
}

Result<void> RtnlRequests::open(time_t timeout_s)
{
    nl_ = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
    if (!nl_ || mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0)
        return make_error(std::string("cannot open a netlink socket: ") + std::strerror(errno),
                          errno);
    timeval tv{timeout_s, 0};
    setsockopt(mnl_socket_get_fd(nl_), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;    // acknowledgements without a copy of the request
    mnl_socket_setsockopt(nl_, NETLINK_CAP_ACK, &one, sizeof(one));
    return {};
}

nlmsghdr *RtnlRequests::request(uint16_t type, uint16_t flags)
{
    nlmsghdr *nlh = mnl_nlmsg_put_header(qbuf_);
    nlh->nlmsg_type = type;
    nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    nlh->nlmsg_seq = ++seq_;
    return nlh;
}

} // namespace xesp
