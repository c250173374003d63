// The daemon's side of the control socket (control.h): serving requests, the server loop,
// and ConfigHandler, which applies changes to a Config all or nothing.
#include "userspace/base/clock.h"
#include "userspace/control/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "userspace/control/control_text.h"
#include "userspace/esp/seq_reserve.h"
#include "userspace/base/sys_util.h"
#include "userspace/config/xfrm_words.h"

namespace xesp {

namespace {

using nlohmann::json;

using namespace control_text;

std::string answer_line(const Result<std::string> &r)
{
    std::string out;
    out.reserve(r ? r->size() + r->size() / 8 + 32 : 64);
    if (r) {
        append_wiped(out, "{\"ok\":true,\"output\":");
        append_json_string(out, *r);
    } else {
        append_wiped(out, "{\"ok\":false,\"error\":");
        append_json_string(out, r.error().message);
    }
    append_wiped(out, "}\n");
    return out;
}

// ---- Serving one request ------------------------------------------------------------------

bool is_mutating(Command::Verb v)
{
    using V = Command::Verb;
    return v == V::Add || v == V::Update || v == V::Del || v == V::Flush;
}

Result<bool> flag_field(const json &req, const char *name)
{
    auto it = req.find(name);
    if (it == req.end())
        return false;
    if (!it->is_boolean())
        return make_error(std::string("invalid request: \"") + name + "\" must be true or false");
    return it->get<bool>();
}

// The "words" of a request: a non-empty array of strings.
Result<std::vector<std::string>> words_field(const json &req, const char *cmd)
{
    auto it = req.find("words");
    if (it == req.end() || !it->is_array() || it->empty())
        return make_error(std::string("invalid request: \"") + cmd +
                          "\" needs \"words\", an array of strings");
    std::vector<std::string> words;
    for (auto &w : *it) {
        if (!w.is_string())
            return make_error("invalid request: \"words\" must be an array of strings");
        words.push_back(w.get<std::string>());
    }
    return words;
}

Result<std::string> serve_command(ControlHandler &h, json &req)
{
    auto got = words_field(req, "command");
    if (!got)
        return got.error();
    std::vector<std::string> &words = *got;
    auto show_keys = flag_field(req, "show_keys");
    Result<std::string> out = make_error("");
    if (!show_keys) {
        out = show_keys.error();
    } else if (auto cmd = parse_command(words); !cmd) {
        out = cmd.error();
    } else {
        out = h.command(*cmd, *show_keys);
    }
    for (auto &w : words)
        wipe(w);
    return out;
}

Result<std::string> serve_iface(ControlHandler &h, json &req)
{
    auto words = words_field(req, "iface");
    if (!words)
        return words.error();
    return h.iface(*words);
}

// A name as it goes into messages: control characters as \xNN, so that an error stays on one
// line.
std::string one_line(std::string_view name)
{
    std::string out;
    for (char c : name) {
        auto u = static_cast<unsigned char>(c);
        if (u < 0x20 || u == 0x7f) {
            char esc[5];
            std::snprintf(esc, sizeof(esc), "\\x%02x", u);
            out += esc;
        } else {
            out += c;
        }
    }
    return out;
}

Result<std::string> serve_batch(ControlHandler &h, json &req)
{
    auto text = req.find("text");
    if (text == req.end() || !text->is_string())
        return make_error("invalid request: \"batch\" needs \"text\", a string");
    std::string name = "<request>";
    if (auto n = req.find("name"); n != req.end()) {
        if (!n->is_string())
            return make_error("invalid request: \"name\" must be a string");
        name = one_line(n->get_ref<const std::string &>());
    }
    auto check = flag_field(req, "check");
    if (!check)
        return check.error();
    auto applied = h.batch(text->get_ref<const std::string &>(), name, *check);
    if (!applied)
        return applied.error();
    return std::string();
}

Result<std::string> serve(ControlHandler &h, json &req)
{
    if (!req.is_object())
        return make_error("invalid request: expected a JSON object");
    auto cmd = req.find("cmd");
    if (cmd == req.end() || !cmd->is_string())
        return make_error("invalid request: \"cmd\" is missing");
    const auto &name = cmd->get_ref<const std::string &>();
    if (name == "ping")
        return std::string();
    if (name == "command")
        return serve_command(h, req);
    if (name == "batch")
        return serve_batch(h, req);
    if (name == "stats")
        return h.stats_json();
    if (name == "iface")
        return serve_iface(h, req);
    return make_error("invalid request: unknown cmd " + xfrm::shown(name.substr(0, 32)) +
                      "; expected ping, command, batch, iface or stats");
}

}  // namespace

std::string answer_request(ControlHandler &h, std::string_view line, bool *ok)
{
    auto req = parse_message(line);
    Result<std::string> out =
        req ? serve(h, *req)
            : Result<std::string>(make_error("invalid request: " + req.error().message));
    if (req)
        wipe_json(*req);
    *ok = out.ok();
    std::string text = answer_line(out);
    if (out)
        wipe(*out);
    return text;
}

namespace {

// ---- Sockets ------------------------------------------------------------------------------

// 0: nothing answers on path (no file, or a stale one); 1: a server answers; or an error.
Result<bool> server_answers(const std::string &path, const sockaddr_un &addr)
{
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return make_error(sys_error("cannot create a socket for", path), errno);
    int rc = ::connect(fd, reinterpret_cast<const sockaddr *>(&addr), sizeof(addr));
    int err = errno;
    ::close(fd);
    if (rc == 0 || err == EAGAIN || err == EINPROGRESS)
        return true;
    if (err == ECONNREFUSED || err == ENOENT)
        return false;
    errno = err;
    return make_error(sys_error("cannot probe", path), err);
}

// Makes sure no live server owns path, and removes a stale socket file left by a dead one.
Result<void> claim_path(const std::string &path, const sockaddr_un &addr)
{
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0)
        return errno == ENOENT ? Result<void>() : make_error(sys_error("cannot stat", path), errno);
    if (!S_ISSOCK(st.st_mode))
        return make_error(path + " exists and is not a socket; remove it or choose another path",
                          EEXIST);
    auto live = server_answers(path, addr);
    if (!live)
        return live.error();
    if (*live)
        return make_error("another xesp daemon is already listening on " + path, EADDRINUSE);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
        return make_error(sys_error("cannot remove the stale socket", path), errno);
    return {};
}

std::string too_large(size_t limit)
{
    return answer_line(make_error("request too large: a request line may hold at most " +
                                  std::to_string(limit) + " bytes"));
}

}  // namespace

