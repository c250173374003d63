// The `xesp` command. Exceptions stop here: everything below returns Result.
#include <limits.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tools/xesp/commands.h"

namespace {

// Set in the environment of the daemon's second start, and taken out of it there.
constexpr const char *kRestarted = "XESP_RESTARTED_FOR_HUGE_PAGES";

// `xesp daemon` runs with malloc on transparent huge pages (GLIBC_TUNABLES
// glibc.malloc.hugetlb=1, glibc 2.35 on, which asks for them where the kernel's mode is
// `madvise`, Debian's default): with 100,000 tunnels its tables take over a gigabyte, and a
// start spends more in faulting in 4 KiB pages than in building them (`tools/xesp-tunnels
// load --tunnels 100000` on a 2-vCPU VM: it answers after 10.4 s on small pages, 6.5 s on
// huge ones), and the data path pays a TLB miss for each cold SA. `xesp pcap` and `xesp bench
// pipeline` run the same data path over the same tables, and so the same way. Tunables are
// read when a program starts, so these commands start themselves again with them, once, as
// soon as the command is known (an option before it is no matter). A GLIBC_TUNABLES that
// names glibc.malloc.hugetlb already (=0 for small pages) is left as it is, and so is a
// program run with raised privileges (setuid or file capabilities), for which glibc drops the
// tunable.
void exec_with_huge_pages(char **argv)
{
    const char *was = std::getenv("GLIBC_TUNABLES");
    if ((was && std::strstr(was, "glibc.malloc.hugetlb")) || ::getauxval(AT_SECURE))
        return;
    // The program's own file by its name, so that the process keeps its name (a path through
    // /proc/self/exe would name it "exe").
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self);
    if (n <= 0 || size_t(n) >= sizeof self)
        return;
    self[n] = 0;
    std::string tunables = was && *was ? std::string(was) + ":" : std::string();
    tunables += "glibc.malloc.hugetlb=1";
    if (::setenv("GLIBC_TUNABLES", tunables.c_str(), 1) != 0 || ::setenv(kRestarted, "1", 1) != 0)
        return;
    ::execv(self, argv);
    // Not fatal: the daemon runs on small pages.
    std::fprintf(stderr, "xesp: warning: cannot restart with huge pages for malloc: %s\n",
                 std::strerror(errno));
    ::unsetenv(kRestarted);
}

}  // namespace

int main(int argc, char **argv)
{
    const bool restarted = std::getenv(kRestarted) != nullptr;
    ::unsetenv(kRestarted);
    CLI::App app{"xesp: an XDP/AF_XDP-accelerated IPsec ESP gateway"};
    app.require_subcommand(0, 1);
    xesp::cli::register_db_commands(app);
    xesp::cli::register_pcap_command(app);
    xesp::cli::register_bench_command(app);
    xesp::cli::register_daemon_command(app);
    xesp::cli::register_gateway_commands(app);
    try {
        if (!restarted)
            for (CLI::App *data_path : {app.get_subcommand("daemon"), app.get_subcommand("pcap"),
                                        app.get_subcommand("bench")->get_subcommand("pipeline")})
                data_path->preparse_callback([argv](std::size_t) { exec_with_huge_pages(argv); });
        app.parse(argc, argv);
        if (app.get_subcommands().empty() && app.count("--batch") == 0) {
            std::fprintf(stderr, "%s", app.help().c_str());
            return 1;
        }
    } catch (const CLI::ParseError &e) {
        return app.exit(e);
    } catch (const xesp::cli::Failure &e) {
        std::fprintf(stderr, "xesp: %s\n", e.what());
        return 1;
    }
    return 0;
}
