// Every block the `xesp` process frees through operator delete is wiped first. Keys pass as
// text through buffers the program does not own (the JSON lexer's, the stream buffers of a
// state file being read, a vector's old storage as it grows): wiping each block on its way
// back to malloc means none of them outlives its use in freed memory, whatever the path. The
// data path allocates nothing, so this costs only the control path. Not under the address or
// thread sanitizer, which bring their own operator delete.
#include <malloc.h>
#include <string.h>

#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define XESP_WIPE_ON_FREE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define XESP_WIPE_ON_FREE 0
#endif
#endif
#ifndef XESP_WIPE_ON_FREE
#define XESP_WIPE_ON_FREE 1
#endif

#if XESP_WIPE_ON_FREE

namespace {

void wipe_and_free(void *p) noexcept
{
    if (!p)
        return;
    explicit_bzero(p, malloc_usable_size(p));
    std::free(p);
}

}  // namespace

// operator new is the library's (malloc, or aligned_alloc for the aligned forms): these free
// what it returns the way its own operator delete would.
void operator delete(void *p) noexcept
{
    wipe_and_free(p);
}
void operator delete[](void *p) noexcept
{
    wipe_and_free(p);
}
void operator delete(void *p, std::size_t) noexcept
{
    wipe_and_free(p);
}
void operator delete[](void *p, std::size_t) noexcept
{
    wipe_and_free(p);
}
void operator delete(void *p, std::align_val_t) noexcept
{
    wipe_and_free(p);
}
void operator delete[](void *p, std::align_val_t) noexcept
{
    wipe_and_free(p);
}
void operator delete(void *p, std::size_t, std::align_val_t) noexcept
{
    wipe_and_free(p);
}
void operator delete[](void *p, std::size_t, std::align_val_t) noexcept
{
    wipe_and_free(p);
}

#endif