// ---- ConfigHandler ------------------------------------------------------------------------

std::string command_output(const Command &cmd, const Config &cfg, bool show_keys)
{
    using V = Command::Verb;
    bool sa = cmd.object == Command::Object::Sa;
    std::string out;
    auto add = [&out](std::string line) {
        append_wiped(out, line);
        append_wiped(out, "\n");
        wipe(line);
    };
    if (cmd.verb == V::Get && sa) {
        if (const SaConfig *s = cfg.find_sa(cmd.sa.dst, cmd.sa.spi))
            add(format_sa(*s, show_keys));
    } else if (cmd.verb == V::Get) {
        if (const PolicyConfig *p = cfg.find_policy(cmd.policy.sel, cmd.policy.dir))
            add(format_policy(*p));
    } else if (cmd.verb == V::List && sa) {
        // Both SAs of a pair that shares a key and salt are marked, with a comment that
        // keeps the line loadable.
        std::vector<size_t> twin = nonce_key_twins(cfg), mark = twin;
        for (size_t j = 0; j < twin.size(); j++)
            if (twin[j] != SIZE_MAX && mark[twin[j]] == SIZE_MAX)
                mark[twin[j]] = j;
        std::vector<const SaConfig *> sas;
        for (const SaConfig &c : cfg.sas)
            sas.push_back(&c);
        for (size_t i = 0; i < sas.size(); i++) {
            std::string line = format_sa(*sas[i], show_keys);
            if (mark[i] != SIZE_MAX)
                append_wiped(line, "  # nonce-reuse risk: same key and salt as " +
                                       describe_sa(sas[mark[i]]->dst, sas[mark[i]]->spi));
            add(std::move(line));
        }
    } else if (cmd.verb == V::List) {
        for (const auto &p : cfg.policies)
            add(format_policy(p));
    }
    return out;
}

