// The control channel: a ControlServer over a ConfigHandler on a temporary socket, driven by a
// ControlClient on another thread while this one polls the server.
#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "userspace/control/control.h"
#include "userspace/control/control_text.h"

using namespace xesp;

namespace {

const std::string kKeyHex = "5ec2e7c0ffee5ec2e7c0ffee5ec2e7c0a1b2c3d4";
const std::vector<std::string> kAddSa = {
    "sa",  "add",    "src",  "192.0.2.1", "dst",  "192.0.2.2",         "proto",        "esp",
    "spi", "0x1000", "mode", "tunnel",    "aead", "rfc4106(gcm(aes))", "0x" + kKeyHex, "128"};

// A fresh directory per test, removed with everything in it.
struct TempDir {
    std::string path;
    TempDir()
    {
        std::string tmpl = "/tmp/xesp-ctl.XXXXXX";
        REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
        path = tmpl;
    }
    ~TempDir() { std::filesystem::remove_all(path); }
    std::string sock() const { return path + "/run/xesp.sock"; }
};

// Runs client on a thread and polls the server until it returns.
void with_client(ControlServer &server, const std::function<void()> &client)
{
    std::atomic<bool> done{false};
    std::thread t([&] {
        client();
        done = true;
    });
    while (!done) {
        auto polled = server.poll_once(10);
        REQUIRE(polled.ok());
    }
    t.join();
}

ControlResponse ask(ControlServer &server,
                    const std::function<Result<ControlResponse>(ControlClient &)> &request)
{
    ControlResponse r;
    std::string failure;
    with_client(server, [&] {
        auto c = ControlClient::connect(server.path(), 5000);
        if (!c) {
            failure = c.error().message;
            return;
        }
        auto got = request(*c);
        if (got)
            r = std::move(*got);
        else
            failure = got.error().message;
    });
    INFO(failure);
    REQUIRE(failure.empty());
    return r;
}

ControlResponse command(ControlServer &s, const std::vector<std::string> &words,
                        bool show_keys = false)
{
    return ask(s, [&](ControlClient &c) { return c.command(words, show_keys); });
}

// Sends raw bytes and reads what comes back until the server closes or answers one line.
std::string raw_exchange(ControlServer &server, const std::string &bytes, bool want_close)
{
    std::string got;
    with_client(server, [&] {
        int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un addr{};
        addr.sun_family = AF_UNIX;
        std::strcpy(addr.sun_path, server.path().c_str());
        if (::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) != 0) {
            ::close(fd);
            return;
        }
        timeval tv{5, 0};
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        size_t done = 0;
        while (done < bytes.size()) {
            ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
            if (n <= 0)
                break;  // the server may close on us once it has seen enough
            done += size_t(n);
        }
        char buf[4096];
        for (;;) {
            ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
            if (n <= 0)
                break;
            got.append(buf, size_t(n));
            if (!want_close && got.find('\n') != std::string::npos)
                break;
        }
        ::close(fd);
    });
    return got;
}

// Polls until the server has noticed that its clients went away.
size_t clients_after_settling(ControlServer &server)
{
    for (int i = 0; i < 50 && server.clients() > 0; i++)
        REQUIRE(server.poll_once(10).ok());
    return server.clients();
}

size_t count_lines(const std::string &s)
{
    return size_t(std::count(s.begin(), s.end(), '\n'));
}

}  // namespace

