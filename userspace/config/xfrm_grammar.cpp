// Reading and writing `ip xfrm state` / `ip xfrm policy` words (ip-xfrm(8)).
//
// A line that parses is a complete and consistent SA or policy: what the kernel's xfrm_user
// would refuse (a wrong key length, ESN without a replay window, a change of family in
// transport mode...) is refused here, with a message that names the word and, where it can,
// the fix. Messages never contain key material: keys are never echoed, and a word echoed
// because it is misplaced is hidden when it looks like a key (see shown() in xfrm_words.h).
//
// This file reads the object and the verb and hands the rest to the object's parser:
// xfrm_sa.cpp or xfrm_policy.cpp. They share xfrm_words (splitting, values, the cursor,
// messages for wrong words), xfrm_algs (advice on algorithm names; the table is esp/algs.h)
// and xfrm_selector (selectors, mode, proto, dir).
#include "userspace/config/xfrm_grammar.h"

#include "userspace/config/xfrm_policy.h"
#include "userspace/config/xfrm_sa.h"
#include "userspace/config/xfrm_words.h"

namespace xesp {

using xfrm::Cursor;
using xfrm::shown;

namespace {

Result<Command::Verb> parse_verb(std::string_view w)
{
    using V = Command::Verb;
    if (w == "add")
        return V::Add;
    if (w == "update")
        return V::Update;
    if (w == "del" || w == "delete")
        return V::Del;
    if (w == "get")
        return V::Get;
    if (w == "flush")
        return V::Flush;
    if (w == "list" || w == "show")
        return V::List;
    return make_error("unknown command " + shown(w) +
                      "; expected add, update, del, get, flush or list");
}

}  // namespace

Result<Command> parse_command(const std::vector<std::string> &words)
{
    Command cmd;
    if (words.empty())
        return make_error("empty command; expected sa ... or policy ...");
    std::string_view obj = words[0];
    if (obj == "sa" || obj == "state")
        cmd.object = Command::Object::Sa;
    else if (obj == "policy")
        cmd.object = Command::Object::Policy;
    else
        return make_error("unknown object " + shown(obj) + "; expected sa or policy");
    if (words.size() < 2)
        return make_error(std::string(obj) +
                          ": missing command: add, update, del, get, flush or list");
    XESP_SET(cmd.verb, parse_verb(words[1]));
    bool sa = cmd.object == Command::Object::Sa;
    Cursor c(words, std::string(sa ? "sa " : "policy ") + words[1]);
    using V = Command::Verb;
    switch (cmd.verb) {
    case V::Add:
    case V::Update:
        if (sa)
            XESP_SET(cmd.sa, xfrm::parse_sa(c));
        else
            XESP_SET(cmd.policy, xfrm::parse_policy(c, false));
        break;
    case V::Del:
    case V::Get:
        if (sa)
            XESP_SET(cmd.sa, xfrm::parse_sa_id(c));
        else
            XESP_SET(cmd.policy, xfrm::parse_policy(c, true));
        break;
    case V::Flush:
    case V::List:
        if (c.more())
            return c.fail("takes no arguments, not " + shown(c.peek()));
        break;
    }
    return cmd;
}

}  // namespace xesp