Result<std::string> ConfigHandler::command(const Command &cmd, bool show_keys)
{
    // get checks that the entry exists; list changes nothing.
    auto change = change_of(config_, cmd);
    if (!change)
        return change.error();
    if (!is_mutating(cmd.verb))
        return command_output(cmd, config_, show_keys);
    auto committed = commit(*change);
    if (!committed)
        return committed.error();
    return std::string();
}

Result<void> ConfigHandler::batch(std::string_view text, std::string_view name, bool check_only)
{
    auto change = batch_change(text, name, config_, [this](const Command &c) { return check(c); });
    if (!change)
        return change.error();
    if (check_only)
        return {};
    return commit(*change);
}

std::string ConfigHandler::stats_json()
{
    return json{{"sas", config_.sas.size()}, {"policies", config_.policies.size()}}.dump();
}

Result<void> ConfigHandler::commit(const ConfigChange &change)
{
    apply_change(config_, change);
    return {};
}

// ---- ControlServer ------------------------------------------------------------------------

namespace {

struct Conn {
    int fd = -1;
    std::string in;              // received, not yet answered
    std::string out;             // answers not yet sent
    size_t sent = 0;             // bytes of out already sent
    Clock::time_point deadline;  // dropped if no request arrives and nothing is sent by then
    bool peer_done = false;      // the client shut down its side
    bool closing = false;        // close once out is sent
    bool dead = false;

    ~Conn()
    {
        wipe(in);
        wipe(out);
        if (fd >= 0)
            ::close(fd);
    }
};

}  // namespace

struct ControlServer::Impl {
    ControlHandler *handler = nullptr;
    Options opt;
    int listen_fd = -1;
    dev_t dev = 0;  // the socket file we bound, removed only if still the same
    ino_t ino = 0;
    std::vector<std::unique_ptr<Conn>> conns;
    ControlCounters counters;

    ~Impl()
    {
        conns.clear();
        if (listen_fd < 0)
            return;
        ::close(listen_fd);
        struct stat st;
        if (::lstat(opt.path.c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino)
            ::unlink(opt.path.c_str());
    }

    Clock::duration idle() const { return std::chrono::milliseconds(opt.idle_timeout_ms); }
    void accept_clients();
    void read_from(Conn &c);
    void answer_lines(Conn &c);
    void write_to(Conn &c);
    void drop(Conn &c)
    {
        c.dead = true;
        counters.dropped++;
    }
};

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl))
{}
ControlServer::ControlServer(ControlServer &&) noexcept = default;
ControlServer &ControlServer::operator=(ControlServer &&) noexcept = default;
ControlServer::~ControlServer() = default;

const std::string &ControlServer::path() const
{
    return impl_->opt.path;
}
size_t ControlServer::clients() const
{
    return impl_->conns.size();
}
const ControlCounters &ControlServer::counters() const
{
    return impl_->counters;
}

Result<ControlServer> ControlServer::listen(ControlHandler &handler, const std::string &path)
{
    Options o;
    o.path = path;
    return listen(handler, std::move(o));
}

Result<ControlServer> ControlServer::listen(ControlHandler &handler, Options options)
{
    const std::string path = options.path;
    auto addr = unix_address(path);
    if (!addr)
        return addr.error();
    std::string dir = parent_dir(path);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
        return make_error(sys_error("cannot create directory", dir), errno);
    if (auto claimed = claim_path(path, *addr); !claimed)
        return claimed.error();

    auto impl = std::make_unique<Impl>();
    impl->handler = &handler;
    impl->opt = std::move(options);
    impl->listen_fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (impl->listen_fd < 0)
        return make_error(sys_error("cannot create a socket for", path), errno);
    // Until listen(), connecting fails with ECONNREFUSED: nobody can get in before the mode
    // is 0600, whatever the umask and the directory's mode.
    if (::bind(impl->listen_fd, reinterpret_cast<const sockaddr *>(&*addr), sizeof(*addr)) != 0) {
        int err = errno;
        ::close(impl->listen_fd);
        impl->listen_fd = -1;
        errno = err;
        return make_error(sys_error("cannot bind", path), err);
    }
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0)
        return make_error(sys_error("cannot stat", path), errno);
    impl->dev = st.st_dev;  // from here on, ~Impl removes the file
    impl->ino = st.st_ino;
    if (::chmod(path.c_str(), 0600) != 0)
        return make_error(sys_error("cannot set the mode of", path), errno);
    if (::listen(impl->listen_fd, 16) != 0)
        return make_error(sys_error("cannot listen on", path), errno);
    return ControlServer(std::move(impl));
}

