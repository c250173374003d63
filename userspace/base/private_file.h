// Files that hold keys and must not be read, replaced or shared by anyone else: the daemon's
// state file. Three guards:
//   - the directory: owned by root or by this process's user, and writable by nobody else,
//     so no other user can plant a file or a link where the file will be;
//   - a lock (flock on FILE.lock, held for the process's life), so two daemons never write
//     the same file and lose each other's sequence reservations;
//   - the write: a temporary opened O_CREAT|O_EXCL|O_NOFOLLOW with mode 0600 (fchmod'd on the
//     descriptor, so the umask cannot widen it and nothing is readable for a moment), written,
//     fsynced, renamed over the file, and the directory fsynced: once write_private_file()
//     returns, the new contents survive a crash of the machine too.
#pragma once

#include <string>
#include <string_view>

#include "userspace/base/result.h"

namespace xesp {

// The directory `dir` exists, is a directory, belongs to root or to the effective uid, and
// is neither group- nor world-writable. The error is one line naming the directory.
Result<void> check_private_dir(const std::string &dir);

// An exclusive lock on PATH.lock for the object's life.
class PrivateFileLock {
public:
    // Fails at once (no waiting) when another process holds it: "state file PATH is in use
    // by another xesp daemon (PATH.lock is locked)".
    static Result<PrivateFileLock> acquire(const std::string &path);

    PrivateFileLock(PrivateFileLock &&o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
    PrivateFileLock &operator=(PrivateFileLock &&o) noexcept;
    PrivateFileLock(const PrivateFileLock &) = delete;
    PrivateFileLock &operator=(const PrivateFileLock &) = delete;
    ~PrivateFileLock();

private:
    explicit PrivateFileLock(int fd) : fd_(fd) {}
    int fd_ = -1;
};

// Replaces `path` with `text` durably (see above). A temporary left by a crash is removed
// first: the caller holds the lock, so no one else is writing it.
Result<void> write_private_file(const std::string &path, std::string_view text);

}  // namespace xesp
