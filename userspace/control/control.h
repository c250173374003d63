// The control channel between `xesp daemon` and the `xesp` command: a root-only Unix stream
// socket (default /run/xesp/xesp.sock) that carries `ip xfrm` commands and batches to the
// daemon, which applies them all or nothing and answers with what the command prints.
//
// Protocol. A connection carries any number of requests, one after the other. A request is one
// line: a JSON object followed by '\n'. The server answers each with one line, in order.
//
//   {"cmd": "ping"}
//   {"cmd": "command", "words": ["sa", "add", "src", ...], "show_keys": false}
//       one command in the words of parse_command; "output" is what `xesp sa|policy ...`
//       prints (the entry for get, the entries for list, nothing for the others)
//   {"cmd": "batch", "text": "sa add ...\npolicy add ...\n", "name": "FILE", "check": false}
//       the text of a batch file, applied all or nothing (check: only checked); errors are
//       "FILE:LINE: message" as from load_batch
//   {"cmd": "stats"}
//       "output" is the handler's statistics, itself a JSON object
//   {"cmd": "iface", "words": ["add", "eth0", "role", "public"]}
//       the words after `xesp iface` (add, del, list); "output" is what the command prints
//
//   answer: {"ok": true, "output": "..."}  or  {"ok": false, "error": "one-line message"}
//
// Unknown fields are ignored; a missing "show_keys"/"check" is false. A line that is not such
// an object is answered with an error and the connection stays usable. A request line longer
// than ControlServer::Options::max_request (32 MiB) is answered with an error and the
// connection is closed, since the rest of the line cannot be told from the next request.
//
// The server never blocks on a client: sockets are non-blocking, a client holds a slot only
// while it makes progress (Options::idle_timeout_ms), and the number of clients is bounded.
// Requests and answers carry keys, so every buffer that held one is wiped (OPENSSL_cleanse)
// once it has been used.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "userspace/config/config.h"
#include "userspace/base/result.h"
#include "userspace/config/xfrm_grammar.h"

namespace xesp {

inline constexpr const char *kDefaultControlSocket = "/run/xesp/xesp.sock";

// What the daemon does with the requests. Called from ControlServer::poll_once, on the thread
// that polls; a request is answered only when the call returns.
class ControlHandler {
public:
    virtual ~ControlHandler() = default;
    // Runs one parsed command; returns what it prints (lines ending in '\n'), or an error
    // naming the command, e.g. "sa add: SA dst ... already exists; ...". On error nothing
    // changes.
    virtual Result<std::string> command(const Command &cmd, bool show_keys) = 0;
    // Applies the text of a batch all or nothing; with check_only changes nothing.
    // Errors are "NAME:LINE: message".
    virtual Result<void> batch(std::string_view text, std::string_view name, bool check_only) = 0;
    // A JSON object.
    virtual std::string stats_json() = 0;
    // `xesp iface ...` (the words after "iface"); only a gateway has interfaces.
    virtual Result<std::string> iface(const std::vector<std::string> &words)
    {
        (void)words;
        return make_error("iface: this server runs no data path");
    }
};

// A ControlHandler over a Config. Each change is made on a copy, which commit() then installs:
// a daemon overrides commit() to push the new configuration into the data path first, and
// refuses it (changing nothing) when that fails.
class ConfigHandler : public ControlHandler {
public:
    explicit ConfigHandler(Config initial = {}) : config_(std::move(initial)) {}

    Result<std::string> command(const Command &cmd, bool show_keys) override;
    Result<void> batch(std::string_view text, std::string_view name, bool check_only) override;
    std::string stats_json() override;  // {"sas": N, "policies": N}

    const Config &config() const { return config_; }

protected:
    // Makes `change` (checked against config()); the base applies it to config().
    virtual Result<void> commit(const ConfigChange &change);
    // Each command of a batch, before commit(), beyond what the grammar checks: what it refuses
    // is refused with the batch's NAME:LINE, by `batch --check` too. The base takes all.
    virtual Result<void> check(const Command &) const { return {}; }

private:
    Config config_;
};

// What `xesp sa|policy ...` prints after cmd was applied to cfg: the entry for get, all the
// entries of its kind for list, nothing otherwise. Keys are hidden unless show_keys.
std::string command_output(const Command &cmd, const Config &cfg, bool show_keys);

// The answer line ('\n' included) to one request line (without its '\n'), as the server sends
// it; *ok tells whether it says "ok": true. The line holds keys when the answer does.
std::string answer_request(ControlHandler &h, std::string_view line, bool *ok);

struct ControlCounters {
    uint64_t connections = 0;  // accepted
    uint64_t requests = 0;     // answered, successfully or not
    uint64_t errors = 0;       // answered with ok: false
    uint64_t dropped = 0;      // closed for a request too large, a timeout or an I/O error
};

class ControlServer {
public:
    struct Options {
        std::string path = kDefaultControlSocket;
        size_t max_request = size_t(32) << 20;  // bytes in one request line (a batch)
        int idle_timeout_ms = 10000;            // a client making no progress is dropped
        size_t max_clients = 16;                // more wait in the listen backlog
    };

    // Creates the socket's directory (0700) when missing, refuses to start when a live server
    // answers on the path, replaces a stale socket file, and binds a socket file of mode 0600.
    static Result<ControlServer> listen(ControlHandler &handler, Options options);
    static Result<ControlServer> listen(ControlHandler &handler, const std::string &path);

    ControlServer(ControlServer &&) noexcept;
    ControlServer &operator=(ControlServer &&) noexcept;
    ~ControlServer();  // closes the clients and removes the socket file if it is still ours

    // Waits up to timeout_ms (0: does not wait, -1: until something happens) for clients,
    // then accepts, reads, answers and writes as far as that goes without blocking.
    Result<void> poll_once(int timeout_ms);

    const std::string &path() const;
    size_t clients() const;
    const ControlCounters &counters() const;

private:
    struct Impl;
    explicit ControlServer(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

struct ControlResponse {
    bool ok = false;
    std::string error;
    std::string output;

    void wipe();  // output may hold keys
};

class ControlClient {
public:
    // Fails with the errno of connect(2): ENOENT or ECONNREFUSED mean that no server runs.
    static Result<ControlClient> connect(const std::string &path, int timeout_ms = 30000);

    ControlClient(ControlClient &&o) noexcept;
    ControlClient &operator=(ControlClient &&o) noexcept;
    ~ControlClient();

    Result<ControlResponse> ping();
    Result<ControlResponse> command(const std::vector<std::string> &words, bool show_keys);
    Result<ControlResponse> batch(std::string_view text, std::string_view name, bool check_only);
    Result<ControlResponse> stats();
    Result<ControlResponse> iface(const std::vector<std::string> &words);

    // Sends one request line as it is ('\n' is added) and reads the answer line.
    Result<ControlResponse> exchange(std::string_view line);

private:
    ControlClient(int fd, int timeout_ms) : fd_(fd), timeout_ms_(timeout_ms) {}
    Result<std::string> read_line();

    int fd_ = -1;
    int timeout_ms_ = 0;
    std::string in_;  // bytes received after the last answer line
};

}  // namespace xesp
