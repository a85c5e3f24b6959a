/* Preloaded into every program of a gVisor sandbox (through /etc/ld.so.preload).
 *
 * The runsc Debian 12 ships refuses the AT_NO_AUTOMOUNT flag of statx(2) and fstatat(2)
 * with EINVAL, and coreutils always passes it: `ls`, `stat`, `du`, `cp -a` fail. gVisor never
 * automounts, so the flag is dropped before the syscall. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf) {
    return (int)syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, struct stat64 *buf, int flags) {
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~AT_NO_AUTOMOUNT);
}
