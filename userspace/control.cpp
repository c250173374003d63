#include "userspace/control.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "userspace/sys_util.h"

namespace xesp {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr size_t kChunk = 64 * 1024;
constexpr size_t kMaxAnswer = size_t(64) << 20;     // the client's bound on one answer line

// ---- Buffers that may hold keys -----------------------------------------------------------

void wipe(std::string &s)
{
    OPENSSL_cleanse(s.data(), s.size());
    s.clear();
}

// Appends, and when the string must grow, moves it to a larger one by hand so that the old
// storage is wiped instead of freed with the bytes still in it.
void append_wiped(std::string &buf, std::string_view more)
{
    if (buf.size() + more.size() > buf.capacity()) {
        std::string bigger;
        bigger.reserve(std::max(buf.capacity() * 2, buf.size() + more.size()));
        bigger.append(buf);
        wipe(buf);
        buf.swap(bigger);
    }
    buf.append(more);
}

// Drops the first n bytes; the bytes freed at the end are wiped.
void consume_front(std::string &buf, size_t n)
{
    size_t rest = buf.size() - n;
    std::memmove(buf.data(), buf.data() + n, rest);
    OPENSSL_cleanse(buf.data() + rest, n);
    buf.resize(rest);
}

// Wipes every string inside a parsed request.
void wipe_json(json &j)
{
    if (j.is_string()) {
        wipe(j.get_ref<std::string &>());
    } else if (j.is_structured()) {
        for (auto &item : j)
            wipe_json(item);
    }
}

// ---- JSON text, written by hand into buffers that are wiped ------------------------------

void append_json_string(std::string &out, std::string_view s)
{
    static const char hex[] = "0123456789abcdef";
    append_wiped(out, "\"");
    for (char c : s) {
        auto u = static_cast<unsigned char>(c);
        if (c == '"' || c == '\\') {
            const char esc[2] = {'\\', c};
            append_wiped(out, {esc, 2});
        } else if (u < 0x20) {
            const char esc[6] = {'\\', 'u', '0', '0', hex[u >> 4], hex[u & 15]};
            append_wiped(out, {esc, 6});
        } else {
            append_wiped(out, {&c, 1});
        }
    }
    append_wiped(out, "\"");
}

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

// Where s stops being UTF-8 (JSON text must be: RFC 3629, no surrogates, no overlong forms),
// or npos.
size_t invalid_utf8_at(std::string_view s)
{
    auto byte = [&](size_t i) -> unsigned {
        return i < s.size() ? static_cast<unsigned char>(s[i]) : 0u;
    };
    size_t i = 0;
    while (i < s.size()) {
        unsigned c = byte(i);
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n = 0;               // continuation bytes
        unsigned lo = 0x80, hi = 0xbf;  // the range of the first one
        if (c >= 0xc2 && c <= 0xdf)
            n = 1;
        else if (c >= 0xe0 && c <= 0xef)
            n = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
        else if (c >= 0xf0 && c <= 0xf4)
            n = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
        else
            return i;
        if (byte(i + 1) < lo || byte(i + 1) > hi)
            return i;
        for (size_t k = 2; k <= n; k++)
            if ((byte(i + k) & 0xc0) != 0x80)
                return i;
        i += n + 1;
    }
    return std::string_view::npos;
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

Result<std::string> serve_batch(ControlHandler &h, json &req)
{
    auto text = req.find("text");
    if (text == req.end() || !text->is_string())
        return make_error("invalid request: \"batch\" needs \"text\", a string");
    std::string name = "<request>";
    if (auto n = req.find("name"); n != req.end()) {
        if (!n->is_string())
            return make_error("invalid request: \"name\" must be a string");
        name = n->get<std::string>();
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
    return make_error("invalid request: unknown cmd '" + name.substr(0, 32) +
                      "'; expected ping, command, batch, iface or stats");
}

// The answer line for one request line; *ok tells which kind it is.
std::string answer(ControlHandler &h, std::string_view line, bool *ok)
{
    json req = json::parse(line, nullptr, false);
    Result<std::string> out = req.is_discarded()
                                  ? Result<std::string>(make_error("invalid request: not JSON"))
                                  : serve(h, req);
    wipe_json(req);
    *ok = out.ok();
    std::string text = answer_line(out);
    if (out)
        wipe(*out);
    return text;
}

// ---- Sockets ------------------------------------------------------------------------------

Result<sockaddr_un> unix_address(const std::string &path)
{
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.empty() || path.size() >= sizeof(addr.sun_path))
        return make_error("control socket path '" + path + "' is empty or longer than " +
                          std::to_string(sizeof(addr.sun_path) - 1) + " bytes", ENAMETOOLONG);
    std::memcpy(addr.sun_path, path.data(), path.size());
    return addr;
}

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

} // namespace

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
        for (const auto &s : cfg.sas)
            add(format_sa(s, show_keys));
    } else if (cmd.verb == V::List) {
        for (const auto &p : cfg.policies)
            add(format_policy(p));
    }
    return out;
}

