// The `xesp` command's side of the control socket (control.h).
#include "userspace/control/control.h"

#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>

#include "userspace/control/control_text.h"
#include "userspace/base/sys_util.h"

namespace xesp {

using namespace control_text;
using nlohmann::json;

void ControlResponse::wipe()
{
    control_text::wipe(output);
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
{}

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
            // The daemon stops reading a request it refuses (too large) and closes after
            // saying why: its answer is the better error.
            if (err == EPIPE || err == ECONNRESET)
                if (auto a = read_line(); a) {
                    auto parsed = parse_message(*a);
                    wipe(*a);
                    json j = parsed ? std::move(*parsed) : json();
                    bool said = j.is_object() && j.contains("error") && j["error"].is_string();
                    std::string why = said ? j["error"].get<std::string>() : std::string();
                    wipe_json(j);
                    if (said)
                        return make_error(why, err);
                }
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
    auto parsed = parse_message(*answer_text);
    wipe(*answer_text);
    json j = parsed ? std::move(*parsed) : json();
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

}  // namespace xesp