TEST_CASE("control: the socket is private and answers ping", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    INFO((server ? std::string() : server.error().message));
    REQUIRE(server.ok());
    struct stat st;
    REQUIRE(::stat(dir.sock().c_str(), &st) == 0);
    CHECK(S_ISSOCK(st.st_mode));
    CHECK((st.st_mode & 0777) == 0600);
    REQUIRE(::stat((dir.path + "/run").c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0700);

    auto r = ask(*server, [](ControlClient &c) { return c.ping(); });
    CHECK(r.ok);
    CHECK(r.output.empty());
}

TEST_CASE("control: sa add, list with and without keys, get, duplicates", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());

    auto added = command(*server, kAddSa);
    INFO(added.error);
    REQUIRE(added.ok);
    CHECK(added.output.empty());
    REQUIRE(handler.config().sas.size() == 1);
    CHECK(handler.config().sas.nth(0).spi == 0x1000);

    auto hidden = command(*server, {"sa", "list"});
    REQUIRE(hidden.ok);
    CHECK(count_lines(hidden.output) == 1);
    CHECK(hidden.output.find("spi 0x") != std::string::npos);
    CHECK(hidden.output.find(kKeyHex) == std::string::npos);
    CHECK(hidden.output.find(std::string(kHiddenKey)) != std::string::npos);

    auto shown = command(*server, {"sa", "list"}, true);
    REQUIRE(shown.ok);
    CHECK(shown.output.find(kKeyHex) != std::string::npos);

    auto get = command(*server, {"sa", "get", "dst", "192.0.2.2", "spi", "0x1000"});
    REQUIRE(get.ok);
    CHECK(get.output == hidden.output);

    auto dup = command(*server, kAddSa);
    CHECK_FALSE(dup.ok);
    CHECK(dup.error.find("already exists") != std::string::npos);
    CHECK(dup.error.find(kKeyHex) == std::string::npos);
    CHECK(handler.config().sas.size() == 1);

    auto missing = command(*server, {"sa", "get", "dst", "192.0.2.2", "spi", "0x2000"});
    CHECK_FALSE(missing.ok);
    CHECK(missing.error.find("sa get: no SA") != std::string::npos);

    auto bad = command(*server, {"sa", "add", "src", "192.0.2.1", "dst", "192.0.2.2", "proto",
                                 "esp", "spi", "7", "aead", "gcm(aes)", "0x" + kKeyHex, "128"});
    CHECK_FALSE(bad.ok);
    CHECK(bad.error.find("rfc4106(gcm(aes))") != std::string::npos);
    CHECK(bad.error.find(kKeyHex) == std::string::npos);

    auto del = command(*server, {"sa", "del", "dst", "192.0.2.2", "spi", "0x1000"});
    CHECK(del.ok);
    CHECK(handler.config().sas.empty());
}

TEST_CASE("control: a batch applies all or nothing", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());
    REQUIRE(command(*server, kAddSa).ok);
    Config before = handler.config();

    const std::string good = "# a comment\n"
                             "sa add src 192.0.2.2 dst 192.0.2.1 proto esp spi 0x2000 mode tunnel "
                             "aead 'rfc4106(gcm(aes))' 0x" +
                             kKeyHex +
                             " 128\n"
                             "policy add src 10.2.0.0/16 dst 10.1.0.0/16 dir fwd "
                             "tmpl src 192.0.2.2 dst 192.0.2.1 proto esp mode tunnel\n";
    const std::string bad_line = "sa add src 192.0.2.2 dst 192.0.2.1 proto esp spi 0x2001 "
                                 "mode tunnel aead 'rfc4106(gcm(aes))' 0x1234 128\n";

    auto bad =
        ask(*server, [&](ControlClient &c) { return c.batch(good + bad_line, "b.conf", false); });
    CHECK_FALSE(bad.ok);
    CHECK(bad.error.rfind("b.conf:4: ", 0) == 0);
    CHECK(bad.error.find('\n') == std::string::npos);
    CHECK(handler.config() == before);

    auto dup =
        ask(*server, [&](ControlClient &c) { return c.batch(good + good, "d.conf", false); });
    CHECK_FALSE(dup.ok);
    CHECK(dup.error.rfind("d.conf:5: ", 0) == 0);  // the second "sa add" of 0x2000
    CHECK(handler.config() == before);

    auto check = ask(*server, [&](ControlClient &c) { return c.batch(good, "g.conf", true); });
    CHECK(check.ok);
    CHECK(handler.config() == before);

    auto applied = ask(*server, [&](ControlClient &c) { return c.batch(good, "g.conf", false); });
    INFO(applied.error);
    CHECK(applied.ok);
    CHECK(handler.config().sas.size() == 2);
    CHECK(handler.config().policies.size() == 1);

    auto policies = command(*server, {"policy", "list"});
    CHECK(policies.output.find("10.2.0.0/16") != std::string::npos);
}

TEST_CASE("control: stats is JSON", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());
    REQUIRE(command(*server, kAddSa).ok);
    auto r = ask(*server, [](ControlClient &c) { return c.stats(); });
    REQUIRE(r.ok);
    auto j = nlohmann::json::parse(r.output, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(j["sas"] == 1);
    CHECK(j["policies"] == 0);
    CHECK(server->counters().requests >= 2);
}

TEST_CASE("control: one server per socket; a stale socket is replaced", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    {
        auto first = ControlServer::listen(handler, dir.sock());
        REQUIRE(first.ok());
        auto second = ControlServer::listen(handler, dir.sock());
        REQUIRE_FALSE(second.ok());
        CHECK(second.error().message.find("already listening") != std::string::npos);
        // The refused server left the first one's socket alone.
        CHECK(ask(*first, [](ControlClient &c) { return c.ping(); }).ok);
    }
    struct stat st;
    CHECK(::stat(dir.sock().c_str(), &st) != 0);  // removed on shutdown

    // A socket file nobody listens on, as a crashed daemon leaves it.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, dir.sock().c_str());
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
    ::close(fd);
    REQUIRE(::stat(dir.sock().c_str(), &st) == 0);

    auto server = ControlServer::listen(handler, dir.sock());
    INFO((server ? std::string() : server.error().message));
    REQUIRE(server.ok());
    CHECK(ask(*server, [](ControlClient &c) { return c.ping(); }).ok);

    auto no_daemon = ControlClient::connect(dir.path + "/none.sock");
    REQUIRE_FALSE(no_daemon.ok());
    CHECK(no_daemon.error().code.value() == ENOENT);
}