void ControlServer::Impl::accept_clients()
{
    while (conns.size() < opt.max_clients) {
        int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return;  // EAGAIN, or out of descriptors: try again on the next poll
        }
        auto c = std::make_unique<Conn>();
        c->fd = fd;
        c->deadline = Clock::now() + idle();
        conns.push_back(std::move(c));
        counters.connections++;
    }
}

// One read per poll: a client sending a lot cannot keep the others waiting.
void ControlServer::Impl::read_from(Conn &c)
{
    char chunk[kChunk];
    ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), 0);
    if (n < 0) {
        if (errno != EAGAIN && errno != EINTR)
            drop(c);
        return;
    }
    if (n == 0) {
        c.peer_done = true;
        return;
    }
    append_wiped(c.in, {chunk, size_t(n)});
    OPENSSL_cleanse(chunk, size_t(n));
}

void ControlServer::Impl::answer_lines(Conn &c)
{
    while (!c.closing) {
        size_t nl = c.in.find('\n');
        if (nl == std::string::npos && c.peer_done && !c.in.empty())
            nl = c.in.size();  // a last request without its newline
        if (nl == std::string::npos ? c.in.size() > opt.max_request : nl > opt.max_request) {
            append_wiped(c.out, too_large(opt.max_request));
            wipe(c.in);
            c.closing = true;
            counters.requests++;
            counters.errors++;
            counters.dropped++;
            return;
        }
        if (nl == std::string::npos)
            return;
        std::string_view line(c.in.data(), nl);
        if (!line.empty() && line.back() == '\r')
            line.remove_suffix(1);
        if (line.find_first_not_of(" \t") != std::string_view::npos) {
            bool ok = false;
            std::string a = answer_request(*handler, line, &ok);
            counters.requests++;
            counters.errors += ok ? 0 : 1;
            append_wiped(c.out, a);
            wipe(a);
        }
        consume_front(c.in, std::min(nl + 1, c.in.size()));
        c.deadline = Clock::now() + idle();
    }
}

void ControlServer::Impl::write_to(Conn &c)
{
    while (c.sent < c.out.size()) {
        ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN)
                drop(c);
            return;
        }
        c.sent += size_t(n);
        c.deadline = Clock::now() + idle();
    }
    wipe(c.out);
    c.sent = 0;
    if (c.closing || (c.peer_done && c.in.empty()))
        c.dead = true;
}

Result<void> ControlServer::poll_once(int timeout_ms)
{
    Impl &s = *impl_;
    auto now = Clock::now();
    for (const auto &c : s.conns) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(c->deadline - now).count();
        left = std::max<decltype(left)>(left, 0);
        if (timeout_ms < 0 || left < timeout_ms)
            timeout_ms = int(left);
    }
    std::vector<pollfd> fds;
    fds.push_back({s.conns.size() < s.opt.max_clients ? s.listen_fd : -1, POLLIN, 0});
    for (const auto &c : s.conns) {
        bool sending = c->sent < c->out.size();
        // Nothing more is read from a client until it has taken its answers.
        short events = sending ? POLLOUT : c->peer_done || c->closing ? 0 : POLLIN;
        fds.push_back({c->fd, events, 0});
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0) {
        if (errno == EINTR)
            return {};
        return make_error(sys_error("cannot poll", s.opt.path), errno);
    }
    size_t existing = s.conns.size();
    for (size_t i = 0; i < existing; i++) {
        Conn &c = *s.conns[i];
        short re = fds[i + 1].revents;
        if (re & POLLIN)
            s.read_from(c);
        else if (re & (POLLHUP | POLLERR) && !(re & POLLOUT))
            c.peer_done = true;
        if (!c.dead)
            s.answer_lines(c);
        if (!c.dead)
            s.write_to(c);
        if (!c.dead && Clock::now() >= c.deadline)
            s.drop(c);
    }
    if (fds[0].revents & POLLIN)
        s.accept_clients();
    std::erase_if(s.conns, [](const auto &c) { return c->dead; });
    return {};
}

}  // namespace xesp
