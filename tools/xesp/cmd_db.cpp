// `xesp sa ...`, `xesp policy ...` and `xesp batch FILE`: the `ip xfrm` grammar on the command
// line. The databases are kept in a file (--db) holding one batch of `sa add` / `policy add`
// lines, keys included: it is read, changed in memory and replaced atomically, so that a
// command that fails leaves it exactly as it was.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <iterator>
#include <optional>

#include "tools/xesp/commands.h"
#include "userspace/config.h"

namespace xesp::cli {

namespace {

constexpr const char *kDefaultDb = "/var/lib/xesp/db.conf";

std::string default_db()
{
    const char *env = std::getenv("XESP_DB");
    return env && *env ? env : kDefaultDb;
}

std::string sys_error(const std::string &what, const std::string &path)
{
    return what + " " + path + ": " + std::strerror(errno);
}

std::string parent_dir(const std::string &path)
{
    auto slash = path.rfind('/');
    if (slash == std::string::npos)
        return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

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
    std::string text = "# xesp database: `ip xfrm` lines, keys included. Load with xesp batch.\n" +
                       cfg.to_batch(true);
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
        ::fsync(dfd);     // make the rename itself durable
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
    using V = Command::Verb;
    bool sa = cmd.object == Command::Object::Sa;
    if (cmd.verb == V::Get) {
        if (sa)
            std::cout << format_sa(*cfg.find_sa(cmd.sa.dst, cmd.sa.spi), show_keys) << '\n';
        else
            std::cout << format_policy(*cfg.find_policy(cmd.policy.sel, cmd.policy.dir)) << '\n';
    } else if (cmd.verb == V::List) {
        if (sa)
            for (const auto &s : cfg.sas)
                std::cout << format_sa(s, show_keys) << '\n';
        else
            for (const auto &p : cfg.policies)
                std::cout << format_policy(p) << '\n';
    }
    std::cout.flush();
}

void run_command(const std::string &object, const std::vector<std::string> &words,
                 const std::string &db, bool show_keys)
{
    std::vector<std::string> all{object};
    all.insert(all.end(), words.begin(), words.end());
    auto cmd = parse_command(all);
    if (!cmd)
        throw Failure(cmd.error().message);
    with_db(db, is_mutating(cmd->verb), [&](Config &cfg) {
        auto applied = cfg.apply(*cmd);
        if (!applied)
            throw Failure(applied.error().message);
        print_entries(*cmd, cfg, show_keys);
    });
}

void run_batch(const std::string &file, const std::string &db, bool check_only)
{
    with_db(db, !check_only, [&](Config &cfg) {
        Result<Config> loaded = make_error("");
        if (file == "-") {
            std::string text((std::istreambuf_iterator<char>(std::cin)),
                             std::istreambuf_iterator<char>());
            loaded = load_batch(text, "<stdin>", cfg);
            OPENSSL_cleanse(text.data(), text.size());
        } else {
            loaded = load_batch_file(file, cfg);
        }
        if (!loaded)
            throw Failure(loaded.error().message);
        cfg = std::move(*loaded);
    });
}

struct DbOptions {
    std::string db = default_db();
    bool show_keys = false;
    std::vector<std::string> words;
    std::string file;
    bool check = false;
};

void add_db_option(CLI::App *sub, DbOptions &o)
{
    sub->add_option("--db", o.db,
                    "database file (default: $XESP_DB, else " + std::string(kDefaultDb) + ")");
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

} // namespace

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
    sa->callback([sa_opts] { run_command("sa", sa_opts->words, sa_opts->db, sa_opts->show_keys); });

    auto pol_opts = std::make_shared<DbOptions>();
    CLI::App *policy = app.add_subcommand("policy", "add, change and list security policies");
    add_db_option(policy, *pol_opts);
    policy->add_option("words", pol_opts->words, "COMMAND and its ip xfrm words");
    policy->footer(kPolicyFooter);
    policy->callback([pol_opts] { run_command("policy", pol_opts->words, pol_opts->db, false); });

    auto batch_opts = std::make_shared<DbOptions>();
    CLI::App *batch = app.add_subcommand(
        "batch", "apply a file of 'sa ...' / 'policy ...' lines to the database, all or nothing");
    add_db_option(batch, *batch_opts);
    batch->add_option("file", batch_opts->file, "the batch file, - for standard input")->required();
    batch->add_flag("--check", batch_opts->check,
                    "check the file against the database, change nothing");
    batch->callback(
        [batch_opts] { run_batch(batch_opts->file, batch_opts->db, batch_opts->check); });

    // `xesp -b FILE`, as `ip -b FILE`: the same as `xesp batch FILE`.
    auto top_opts = std::make_shared<DbOptions>();
    app.add_option("-b,--batch", top_opts->file,
                   "apply a batch file of 'sa ...' / 'policy ...' lines (as 'xesp batch FILE')");
    app.callback([top_opts] {
        if (!top_opts->file.empty())
            run_batch(top_opts->file, top_opts->db, false);
    });
}

} // namespace xesp::cli
