// Each `xesp` subcommand registers itself on the CLI11 app; main.cpp only wires them up.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace xesp::cli {

void register_db_commands(CLI::App &app);               // xesp sa ..., xesp policy ...
void register_pcap_command(CLI::App &app);              // xesp pcap
void register_bench_command(CLI::App &app);             // xesp bench
void register_bench_pipeline_command(CLI::App &bench);  // xesp bench pipeline
void register_bench_cpus_command(CLI::App &bench);      // xesp bench cpus
void register_bench_keys_command(CLI::App &bench);      // xesp bench keys
void register_daemon_command(CLI::App &app);            // xesp daemon
void register_gateway_commands(CLI::App &app);          // xesp iface ..., xesp stats

// The daemon's control socket: $XESP_SOCKET, else /run/xesp/xesp.sock, or in a named network
// namespace NS (netns.h) /run/xesp/xesp-NS.sock: a daemon and the CLI run in the same
// namespace agree on it, and daemons in different ones do not collide.
std::string default_socket();
inline constexpr const char *kDefaultSocketHelp =
    "/run/xesp/xesp.sock, in network namespace NS /run/xesp/xesp-NS.sock";

// A command that failed in a way the user must see: printed as "xesp: <message>", exit code 1.
struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

}  // namespace xesp::cli
