// libFuzzer target for the daemon's state file: the input is the file, read by load_state().
// An error must be one line that names the file; a file that loads must save and load back to
// the same state, and give each of its SAs its own sequence numbers back.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "userspace/gateway/state.h"

using namespace xesp;

namespace {

[[noreturn]] void fail(const char *what, const std::string &detail)
{
    std::fprintf(stderr, "fuzz_state: %s\n  %s\n", what, detail.c_str());
    std::abort();
}

// The input goes into a memory file, read through its /proc path as any other file.
struct Files {
    int fd = -1;
    std::string input;
    std::string dir;  // where saved states go

    Files()
    {
        fd = ::memfd_create("fuzz_state", MFD_CLOEXEC);
        if (fd < 0)
            fail("memfd_create", "");
        input = "/proc/self/fd/" + std::to_string(fd);
        std::string tmpl = (std::filesystem::temp_directory_path() / "fuzz_state.XXXXXX");
        if (!::mkdtemp(tmpl.data()))
            fail("mkdtemp", tmpl);
        dir = tmpl;
    }
    ~Files() { std::filesystem::remove_all(dir); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static Files files;
    if (size > 65536)
        return 0;
    if (::ftruncate(files.fd, 0) != 0 || ::pwrite(files.fd, data, size, 0) != ssize_t(size))
        fail("cannot write the input", files.input);
    auto loaded = load_state(files.input);
    if (!loaded) {
        const std::string &m = loaded.error().message;
        if (m.rfind("state file " + files.input + ": ", 0) != 0 || m.find('\n') != m.npos)
            fail("an error that is not one line naming the file", m);
        return 0;
    }
    if (!*loaded)
        fail("an existing file read as no file", files.input);
    const GatewayState &st = **loaded;

    std::string saved = files.dir + "/state";
    if (auto s = save_state(saved, st); !s)
        fail("a loaded state does not save", s.error().message);
    auto again = load_state(saved);
    if (!again || !*again)
        fail("a saved state does not load", again ? "no file" : again.error().message);
    if (!((*again)->config == st.config) || (*again)->ifaces != st.ifaces ||
        (*again)->renamed != st.renamed)
        fail("the state changed through save_state -> load_state", to_batch(st.config, false));
    if (!(with_saved_sequence(st.config, st.config) == st.config))
        fail("with_saved_sequence changed a configuration given its own numbers",
             to_batch(st.config, false));
    return 0;
}
