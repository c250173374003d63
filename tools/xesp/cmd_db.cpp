// `xesp sa ...`, `xesp policy ...` and `xesp batch FILE`: the `ip xfrm` grammar on the command
// line. The commands go to the `xesp daemon` on its control socket (--socket, default_socket()) and
// it applies them (userspace/control/control.h). With --db FILE they go to a database file instead,
// holding one batch of `sa add` / `policy add` lines, keys included: it is read, changed in memory
// and replaced atomically, so that a command that fails leaves it exactly as it was. Only --db
// means the file: a daemon that does not answer is an error naming its socket, never a reason to
// change a file that no daemon reads.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>

#include "tools/xesp/commands.h"
#include "userspace/config/config.h"
#include "userspace/control/control.h"
#include "userspace/base/netns.h"
#include "userspace/esp/seq_reserve.h"
#include "userspace/base/sys_util.h"
#include "userspace/base/wiped.h"

namespace xesp::cli {

namespace {

// Holds an flock on DB.lock for one read-modify-write cycle, so that two xesp commands on the
// same database do not lose each other's change. (The db itself cannot carry the lock: it is
// replaced by rename. Readers need none: they see the old file or the new one.)
class DbLock {
public:
    explicit DbLock(const std::string &db)
    {
        std::string path = db + ".lock";
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd_ < 0)
            throw Failure(sys_error("cannot open", path) + " (choose another file with --db)");
        if (::flock(fd_, LOCK_EX) != 0) {
            ::close(fd_);
            throw Failure(sys_error("cannot lock", path));
        }
    }
    ~DbLock() { ::close(fd_); }
    DbLock(const DbLock &) = delete;
    DbLock &operator=(const DbLock &) = delete;

private:
    int fd_ = -1;
};

Config read_db(const std::string &path)
{
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
        if (errno == ENOENT)
            return {};
        throw Failure(sys_error("cannot read", path));
    }
    auto cfg = load_batch_file(path);
    if (!cfg)
        throw Failure(cfg.error().message);
    return std::move(*cfg);
}

void write_all(int fd, const std::string &text, const std::string &path)
{
    size_t done = 0;
    while (done < text.size()) {
        ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            throw Failure(sys_error("cannot write", path));
        done += size_t(n);
    }
}

// Writes the database to a temporary file next to it and renames it into place: readers see
// the old or the new database, never a part of one. Mode 0600: the file holds the keys.
void write_db(const std::string &path, const Config &cfg)
{
    std::string dir = parent_dir(path);
    std::string tmp = path + ".XXXXXX";
    int fd = ::mkstemp(tmp.data());
    if (fd < 0)
        throw Failure(sys_error("cannot create", tmp));
    std::string text = "# xesp database: `ip xfrm` lines, keys included. Load with xesp batch.\n";
    append_secret(text, to_batch(cfg, true));
    try {
        if (::fchmod(fd, 0600) != 0)
            throw Failure(sys_error("cannot chmod", tmp));
        write_all(fd, text, tmp);
        if (::fsync(fd) != 0)
            throw Failure(sys_error("cannot sync", tmp));
        if (::close(fd) != 0) {
            fd = -1;
            throw Failure(sys_error("cannot write", tmp));
        }
        fd = -1;
        if (::rename(tmp.c_str(), path.c_str()) != 0)
            throw Failure(sys_error("cannot replace", path));
    } catch (...) {
        if (fd >= 0)
            ::close(fd);
        ::unlink(tmp.c_str());
        OPENSSL_cleanse(text.data(), text.size());
        throw;
    }
    OPENSSL_cleanse(text.data(), text.size());
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);  // make the rename itself durable
        ::close(dfd);
    }
}

// Runs `change` on the database under its lock; writes the result back when `mutating`.
void with_db(const std::string &db, bool mutating, const std::function<void(Config &)> &change)
{
    std::optional<DbLock> lock;
    if (mutating) {
        std::string dir = parent_dir(db);
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
            throw Failure(sys_error("cannot create directory", dir) +
                          " (choose another file with --db)");
        lock.emplace(db);
    }
    Config cfg = read_db(db);
    change(cfg);
    if (mutating)
        write_db(db, cfg);
}

bool is_mutating(Command::Verb v)
{
    using V = Command::Verb;
    return v == V::Add || v == V::Update || v == V::Del || v == V::Flush;
}

