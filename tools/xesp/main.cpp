// The `xesp` command. Exceptions stop here: everything below returns Result.
#include <cstdio>

#include "tools/xesp/commands.h"

int main(int argc, char **argv)
{
    CLI::App app{"xesp: an XDP/AF_XDP-accelerated IPsec ESP gateway"};
    app.require_subcommand(0, 1);
    xesp::cli::register_db_commands(app);
    xesp::cli::register_pcap_command(app);
    xesp::cli::register_bench_command(app);
    xesp::cli::register_daemon_command(app);
    xesp::cli::register_gateway_commands(app);
    try {
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