Result<std::string> ConfigHandler::command(const Command &cmd, bool show_keys)
{
    if (!is_mutating(cmd.verb)) {
        Config view = config_;          // get checks that the entry exists; list changes nothing
        auto checked = view.apply(cmd);
        if (!checked)
            return checked.error();
        return command_output(cmd, config_, show_keys);
    }
    Config next = config_;
    auto applied = next.apply(cmd);
    if (!applied)
        return applied.error();
    auto committed = commit(std::move(next));
    if (!committed)
        return committed.error();
    return std::string();
}

Result<void> ConfigHandler::batch(std::string_view text, std::string_view name, bool check_only)
{
    auto next = load_batch(text, name, config_);
    if (!next)
        return next.error();
    if (check_only)
        return {};
    return commit(std::move(*next));
}

std::string ConfigHandler::stats_json()
{
    return json{{"sas", config_.sas.size()}, {"policies", config_.policies.size()}}.dump();
}

Result<void> ConfigHandler::commit(Config next)
{
    config_ = std::move(next);
    return {};
}

// ---- ControlServer ------------------------------------------------------------------------

namespace {

struct Conn {
    int fd = -1;
    std::string in;                 // received, not yet answered
    std::string out;                // answers not yet sent
    size_t sent = 0;                // bytes of out already sent
    Clock::time_point deadline;     // dropped if no request arrives and nothing is sent by then
    bool peer_done = false;         // the client shut down its side
    bool closing = false;           // close once out is sent
    bool dead = false;

    ~Conn()
    {
        wipe(in);
        wipe(out);
        if (fd >= 0)
            ::close(fd);
    }
};

} // namespace