void print_entries(const Command &cmd, const Config &cfg, bool show_keys)
{
    std::string out = command_output(cmd, cfg, show_keys);
    std::cout << out;
    std::cout.flush();
    OPENSSL_cleanse(out.data(), out.size());
}

struct DbOptions {
    std::string db;
    std::string socket = default_socket();
    bool show_keys = false;
    std::vector<std::string> words;
    std::string file;
    bool check = false;
    CLI::Option *db_given = nullptr;
    CLI::Option *socket_given = nullptr;
};

void add_db_option(CLI::App *sub, DbOptions &o)
{
    o.db_given =
        sub->add_option("--db", o.db, "work on this database file instead of a running daemon");
    o.socket_given = sub->add_option(
        "--socket", o.socket,
        std::string("the xesp daemon's control socket (default: $XESP_SOCKET, else ") +
            kDefaultSocketHelp + ")");
    o.db_given->excludes(o.socket_given);
}

bool given(const CLI::Option *opt)
{
    return opt && opt->count() > 0;
}

// The daemon, unless --db names a file: the one on --socket, else on the default socket. One
// that does not answer is an error that names the socket tried.
std::optional<ControlClient> reach_daemon(const DbOptions &o)
{
    if (given(o.db_given))
        return std::nullopt;
    auto client = ControlClient::connect(o.socket);
    if (client)
        return std::move(*client);
    int err = client.error().code.value();
    throw Failure(client.error().message +
                  (err == EACCES || err == EPERM
                       ? " (the socket is root's)"
                       : " (is `xesp daemon` running in this network namespace? --socket PATH "
                         "names another; --db FILE works on a database file instead)"));
}

// Prints what the daemon answered, or fails with its one-line error.
void finish(Result<ControlResponse> r)
{
    if (!r)
        throw Failure(r.error().message);
    if (!r->ok)
        throw Failure(r->error);
    std::cout << r->output;
    std::cout.flush();
    r->wipe();
}

Result<std::string> read_batch_text(const std::string &file)
{
    if (file == "-")
        return std::string((std::istreambuf_iterator<char>(std::cin)),
                           std::istreambuf_iterator<char>());
    std::ifstream in(file, std::ios::binary);
    if (!in)
        return make_error("cannot open " + file + ": " + std::strerror(errno), errno);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) {
        OPENSSL_cleanse(text.data(), text.size());
        return make_error("cannot read " + file + ": " + std::strerror(errno), errno);
    }
    return text;
}

void daemon_batch(ControlClient &daemon, const std::string &file, bool check_only)
{
    auto text = read_batch_text(file);
    if (!text)
        throw Failure(text.error().message);
    auto r = daemon.batch(*text, file == "-" ? "<stdin>" : file, check_only);
    OPENSSL_cleanse(text->data(), text->size());
    finish(std::move(r));
}

void run_command(const std::string &object, const DbOptions &o)
{
    std::vector<std::string> all{object};
    all.insert(all.end(), o.words.begin(), o.words.end());
    auto cmd = parse_command(all);
    if (!cmd)
        throw Failure(cmd.error().message);
    if (auto daemon = reach_daemon(o)) {
        auto r = daemon->command(all, o.show_keys);
        for (auto &w : all)
            OPENSSL_cleanse(w.data(), w.size());
        finish(std::move(r));
        return;
    }
    with_db(o.db, is_mutating(cmd->verb), [&](Config &cfg) {
        auto applied = apply_command(cfg, *cmd);
        if (!applied)
            throw Failure(applied.error().message);
        if (cmd->object == Command::Object::Sa &&
            (cmd->verb == Command::Verb::Add || cmd->verb == Command::Verb::Update))
            std::cerr << shared_key_warnings(cfg, &cmd->sa);
        print_entries(*cmd, cfg, o.show_keys);
    });
}

void run_batch(const DbOptions &o)
{
    if (auto daemon = reach_daemon(o)) {
        daemon_batch(*daemon, o.file, o.check);
        return;
    }
    with_db(o.db, !o.check, [&](Config &cfg) {
        Result<Config> loaded = make_error("");
        if (o.file == "-") {
            std::string text((std::istreambuf_iterator<char>(std::cin)),
                             std::istreambuf_iterator<char>());
            loaded = load_batch(text, "<stdin>", cfg);
            OPENSSL_cleanse(text.data(), text.size());
        } else {
            loaded = load_batch_file(o.file, cfg);
        }
        if (!loaded)
            throw Failure(loaded.error().message);
        cfg = std::move(*loaded);
    });
}

