#include "af_xdp/umem.h"

#include <sys/mman.h>
#include <xdp/xsk.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace xesp {

static_assert((kFrameSize & (kFrameSize - 1)) == 0, "aligned-mode UMEM chunks are a power of two");
static_assert(kFrameHeadroom >= XDP_PACKET_HEADROOM,
              "the kernel always leaves XDP_PACKET_HEADROOM in front of a received frame");
constexpr uint32_t kUmemFrameHeadroom = kFrameHeadroom - XDP_PACKET_HEADROOM;

struct Umem::State {
    uint8_t *area = nullptr;
    uint64_t size = 0;
    UmemOptions options;
    xsk_umem *umem = nullptr;
    // libxdp keeps pointers to these two until the first socket is bound, and to their
    // mappings until the UMEM is deleted: they must not move, hence the heap State.
    xsk_ring_prod fill{};
    xsk_ring_cons comp{};
    uint32_t sockets = 0;
    bool spent = false;

    State() = default;
    State(const State &) = delete;
    State &operator=(const State &) = delete;
    ~State()
    {
        if (umem && xsk_umem__delete(umem) != 0)
            return;  // sockets still bound: the kernel may still write to the area
        if (area)
            munmap(area, size);
    }
};

static bool power_of_two(uint32_t v)
{
    return v && (v & (v - 1)) == 0;
}

Result<Umem> Umem::create(const UmemOptions &options)
{
    if (!options.frame_count)
        return make_error("umem: frame_count is 0; give it at least the fill ring's size");
    if (!power_of_two(options.fill_size) || !power_of_two(options.comp_size))
        return make_error("umem: fill_size " + std::to_string(options.fill_size) +
                          " and comp_size " + std::to_string(options.comp_size) +
                          " must be powers of two");

    auto s = std::make_unique<State>();
    s->options = options;
    s->size = uint64_t(options.frame_count) * kFrameSize;
    void *area = mmap(nullptr, s->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (area == MAP_FAILED)
        return make_error("umem: mmap of " + std::to_string(s->size) +
                              " bytes failed: " + std::strerror(errno) + "; lower frame_count",
                          errno);
    s->area = static_cast<uint8_t *>(area);

    xsk_umem_config cfg{};
    cfg.fill_size = options.fill_size;
    cfg.comp_size = options.comp_size;
    cfg.frame_size = kFrameSize;
    cfg.frame_headroom = kUmemFrameHeadroom;
    cfg.flags = 0;
    int err = xsk_umem__create(&s->umem, s->area, s->size, &s->fill, &s->comp, &cfg);
    if (err) {
        s->umem = nullptr;
        return make_error(std::string("umem: xsk_umem__create failed: ") + std::strerror(-err) +
                              (-err == ENOMEM || -err == EPERM
                                   ? " (the area is pinned: raise RLIMIT_MEMLOCK or run as root)"
                                   : ""),
                          -err);
    }
    return Umem(std::move(s));
}

Umem::Umem(std::unique_ptr<State> s) : s_(std::move(s))
{}
Umem::~Umem() = default;
Umem::Umem(Umem &&) noexcept = default;
Umem &Umem::operator=(Umem &&) noexcept = default;

uint8_t *Umem::area() const
{
    return s_->area;
}
uint64_t Umem::size() const
{
    return s_->size;
}
uint32_t Umem::frame_count() const
{
    return s_->options.frame_count;
}
uint32_t Umem::fill_size() const
{
    return s_->options.fill_size;
}
uint32_t Umem::comp_size() const
{
    return s_->options.comp_size;
}
xsk_umem *Umem::handle() const
{
    return s_->umem;
}
xsk_ring_prod *Umem::initial_fill() const
{
    return &s_->fill;
}
xsk_ring_cons *Umem::initial_comp() const
{
    return &s_->comp;
}
uint32_t Umem::sockets() const
{
    return s_->sockets;
}
void Umem::count_socket(int delta)
{
    s_->sockets = uint32_t(int(s_->sockets) + delta);
    if (!s_->sockets)
        s_->spent = true;
}
bool Umem::spent() const
{
    return s_->spent;
}

FramePool::FramePool(const Umem &umem) : stack_(umem.frame_count())
{
    // Hand out low addresses first: the stack pops from the top.
    for (uint32_t i = 0; i < capacity(); ++i)
        stack_[i] = uint64_t(capacity() - 1 - i) * kFrameSize;
    top_ = capacity();
}

FramePool::FramePool(uint32_t capacity) : stack_(capacity)
{}

FramePool FramePool::split(uint32_t n)
{
    FramePool other(capacity());
    other.top_ = alloc(other.stack_.data(), n);
    return other;
}

}  // namespace xesp
