// Huge pages for the heap of `xesp pcap`. With thousands of tunnels, a burst touches an SA,
// its keys and its table slots in as many 4 KiB pages: the TLB misses cost about as much as
// the cache misses (in a VM, twice over). Once the tables are loaded, the process's heap is put
// on transparent huge pages where the kernel lets a process ask for them (`madvise` mode,
// Debian's default): what malloc hands out after that comes from huge pages, and what is
// already there is collapsed into them (MADV_COLLAPSE, Linux 6.1 on; older kernels leave that
// to khugepaged).
//
// Not for the daemon: a collapse makes a whole 2 MiB resident for one page in use (undoing
// malloc_trim), and leaves the small pages it copied, keys included, to the kernel unwiped
// (khugepaged may still do that later, to what is on small pages; the kernel clears a page
// before any process gets it).
// The daemon gets huge pages from malloc itself, for everything it allocates:
// GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (glibc 2.35 on), which `xesp daemon` sets for itself
// (tools/xesp/main.cpp).
//
// The heap is every private, writable, anonymous mapping but the stacks: the main arena
// ([heap]), the other arenas, and malloc's own mappings of large blocks (the tables' arrays).
// A thread's stack is the mapping right above its guard (PROT_NONE, a few pages); it stays on
// small pages. (An arena may sit right above another's reserved tail, PROT_NONE too, but
// megabytes long.)
#pragma once

#include <cstddef>

namespace xesp {

struct HugePageAdvice {
    size_t advised = 0;      // bytes now eligible for huge pages
    size_t collapsed = 0;    // bytes collapsed into huge pages now
    int collapse_error = 0;  // errno of the first collapse refused (EINVAL: before Linux 6.1)
};

// Does nothing where transparent huge pages are off (`never`). Never fails: a mapping the
// kernel refuses stays as it was.
HugePageAdvice advise_huge_pages();

}  // namespace xesp