TEST_CASE("control: a file that is not a socket is left alone", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    std::string path = dir.path + "/plain";
    REQUIRE(std::system(("touch " + path).c_str()) == 0);
    auto server = ControlServer::listen(handler, path);
    REQUIRE_FALSE(server.ok());
    CHECK(server.error().message.find("not a socket") != std::string::npos);
    struct stat st;
    CHECK(::stat(path.c_str(), &st) == 0);
}

TEST_CASE("control: garbage gets an error and the server keeps serving", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());

    const std::vector<std::pair<std::string, std::string>> cases = {
        {"this is not json", "not JSON"},
        {"[1, 2, 3]", "expected a JSON object"},
        {R"({"text": "x"})", "\"cmd\" is missing"},
        {R"({"cmd": "reboot"})", "unknown cmd 'reboot'"},
        {R"({"cmd": "command", "words": "sa list"})", "array of strings"},
        {R"({"cmd": "command", "words": ["sa", 7]})", "array of strings"},
        {R"({"cmd": "command", "words": ["sa", "list"], "show_keys": "yes"})", "true or false"},
        {R"({"cmd": "command", "words": ["sa", "frobnicate"]})", "frobnicate"},
        {R"({"cmd": "batch"})", "needs \"text\""},
    };
    for (const auto &[line, expect] : cases) {
        INFO(line);
        auto r = ask(*server, [&](ControlClient &c) { return c.exchange(line); });
        CHECK_FALSE(r.ok);
        CHECK(r.error.find(expect) != std::string::npos);
    }

    // Several requests on one connection, garbage among them, answered in order.
    std::string answers =
        raw_exchange(*server, "{\"cmd\":\"ping\"}\n\x01\x02garbage\n\n{\"cmd\":\"stats\"}\n", true);
    REQUIRE(count_lines(answers) == 3);
    auto first = nlohmann::json::parse(answers.substr(0, answers.find('\n')));
    CHECK(first["ok"] == true);
    CHECK(answers.find("not JSON") != std::string::npos);
    CHECK(answers.find("\\\"sas\\\":0") != std::string::npos);

    CHECK(ask(*server, [](ControlClient &c) { return c.ping(); }).ok);
    CHECK(clients_after_settling(*server) == 0);
}

TEST_CASE("control: an oversized request is refused", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());

    // A batch of 10,000 configuration lines (some 1.5 MB) is one request: the default limit
    // leaves room for many times that.
    CHECK(ControlServer::Options{}.max_request >= size_t(16) << 20);
    ControlServer::Options opt;
    opt.path = dir.path + "/small.sock";
    opt.max_request = size_t(1) << 20;
    auto small = ControlServer::listen(handler, opt);
    REQUIRE(small.ok());

    std::string huge = R"({"cmd":"batch","name":"big","text":")" +
                       std::string((size_t(1) << 20) + 100, '#') + "\"}\n";
    std::string got = raw_exchange(*small, huge, true);
    CHECK(count_lines(got) == 1);
    CHECK(got.find("\"ok\":false") != std::string::npos);
    CHECK(got.find("request too large") != std::string::npos);

    // Through the client the daemon's reason is the error, not a broken pipe.
    std::string failure;
    with_client(*small, [&] {
        auto c = ControlClient::connect(small->path(), 5000);
        if (!c) {
            failure = c.error().message;
            return;
        }
        auto r = c->batch(std::string((size_t(2) << 20), ' '), "big", false);
        failure = r ? std::string("accepted") : r.error().message;
    });
    CHECK(failure.find("request too large") != std::string::npos);

    // Through the client, a batch of just under the limit still goes through.
    std::string text(1000 * 1000, ' ');
    text += "\n";
    auto r = ask(*small, [&](ControlClient &c) { return c.batch(text, "spaces", false); });
    CHECK(r.ok);
    CHECK(ask(*server, [](ControlClient &c) { return c.ping(); }).ok);
    CHECK(clients_after_settling(*server) == 0);
}