constexpr const char *kSaFooter = R"(Commands, in the words of `ip xfrm state`:
  add|update src ADDR dst ADDR proto esp spi SPI [reqid N] [mode tunnel|transport]
      { aead NAME KEY ICV-BITS | enc NAME KEY { auth NAME KEY | auth-trunc NAME KEY BITS } }
      [flag esn] [replay-window N] [replay-seq N] [replay-oseq N] [replay-seq-hi N]
      [replay-oseq-hi N] [encap espinudp SPORT DPORT OADDR]
      [sel src PREFIX dst PREFIX [proto P] [sport N] [dport N]]
      [limit {byte|packet}-{soft|hard} N]... [dir in|out]
  del|get [src ADDR] dst ADDR [proto esp] spi SPI
  flush | list
aead: rfc4106(gcm(aes)), rfc4543(gcm(aes)), rfc7539esp(chacha20,poly1305)
enc: cbc(aes), ecb(cipher_null)   auth: hmac(sha1), hmac(sha256), hmac(sha384), hmac(sha512)
Keys are 0x hex or a string; an AEAD key ends with the 4-byte salt.)";

constexpr const char *kPolicyFooter = R"(Commands, in the words of `ip xfrm policy`:
  add|update src PREFIX dst PREFIX [proto P [sport N] [dport N]] dir in|out|fwd
      [priority N] [action allow|block]
      [tmpl [src ADDR dst ADDR] proto esp [spi SPI] [reqid N] mode tunnel|transport]
  del|get src PREFIX dst PREFIX [proto P [sport N] [dport N]] dir in|out|fwd
  flush | list)";

}  // namespace

void register_db_commands(CLI::App &app)
{
    // Each subcommand keeps its options alive for the callback.
    auto sa_opts = std::make_shared<DbOptions>();
    CLI::App *sa = app.add_subcommand("sa", "add, change and list security associations");
    sa->alias("state");
    add_db_option(sa, *sa_opts);
    sa->add_flag("--show-keys", sa_opts->show_keys, "print keys in list and get");
    sa->add_option("words", sa_opts->words, "COMMAND and its ip xfrm words");
    sa->footer(kSaFooter);
    sa->callback([sa_opts] { run_command("sa", *sa_opts); });

    auto pol_opts = std::make_shared<DbOptions>();
    CLI::App *policy = app.add_subcommand("policy", "add, change and list security policies");
    add_db_option(policy, *pol_opts);
    policy->add_option("words", pol_opts->words, "COMMAND and its ip xfrm words");
    policy->footer(kPolicyFooter);
    policy->callback([pol_opts] { run_command("policy", *pol_opts); });

    auto batch_opts = std::make_shared<DbOptions>();
    CLI::App *batch = app.add_subcommand(
        "batch", "apply a file of 'sa ...' / 'policy ...' lines to the database, all or nothing");
    add_db_option(batch, *batch_opts);
    batch->add_option("file", batch_opts->file, "the batch file, - for standard input")->required();
    batch->add_flag("--check", batch_opts->check,
                    "check the file against the database, change nothing");
    batch->callback([batch_opts] { run_batch(*batch_opts); });

    // `xesp -b FILE`, as `ip -b FILE`: the same as `xesp batch FILE`.
    auto top_opts = std::make_shared<DbOptions>();
    add_db_option(&app, *top_opts);
    app.add_option("-b,--batch", top_opts->file,
                   "apply a batch file of 'sa ...' / 'policy ...' lines (as 'xesp batch FILE')");
    app.callback([top_opts] {
        if (!top_opts->file.empty())
            run_batch(*top_opts);
    });
}

std::string default_socket()
{
    const char *env = std::getenv("XESP_SOCKET");
    if (env && *env)
        return env;
    std::string ns = netns_name();
    return ns.empty() ? kDefaultControlSocket : "/run/xesp/xesp-" + ns + ".sock";
}

}  // namespace xesp::cli