struct ControlServer::Impl {
    ControlHandler *handler = nullptr;
    Options opt;
    int listen_fd = -1;
    dev_t dev = 0;                  // the socket file we bound, removed only if still the same
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

ControlServer::ControlServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ControlServer::ControlServer(ControlServer &&) noexcept = default;
ControlServer &ControlServer::operator=(ControlServer &&) noexcept = default;
ControlServer::~ControlServer() = default;

const std::string &ControlServer::path() const { return impl_->opt.path; }
size_t ControlServer::clients() const { return impl_->conns.size(); }
const ControlCounters &ControlServer::counters() const { return impl_->counters; }

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
    impl->dev = st.st_dev;          // from here on, ~Impl removes the file
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
            return;     // EAGAIN, or out of descriptors: try again on the next poll
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
            nl = c.in.size();           // a last request without its newline
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
            std::string a = answer(*handler, line, &ok);
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

// ---- ControlClient ------------------------------------------------------------------------

void ControlResponse::wipe()
{
    xesp::wipe(output);
}

Result<ControlClient> ControlClient::connect(const std::string &path, int timeout_ms)
{
    auto addr = unix_address(path);
    if (!addr)
        return addr.error();
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return make_error(sys_error("cannot create a socket for", path), errno);
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (::connect(fd, reinterpret_cast<const sockaddr *>(&*addr), sizeof(*addr)) != 0) {
        int err = errno;
        ::close(fd);
        errno = err;
        return make_error(sys_error("cannot connect to the xesp daemon at", path), err);
    }
    return ControlClient(fd, timeout_ms);
}

ControlClient::ControlClient(ControlClient &&o) noexcept
    : fd_(std::exchange(o.fd_, -1)), timeout_ms_(o.timeout_ms_), in_(std::move(o.in_))
{
}

ControlClient &ControlClient::operator=(ControlClient &&o) noexcept
{
    if (this != &o) {
        if (fd_ >= 0)
            ::close(fd_);
        wipe(in_);
        fd_ = std::exchange(o.fd_, -1);
        timeout_ms_ = o.timeout_ms_;
        in_ = std::move(o.in_);
    }
    return *this;
}

ControlClient::~ControlClient()
{
    wipe(in_);
    if (fd_ >= 0)
        ::close(fd_);
}

Result<ControlResponse> ControlClient::ping()
{
    return exchange(R"({"cmd":"ping"})");
}

Result<ControlResponse> ControlClient::stats()
{
    return exchange(R"({"cmd":"stats"})");
}

Result<ControlResponse> ControlClient::iface(const std::vector<std::string> &words)
{
    json req = {{"cmd", "iface"}, {"words", words}};
    return exchange(req.dump());
}

Result<ControlResponse> ControlClient::command(const std::vector<std::string> &words,
                                              bool show_keys)
{
    std::string req;
    req.reserve(256);
    append_wiped(req, "{\"cmd\":\"command\",\"show_keys\":");
    append_wiped(req, show_keys ? "true" : "false");
    append_wiped(req, ",\"words\":[");
    for (size_t i = 0; i < words.size(); i++) {
        if (invalid_utf8_at(words[i]) != std::string_view::npos)
            return make_error("word " + std::to_string(i + 1) + " is not UTF-8 text", EINVAL);
        if (i)
            append_wiped(req, ",");
        append_json_string(req, words[i]);
    }
    append_wiped(req, "]}");
    auto r = exchange(req);
    wipe(req);
    return r;
}

Result<ControlResponse> ControlClient::batch(std::string_view text, std::string_view name,
                                            bool check_only)
{
    if (size_t bad = invalid_utf8_at(text); bad != std::string_view::npos) {
        size_t line = 1 + size_t(std::count(text.begin(), text.begin() + ptrdiff_t(bad), '\n'));
        return make_error(std::string(name) + ":" + std::to_string(line) +
                              ": not UTF-8 text, which the daemon takes only",
                          EINVAL);
    }
    std::string req;
    req.reserve(text.size() + text.size() / 8 + name.size() + 64);
    append_wiped(req, "{\"cmd\":\"batch\",\"check\":");
    append_wiped(req, check_only ? "true" : "false");
    append_wiped(req, ",\"name\":");
    append_json_string(req, name);
    append_wiped(req, ",\"text\":");
    append_json_string(req, text);
    append_wiped(req, "}");
    auto r = exchange(req);
    wipe(req);
    return r;
}

Result<ControlResponse> ControlClient::exchange(std::string_view line)
{
    std::string buf;
    buf.reserve(line.size() + 1);
    buf.append(line);
    buf.push_back('\n');
    size_t done = 0;
    while (done < buf.size()) {
        ssize_t n = ::send(fd_, buf.data() + done, buf.size() - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            wipe(buf);
            return make_error(std::string("cannot send to the xesp daemon: ") +
                                  (err == EAGAIN ? "timed out" : std::strerror(err)),
                              err);
        }
        done += size_t(n);
    }
    wipe(buf);
    auto answer_text = read_line();
    if (!answer_text)
        return answer_text.error();
    json j = json::parse(*answer_text, nullptr, false);
    wipe(*answer_text);
    ControlResponse r;
    bool valid = j.is_object() && j.contains("ok") && j["ok"].is_boolean();
    if (valid) {
        r.ok = j["ok"].get<bool>();
        if (auto e = j.find("error"); e != j.end() && e->is_string())
            r.error = e->get<std::string>();
        if (auto o = j.find("output"); o != j.end() && o->is_string())
            r.output = o->get<std::string>();
    }
    wipe_json(j);
    if (!valid)
        return make_error("the xesp daemon sent an answer that is not one", EPROTO);
    if (!r.ok && r.error.empty())
        r.error = "the xesp daemon refused the request without saying why";
    return r;
}

Result<std::string> ControlClient::read_line()
{
    size_t scanned = 0;
    for (;;) {
        size_t nl = in_.find('\n', scanned);
        if (nl != std::string::npos) {
            std::string line(in_.data(), nl);
            consume_front(in_, nl + 1);
            return line;
        }
        scanned = in_.size();
        if (in_.size() > kMaxAnswer)
            return make_error("the xesp daemon's answer is too large", EMSGSIZE);
        char chunk[kChunk];
        ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int err = errno;
            return make_error(std::string("no answer from the xesp daemon: ") +
                                  (err == EAGAIN ? "timed out" : std::strerror(err)),
                              err);
        }
        if (n == 0)
            return make_error("the xesp daemon closed the connection without answering",
                              ECONNRESET);
        append_wiped(in_, {chunk, size_t(n)});
        OPENSSL_cleanse(chunk, size_t(n));
    }
}

} // namespace xesp