TEST_CASE("control: a client that stalls is dropped, others are served meanwhile", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    ControlServer::Options o;
    o.path = dir.sock();
    o.idle_timeout_ms = 300;
    auto server = ControlServer::listen(handler, o);
    REQUIRE(server.ok());

    // Half a request and then silence.
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, dir.sock().c_str());
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&addr), sizeof(addr)) == 0);
    REQUIRE(::send(fd, "{\"cmd\":", 7, 0) == 7);
    REQUIRE(server->poll_once(50).ok());
    REQUIRE(server->clients() == 1);

    CHECK(ask(*server, [](ControlClient &c) { return c.ping(); }).ok);

    for (int i = 0; i < 40 && server->clients() > 0; i++)
        REQUIRE(server->poll_once(50).ok());
    CHECK(server->clients() == 0);
    CHECK(server->counters().dropped == 1);
    char c;
    CHECK(::recv(fd, &c, 1, 0) == 0);  // closed on it
    ::close(fd);
}

TEST_CASE("control: a committing handler can refuse a change", "[control]")
{
    struct Refusing : ConfigHandler {
        Result<void> commit(const ConfigChange &) override
        {
            return make_error("data path: no room");
        }
    };
    TempDir dir;
    Refusing handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());
    auto r = command(*server, kAddSa);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "data path: no room");
    CHECK(handler.config().sas.empty());
}

TEST_CASE("control: a deeply nested request is refused and changes nothing", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());
    REQUIRE(command(*server, kAddSa).ok);

    // 100000 levels of arrays beside a flush that would otherwise run: well under the size
    // limit, and far deeper than any request has reason to be.
    const size_t depth = 100000;
    std::string line = R"({"cmd":"command","words":["sa","flush"],"x":)" + std::string(depth, '[') +
                       std::string(depth, ']') + "}";
    auto r = ask(*server, [&](ControlClient &c) { return c.exchange(line); });
    CHECK_FALSE(r.ok);
    CHECK(r.error.find("nested deeper than") != std::string::npos);
    CHECK(r.error.find('\n') == std::string::npos);
    CHECK(handler.config().sas.size() == 1);

    // Objects too, and the same request a little less deep is served.
    std::string objects = R"({"cmd":"ping","x":)";
    for (size_t i = 0; i < depth; i++)
        objects += R"({"a":)";
    objects += "1" + std::string(depth, '}') + "}";
    r = ask(*server, [&](ControlClient &c) { return c.exchange(objects); });
    CHECK_FALSE(r.ok);
    CHECK(r.error.find("nested deeper than") != std::string::npos);
    CHECK(ask(*server, [](ControlClient &c) {
              return c.exchange(R"({"cmd":"ping","x":[["a"]]})");
          }).ok);
    CHECK(ask(*server, [](ControlClient &c) { return c.ping(); }).ok);
}

TEST_CASE("control: text that is not UTF-8 goes out as U+FFFD", "[control]")
{
    // "\xc3" alone is half a character, "\xff" never is one; "\xc3\xa9" is whole.
    std::string out;
    control_text::append_json_string(out, "a\xc3\xa9 \xc3 \xff\n");
    CHECK(out == "\"a\xc3\xa9 \\ufffd \\ufffd\\u000a\"");
    auto j = nlohmann::json::parse(out, nullptr, false);
    REQUIRE(j.is_string());
    CHECK(j.get<std::string>() == "a\xc3\xa9 \xef\xbf\xbd \xef\xbf\xbd\n");
}

TEST_CASE("control: an error quoting the request is one line", "[control]")
{
    TempDir dir;
    ConfigHandler handler;
    auto server = ControlServer::listen(handler, dir.sock());
    REQUIRE(server.ok());

    std::string name = "a";
    for (int i = 0; i < 15; i++)
        name += "\xc3\xa9";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {R"({"cmd":"co block\n"})", "unknown cmd 'co block\\x0a'"},
        {R"({"cmd":")" + name + R"("})", "unknown cmd 'a\\xc3\\xa9"},
        {R"({"cmd":"batch","name":"gw\nconf","text":"sa frob\n"})", "gw\\x0aconf:1: "},
    };
    for (const auto &[line, expect] : cases) {
        INFO(line);
        auto r = ask(*server, [&](ControlClient &c) { return c.exchange(line); });
        CHECK_FALSE(r.ok);
        CHECK(r.error.find('\n') == std::string::npos);
        CHECK(r.error.find(expect) != std::string::npos);
        CHECK(control_text::invalid_utf8_at(r.error) == std::string_view::npos);
    }
}

TEST_CASE("control: wipe_json reaches strings at any depth without recursion", "[control]")
{
    nlohmann::json root = nlohmann::json::array();
    nlohmann::json *cur = &root;
    for (int i = 0; i < 100000; i++) {
        cur->push_back(nlohmann::json::object());
        cur = &cur->back();
        (*cur)["k"] = nlohmann::json::array();
        cur = &(*cur)["k"];
    }
    cur->push_back(kKeyHex);
    control_text::wipe_json(root);
    REQUIRE(cur->size() == 1);
    CHECK((*cur)[0].get_ref<const std::string &>().empty());
}
