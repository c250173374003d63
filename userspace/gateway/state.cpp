#include "userspace/gateway/state.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "userspace/sys_util.h"
#include "userspace/xfrm_words.h"

namespace xesp {

namespace {

void wipe(std::string &s) { OPENSSL_cleanse(s.data(), s.size()); }

void copy_sequence(SaConfig &to, const SaConfig &from)
{
    to.seq = from.seq;
    to.seq_hi = from.seq_hi;
    to.oseq = from.oseq;
    to.oseq_hi = from.oseq_hi;
}

} // namespace

Result<std::optional<GatewayState>> load_state(const std::string &path)
{
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        if (errno == ENOENT)
            return std::optional<GatewayState>();
        return make_error(sys_error("cannot open the state file", path), errno);
    }
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    wipe(text);
    auto bad = [&](const std::string &what) {
        return make_error("state file " + path + ": " + what +
                          "; move it away to start without it");
    };
    if (!j.is_object() || !j.contains("config") || !j["config"].is_string() ||
        !j.contains("ifaces") || !j["ifaces"].is_array())
        return bad("not a state file");
    GatewayState st;
    std::string &batch = j["config"].get_ref<std::string &>();
    auto cfg = load_batch(batch, path);
    wipe(batch);
    if (!cfg)
        return bad(cfg.error().message);
    st.config = std::move(*cfg);
    for (const auto &i : j["ifaces"]) {
        if (!i.is_object() || !i.contains("name") || !i["name"].is_string() ||
            !i.contains("role") || !i["role"].is_string())
            return bad("an interface entry needs a name and a role");
        const std::string &role = i["role"].get_ref<const std::string &>();
        if (role != "public" && role != "protected")
            return bad("role " + xfrm::shown(role) + " is neither public nor protected");
        st.ifaces.emplace_back(i["name"].get<std::string>(),
                               role == "public" ? IfaceRole::Public : IfaceRole::Protected);
    }
    if (j.contains("netns")) {
        if (!j["netns"].is_string())
            return bad("netns is not a string");
        st.netns = j["netns"].get<std::string>();
    }
    return std::optional<GatewayState>(std::move(st));
}

Result<void> save_state(const std::string &path, const GatewayState &st)
{
    nlohmann::json j;
    j["config"] = st.config.to_batch(true);
    j["ifaces"] = nlohmann::json::array();
    for (const auto &[name, role] : st.ifaces)
        j["ifaces"].push_back({{"name", name},
                               {"role", role == IfaceRole::Public ? "public" : "protected"}});
    if (st.netns)
        j["netns"] = *st.netns;
    std::string text = j.dump(1) + "\n";
    wipe(j["config"].get_ref<std::string &>());

    std::string tmp = path + ".tmp";
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        wipe(text);
        return make_error(sys_error("cannot write the state file", tmp), errno);
    }
    size_t done = 0;
    while (done < text.size()) {
        ssize_t w = ::write(fd, text.data() + done, text.size() - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        done += size_t(w);
    }
    wipe(text);
    bool ok = done == text.size() && ::fsync(fd) == 0;
    int err = errno;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
        if (ok)
            err = errno;
        ::unlink(tmp.c_str());
        errno = err;
        return make_error(sys_error("cannot write the state file", path), err);
    }
    return {};
}

Config with_saved_sequence(Config configured, const Config &saved)
{
    for (SaConfig &c : configured.sas) {
        const SaConfig *s = saved.find_sa(c.dst, c.spi);
        if (!s)
            continue;
        SaConfig probe = c;
        copy_sequence(probe, *s);
        if (same_sa(probe, *s))
            copy_sequence(c, *s);
    }
    return configured;
}

} // namespace xesp
