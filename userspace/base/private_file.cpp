#include "userspace/base/private_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "userspace/base/sys_util.h"

namespace xesp {

Result<void> check_private_dir(const std::string &dir)
{
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0)
        return make_error(sys_error("cannot use the state directory", dir), errno);
    if (!S_ISDIR(st.st_mode))
        return make_error("state directory " + dir + " is not a directory", ENOTDIR);
    if (st.st_uid != 0 && st.st_uid != ::geteuid())
        return make_error("state directory " + dir + " belongs to uid " +
                              std::to_string(st.st_uid) +
                              ", neither root nor this user; choose another --state",
                          EPERM);
    if (st.st_mode & (S_IWGRP | S_IWOTH))
        return make_error("state directory " + dir +
                              " is writable by others (group or world); chmod go-w it or "
                              "choose another --state",
                          EPERM);
    return {};
}

Result<PrivateFileLock> PrivateFileLock::acquire(const std::string &path)
{
    std::string lock = path + ".lock";
    // Read-only: flock needs no more, and the directory can still be remounted read-only.
    int fd = ::open(lock.c_str(), O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return make_error(sys_error("cannot open the lock file", lock), errno);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        ::close(fd);
        if (err == EWOULDBLOCK)
            return make_error("state file " + path + " is in use by another xesp daemon (" + lock +
                                  " is locked); give this one its own --state",
                              err);
        errno = err;
        return make_error(sys_error("cannot lock", lock), err);
    }
    return PrivateFileLock(fd);
}

PrivateFileLock &PrivateFileLock::operator=(PrivateFileLock &&o) noexcept
{
    if (this != &o) {
        if (fd_ >= 0)
            ::close(fd_);
        fd_ = o.fd_;
        o.fd_ = -1;
    }
    return *this;
}

PrivateFileLock::~PrivateFileLock()
{
    if (fd_ >= 0)
        ::close(fd_);
}

namespace {

bool write_all(int fd, std::string_view text)
{
    size_t done = 0;
    while (done < text.size()) {
        ssize_t w = ::write(fd, text.data() + done, text.size() - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return false;
        }
        done += size_t(w);
    }
    return true;
}

}  // namespace

Result<void> write_private_file(const std::string &path, std::string_view text)
{
    std::string tmp = path + ".tmp";
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT)
        return make_error(sys_error("cannot remove the stale temporary", tmp), errno);
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return make_error(sys_error("cannot create", tmp), errno);
    bool ok = ::fchmod(fd, 0600) == 0 && write_all(fd, text) && ::fsync(fd) == 0;
    int err = errno;
    if (::close(fd) != 0 && ok) {
        ok = false;
        err = errno;
    }
    if (ok && ::rename(tmp.c_str(), path.c_str()) != 0) {
        ok = false;
        err = errno;
    }
    if (!ok) {
        ::unlink(tmp.c_str());
        errno = err;
        return make_error(sys_error("cannot write", path), err);
    }
    std::string dir = parent_dir(path);
    int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return make_error(sys_error("cannot open the directory of", path), errno);
    ok = ::fsync(dfd) == 0;
    err = errno;
    ::close(dfd);
    if (!ok) {
        errno = err;
        return make_error(sys_error("cannot sync the directory of", path), err);
    }
    return {};
}

}  // namespace xesp
