// LD_PRELOAD shim for the fault suite: makes writes and syncs of files under one directory fail
// with an errno (EIO by default), while a trigger file exists; and holds a job at a named rename.
// The daemon and the worker and store processes it execs inherit it through the environment.
//
//   OFFLOADD_FAULT_PREFIX   fail only fds whose /proc/self/fd target starts with this path
//   OFFLOADD_FAULT_ARM      fail only while this file exists (the test arms and disarms it)
//   OFFLOADD_FAULT_ERRNO    the errno to return (default EIO)
//   OFFLOADD_FAULT_NO_URING refuse io_uring_setup with ENOSYS (seccomp), so offloadd-store takes
//                           its pread/pwrite engine and its writes pass through this shim
//   OFFLOADD_FAULT_HOLD_NAME hold the thread that renames or mkdirs something to this name (a
//   OFFLOADD_FAULT_HOLD_DIR checkpoint's commit: "checkpoint-4"; a trailing '*' matches a prefix:
//                           ".checkpoint-2.*", its temporary directory) once that is done, until
//                           the test lets it go: the job stands still at a known point while the
//                           test acts.
//                           The directory holds two FIFOs the test made: the shim writes a byte
//                           to `held` (the test polls it) and waits for one on `release`. One hold
//                           per FIFO pair: the shim unlinks `held`, so a restarted process passes.
//
// glibc-internal calls (stdio's own write) are not interposed; the product writes checkpoints,
// SQLite pages and store extents through the public functions below.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

static const char* prefix;
static size_t prefix_len;
static const char* arm;
static int fault_errno = EIO;
static const char* hold_name;
static const char* hold_dir;

static void refuse_io_uring(void) {
  struct sock_filter f[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
    perror("fault_shim: seccomp");
  }
}

__attribute__((constructor)) static void init(void) {
  prefix = getenv("OFFLOADD_FAULT_PREFIX");
  prefix_len = prefix ? strlen(prefix) : 0;
  arm = getenv("OFFLOADD_FAULT_ARM");
  const char* e = getenv("OFFLOADD_FAULT_ERRNO");
  if (e) fault_errno = atoi(e);
  if (getenv("OFFLOADD_FAULT_NO_URING")) refuse_io_uring();
  hold_name = getenv("OFFLOADD_FAULT_HOLD_NAME");
  hold_dir = getenv("OFFLOADD_FAULT_HOLD_DIR");
}

static int hit(int fd) {
  if (!prefix_len || !arm || access(arm, F_OK) != 0) return 0;
  char link[64], path[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, sizeof path - 1);
  if (n <= 0) return 0;
  path[n] = 0;
  if (strncmp(path, prefix, prefix_len) != 0) return 0;
  errno = fault_errno;
  return 1;
}

#define REAL(ret, name, ...)                                       \
  static ret (*real)(__VA_ARGS__);                                 \
  if (!real) real = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void* b, size_t n) {
  REAL(ssize_t, write, int, const void*, size_t);
  return hit(fd) ? -1 : real(fd, b, n);
}
ssize_t pwrite(int fd, const void* b, size_t n, off_t o) {
  REAL(ssize_t, pwrite, int, const void*, size_t, off_t);
  return hit(fd) ? -1 : real(fd, b, n, o);
}
ssize_t pwrite64(int fd, const void* b, size_t n, off_t o) {
  REAL(ssize_t, pwrite64, int, const void*, size_t, off_t);
  return hit(fd) ? -1 : real(fd, b, n, o);
}
ssize_t writev(int fd, const struct iovec* v, int c) {
  REAL(ssize_t, writev, int, const struct iovec*, int);
  return hit(fd) ? -1 : real(fd, v, c);
}
ssize_t pwritev(int fd, const struct iovec* v, int c, off_t o) {
  REAL(ssize_t, pwritev, int, const struct iovec*, int, off_t);
  return hit(fd) ? -1 : real(fd, v, c, o);
}
ssize_t pwritev64(int fd, const struct iovec* v, int c, off_t o) {
  REAL(ssize_t, pwritev64, int, const struct iovec*, int, off_t);
  return hit(fd) ? -1 : real(fd, v, c, o);
}
int fsync(int fd) {
  REAL(int, fsync, int);
  return hit(fd) ? -1 : real(fd);
}
int fdatasync(int fd) {
  REAL(int, fdatasync, int);
  return hit(fd) ? -1 : real(fd);
}
ssize_t copy_file_range(int in, loff_t* oi, int out, loff_t* oo, size_t n, unsigned int flags) {
  REAL(ssize_t, copy_file_range, int, loff_t*, int, loff_t*, size_t, unsigned int);
  return hit(out) ? -1 : real(in, oi, out, oo, n, flags);
}
ssize_t sendfile(int out, int in, off_t* o, size_t n) {
  REAL(ssize_t, sendfile, int, int, off_t*, size_t);
  return hit(out) ? -1 : real(out, in, o, n);
}

// Holds the calling thread when `newpath` (the name a rename or mkdir gave) is the hold's name, or
// starts with it when the name ends in '*'. The test opened `held` for reading before the job
// started, so the non-blocking open for writing below finds a reader; `release` is opened before
// `held` is signalled, so the test's non-blocking open for writing finds one too. A FIFO that
// never had a writer polls neither readable nor hung up: the poll returns when the test writes
// its byte or closes.
static void hold_if_named(const char* newpath) {
  if (!hold_name || !hold_dir) return;
  const char* base = strrchr(newpath, '/');
  base = base ? base + 1 : newpath;
  const size_t n = strlen(hold_name);
  if (n > 0 && hold_name[n - 1] == '*' ? strncmp(base, hold_name, n - 1) != 0
                                       : strcmp(base, hold_name) != 0)
    return;
  char held[4096], release[4096];
  snprintf(held, sizeof held, "%s/held", hold_dir);
  snprintf(release, sizeof release, "%s/release", hold_dir);
  const int saved = errno;
  const int r = open(release, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const int w = r < 0 ? -1 : open(held, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (w >= 0) {
    unlink(held);
    const char byte = 'h';
    if (write(w, &byte, 1) != 1) perror("fault_shim: hold");
    close(w);
    struct pollfd p = {.fd = r, .events = POLLIN};
    while (poll(&p, 1, -1) < 0 && errno == EINTR) {
    }
  }
  if (r >= 0) close(r);
  errno = saved;
}

int rename(const char* oldpath, const char* newpath) {
  REAL(int, rename, const char*, const char*);
  const int rc = real(oldpath, newpath);
  if (rc == 0) hold_if_named(newpath);
  return rc;
}
int renameat(int olddirfd, const char* oldpath, int newdirfd, const char* newpath) {
  REAL(int, renameat, int, const char*, int, const char*);
  const int rc = real(olddirfd, oldpath, newdirfd, newpath);
  if (rc == 0) hold_if_named(newpath);
  return rc;
}
int mkdir(const char* path, mode_t mode) {
  REAL(int, mkdir, const char*, mode_t);
  const int rc = real(path, mode);
  if (rc == 0) hold_if_named(path);
  return rc;
}
int mkdirat(int dirfd, const char* path, mode_t mode) {
  REAL(int, mkdirat, int, const char*, mode_t);
  const int rc = real(dirfd, path, mode);
  if (rc == 0) hold_if_named(path);
  return rc;
}
